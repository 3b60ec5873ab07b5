"""A running node takes a new node-rank from a new replicator.yaml.

GKE's replicator reads node-rank from every replicator.yaml it is given
(util.py: read_config, run per job start; nothing pins a node to its first
rank), so a pod whose job restarts with another rank serves that rank. mtcfs
does the same for a node that learns its rank from the yaml (coordinator=,
no rank= and no peers= table): it reconnects to the coordinator as the new
rank, restores the new rank's shard and commits under it. A node whose rank
the mount fixes (rank=, or its entry in peers=) still refuses another rank
(test_registration.py).

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \\
     /usr/bin/python3 tests/integration/test_rank_change.py [-k NAME]
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import admin_ls, wait_until, write_file  # noqa: E402
from cluster import Cluster, shard_files  # noqa: E402

TIMEOUT = 60


class RankCluster(Cluster):
    """Registered nodes (they know only the coordinator's address); node i
    runs as rank self.ranks[i]."""

    def __init__(self, n):
        super().__init__(n, ram_size="512M", restore_timeout=15)
        coord = self.addrs[0]
        self.ranks = list(range(n))
        for i, d in enumerate(self.nodes):
            d.opts = ("ram_size=512M,listen=%s,coordinator=%s,restore_timeout=15,"
                      "secret_file=%s" % (self.addrs[i], coord, self.secret))
            d.extra_args.append("-d")

    def yaml(self, job, i, extra=""):
        return super().yaml(job, self.ranks[i], extra)

    def save_as_ranks(self, job, step):
        for i, d in enumerate(self.nodes):
            tmp = os.path.join(d.mnt, "%d.orbax-checkpoint-tmp-%d" % (step, i))
            for rel, data in shard_files(job, step, self.ranks[i]).items():
                p = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                write_file(p, data)
            write_file(os.path.join(tmp, "commit_success.txt"), b"ok\n")
            os.rename(tmp, os.path.join(d.mnt, str(step)))

    def own(self, i, job):
        """{(owner, step)} node i holds as its own shards."""
        return {(s["rank"], s["step"]) for s in admin_ls(self.nodes[i].ramdir)["shards"]
                if s["job"] == job and s["state"] in harness.COMMITTED_STATES}


class RankChange(unittest.TestCase):
    def test_two_nodes_swap_ranks_and_restore_each_others_shard(self):
        job = "rk"
        c = RankCluster(3)
        self.addCleanup(c.close)
        self.daemons = list(c.nodes)
        c.start()
        self.assertEqual(c.job_start(job), {0: 0, 1: 0, 2: 0})
        c.save_as_ranks(job, 7)
        c.wait_replicated(job, 7, timeout=TIMEOUT)

        # the job restarts with nodes 1 and 2 swapped
        c.ranks = [0, 2, 1]
        self.assertEqual(c.job_start(job), {0: 7, 1: 7, 2: 7})
        for i in range(3):
            r = c.ranks[i]
            mnt = c.nodes[i].mnt
            ms = sorted(x for x in os.listdir(mnt) if x.endswith(".restore"))
            self.assertEqual(ms, ["%s-s7-n%d-w0.restore" % (job, r)], "node %d" % i)
            os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, "7"))
            for rel, data in shard_files(job, 7, r).items():
                with open(os.path.join(mnt, "7", rel), "rb") as f:
                    self.assertEqual(f.read(), data, "node %d (rank %d): %s" % (i, r, rel))
        for i in (1, 2):
            self.assertRegex(c.nodes[i].log_text(),
                             r"node-rank changes from %d to %d" % (i, c.ranks[i]))

        # and the job goes on under the new ranks: step 8 is complete job-wide
        c.save_as_ranks(job, 8)
        rx = re.compile(r"job %s: step 8 is complete on all 3 nodes" % job)
        wait_until(lambda: rx.search(c.nodes[0].log_text()), TIMEOUT,
                   "step 8 complete job-wide")
        for i in range(3):
            self.assertIn((c.ranks[i], 8), c.own(i, job), "node %d" % i)


if __name__ == "__main__":
    harness.main()
