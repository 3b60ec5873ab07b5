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
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20
JOB = "demo-job"


def say(msg):
    print("demo: " + msg, flush=True)


def wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = cond()
        if r:
            return r
        time.sleep(0.02)
    raise SystemExit("demo: timed out waiting for " + what)


def mounted(mnt):
    with open("/proc/mounts") as f:
        return any(l.split()[1] == mnt and l.split()[2] == "fuse.mtcfs" for l in f)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Node:
    def __init__(self, binary, rank, ramdir, mnt, opts, log):
        self.binary, self.rank, self.ramdir, self.mnt = binary, rank, ramdir, mnt
        self.opts, self.log, self.proc = opts, log, None

    def start(self):
        self.proc = subprocess.Popen([self.binary, "-f", "-d", "-o", self.opts, self.ramdir, self.mnt],
                                     stdout=self.log, stderr=self.log, start_new_session=True)
        wait_until(lambda: mounted(self.mnt), 30, "the mount of node %d" % self.rank)

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
        subprocess.run(["fusermount3", "-u", "-z", self.mnt], stderr=subprocess.DEVNULL)
        self.proc = None

    def stop(self):
        if self.proc:
            subprocess.run(["fusermount3", "-u", self.mnt], stderr=subprocess.DEVNULL)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if mounted(self.mnt):
            subprocess.run(["umount", "-l", self.mnt], stderr=subprocess.DEVNULL)


def node_job_start(node, nodes, out):
    """What Orbax's initialize_multi_tier_checkpointing does on one node."""
    mnt = node.mnt
    yaml = os.path.join(mnt, "replicator.yaml")
    wait_until(lambda: not os.path.exists(yaml), 30, "replicator.yaml to be absent")
    with open(yaml + ".tmp", "w") as f:
        f.write("job-name: %s\nframework: orbax\nnode-rank: %d\nnodes: %d\npeers-per-node: 1\n"
                "backup-interval-steps: 1\n" % (JOB, node.rank, nodes))
    os.replace(yaml + ".tmp", yaml)
    t0 = time.monotonic()
    wait_until(lambda: not os.path.exists(yaml), 60, "mtcfs to take replicator.yaml")
    failed = os.path.join(mnt, "replicator.failed")

    def markers():
        if os.path.exists(failed):
            raise SystemExit("demo: node %d: %s" % (node.rank, open(failed).read()))
        return [m for m in os.listdir(mnt) if m.endswith(".restore")]
    ms = wait_until(markers, 120, "a .restore marker on node %d" % node.rank)
    step = int(re.match(r".*-s(\d+)-n\d+-w\d+\.restore$", ms[0]).group(1))
    target = None
    if step:
        target = os.readlink(os.path.join(mnt, ms[0]))
        os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, str(step)))
    out[node.rank] = (step, target, time.monotonic() - t0)


def job_start(nodes):
    out, ts = {}, []
    for n in nodes:
        t = threading.Thread(target=node_job_start, args=(n, len(nodes), out))
        t.start()
        ts.append(t)
    for t in ts:
        t.join()
    if len(out) != len(nodes):
        raise SystemExit("demo: the job did not start on every node")
    return out


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


def catalog(admin, node):
    out = subprocess.run([admin, "ls", node.ramdir, "--json"], stdout=subprocess.PIPE).stdout
    return json.loads(out)["shards"]


def verify(node, step):
    for rel, data in state(step, node.rank).items():
        with open(os.path.join(node.mnt, str(step), rel), "rb") as f:
            if f.read() != data:
                raise SystemExit("demo: node %d: restored %s differs!" % (node.rank, rel))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--nodes", type=int, default=3)
    a = ap.parse_args()
    binary = os.path.abspath(os.path.join(a.build, "mtcfs"))
    admin = os.path.abspath(os.path.join(a.build, "mtcfs-admin"))
    work = tempfile.mkdtemp(prefix="mtcfs-demo-")
    tmpfs = os.path.join(work, "ram")
    os.mkdir(tmpfs)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4G,huge=always", "mtcfs-demo", tmpfs], check=True)
    bucket = os.path.join(work, "bucket")
    secret = os.path.join(work, "secret")
    with open(secret, "w") as f:
        f.write(os.urandom(24).hex() + "\n")
    addrs = ["127.0.0.1:%d" % p for p in free_ports(a.nodes)]
    log = open(os.path.join(work, "mtcfs.log"), "ab")
    nodes = []
    for r in range(a.nodes):
        ramdir, mnt = os.path.join(tmpfs, "node%d" % r), os.path.join(work, "ckpt%d" % r)
        os.mkdir(ramdir)
        os.mkdir(mnt)
        opts = "ram_size=1G,listen=%s,peers=%s,secret_file=%s,restore_timeout=30,bucket=file://%s" % (
            addrs[r], ",".join(addrs), secret, bucket)
        nodes.append(Node(binary, r, ramdir, mnt, opts, log))
    signal.signal(signal.SIGTERM, lambda *x: sys.exit(1))
    ok = False
    try:
        say("%d nodes on loopback %s, RAM tiers on tmpfs %s" % (a.nodes, ", ".join(addrs), tmpfs))
        for n in nodes:
            n.start()
        say("job incarnation 1 starts on every node")
        res = job_start(nodes)
        say("  nothing to restore: %s" % sorted({s for s, _, _ in res.values()}))
        for step in (100, 200):
            for n in nodes:
                save(n, step)
            say("  every node saved step %d (32 MiB per node)" % step)

        def replicated():
            owners = {}
            for n in nodes:
                for s in catalog(admin, n):
                    if s["step"] == 200 and s["state"] in ("committed", "replicated", "backed-up"):
                        owners.setdefault(s["rank"], set()).add(n.rank)
            return all(len(owners.get(r, ())) >= 2 for r in range(a.nodes))
        wait_until(replicated, 60, "step 200 to be replicated")
        say("  step 200 of every node is in RAM on two nodes:")
        for n in nodes:
            held = ["node %d%s" % (s["rank"], "" if s["own"] else " (replica)")
                    for s in catalog(admin, n) if s["step"] == 200]
            say("    node %d holds step 200 of %s" % (n.rank, ", ".join(held)))
        say("kill -9 node 1 and give it an EMPTY RAM tier (a replaced machine)")
        nodes[1].kill9()
        shutil.rmtree(nodes[1].ramdir)
        os.mkdir(nodes[1].ramdir)
        nodes[1].start()
        say("job incarnation 2 starts on every node")
        res = job_start(nodes)
        for r in sorted(res):
            step, target, secs = res[r]
            say("  node %d: restored step %d (%s), markers after %.0f ms" % (r, step, target, secs * 1e3))
            if step != 200:
                raise SystemExit("demo: node %d restored step %s, expected 200" % (r, step))
            verify(nodes[r], step)
        src = [l for l in open(os.path.join(work, "mtcfs.log"), errors="replace")
               if "restored job=%s step=200" % JOB in l]
        for l in src:
            say("  " + l.split(" INFO ")[-1].strip())
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
            shutil.rmtree(n.ramdir)
            os.mkdir(n.ramdir)
            n.start()
        say("job incarnation 3 starts on every node")
        res = job_start(nodes)
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
        for n in nodes:
            n.stop()
        log.close()
        subprocess.run(["umount", tmpfs], stderr=subprocess.DEVNULL)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say("left %s for inspection (mtcfs.log)" % work)
    say("done")


if __name__ == "__main__":
    main()
