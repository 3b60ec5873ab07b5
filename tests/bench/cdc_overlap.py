#!/usr/bin/env python3
"""cdc_overlap.py: how much of a data-parallel checkpoint mtcfs's own chunker
(common/cdc.c, through mtcfs-cdcbench --list) finds again in a twin's
checkpoint, at a few candidate average chunk sizes (docs/chunks.md).

    tests/bench/cdc_overlap.py --cdcbench build/mtcfs-cdcbench
        [--work /dev/shm/mtcfs-cdc-overlap] [--mib 32] [--avg 8,16,32,64]
        [--keep] [--reuse] [--md OUT.md]

Without --cdcbench it only writes the checkpoints (and keeps them, for a
later --reuse run that measures without writing them again).

It makes, with the real clients in the test venv
(/var/cache/mtcfs-test-venv/bin/python, or $MTCFS_TEST_PY):
  orbax   2 JAX processes on CPU (jax.distributed on loopback), one mesh
          axis 'data' of 2 devices, every leaf replicated (pure data
          parallelism), saved with Orbax's ReplicatorCheckpointManager (OCDBT
          on, as that manager hard-wires it) into one directory per process;
          steps 1 and 2 (step 2 changes half of the leaves);
  dcp     2 gloo ranks saving the same state with torch.distributed.checkpoint
          into per-rank directories (no_dist, NeMo's in-cluster layout
          __<rank>_), steps 1 and 2.
The state is --mib MiB of bf16 and f32 leaves, seeded by leaf name (not by
process), as in ../shared/DP-OVERLAP.md.

Share = the fraction of process 0's bytes in chunks whose SHA-256 also
occurs among process 1's chunks of the same step (any file, any offset);
"step" = process 0's step 2 against process 0's step 1. Chunk-list
overhead = chunks per GiB x entry bytes (an entry: 32-byte hash + 4-byte
length = 36 B; offsets follow from the lengths). Everything it writes
lives under --work and is removed at the end unless --keep (or no
--cdcbench).
"""
import argparse
import collections
import os
import shutil
import socket
import subprocess
import sys
import time
import zlib

VENV_PY = os.environ.get("MTCFS_TEST_PY", "/var/cache/mtcfs-test-venv/bin/python")
ENTRY_BYTES = 36

# name: (share of the state, dtype, changes at step 2?)
LEAVES = [
    ("embed", 0.25, "bfloat16", False),
    ("layer0/attn", 0.15, "float32", True),
    ("layer0/mlp", 0.15, "bfloat16", False),
    ("layer1/attn", 0.15, "float32", True),
    ("layer1/mlp", 0.15, "bfloat16", True),
    ("opt/mu", 0.10, "float32", True),
    ("opt/count", 0.0, "int32", True),
    ("head/bias", 0.05, "float32", False),
]


def leaf_arrays(np, mib, step):
    """[(name, dtype, numpy array)] of the state at step, the same in every
    process (float32 arrays: the writer casts the bfloat16 ones)."""
    out = []
    for name, share, dtype, changes in LEAVES:
        seed = zlib.crc32(name.encode()) * 1000 + (step if changes else 0)
        rng = np.random.default_rng(seed)
        if dtype == "int32":
            out.append((name, dtype, np.full((8,), step, dtype=np.int32)))
            continue
        isz = 2 if dtype == "bfloat16" else 4
        n = max(1024, int(mib * (1 << 20) * share) // isz // 1024 * 1024)
        a = rng.standard_normal(n, dtype=np.float32) * 0.02
        out.append((name, dtype, a.reshape(-1, 1024)))
    return out


# ---- the two writers, run as child processes of this script -----------------

def run_orbax(args):
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import numpy as np
    import ml_dtypes
    import orbax.checkpoint as ocp
    from etils import epath
    from orbax.checkpoint.experimental.emergency import (
        replicator_checkpoint_manager as rcm)
    jax.distributed.initialize("127.0.0.1:%d" % args.port, num_processes=2,
                               process_id=args.rank, initialization_timeout=60)
    # as initialize_multi_tier_checkpointing does (MaxText's path)
    from absl import flags
    from orbax.checkpoint._src.multihost import multihost
    flags.FLAGS(sys.argv[:1])
    flags.FLAGS.experimental_orbax_use_distributed_process_id = True
    multihost.initialize_distributed_to_device_ids()
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    d = os.path.join(args.out, "p%d" % args.rank)
    os.makedirs(d, exist_ok=True)
    mngr = rcm.ReplicatorCheckpointManager(
        epath.Path(d),
        options=rcm.ReplicatorCheckpointManagerOptions(save_interval_steps=1),
        global_mesh=mesh)
    for step in (1, 2):
        tree = {}
        for name, dt, arr in leaf_arrays(np, args.mib, step):
            if dt == "bfloat16":
                arr = arr.astype(ml_dtypes.bfloat16)
            tree[name.replace("/", "_")] = jax.make_array_from_callback(
                arr.shape, rep, lambda idx, a=arr: a[idx])
        mngr.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(tree)))
        mngr.wait_until_finished()
    mngr.close()
    jax.distributed.shutdown()


def run_dcp(args):
    import dataclasses
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import _StoragePrefix
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port),
                      RANK=str(args.rank), WORLD_SIZE="2")
    dist.init_process_group("gloo")

    class RankWriter(dcp.FileSystemWriter):
        def prepare_global_plan(self, plans):
            return [dataclasses.replace(
                plans[0], storage_data=_StoragePrefix("__%d_" % args.rank))]

    for step in (1, 2):
        sd = {}
        for name, dt, arr in leaf_arrays(np, args.mib, step):
            t = torch.from_numpy(np.ascontiguousarray(arr))
            sd[name.replace("/", ".")] = t.to(torch.bfloat16) if dt == "bfloat16" else t
        d = os.path.join(args.out, "p%d" % args.rank, "step=%d" % step)
        os.makedirs(d, exist_ok=True)
        dist.barrier()
        dcp.save(sd, storage_writer=RankWriter(d), no_dist=True)
    dist.barrier()
    dist.destroy_process_group()


# ---- driver -----------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def generate(kind, out, mib):
    """Both processes of one writer; a second try on another port if the
    first fails (seen once: JAX's coordination service never connected)."""
    for attempt in (1, 2):
        errs = generate_once(kind, out, mib)
        if not errs:
            return
        print("cdc_overlap: %s writer failed (try %d):\n%s" % (
            kind, attempt, "\n".join(errs)), file=sys.stderr)
        shutil.rmtree(out, ignore_errors=True)
    sys.exit("cdc_overlap: %s writer failed twice" % kind)


def generate_once(kind, out, mib):
    port = free_port()
    procs = [subprocess.Popen([VENV_PY, os.path.abspath(__file__), "--role", kind,
                               "--rank", str(r), "--port", str(port),
                               "--out", out, "--mib", str(mib)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for r in (0, 1)]
    errs = []
    for p in procs:
        _, err = p.communicate(timeout=900)
        if p.returncode != 0:
            errs.append(err.decode(errors="replace")[-3000:])
    return errs


def step_dirs(kind, root, proc):
    base = os.path.join(root, "p%d" % proc)
    if kind == "orbax":
        return {s: os.path.join(base, str(s)) for s in (1, 2)}
    return {s: os.path.join(base, "step=%d" % s) for s in (1, 2)}


def files_under(d):
    out = []
    for dp, _, fns in os.walk(d):
        out += [os.path.join(dp, f) for f in fns]
    return sorted(out)


def chunk_list(cdcbench, avg, files):
    """[(length, sha256 hex)] of every chunk of every file, by mtcfs's chunker."""
    r = subprocess.run([cdcbench, "--list", "--avg", str(avg)] + files,
                       check=True, capture_output=True, text=True)
    out = []
    for line in r.stdout.splitlines():
        _, _, length, h = line.split()
        out.append((int(length), h))
    return out


def share(a, b):
    have = {h for _, h in b}
    total = sum(n for n, _ in a)
    same = sum(n for n, h in a if h in have)
    return total, same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--out")
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--cdcbench")
    ap.add_argument("--work", default="/dev/shm/mtcfs-cdc-overlap")
    ap.add_argument("--avg", default="8,16,32,64")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--reuse", action="store_true",
                    help="use the checkpoints already under --work")
    ap.add_argument("--md")
    a = ap.parse_args()
    if a.role == "orbax":
        return run_orbax(a)
    if a.role == "dcp":
        return run_dcp(a)
    rows = []
    try:
        for kind in ("orbax", "dcp"):
            out = os.path.join(a.work, kind)
            if not a.reuse:
                shutil.rmtree(out, ignore_errors=True)
                t0 = time.monotonic()
                generate(kind, out, a.mib)
                print("%s: written in %.1f s" % (kind, time.monotonic() - t0),
                      file=sys.stderr)
            if not a.cdcbench:      # generate only: leave them for a later --reuse
                continue
            d0, d1 = step_dirs(kind, out, 0), step_dirs(kind, out, 1)
            for avg in [int(x) for x in a.avg.split(",")]:
                c01 = chunk_list(a.cdcbench, avg * 1024, files_under(d0[1]))
                c11 = chunk_list(a.cdcbench, avg * 1024, files_under(d1[1]))
                c02 = chunk_list(a.cdcbench, avg * 1024, files_under(d0[2]))
                c12 = chunk_list(a.cdcbench, avg * 1024, files_under(d1[2]))
                t1, s1 = share(c01, c11)
                t2, s2 = share(c02, c12)
                ts, ss = share(c02, c01)
                n = len(c01)
                mean = t1 / n
                uniq = len({h for _, h in c01})
                rows.append(collections.OrderedDict(
                    kind=kind, avg=avg, bytes=t1, chunks=n, mean=mean,
                    dup_within=1 - uniq / n,
                    dp1=s1 / t1, new1=t1 - s1, dp2=s2 / t2, new2=t2 - s2,
                    step=ss / ts,
                    list_per_gib=(1 << 30) / mean * ENTRY_BYTES))
    finally:
        if not a.keep and a.cdcbench:
            shutil.rmtree(a.work, ignore_errors=True)
    lines = ["| writer | avg | bytes p0 step 1 | chunks | mean chunk | DP share step 1 (new bytes) | DP share step 2 (new bytes) | step 2 vs step 1 | chunk list per GiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %d KiB | %s | %d | %.0f B | %.3f %% (%s B) | %.3f %% (%s B) | %.3f %% | %.2f MiB (%.3f %%) |" % (
            r["kind"], r["avg"], format(r["bytes"], ","), r["chunks"], r["mean"],
            100 * r["dp1"], format(r["new1"], ","), 100 * r["dp2"],
            format(r["new2"], ","), 100 * r["step"],
            r["list_per_gib"] / (1 << 20), 100 * r["list_per_gib"] / (1 << 30)))
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
