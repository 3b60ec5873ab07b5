"""One rank of a PyTorch job that checkpoints the way the NeMo reference
(AI-Hypercomputer/resiliency, --enable-high-scale-ckpt) does, with the real
torch.distributed.checkpoint over gloo. Run by the venv python, one process
per node, each on its own mtcfs mount (its "/local").

Start-up (resiliency/high_scale_ckpt_utils.py): wait until replicator.yaml
is absent, yaml.dump the config straight into replicator.yaml
(framework: pytorch.distributed, peers-per-node: 1), barrier; then wait for
it to be consumed, check replicator.failed/.errors, wait for
replicator.prerestore, take the first *.restore and rename it to
step=<step> (step 0: nothing to restore).

Restore (in_cluster_local_ckpt.py): each rank reads its own
DIR/step=<S>/<rank>/ with DCP (rank-local metadata, no_dist), plus the
node's common.pt.

Save (callbacks/model_checkpoint.py, _ckpt_utils.save): touch
DIR/step=<N>-unfinished, barrier; mkdir DIR/step=<N>, barrier; DCP writes
DIR/step=<N>/<rank>/__<rank>_0.distcp and .metadata (every rank its own
coordinator, storage prefix __<rank>_), torch.save common.pt, metadata.json;
barrier, unlink the marker, rename DIR/step=<N> to DIR/<N>.

Output: a JSON report (--out) and, for a restore, the raw bytes of every
restored tensor in --dump-dir, for the test to compare with its own copy.
"""
import argparse
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_data  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.filesystem import _StoragePrefix  # noqa: E402
import yaml  # noqa: E402

TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16,
               "int64": torch.int64, "int32": torch.int32}


def log(msg):
    sys.stderr.write("[torch rank %s %.3f] %s\n" % (
        os.environ.get("RANK"), time.time(), msg))
    sys.stderr.flush()


def wait(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError("timed out waiting for " + what)
        time.sleep(0.05)


# -- the reference's replicator handshake -----------------------------------

def handle_replicator_fail_situation(d):
    err, failed = d / "replicator.errors", d / "replicator.failed"
    if err.exists():
        log("replicator.errors: " + err.read_text())
        err.unlink()
    if failed.exists():
        msg = failed.read_text()
        failed.unlink()
        raise ValueError("Replicator failed with error " + msg)


def init_high_scale_ckpt(d, job, interval_minutes, dp=0):
    config = {
        "job-name": job,
        "framework": "pytorch.distributed",
        "node-rank": int(os.environ["NODE_RANK"]),
        "nodes": int(os.environ["NNODES"]),
        "peers-per-node": 1,
        "backup-interval-minutes": interval_minutes,
    }
    if dp:
        config["assume-data-parallelism"] = dp
    f = d / "replicator.yaml"
    wait(lambda: not f.exists(), 120, "old replicator.yaml to disappear")
    with open(f, "w") as fh:
        yaml.dump(config, fh, default_flow_style=False, sort_keys=False)
    log("wrote replicator.yaml %r" % config)


def block_and_process_restore_dir(d, timeout=120):
    """Returns (step, the prerestore step, the marker's name)."""
    wait(lambda: not (d / "replicator.yaml").exists(), timeout,
         "replicator.yaml to be consumed")
    handle_replicator_fail_situation(d)
    pre = d / "replicator.prerestore"
    wait(pre.exists, timeout, "replicator.prerestore")
    with open(pre) as fh:
        info = yaml.safe_load(fh)
    pre_step = int(info.get("restore-step", 0))
    log("prerestore %r" % (info,))

    def first_marker():
        handle_replicator_fail_situation(d)
        for f in d.glob("*.restore"):
            return f
        return None
    f = wait(first_marker, timeout, "a .restore marker")
    m = re.search(r"-s(\d+)-n\d+-w\d+", f.name)
    step = int(m.group(1)) if m else 0
    if step == 0:
        log("restore marker %s: nothing to restore" % f.name)
        return 0, pre_step, f.name
    os.rename(d / f.name, d / ("step=%d" % step))
    log("renamed %s to step=%d" % (f.name, step))
    return step, pre_step, f.name


# -- DCP the way the in-cluster writer lays it out --------------------------

class InClusterWriter(dcp.FileSystemWriter):
    """Every rank plans alone and writes DIR/step=N/<rank>/__<rank>_*."""

    def __init__(self, path, rank):
        super().__init__(os.path.join(path, str(rank)), thread_count=2)
        self.my_rank = rank

    def prepare_global_plan(self, plans):
        assert len(plans) == 1
        return [dataclasses.replace(
            plans[0], storage_data=_StoragePrefix("__%d_" % self.my_rank))]


def make_state(step, rank):
    sd = {}
    for name, (shape, dtype) in ckpt_data.TORCH_TENSORS.items():
        b = bytearray(ckpt_data.torch_tensor(name, step, rank))
        sd[name] = torch.frombuffer(b, dtype=TORCH_DTYPE[dtype]).reshape(shape).clone()
    return sd


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def save(d, step, rank, state):
    ckpt = d / ("step=%d" % step)
    marker = d / ("step=%d-unfinished" % step)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    dist.barrier()
    ckpt.mkdir(exist_ok=True)
    dist.barrier()
    dcp.save(state, storage_writer=InClusterWriter(str(ckpt), rank), no_dist=True)
    torch.save({"world_size": dist.get_world_size(), "step": step,
                "rank": rank}, ckpt / "common.pt")
    (ckpt / "metadata.json").write_text(
        json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    dist.barrier()
    if marker.exists():
        marker.unlink()
    handle_replicator_fail_situation(d)
    os.rename(ckpt, d / str(step))
    log("saved step %d" % step)


def restore(d, step, rank, dump_dir, columns=0):
    """columns (--dp-columns): the job is data parallel with that many
    ranks per replica; a rank added by a grow restart was given its column
    mate's shard (rank % columns), whose DCP directory is named by that
    rank, and the state it loads is that rank's (identical replicas)."""
    src = rank % columns if columns else rank
    ckpt = d / ("step=%d" % step)
    state = {name: torch.empty(shape, dtype=TORCH_DTYPE[dtype])
             for name, (shape, dtype) in ckpt_data.TORCH_TENSORS.items()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(ckpt / str(src))),
             no_dist=True)
    common = torch.load(ckpt / "common.pt", weights_only=True)
    files = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())
    ok = True
    for name, t in state.items():
        got = tensor_bytes(t)
        if dump_dir:
            with open(os.path.join(dump_dir, "rank%d.%s" % (rank, name)), "wb") as fh:
                fh.write(got)
        if got != ckpt_data.torch_tensor(name, step, src):
            log("MISMATCH %s at step %d" % (name, step))
            ok = False
    return {"common": common, "files": files, "equal": ok}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--steps", default="", help="steps to save, e.g. 1,2,3")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dump-dir")
    ap.add_argument("--interval-minutes", type=int, default=30)
    ap.add_argument("--data-parallelism", type=int, default=0,
                    help="assume-data-parallelism in the yaml")
    ap.add_argument("--dp-columns", type=int, default=0,
                    help="restore the DCP directory of rank %% this")
    a = ap.parse_args()

    d = Path(a.dir)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=120))
    report = {"rank": rank}
    # the reference: only the node's file handler (local rank 0) talks to
    # the replicator, then everybody meets at a barrier
    init_high_scale_ckpt(d, a.job, a.interval_minutes, a.data_parallelism)
    dist.barrier()
    step, pre_step, marker = block_and_process_restore_dir(d)
    report.update(restored_step=step, prerestore_step=pre_step, marker=marker)
    if step:
        report["restore"] = restore(d, step, rank, a.dump_dir, a.dp_columns)
    dist.barrier()
    for s in [int(x) for x in a.steps.split(",") if x]:
        save(d, s, rank, make_state(s, rank))
    report["top"] = sorted(os.listdir(d))
    with open(a.out, "w") as fh:
        json.dump(report, fh, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    if step and not report["restore"]["equal"]:
        sys.exit(3)


if __name__ == "__main__":
    main()
