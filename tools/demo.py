"""mtcfs demo: a local multi-node job on loopback with a file:// bucket.

Three mtcfs nodes (separate processes, each with its own RAM tier and
mount, a static peers= table, a shared secret, and one file:// bucket) run
an Orbax-style job: every node saves steps, mtcfs replicates each node's
shard to a peer and backs every step up to the bucket. Then:
  1. node 1 is killed with kill -9 and comes back with an EMPTY RAM tier;
     the job restarts on every node and node 1 gets its last step back from
     its peer, byte for byte, while the others restore from their own RAM;
  2. every node is killed and wiped: the job restores from the bucket.

Everything it starts (tmpfs, mounts, daemons) is stopped and removed at the
end, also on errors and Ctrl-C.
"""
import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

MiB = 1 << 20
JOB = "demo-job"

# tools/mtcfs_local.py: mtcfs nodes and clusters (imported in main(), once
# MTCFS_BIN points at --build)
local = None


def say(msg):
    print("demo: " + msg, flush=True)


def make_node_class():
    class DemoNode(local.Daemon):
        """A mtcfs_local daemon (-d) whose RAMDIR is on the demo's tmpfs and
        whose mount and log are in the demo's directory."""

        def __init__(self, rank, work, tmpfs, **kw):
            ramdir = os.path.join(tmpfs, "node%d" % rank)
            mnt = os.path.join(work, "ckpt%d" % rank)
            os.mkdir(ramdir)
            os.mkdir(mnt)
            super().__init__(ramdir, mnt, extra_args=["-d"],
                             log_path=os.path.join(work, "node%d.log" % rank), **kw)
            self.rank = rank
            # a killed peer or coordinator is what the demo does: the
            # survivors' WARN/ERROR lines about it are expected
            self.expect_log(r"^\S+Z (ERROR|WARN) ")
    return DemoNode


def job_start(c):
    """Every node (in parallel) starts the job the way Orbax's
    initialize_multi_tier_checkpointing does, then renames its marker to
    <step> (Orbax's restore). {rank: (step, marker target, secs)}."""
    res = {}
    for r, step in c.job_start(JOB, timeout=120).items():
        _, ms, secs = c.started[r]
        mnt = c.nodes[r].mnt
        target = None
        if step:
            target = os.readlink(os.path.join(mnt, ms[0]))
            os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, str(step)))
        res[r] = (step, target, secs)
    return res


def state(step, rank):
    """A node's 'model state' at a step: deterministic bytes."""
    out = {}
    for i, size in enumerate((24 * MiB, 8 * MiB + 17)):
        h = hashlib.sha256(b"%d/%d/%d" % (rank, step, i)).digest()
        out["state/array%d/shard%d" % (i, rank)] = (h * (size // 32 + 1))[:size]
    out["_CHECKPOINT_METADATA"] = b'{"step": %d}' % step
    return out


def save(node, step):
    """Orbax's save: tmp dir, files, commit_success.txt, final rename."""
    tmp = os.path.join(node.mnt, "%d.orbax-checkpoint-tmp-%d" % (step, os.getpid()))
    for rel, data in state(step, node.rank).items():
        p = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    with open(os.path.join(tmp, "commit_success.txt"), "w") as f:
        f.write("Checkpoint commit was successful to %s\n" % tmp)
    os.rename(tmp, os.path.join(node.mnt, str(step)))


def catalog(node):
    return local.admin_ls(node.ramdir)["shards"]


def verify(node, step):
    for rel, data in state(step, node.rank).items():
        with open(os.path.join(node.mnt, str(step), rel), "rb") as f:
            if f.read() != data:
                raise SystemExit("demo: node %d: restored %s differs!" % (node.rank, rel))


def main():
    global local
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--nodes", type=int, default=3)
    a = ap.parse_args()
    os.environ["MTCFS_BIN"] = os.path.abspath(os.path.join(a.build, "mtcfs"))
    os.environ["MTCFS_ADMIN"] = os.path.abspath(os.path.join(a.build, "mtcfs-admin"))
    import mtcfs_local
    local = mtcfs_local
    # Ctrl-C and SIGTERM end in the finally below: nodes stopped, tmpfs gone
    signal.signal(signal.SIGTERM, lambda *x: sys.exit(1))
    wait_until = local.wait_until
    work = tempfile.mkdtemp(prefix="mtcfs-demo-")
    tmpfs = os.path.join(work, "ram")
    os.mkdir(tmpfs)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4G,huge=always", "mtcfs-demo", tmpfs], check=True)
    bucket = os.path.join(work, "bucket")
    DemoNode = make_node_class()
    c = None
    ok = False
    try:
        # a cluster: ports, peers= table, shared secret, the nodes
        c = local.Cluster(a.nodes, ram_size="1G", restore_timeout=30,
                          extra="bucket=file://" + bucket,
                          make_node=lambda r, **kw: DemoNode(r, work, tmpfs, **kw))
        c.interval = "backup-interval-steps: 1"
        nodes = c.nodes
        say("%d nodes on loopback %s, RAM tiers on tmpfs %s" % (a.nodes, ", ".join(c.addrs), tmpfs))
        c.start()
        say("job incarnation 1 starts on every node")
        res = job_start(c)
        say("  nothing to restore: %s" % sorted({s for s, _, _ in res.values()}))
        for step in (100, 200):
            for n in nodes:
                save(n, step)
            say("  every node saved step %d (32 MiB per node)" % step)
        c.wait_replicated(JOB, 200, timeout=60)
        say("  step 200 of every node is in RAM on two nodes:")
        for n in nodes:
            held = ["node %d%s" % (s["rank"], "" if s["own"] else " (replica)")
                    for s in catalog(n) if s["step"] == 200]
            say("    node %d holds step 200 of %s" % (n.rank, ", ".join(held)))
        say("kill -9 node 1 and give it an EMPTY RAM tier (a replaced machine)")
        nodes[1].kill9()
        nodes[1].wipe_ramdir()
        nodes[1].start()
        say("job incarnation 2 starts on every node")
        res = job_start(c)
        for r in sorted(res):
            step, target, secs = res[r]
            say("  node %d: restored step %d (%s), markers after %.0f ms" % (r, step, target, secs * 1e3))
            if step != 200:
                raise SystemExit("demo: node %d restored step %s, expected 200" % (r, step))
            verify(nodes[r], step)
        for n in nodes:
            for line in n.log_text().splitlines():
                if "restored job=%s step=200" % JOB in line:
                    say("  " + line.split(" INFO ")[-1].strip())
        say("  every node's step 200 equals what it wrote; node 1's came from its peer")

        for n in nodes:
            save(n, 300)
        say("  every node saved step 300")

        def backed_up(step):
            job_dir = os.path.join(bucket, JOB)
            for name in sorted(os.listdir(job_dir)) if os.path.isdir(job_dir) else []:
                metas = [m for m in os.listdir(os.path.join(job_dir, name))
                         if m.endswith(".meta") and "-s%d-" % step in m]
                if len(metas) == len(nodes):
                    return name
            return None
        name = wait_until(lambda: backed_up(300), 60, "step 300 in the bucket")
        say("  backup %s of step 300 is complete in %s" % (name, bucket))
        say("kill -9 EVERY node and wipe every RAM tier (the whole job lost its machines)")
        for n in nodes:
            n.kill9()
            n.wipe_ramdir()
            n.start()
        say("job incarnation 3 starts on every node")
        res = job_start(c)
        for r in sorted(res):
            step, target, secs = res[r]
            pre = open(os.path.join(nodes[r].mnt, "replicator.prerestore")).read().split()
            say("  node %d: restored step %d from the bucket (%s), markers after %.0f ms" % (
                r, step, " ".join(pre), secs * 1e3))
            if step != 300:
                raise SystemExit("demo: node %d restored step %s, expected 300" % (r, step))
            verify(nodes[r], step)
        say("  every node's step 300 equals what it wrote")
        ok = True
    finally:
        try:
            if c is not None:
                c.close()
        finally:
            subprocess.run(["umount", tmpfs], stderr=subprocess.DEVNULL)
            if ok:
                shutil.rmtree(work, ignore_errors=True)
            else:
                say("left %s for inspection (node*.log)" % work)
    say("done")


if __name__ == "__main__":
    main()
