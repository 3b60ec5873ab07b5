"""Membership by registration (coordinator=HOST:PORT, no peers= table):
nodes learn their rank from replicator.yaml, register their listen address
with rank 0's coordinator, and find each other through it for replication
and restores."""
import os
import sys
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import Daemon, admin_ls, wait_until  # noqa: E402
from cluster import Cluster, free_ports, shard_files  # noqa: E402


class RegisteredCluster(Cluster):
    """A Cluster whose nodes know only the coordinator's address."""

    def __init__(self, n):
        super().__init__(n, ram_size="512M", restore_timeout=15)
        coord = self.addrs[0]
        for i, d in enumerate(self.nodes):
            d.opts = "ram_size=512M,listen=%s,coordinator=%s,restore_timeout=15,secret_file=%s" % (
                self.addrs[i], coord, self.secret)


class Registration(unittest.TestCase):
    def test_register_replicate_restore(self):
        job = "reg"
        c = RegisteredCluster(3)
        self.addCleanup(c.close)
        c.start()
        self.assertEqual(c.job_start(job), {0: 0, 1: 0, 2: 0})
        c.save(job, 7)
        c.wait_replicated(job, 7)
        # rank 2's replica lives on its placement peer ((2 XOR 1) mod 3 = 0, as GKE)
        self.assertIn((2, 7), c.holds(0, job))
        # node 2 comes back empty: it must find rank 1 through the coordinator
        c.nodes[2].expect_log(r"ERROR")
        c.nodes[2].kill9()
        c.nodes[2].wipe_ramdir()
        c.nodes[2].start()
        self.assertEqual(c.job_start(job), {0: 7, 1: 7, 2: 7})
        for r in range(3):
            c.restore_and_verify(job, r, 7)
        st = admin_ls(c.nodes[2].ramdir)
        mine = [s for s in st["shards"] if s["job"] == job and s["rank"] == 2]
        self.assertTrue(mine and mine[0]["restored"], mine)

    def test_wrong_rank_in_yaml_is_refused(self):
        # rank= fixes the node's identity; a yaml claiming another rank fails
        port = free_ports(1)[0]
        d = Daemon(opts="ram_size=256M,listen=127.0.0.1:%d,coordinator=127.0.0.1:%d,rank=0"
                   % (port, port))
        self.addCleanup(d.close)
        d.start()
        d.expect_log(r"ERROR ctl: replicator.yaml rejected")
        with open(os.path.join(d.mnt, "replicator.yaml"), "w") as f:
            f.write("job-name: j\nnode-rank: 1\nnodes: 2\n")
        failed = os.path.join(d.mnt, "replicator.failed")
        wait_until(lambda: os.path.exists(failed), 30, "replicator.failed")
        with open(failed) as f:
            self.assertIn("node-rank: 1, but this node is rank 0", f.read())


if __name__ == "__main__":
    harness.main()
