"""One JAX process of a multi-process job (CPU) that checkpoints the way
MaxText does with multi-tier checkpointing, through the real Orbax code:

- orbax...multi_tier_checkpointing.initialization.
  initialize_multi_tier_checkpointing(): with its default
  use_mtc_process_ids=True it waits for DIR/jax-init-info.txt (written by
  the node's replicator, here mtcfs), calls jax.distributed.initialize
  with that process id and coordinator, writes replicator.yaml (tmp +
  rename, framework orbax, peer-ranks from the slice layout), waits until
  it is consumed and processes the *.restore markers (renames the newest
  to DIR/<step>, removes the rest);
- ReplicatorCheckpointManager on DIR with the global mesh; restore of the
  latest step as MaxText does (Composite(state=PyTreeRestore(item=abstract,
  restore_args=ArrayRestoreArgs per leaf))), then saves of --steps
  (Composite(state=PyTreeSave(tree))), wait_until_finished, close.

The pytree (ckpt_data.ORBAX_TREE) has leaves sharded along axis 0 over the
processes (each process writes only its half) and a replicated one; with
--replicated every leaf is replicated (pure data parallelism over the
slices, MaxText's default data_parallelism = number of slices).
Output: a JSON report (--out); for a restore, the raw bytes of every
restored leaf's local shard in --dump-dir, for the test to compare with
its own copy.
"""
import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_data  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import flags  # noqa: E402
import ml_dtypes  # noqa: E402
from etils import epath  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from orbax.checkpoint.experimental.emergency import (  # noqa: E402
    replicator_checkpoint_manager as rcm)
from orbax.checkpoint.experimental.emergency.multi_tier_checkpointing import (  # noqa: E402
    initialization)

NP_DTYPE = {"float32": np.float32, "int32": np.int32,
            "bfloat16": ml_dtypes.bfloat16}


def log(msg):
    sys.stderr.write("[orbax %.3f] %s\n" % (time.time(), msg))
    sys.stderr.flush()


def nest(flat):
    out = {}
    for name, v in flat.items():
        d = out
        parts = name.split("/")
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = v
    return out


def flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        name = prefix + k
        if isinstance(v, dict):
            out.update(flatten(v, name + "/"))
        else:
            out[name] = v
    return out


REPLICATED = False      # --replicated: every leaf on every process (DP)


def sharding_of(mesh, name):
    _, _, sharded = ckpt_data.ORBAX_TREE[name]
    sharded = sharded and not REPLICATED
    spec = jax.sharding.PartitionSpec("x") if sharded else jax.sharding.PartitionSpec()
    return jax.sharding.NamedSharding(mesh, spec)


def make_tree(mesh, step):
    flat = {}
    for name, (shape, dtype, _) in ckpt_data.ORBAX_TREE.items():
        full = np.frombuffer(ckpt_data.orbax_leaf(name, step),
                             dtype=NP_DTYPE[dtype]).reshape(shape)
        flat[name] = jax.make_array_from_callback(
            shape, sharding_of(mesh, name), lambda idx, full=full: full[idx])
    return nest(flat)


def abstract_tree(mesh):
    return nest({name: jax.ShapeDtypeStruct(shape, NP_DTYPE[dtype],
                                            sharding=sharding_of(mesh, name))
                 for name, (shape, dtype, _) in ckpt_data.ORBAX_TREE.items()})


def local_bytes(arr):
    """The bytes of this process's part of arr (rows in device order)."""
    shards = sorted(arr.addressable_shards,
                    key=lambda s: tuple(sl.start or 0 for sl in s.index))
    seen, parts = set(), []
    for s in shards:
        key = tuple((sl.start, sl.stop) for sl in s.index)
        if key in seen:
            continue
        seen.add(key)
        a = np.asarray(s.data)
        if a.dtype == ml_dtypes.bfloat16:
            a = a.view(np.uint16)
        parts.append(a.tobytes())
    return b"".join(parts)


def file_digests(top):
    """{path relative to top: SHA-256} of every file under top."""
    out = {}
    for dp, _, fns in os.walk(top):
        for fn in fns:
            p = os.path.join(dp, fn)
            with open(p, "rb") as f:
                out[os.path.relpath(p, top)] = hashlib.sha256(f.read()).hexdigest()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--steps", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dump-dir")
    ap.add_argument("--num-slices", type=int, default=2)
    ap.add_argument("--data-parallelism", type=int, default=1,
                    help="0: Orbax's default (= the number of slices)")
    ap.add_argument("--replicated", action="store_true",
                    help="every leaf replicated on every process")
    ap.add_argument("--backup-interval-steps", type=int)
    ap.add_argument("--keep", type=int, help="preservation policy LatestN")
    ap.add_argument("--resized", action="store_true",
                    help="a restore Orbax refuses (another job size) is "
                    "reported, not raised")
    a = ap.parse_args()
    global REPLICATED
    REPLICATED = a.replicated
    d = epath.Path(a.dir)
    # MaxText runs under absl's app.run (flags parsed) and sets this one
    # before creating its emergency checkpoint manager
    flags.FLAGS(sys.argv[:1])
    flags.FLAGS.experimental_orbax_use_distributed_process_id = True

    t0 = time.monotonic()
    initialization.initialize_multi_tier_checkpointing(
        d, run_name=a.job,
        backup_interval_minutes=None if a.backup_interval_steps else 30,
        backup_interval_steps=a.backup_interval_steps,
        num_slices=a.num_slices, data_parallelism=a.data_parallelism or None,
        jax_initialization_timeout_seconds=120)
    pid = jax.process_index()
    log("initialized: process %d of %d, devices %s (%.1f s)" % (
        pid, jax.process_count(), jax.devices(), time.monotonic() - t0))
    report = {"process": pid, "nprocs": jax.process_count(),
              "top_after_init": sorted(os.listdir(a.dir))}
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    policy = ocp.checkpoint_managers.LatestN(n=a.keep) if a.keep else None
    mngr = rcm.ReplicatorCheckpointManager(
        d, options=rcm.ReplicatorCheckpointManagerOptions(
            save_interval_steps=1, preservation_policy=policy),
        global_mesh=mesh)
    latest = mngr.latest_step()
    report["latest_step"] = latest
    report["all_steps"] = list(mngr.all_steps())
    ok = True
    restored = None
    if latest is not None:
        report["step_files"] = file_digests(os.path.join(a.dir, str(latest)))
        abstract = abstract_tree(mesh)
        restore_args = jax.tree.map(
            lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding,
                                           global_shape=x.shape, dtype=x.dtype),
            abstract)
        try:
            restored = mngr.restore(latest, args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args)))
        except ValueError as e:
            # --resized: the job's process count differs from the saver's,
            # which Orbax's multi-controller restore refuses; report it and
            # go on saving (as a job started afresh would)
            if not a.resized:
                raise
            report["restore_error"] = str(e)
            log("restore of step %d refused: %s" % (latest, e))
            restored = None
    if restored is not None:
        flat = flatten(restored["state"])
        report["restored_leaves"] = sorted(flat)
        for name, arr in flat.items():
            got = local_bytes(arr)
            if a.dump_dir:
                with open(os.path.join(a.dump_dir, "p%d.%s" % (
                        pid, name.replace("/", "."))), "wb") as f:
                    f.write(got)
            want = ckpt_data.orbax_local(name, latest, pid, jax.process_count(),
                                         replicated=REPLICATED)
            if got != want:
                log("MISMATCH %s at step %d" % (name, latest))
                ok = False
        log("restored step %d: %s" % (latest, "equal" if ok else "DIFFERENT"))
    report["equal"] = ok
    for s in [int(x) for x in a.steps.split(",") if x]:
        saved = mngr.save(s, args=ocp.args.Composite(
            state=ocp.args.PyTreeSave(make_tree(mesh, s))))
        log("save %d started: %s" % (s, saved))
    mngr.wait_until_finished()
    # Orbax's own bookkeeping (no re-read: mtcfs may be dropping an older
    # step from the view right now, as GKE's replicator renames it away)
    report["all_steps_end"] = sorted(mngr.all_steps())
    mngr.close()
    report["top"] = sorted(os.listdir(a.dir))
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    jax.distributed.shutdown()
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
