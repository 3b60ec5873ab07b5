"""mtcfs demo: one node, an Orbax-style job, a crash of mtcfs, a restore.

Everything it starts (tmpfs, mount, daemon) is stopped and removed at the
end, also on errors and Ctrl-C.
"""
import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20


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


class Node:
    def __init__(self, binary, ramdir, mnt, log):
        self.binary, self.ramdir, self.mnt, self.log = binary, ramdir, mnt, log
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [self.binary, "-f", "-d", "-o", "ram_size=2G", self.ramdir, self.mnt],
            stdout=self.log, stderr=self.log, start_new_session=True)
        wait_until(lambda: mounted(self.mnt), 30, "the mount")

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


def job_start(mnt, job):
    """What Orbax's initialize_multi_tier_checkpointing does on a node."""
    yaml = os.path.join(mnt, "replicator.yaml")
    wait_until(lambda: not os.path.exists(yaml), 30, "replicator.yaml to be absent")
    with open(yaml + ".tmp", "w") as f:
        f.write("job-name: %s\nframework: orbax\nassume-data-parallelism: 1\n"
                "node-rank: 0\nnodes: 1\npeer-ranks: []\nbackup-interval-minutes: 30\n" % job)
    os.replace(yaml + ".tmp", yaml)
    t0 = time.monotonic()
    wait_until(lambda: not os.path.exists(yaml), 30, "mtcfs to take replicator.yaml")
    for bad in ("replicator.failed",):
        if os.path.exists(os.path.join(mnt, bad)):
            raise SystemExit("demo: mtcfs rejected the config: " + open(os.path.join(mnt, bad)).read())
    markers = wait_until(lambda: [m for m in os.listdir(mnt) if m.endswith(".restore")],
                         30, "a .restore marker")
    ready = time.monotonic() - t0
    step = max(int(m.rsplit("-s", 1)[1].split("-")[0]) for m in markers)
    if step == 0:
        say("  markers %s: nothing to restore (%.0f ms)" % (markers, ready * 1e3))
        return None
    marker = [m for m in markers if "-s%d-" % step in m][0]
    os.replace(os.path.join(mnt, marker), os.path.join(mnt, str(step)))
    say("  marker %s -> %s, renamed to %d/ (%.0f ms)" % (
        marker, os.readlink(os.path.join(mnt, str(step))), step, ready * 1e3))
    return step


def state(step, seed):
    """The 'model state' of a step: a few arrays of deterministic bytes."""
    out = {}
    for i, size in enumerate((64 * MiB, 16 * MiB, 3 * MiB + 17)):
        h = hashlib.sha256(b"%d/%d/%d" % (seed, step, i)).digest()
        out["state/array%d/0.0" % i] = (h * (size // 32 + 1))[:size]
    out["_CHECKPOINT_METADATA"] = b'{"step": %d}' % step
    return out


def save(mnt, step, files):
    """Orbax's save: tmp dir, files, commit_success.txt, final rename."""
    tmp = os.path.join(mnt, "%d.orbax-checkpoint-tmp-%d" % (step, os.getpid()))
    for rel, data in files.items():
        p = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    with open(os.path.join(tmp, "commit_success.txt"), "w") as f:
        f.write("Checkpoint commit was successful to %s\n" % tmp)
    t0 = time.perf_counter()
    os.rename(tmp, os.path.join(mnt, str(step)))
    return (time.perf_counter() - t0) * 1e3


def verify(mnt, step, files):
    for rel, data in files.items():
        with open(os.path.join(mnt, str(step), rel), "rb") as f:
            if f.read() != data:
                raise SystemExit("demo: restored %s of step %d differs!" % (rel, step))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    binary = os.path.abspath(os.path.join(a.build, "mtcfs"))
    admin = os.path.abspath(os.path.join(a.build, "mtcfs-admin"))
    work = tempfile.mkdtemp(prefix="mtcfs-demo-")
    tmpfs = os.path.join(work, "ram")
    mnt = os.path.join(work, "ckpt")
    os.mkdir(tmpfs)
    os.mkdir(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3G,huge=always", "mtcfs-demo", tmpfs], check=True)
    log = open(os.path.join(work, "mtcfs.log"), "ab")
    node = Node(binary, tmpfs, mnt, log)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    ok = False
    try:
        say("RAM tier: tmpfs %s, mount %s" % (tmpfs, mnt))
        node.start()
        say("job incarnation 1 starts")
        job_start(mnt, "demo-job")
        for step in (100, 200, 300):
            ms = save(mnt, step, state(step, 1))
            say("  saved step %d (83 MiB), commit rename took %.2f ms" % (step, ms))
        def committed(step):
            out = subprocess.run([admin, "ls", tmpfs, "--json"], stdout=subprocess.PIPE).stdout
            return any(s["step"] == step and s["state"] == "committed"
                       for s in json.loads(out)["shards"])
        wait_until(lambda: committed(300), 30, "step 300 to be committed")
        subprocess.run([admin, "ls", tmpfs])
        say("kill -9 mtcfs (the training job dies with it), restart mtcfs on the same RAM tier")
        node.kill9()
        node.start()
        say("job incarnation 2 starts")
        step = job_start(mnt, "demo-job")
        if step != 300:
            raise SystemExit("demo: expected to restore step 300, got %s" % step)
        verify(mnt, step, state(step, 1))
        say("  step %d restored: every byte equals what was written" % step)
        ok = True
    finally:
        node.stop()
        log.close()
        subprocess.run(["umount", tmpfs], stderr=subprocess.DEVNULL)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say("left %s for inspection (mtcfs.log)" % work)
    say("done")


if __name__ == "__main__":
    main()
