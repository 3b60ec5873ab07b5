"""Cluster figures of redundancy=rs:K+M against replication (issue 17), on
real daemons on loopback (tests/integration/cluster.py), one run, side by
side: RAM held per node for one protected step, time from the last
node's commit to redundancy job-wide, and the job restart after one node
was killed -9 and wiped (its shard from a replica, or rebuilt from
fragments). With --tcpbase, the raw-TCP baseline: mtcfs-tcpbase copying
the same shard's files (S bytes) over one loopback connection, tmpfs to
tmpfs. Prints one Markdown table; --json writes every sample (tests/bench/run's
section ec reads it).

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \\
     /usr/bin/python3 tests/bench/ec_cluster.py [--size MiB] [--reps N]
     [--tcpbase build/mtcfs-tcpbase] [--json OUT.json]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(1, os.path.join(HERE, "..", "integration", "multinode"))  # test_ec_cluster
import harness  # noqa: E402
from harness import wait_until  # noqa: E402
from cluster import Cluster, shard_files  # noqa: E402
from test_ec_cluster import du_trees as du  # noqa: E402

MiB = 1 << 20


def frags(c, r, job, step):
    try:
        return os.listdir(harness.parity_dir(c.nodes[r].ramdir, job, step))
    except FileNotFoundError:
        return []


def one(red, n, size, step):
    opts = "redundancy=" + red
    c = Cluster(n, ram_size="8G", restore_timeout=20, extra=opts)
    for d in c.nodes:
        d.extra_args.append("-d")
        d.expect_log(r"ec: |ec restore: |held nowhere|connect")
    c.start()
    try:
        job = "bench" + re.sub(r"\W", "", red)
        c.job_start(job)
        c.save(job, step, size=size)
        t0 = time.monotonic()
        if red == "replication":
            c.wait_replicated(job, step, timeout=300)
        else:
            wait_until(lambda: all("protected" in frags(c, r, job, step) for r in range(n)),
                       300, "protected")
        t_red = time.monotonic() - t0
        if red != "replication":
            wait_until(lambda: all(not [x for x in frags(c, r, job, step) if x.endswith(".tmp")]
                                   for r in range(n)), 60, "sends done")
        S = sum(len(v) for v in shard_files(job, step, 0, size).values())
        ram = max(du([os.path.join(c.nodes[r].ramdir, d) for d in ("shards",)])
                  for r in range(n)) / S
        victim = n - 1
        c.nodes[victim].kill9()
        c.nodes[victim].wipe_ramdir()
        c.nodes[victim].start()
        t0 = time.monotonic()
        got = c.job_start(job)
        t_restart = time.monotonic() - t0
        assert got == {r: step for r in range(n)}, got
        c.restore_and_verify(job, victim, step, size=size)
        m = re.search(r"restored job=%s step=%d from erasure code .* secs=([0-9.]+)" % (job, step),
                      c.nodes[victim].log_text())
        return S, ram, t_red, t_restart, float(m.group(1)) if m else None
    finally:
        c.close()


def tcpbase(binary, size, reps):
    """mtcfs-tcpbase copying one shard's files (shard_files, S bytes) from
    a tmpfs directory to another over loopback: seconds per rep."""
    root = tempfile.mkdtemp(prefix="mtcfs-ecbench-tcp-", dir="/dev/shm")
    try:
        src = os.path.join(root, "src")
        srcs = []
        for i, (rel, data) in enumerate(shard_files("benchtcp", 1, 0, size).items()):
            os.makedirs(src, exist_ok=True)
            p = os.path.join(src, "f%d" % i)
            with open(p, "wb") as f:
                f.write(data)
            srcs.append(p)
        out = []
        for i in range(reps):
            dst = os.path.join(root, "dst%d" % i)
            os.makedirs(dst)
            r = subprocess.run([binary, "--mode", "copy", dst] + srcs, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, check=True, timeout=300)
            out.append(json.loads(r.stdout.decode())["secs"])
            shutil.rmtree(dst)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


CONFIGS = (("replication", 6, 2.0), ("rs:4+1", 5, 1.25), ("rs:4+2", 6, 1.5))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=32, help="params file MiB (the shard is 1.25x)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tcpbase", help="mtcfs-tcpbase binary: the raw-TCP baseline")
    ap.add_argument("--json", help="write every sample here")
    a = ap.parse_args()
    rows = []
    out = {"size": a.size * MiB, "reps": a.reps, "configs": []}
    for red, n, goal in CONFIGS:
        res = [one(red, n, a.size * MiB, 10 + i) for i in range(a.reps)]
        out["configs"].append({
            "redundancy": red, "nodes": n, "goal": goal, "S": res[0][0],
            "ram": [x[1] for x in res], "to_redundancy": [x[2] for x in res],
            "restart": [x[3] for x in res],
            "rebuild": [x[4] for x in res if x[4] is not None]})
        S = res[0][0]
        med = lambda i: statistics.median(x[i] for x in res)  # noqa: E731
        rng = lambda i: "%.2f..%.2f" % (min(x[i] for x in res), max(x[i] for x in res))  # noqa: E731
        dec = [x[4] for x in res if x[4] is not None]
        rows.append("| %s | %d | %.1f | %.3f | %.2f | %.2f (%s) | %.2f (%s) | %s |" % (
            red, n, S / MiB, med(1), goal, med(2), rng(2), med(3), rng(3),
            "%.3f" % statistics.median(dec) if dec else "- (replica)"))
    print("| redundancy | nodes | S MiB | RAM per node (x S, max) | goal | to redundancy s "
          "(median, range) | job restart, 1 node wiped s | rebuild of its shard s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)
    if a.tcpbase:
        out["tcpbase"] = tcpbase(a.tcpbase, a.size * MiB, a.reps)
        print("\nraw TCP (mtcfs-tcpbase, the same %.1f MiB, tmpfs to tmpfs): %.3f s median"
              % (out["configs"][0]["S"] / MiB, statistics.median(out["tcpbase"])))
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(out, f, indent=1)
        os.replace(a.json + ".tmp", a.json)
    harness._cleanup_all()


if __name__ == "__main__":
    main()
