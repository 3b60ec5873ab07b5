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
     /usr/bin/python3 tests/integration/multinode/test_rank_change.py [-k NAME]
"""
import os
import re
import sys
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
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

    def holders(self, job, step):
        """{owner rank: {node index holding it committed}} for step."""
        out = {}
        for i, d in enumerate(self.nodes):
            for s in admin_ls(d.ramdir)["shards"]:
                if (s["job"] == job and s["step"] == step
                        and s["state"] in harness.COMMITTED_STATES):
                    out.setdefault(s["rank"], set()).add(i)
        return out

    def wait_pushed(self, job, step, timeout=TIMEOUT):
        """Every node's replication of its shard of step has ended: pushed
        to its peer, or given up (after the engine's retries)."""
        for i, d in enumerate(self.nodes):
            d.wait_log(r"replicated job=%s step=%d to rank \d+ |job %s step %d: could not be "
                       r"replicated" % (job, step, job, step), timeout,
                       "node %d (rank %d) to end step %d's replication" % (i, self.ranks[i], step))

    def verify_restored(self, job, step):
        """Orbax's restore on every node, as its rank: exact bytes."""
        for i, d in enumerate(self.nodes):
            r = self.ranks[i]
            ms = sorted(x for x in os.listdir(d.mnt) if x.endswith(".restore"))
            want = "%s-s%d-n%d-w0.restore" % (job, step, r)
            assert ms == [want], "node %d (rank %d): %s, want [%s]" % (i, r, ms, want)
            os.replace(os.path.join(d.mnt, want), os.path.join(d.mnt, str(step)))
            for rel, data in shard_files(job, step, r).items():
                with open(os.path.join(d.mnt, str(step), rel), "rb") as f:
                    assert f.read() == data, "node %d (rank %d): %s differs" % (i, r, rel)

    def own(self, i, job):
        """{(owner, step)} node i holds as its own shards."""
        return {(s["rank"], s["step"]) for s in admin_ls(self.nodes[i].ramdir)["shards"]
                if s["job"] == job and s["state"] in harness.COMMITTED_STATES}


def peer_of(rank, nodes):
    """cluster/placement.c's peer with peers-per-node 1 and no assume-data-
    parallelism: the XOR partner (the last rank of an odd count wraps to 0)."""
    return (rank ^ 1) % nodes


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


class PeerTable(unittest.TestCase):
    """Replication follows the coordinator's rank -> address table as ranks
    move (issue 22): a node re-reads it when its own rank changes, when the
    coordinator announces a new generation and when a push is refused; the
    receiver refuses (ESTALE) a push meant for another rank. Before, a node
    kept the table of its first replication: after a rotation its replicas
    landed on the machines that held the peer's rank before, after a swap it
    pushed to itself, and a node back on a new address got none."""

    def start_job(self, c, job, step):
        """The job's first run: step committed and replicated."""
        c.start()
        self.assertEqual(c.job_start(job), {i: 0 for i in range(c.n)})
        c.save_as_ranks(job, step)
        c.wait_replicated(job, step, timeout=TIMEOUT)

    def assert_placed(self, c, job, step, held=None):
        """Each rank's shard of step is on its node and on the node that is
        now its peer rank, nowhere else (held: c.holders() taken before)."""
        held = c.holders(job, step) if held is None else held
        for o in range(c.n):
            want = {c.ranks.index(o), c.ranks.index(peer_of(o, c.n))}
            self.assertEqual(held.get(o, set()), want,
                             "rank %d's step %d: held on nodes %s, want %s (ranks now %s)"
                             % (o, step, sorted(held.get(o, ())), sorted(want), c.ranks))

    def test_rotated_ranks_replicate_to_the_new_peer(self):
        job = "rot"
        c = RankCluster(4)
        self.addCleanup(c.close)
        self.start_job(c, job, 1)
        # a JobSet reschedule: every node comes back one rank further
        c.ranks = [1, 2, 3, 0]
        self.assertEqual(c.job_start(job), {i: 1 for i in range(4)})
        c.save_as_ranks(job, 2)
        c.wait_pushed(job, 2)
        self.assert_placed(c, job, 2)
        c.nodes[0].wait_log(r"job %s: step 2 is committed and replicated on all 4 nodes" % job,
                            TIMEOUT)
        self.assertTrue(any(re.search(r"INFO engine: peer table changed: rank \d+ now at ",
                                      d.log_text()) for d in c.nodes),
                        "no node logged its new peer table")

    def test_swapped_slice_replicates_and_survives_a_lost_node(self):
        job = "swp"
        c = RankCluster(4)
        self.addCleanup(c.close)
        self.start_job(c, job, 1)
        # ranks 0<->1 and 2<->3: each node's new peer rank is its own old one
        c.ranks = [1, 0, 3, 2]
        for d in c.nodes:   # asserted below, after the restore it costs
            d.expect_log(r"could not be replicated")
        self.assertEqual(c.job_start(job), {i: 1 for i in range(4)})
        c.save_as_ranks(job, 2)
        c.wait_pushed(job, 2)
        held = c.holders(job, 2)
        # node 2 (rank 3) is lost with its RAM: its shard of step 2 is on
        # the node that is rank 2 now
        c.nodes[2].kill9()
        c.nodes[2].wipe_ramdir()
        c.nodes[2].start()
        self.assertEqual(c.job_start(job), {i: 2 for i in range(4)})
        c.verify_restored(job, 2)
        self.assert_placed(c, job, 2, held)
        for i, d in enumerate(c.nodes):
            self.assertNotRegex(d.log_text(), r"could not be replicated",
                                "node %d (rank %d)" % (i, c.ranks[i]))

    def test_node_back_on_a_new_address_gets_its_replicas(self):
        job = "mv"
        c = RankCluster(3)
        self.addCleanup(c.close)
        self.start_job(c, job, 1)
        # node 1 comes back (same rank, same RAMDIR) on another address, as
        # a rescheduled pod with a new IP does
        d = c.nodes[1]
        d.kill9()
        new = "127.0.0.1:%d" % harness.free_ports(1)[0]
        d.opts = d.opts.replace("listen=%s," % c.addrs[1], "listen=%s," % new)
        self.assertIn("listen=%s," % new, d.opts)
        c.addrs[1] = new
        d.start()
        self.assertEqual(c.job_start(job), {0: 1, 1: 1, 2: 1})
        c.save_as_ranks(job, 2)
        c.wait_pushed(job, 2)
        self.assert_placed(c, job, 2)
        c.nodes[0].wait_log(r"replicated job=%s step=2 to rank 1 " % job, 5)


class RestartWithoutYaml(unittest.TestCase):
    """mtcfs restarted under a running job (a DaemonSet update), no new
    replicator.yaml: the node takes the last one's job and rank again
    (issue 22, low). Before, it stayed out of its job: its new steps were
    neither reported nor replicated, and the coordinator postponed backups
    ("node 1 is not connected") until the next job restart."""

    def test_restarted_node_replicates_its_next_step(self):
        job = "rs"
        c = RankCluster(3)
        self.addCleanup(c.close)
        c.start()
        self.assertEqual(c.job_start(job), {0: 0, 1: 0, 2: 0})
        c.save_as_ranks(job, 1)
        c.wait_replicated(job, 1, timeout=TIMEOUT)
        c.nodes[1].restart()
        c.save_as_ranks(job, 2)
        c.wait_replicated(job, 2, timeout=30)
        c.nodes[0].wait_log(r"job %s: step 2 is committed and replicated on all 3 nodes" % job,
                            TIMEOUT)
        self.assertRegex(c.nodes[1].log_text(),
                         r"INFO ctl: resuming job=%s rank=1 from the last replicator.yaml" % job)


if __name__ == "__main__":
    harness.main()
