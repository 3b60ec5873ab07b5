"""One worker of a PyTorch job in GKE's `framework: pytorch` mode (the
replicator's framework/pytorch.py): every worker saves one file per step,
DIR/<job>-s<S>-n<node>-w<worker>.save, with the real torch.save; a step of
a node is committed when all workers-per-node files of it are closed. On
restart each worker waits for its own marker <job>-s<S>-n<node>-w<w>.restore
(a symlink to its file; an empty s0 file when there is nothing) and
torch.load()s through it.

Worker w of node n is global rank n*W + w (gloo on loopback). Worker 0 of
each node writes replicator.yaml (tmp + rename) and waits until it is
consumed; everybody meets at a barrier before looking for markers.

Output: a JSON report (--out) and, for a restore, the raw bytes of every
restored tensor in --dump-dir.
"""
import argparse
import datetime
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_data  # noqa: E402
from torch_nemo import make_state, tensor_bytes, wait, log  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--steps", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dump-dir")
    ap.add_argument("--backup-interval-steps", type=int, default=0,
                    help="back up every N steps instead of every 30 minutes")
    ap.add_argument("--data-parallelism", type=int, default=0,
                    help="assume-data-parallelism in the yaml")
    ap.add_argument("--dp-columns", type=int, default=0,
                    help="nodes per replica: a node added by a grow restart "
                    "restores the files of node %% this (same worker)")
    a = ap.parse_args()

    node, nodes = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
    w, W = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    d = a.dir
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    if w == 0:
        y = os.path.join(d, "replicator.yaml")
        wait(lambda: not os.path.exists(y), 60, "old replicator.yaml to go")
        with open(y + ".tmp", "w") as f:
            interval = ("backup-interval-steps: %d" % a.backup_interval_steps
                        if a.backup_interval_steps else "backup-interval-minutes: 30")
            f.write("job-name: %s\nframework: pytorch\nnode-rank: %d\nnodes: %d\n"
                    "peers-per-node: 1\nworkers-per-node: %d\n%s\n"
                    % (a.job, node, nodes, W, interval))
            if a.data_parallelism:
                f.write("assume-data-parallelism: %d\n" % a.data_parallelism)
        os.rename(y + ".tmp", y)
        wait(lambda: not os.path.exists(y), 60, "replicator.yaml consumed")
    dist.barrier()

    failed = os.path.join(d, "replicator.failed")
    pat = re.compile(r"^%s-s(\d+)-n%d-w%d\.restore$" % (re.escape(a.job), node, w))

    def my_marker():
        if os.path.exists(failed):
            raise RuntimeError("replicator.failed: " + open(failed).read())
        for f in os.listdir(d):
            if pat.match(f):
                return f
        return None
    marker = wait(my_marker, 120, "this worker's .restore marker")
    step = int(pat.match(marker).group(1))
    report = {"rank": rank, "node": node, "worker": w, "marker": marker,
              "restored_step": step}
    ok = True
    # the rank whose tensors this worker restores: its own, or under
    # --dp-columns the same worker's of its column's node (identical
    # replicas)
    src = (node % a.dp_columns) * W + w if a.dp_columns else rank
    report["source_rank"] = src
    if step:
        path = os.path.join(d, marker)
        report["marker_is_symlink"] = os.path.islink(path)
        report["marker_target"] = os.readlink(path) if os.path.islink(path) else None
        sd = torch.load(path, weights_only=True)
        report["keys"] = sorted(sd)
        for name in ckpt_data.TORCH_TENSORS:
            got = tensor_bytes(sd[name]) if name in sd else b""
            if a.dump_dir:
                with open(os.path.join(a.dump_dir, "rank%d.%s" % (rank, name)), "wb") as f:
                    f.write(got)
            if got != ckpt_data.torch_tensor(name, step, src):
                log("MISMATCH %s at step %d" % (name, step))
                ok = False
    report["equal"] = ok
    dist.barrier()
    for s in [int(x) for x in a.steps.split(",") if x]:
        torch.save(make_state(s, rank),
                   os.path.join(d, "%s-s%d-n%d-w%d.save" % (a.job, s, node, w)))
        dist.barrier()
        log("saved step %d" % s)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
