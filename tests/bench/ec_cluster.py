"""Cluster figures of redundancy=rs:K+M against replication (issue 17), on
real daemons on loopback (tests/integration/cluster.py), one run, side by
side: RAM held per node for one protected step, time from the last
node's commit to redundancy job-wide, and the job restart after one node
was killed -9 and wiped (its shard from a replica, or rebuilt from
fragments). Prints one Markdown table.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \\
     /usr/bin/python3 tests/bench/ec_cluster.py [--size MiB] [--reps N]
"""
import argparse
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import harness  # noqa: E402
from harness import wait_until  # noqa: E402
from cluster import Cluster, shard_files  # noqa: E402
from test_ec_cluster import du_trees as du  # noqa: E402

MiB = 1 << 20


def frags(c, r, job, step):
    try:
        return os.listdir(os.path.join(c.nodes[r].ramdir, "frags", job, str(step)))
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
        ram = max(du([os.path.join(c.nodes[r].ramdir, d) for d in ("shards", "frags")])
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=32, help="params file MiB (the shard is 1.25x)")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rows = []
    for red, n, goal in (("replication", 6, 2.0), ("rs:4+1", 5, 1.25), ("rs:4+2", 6, 1.5)):
        res = [one(red, n, a.size * MiB, 10 + i) for i in range(a.reps)]
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
    harness._cleanup_all()


if __name__ == "__main__":
    main()
