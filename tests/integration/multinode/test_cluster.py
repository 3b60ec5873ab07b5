"""Multi-node peer tier (issue 4, DESIGN §3–§7): real mtcfs processes on
loopback, one per node, with a shared secret.

Every test first plays a job on every node (replicator.yaml, several saved
steps) and checks that each node holds exactly its own newest step plus the
replicas placement gives it (the rule of tiers/placement.h, recomputed here
in Python) and that older steps were dropped once a newer one was complete
job-wide. Then one scenario each:

- a node killed -9 that comes back with an empty RAMDIR (2, 3, 4 and 8
  nodes): the job restarts, every node restores the same newest step, the
  wiped node's bytes equal what it wrote;
- two nodes lost at once whose shards survive elsewhere (4 nodes k=2,
  8 nodes k=1);
- a node that died mid-save: every node restores the older step, then the
  job saves the newer step again (other bytes) and that replaces the old
  shards and replicas everywhere;
- a corrupted replica: with k=2 the other holder is used and
  replicator.errors names the failed source; with k=1 nothing is restored
  (s0 markers), never a corrupt restore; neither waits for
  restore_timeout (no restart with every node present may);
- a peer that never comes back: the others restore after restore_timeout;
- a new replicator.yaml on one node while its restore round waits for a
  node that has not written its yaml: the round starts over at once (not
  after restore_timeout), then both nodes restore;
- malformed frames on the peer port: dropped, nothing stored, the daemon
  keeps serving;
- restore-from-peer time of a 256 MiB shard (printed, not asserted).

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \\
     /usr/bin/python3 tests/integration/multinode/test_cluster.py [-k NAME]
"""

import os
import re
import socket
import sys
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
sys.path.insert(1, os.path.join(INTEG, "security"))  # test_peer_security: the Python peer
import harness  # noqa: E402
from harness import wait_until, admin_ls  # noqa: E402
from cluster import Cluster, MiB  # noqa: E402
import test_peer_security as ps  # noqa: E402

KiB = 1024
STEPS = (10, 20, 30)
RESTART_MAX_SECS = 10.0


# --- placement, recomputed from the rule in tiers/placement.h --------------------

def expected_peers(r, n, k, dp=0):
    """Peers of rank r: K = min(k, n-1) picks from GKE's candidates, skipping
    r and earlier picks. D >= 2 with P = n//D >= 1: (r + a*P) mod n for
    a = -1, +1, -2, +2, ... (k terms); else (r XOR 1) mod n, then
    (r + i*(n//k)) mod n for i = 1..k-1; then (r + j) mod n for j = 1, 2, ..."""
    K = min(k, n - 1)
    picks = []
    if K <= 0:
        return picks

    def add(c):
        if c != r and c not in picks and len(picks) < K:
            picks.append(c)
    if dp >= 2 and n // dp >= 1:
        P = n // dp
        for i in range(k):
            a = i // 2 + 1
            add((r + (-a if i % 2 == 0 else a) * P) % n)
    else:
        add((r ^ 1) % n)
        for i in range(1, k):
            add((r + i * (n // k)) % n)
    j = 1
    while len(picks) < K:
        add((r + j) % n)
        j += 1
    return picks


def expected_holders(owner, n, k):
    """Nodes that hold owner's shard: the owner and its peers."""
    return {owner} | set(expected_peers(owner, n, k))


class KCluster(Cluster):
    """Cluster with peers-per-node k: Cluster.yaml() always writes
    "peers-per-node: 1" (and a second key via extra= is a duplicate-key
    error), so the yaml is written here in full."""

    def __init__(self, n, k=1, **kw):
        super().__init__(n, **kw)
        self.k = k

    def yaml(self, job, rank, extra=""):
        return ("job-name: %s\nframework: orbax\nnode-rank: %d\nnodes: %d\n"
                "peers-per-node: %d\nbackup-interval-minutes: 30\n%s"
                % (job, rank, self.n, self.k, extra))


def markers(mnt):
    return sorted(x for x in os.listdir(mnt) if x.endswith(".restore"))


def read_errors(mnt):
    p = os.path.join(mnt, "replicator.errors")
    try:
        with open(p) as f:
            return f.read()
    except FileNotFoundError:
        return ""


class ClusterCase(unittest.TestCase):

    def make_cluster(self, n, k=1, ram_size="256M", restore_timeout=20,
                     start=True):
        c = KCluster(n, k, ram_size=ram_size, restore_timeout=restore_timeout)
        for d in c.nodes:
            d.extra_args.append("-d")      # INFO lines: evidence on failure
        self.daemons = list(c.nodes)
        self.addCleanup(c.close)
        self.c = c
        if start:
            c.start()
        return c

    # -- the job --

    def populate(self, job, steps=STEPS, size=256 * KiB, ranks=None):
        """Job start (nothing to restore), save steps on every node, then
        wait until placement and GC are exactly as expected."""
        c = self.c
        got = c.job_start(job)
        self.assertEqual(got, {r: 0 for r in range(c.n)}, "fresh job start")
        for s in steps:
            c.save(job, s, ranks=ranks, size=size)
        c.wait_replicated(job, steps[-1])
        self.assert_placement(job, steps[-1])

    def holdings(self, r, job):
        """{owner: (step, state, own, hash)} lists per node r."""
        out = {}
        for s in admin_ls(self.c.nodes[r].ramdir)["shards"]:
            if s["job"] == job:
                out.setdefault(s["rank"], []).append(
                    (s["step"], s["state"], s["own"], s["hash"]))
        return out

    def assert_placement(self, job, step, timeout=30):
        """Node r holds exactly: its own shard of step, and the replicas of
        every owner whose peers include r — all committed, with the owner's
        hash — and no other step (older ones were dropped)."""
        c = self.c
        last = {}

        def ok():
            hold = {r: self.holdings(r, job) for r in range(c.n)}
            last["h"] = hold
            own_hash = {}
            for r in range(c.n):
                for st, state, own, h in hold[r].get(r, []):
                    if st == step and own:
                        own_hash[r] = h
            for r in range(c.n):
                want = {o for o in range(c.n)
                        if r in expected_holders(o, c.n, c.k)}
                if set(hold[r]) != want:
                    return False
                for o, lst in hold[r].items():
                    if len(lst) != 1:
                        return False
                    st, state, own, h = lst[0]
                    if (st != step or state not in harness.COMMITTED_STATES
                            or own != (o == r) or own_hash.get(o) != h):
                        return False
            return True
        try:
            wait_until(ok, timeout, "placement of step %d" % step)
        except AssertionError:
            exp = {r: sorted(o for o in range(c.n)
                             if r in expected_holders(o, c.n, c.k))
                   for r in range(c.n)}
            self.fail("placement of step %d (n=%d k=%d): want owners per "
                      "node %s; got %s" % (step, c.n, c.k, exp, last.get("h")))

    def kill_wipe_start(self, ranks):
        for r in ranks:
            self.c.nodes[r].kill9()
        for r in ranks:
            self.c.nodes[r].wipe_ramdir()
            self.c.nodes[r].start()

    def restart_and_verify(self, job, step, size=256 * KiB, ranks=None,
                           max_secs=RESTART_MAX_SECS):
        """Job restart on ranks (all); every node restores step; bytes ok.
        With every node present nothing waits for restore_timeout (20 s):
        the restart must be done within max_secs."""
        ranks = list(range(self.c.n)) if ranks is None else ranks
        t0 = time.monotonic()
        got = self.c.job_start(job, ranks=ranks)
        secs = time.monotonic() - t0
        self.assertEqual(got, {r: step for r in ranks},
                         "restored steps per node")
        for r in ranks:
            self.c.restore_and_verify(job, r, step, size=size)
        self.assertLess(secs, max_secs, "job restart took %.1f s with every "
                        "node present (restore_timeout is 20 s): did the "
                        "barrier wait for the timeout?" % secs)
        return secs

    # -- 1: a wiped node restores from a peer ---------------------------------------

    def wiped_node(self, n, k, victim, size=256 * KiB):
        job = "wipe%d" % n
        self.make_cluster(n, k)
        self.populate(job, size=size)
        self.kill_wipe_start([victim])
        self.assertEqual(admin_ls(self.c.nodes[victim].ramdir)["shards"], [])
        self.restart_and_verify(job, STEPS[-1], size=size)
        self.assert_restored_from_peer(job, STEPS[-1], victim)

    def assert_restored_from_peer(self, job, step, r, lost=()):
        """Node r's log says it fetched step from one of its peers (the
        holders of its replicas) that is not among the lost nodes."""
        log = self.c.nodes[r].log_text()
        m = re.search(r"restored job=%s step=%d from rank (\d+)" % (job, step),
                      log)
        self.assertTrue(m, "node %d: no 'restored job=%s step=%d from rank' "
                        "line" % (r, job, step))
        src = int(m.group(1))
        self.assertIn(src, set(expected_peers(r, self.c.n, self.c.k))
                      - set(lost),
                      "node %d restored from rank %d, not a live holder of "
                      "its replica" % (r, src))

    def test_n2_wiped_node_restores_from_peer(self):
        self.wiped_node(2, 1, victim=1)

    def test_n3_wiped_last_node_restores_from_peer(self):
        """Odd count: the last rank's replica lives on rank n-2."""
        self.wiped_node(3, 1, victim=2)

    def test_n4_k2_wiped_coordinator_restores_from_peer(self):
        """Rank 0 runs the coordinator: it comes back empty too."""
        self.wiped_node(4, 2, victim=0)

    def test_n8_k2_wiped_node_restores_from_peer(self):
        self.wiped_node(8, 2, victim=5, size=32 * KiB)

    # -- 2: two nodes lost -------------------------------------------------------

    def two_lost(self, n, k, victims, size=256 * KiB):
        for v in victims:
            self.assertTrue(expected_holders(v, n, k) - set(victims),
                            "test setup: node %d's shard must survive" % v)
        job = "two%d" % n
        self.make_cluster(n, k)
        self.populate(job, size=size)
        self.kill_wipe_start(victims)
        self.restart_and_verify(job, STEPS[-1], size=size)
        for v in victims:
            self.assert_restored_from_peer(job, STEPS[-1], v, lost=victims)

    def test_n4_k2_two_nodes_lost(self):
        self.two_lost(4, 2, (1, 2))

    def test_n8_k1_two_nodes_lost(self):
        """Nodes 0 (the coordinator) and 2: their replicas are on 1 and 3."""
        self.two_lost(8, 1, (0, 2), size=32 * KiB)

    # -- 3: a node died mid-save ---------------------------------------------------

    def test_n3_node_died_mid_save(self):
        job = "midsave"
        n, dead = 3, 1
        c = self.make_cluster(n, 1)
        self.populate(job, steps=(10,))
        # step 20 on every node but one; that one dies while writing it
        c.save(job, 20, ranks=[r for r in range(n) if r != dead])
        tmp = os.path.join(c.nodes[dead].mnt, "20.orbax-checkpoint-tmp-%d"
                           % dead)
        os.makedirs(os.path.join(tmp, "state", "params"))
        harness.write_file(os.path.join(tmp, "state", "params", "0.0"),
                           b"half" * 1000)
        # the others' step 20 is replicated; the LKG stays 10 everywhere
        def others_replicated():
            have = {}
            for r in range(n):
                for (o, st), state in c.holds(r, job).items():
                    if st == 20 and state in harness.COMMITTED_STATES:
                        have.setdefault(o, set()).add(r)
            return all(len(have.get(o, ())) >= 2
                       for o in range(n) if o != dead)
        wait_until(others_replicated, 30, "step 20 of the live nodes "
                   "replicated")
        for r in range(n):
            self.assertIn(10, {st for (o, st) in c.holds(r, job)},
                          "node %d dropped step 10 although 20 is "
                          "incomplete" % r)
        c.nodes[dead].kill9()
        c.nodes[dead].start()             # same RAMDIR
        self.restart_and_verify(job, 10)
        # the job goes on from 10 and saves step 20 again, with other bytes
        # than the step 20 that nodes 0 and 2 committed before the crash:
        # the new shards and their replicas replace the old ones
        new = {r: {"state/params/0.0": os.urandom(100 * KiB),
                   "commit_success.txt": b"ok\n"} for r in range(n)}
        for r in range(n):
            mnt = c.nodes[r].mnt
            tmp = os.path.join(mnt, "20.orbax-checkpoint-tmp-again")
            os.makedirs(os.path.join(tmp, "state", "params"))
            for rel, data in new[r].items():
                harness.write_file(os.path.join(tmp, rel), data)
            os.rename(tmp, os.path.join(mnt, "20"))
        self.assert_placement(job, 20)
        for r in range(n):
            s = harness.find_shard(admin_ls(c.nodes[r].ramdir), 20, job=job,
                                   rank=r)
            harness.assert_manifest(self, s, new[r])
        got = c.job_start(job)
        self.assertEqual(got, {r: 20 for r in range(n)})
        for r in range(n):
            mnt = c.nodes[r].mnt
            (m,) = markers(mnt)
            os.replace(os.path.join(mnt, m), os.path.join(mnt, "20"))
            self.assertEqual(harness.read_tree(os.path.join(mnt, "20")),
                             new[r], "node %d: re-saved step 20" % r)

    # -- 4: a corrupt replica ------------------------------------------------------

    def corrupt_replica(self, n, k, owner):
        job = "corrupt%d" % k
        c = self.make_cluster(n, k)
        self.populate(job)
        step = STEPS[-1]
        holders = sorted(expected_holders(owner, n, k) - {owner})
        # the planner takes the least loaded holder, lowest rank first
        # (tiers/lkg.c pick()): that is the copy to corrupt
        bad = holders[0]
        p = os.path.join(harness.shard_dir(c.nodes[bad].ramdir, step, job=job,
                                           rank=owner), "state/params/0.0")
        with open(p, "r+b") as f:
            f.seek(1000)
            b = f.read(1)
            f.seek(1000)
            f.write(bytes([b[0] ^ 0xFF]))
        c.nodes[owner].kill9()
        c.nodes[owner].wipe_ramdir()
        c.nodes[owner].start()
        return job, step, bad, holders

    def test_n4_k2_corrupt_replica_other_holder_used(self):
        n, owner = 4, 1
        job, step, bad, holders = self.corrupt_replica(n, 2, owner)
        secs = self.restart_and_verify(job, step, max_secs=1e9)
        errs = read_errors(self.c.nodes[owner].mnt)
        self.assertRegex(errs, r"restore of step %d: source rank %d failed"
                         % (step, bad),
                         "replicator.errors of node %d" % owner)
        log = self.c.nodes[owner].log_text()
        good = [h for h in holders if h != bad]
        m = re.search(r"restored job=%s step=%d from rank (\d+)"
                      % (job, step), log)
        self.assertTrue(m, "no 'restored ... from rank' line")
        self.assertIn(int(m.group(1)), good)
        # the other nodes were at the barrier of the first plan; the new
        # plan (same step) must not leave them there until restore_timeout
        self.assertLess(secs, RESTART_MAX_SECS,
                        "restart with a replaced source took %.1f s "
                        "(restore_timeout 20 s): the barrier waited for the "
                        "timeout" % secs)

    def test_n4_k1_corrupt_single_copy_nothing_restored(self):
        n, owner = 4, 1
        job, step, bad, holders = self.corrupt_replica(n, 1, owner)
        t0 = time.monotonic()
        got = self.c.job_start(job)
        secs = time.monotonic() - t0
        self.assertEqual(got, {r: 0 for r in range(n)},
                         "with its only copy corrupt, step %d must not be "
                         "restored anywhere (older steps were dropped)" % step)
        for r in range(n):
            mnt = self.c.nodes[r].mnt
            ms = markers(mnt)
            self.assertEqual(ms, ["%s-s0-n%d-w0.restore" % (job, r)], ms)
            p = os.path.join(mnt, ms[0])
            self.assertTrue(os.path.isfile(p) and not os.path.islink(p))
            self.assertEqual(os.path.getsize(p), 0)
        errs = read_errors(self.c.nodes[owner].mnt)
        self.assertRegex(errs, r"restore of step %d: source rank %d failed"
                         % (step, bad))
        self.assertRegex(errs, r"crc32c|CRC|verif",
                         "replicator.errors should say why the copy failed")
        # the corrupt bytes never reached node 1's store under its own key
        self.assertIsNone(harness.find_shard(
            admin_ls(self.c.nodes[owner].ramdir), step, job=job, rank=owner))
        self.assertLess(secs, RESTART_MAX_SECS)

    # -- 5: a peer that never comes back ---------------------------------------------

    def test_n3_peer_never_returns(self):
        timeout = 4
        job = "gone"
        n, dead = 3, 2
        c = self.make_cluster(n, 1, restore_timeout=timeout)
        self.populate(job)
        c.nodes[dead].kill9()
        live = [r for r in range(n) if r != dead]
        t0 = time.monotonic()
        got = c.job_start(job, ranks=live, timeout=timeout + 40)
        secs = time.monotonic() - t0
        sys.stdout.write("\n  [timing] restore with node %d gone "
                         "(restore_timeout=%d): %.2f s\n" % (dead, timeout,
                                                              secs))
        # node 2's shard has a replica on live node 1: step 30 is complete
        self.assertEqual(got, {r: STEPS[-1] for r in live})
        for r in live:
            self.c.restore_and_verify(job, r, STEPS[-1])
        self.assertGreaterEqual(secs, timeout,
                                "planned before restore_timeout passed")
        self.assertLessEqual(secs, timeout + 20)
        self.assertRegex(c.nodes[0].log_text(),
                         r"did not report within restore_timeout")

    def test_n2_new_yaml_during_restore_round_starts_over(self):
        """Node 1 never writes its yaml, so the round waits for it; node 0's
        job restarts (a new replicator.yaml): that round ends at once on
        node 0 and on the coordinator (GKE's replicator restarts at once;
        NeMo gives up after 300 s), and a new one starts with its timeout
        anew. Then node 1 writes its yaml and both restore the step."""
        timeout = 60
        job = "again"
        c = self.make_cluster(2, 1, restore_timeout=timeout)
        self.populate(job, steps=(10,))
        mnt0 = c.nodes[0].mnt
        yaml0 = os.path.join(mnt0, "replicator.yaml")

        def write_yaml0():
            wait_until(lambda: not os.path.exists(yaml0), 10, "yaml absent on node 0")
            with open(yaml0 + ".tmp", "w") as f:
                f.write(c.yaml(job, 0))
            os.rename(yaml0 + ".tmp", yaml0)
            wait_until(lambda: not os.path.exists(yaml0), 10, "yaml consumed on node 0")

        log0 = c.nodes[0].log_text
        rounds = re.compile(r"job %s: rank 0 restarted its restore; starting a new round" % job)
        mark = c.nodes[0].log_size()
        write_yaml0()
        c.wait_coord("catalog", job, 0, since=mark)    # the first catalog is in
        self.assertEqual(markers(mnt0), [], "node 0 waits for node 1")
        n0 = len(rounds.findall(log0()))
        t0 = time.monotonic()
        write_yaml0()
        wait_until(lambda: len(rounds.findall(log0())) > n0, 10,
                   "the coordinator starts a new round at once")
        wait_until(lambda: "restore of job %s interrupted by a new replicator.yaml" % job
                   in log0(), 10, "node 0's old round ends")
        started_over = time.monotonic() - t0
        self.assertLess(started_over, 10)
        self.assertEqual(markers(mnt0), [], "node 0 still waits for node 1")
        self.assertFalse(os.path.exists(os.path.join(mnt0, "replicator.failed")))
        # node 1 comes: both restore step 10, well before restore_timeout
        got1 = c.node_start(1, job, timeout=30)
        self.assertEqual(got1, 10)
        ms = wait_until(lambda: markers(mnt0) or None, 30, "markers on node 0")
        self.assertEqual(ms, ["%s-s10-n0-w0.restore" % job])
        self.assertLess(time.monotonic() - t0, timeout / 2)
        for r in range(2):
            c.restore_and_verify(job, r, 10)
        self.assertNotRegex(log0(), r"did not report within restore_timeout")

    def test_n2_unmount_during_restore_round_exits_at_once(self):
        """A node is unmounted while its restore round waits for a node
        that never writes its yaml (kubelet stops the pod mid-restore): the
        daemon ends the round and exits within seconds, not after
        restore_timeout (it used to wait out the coordinator call, up to
        restore_timeout + 30 s, and the harness killed it). Both the node
        that is only a client of the coordinator and the coordinator's own
        node are checked."""
        job = "unmountwait"
        c = self.make_cluster(2, 1, restore_timeout=300)
        self.populate(job, steps=(10,))
        for r in (0, 1):
            mnt = c.nodes[r].mnt
            y = os.path.join(mnt, "replicator.yaml")
            with open(y + ".tmp", "w") as f:
                f.write(c.yaml(job, r))
            os.rename(y + ".tmp", y)
            # the round has begun: the yaml is taken and the catalog sent
            wait_until(lambda: not os.path.exists(y), 10, "yaml consumed")
            wait_until(lambda: re.search(r"restore: .*job %s|plan|waiting"
                                         % job, c.nodes[0].log_text()),
                       10, "the coordinator has node %d's catalog" % r)
            self.assertEqual(markers(mnt), [], "node %d waits for the other" % r)
            t0 = time.monotonic()
            c.nodes[r].stop(timeout=20)     # raises on a hang or a bad exit
            self.assertLess(time.monotonic() - t0, 15,
                            "node %d took too long to exit" % r)
            self.assertIn("restore of job %s interrupted by the daemon's stop"
                          % job, c.nodes[r].log_text())
            if r == 0:
                # the coordinator comes back (no yaml yet), with a fresh
                # round, so that node 1's round waits for it
                c.nodes[0].start()
            else:
                self.assertTrue(c.nodes[0].running())

    # -- 6: malformed frames ----------------------------------------------------------

    def test_n3_malformed_frames_dropped(self):
        job = "frames"
        n = 3
        c = self.make_cluster(n, 1)
        self.populate(job, steps=(10,))
        before = {r: ps.ramdir_tree(c.nodes[r].ramdir) for r in range(n)}
        ls_before = {r: admin_ls(c.nodes[r].ramdir) for r in range(n)}
        ok_payload = ps.jbytes({"rank": 0, "purpose": "data",
                                "nonce": "00" * 32, "mac": "00" * 32})
        cases = [
            ("garbage", os.urandom(4096)),
            ("garbage that is 23 bytes, then close", os.urandom(23)),
            ("HTTP request", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("huge length (0xffffffff)",
             ps.header(ps.NT_HELLO, 0xFFFFFFFF, 0) + b"x" * 100),
            ("length NET_MAX_PAYLOAD+1",
             ps.header(ps.NT_HELLO, ps.NET_MAX_PAYLOAD + 1, 0)),
            ("oversize HELLO (8 KiB, valid CRCs)",
             ps.frame(ps.NT_HELLO, b"{" + b" " * 8190 + b"}")),
            ("bad header CRC",
             ps.frame(ps.NT_HELLO, ok_payload, bad_hdr_crc=True)),
            ("bad payload CRC",
             ps.frame(ps.NT_HELLO, ok_payload, bad_payload_crc=True)),
            ("bad magic", ps.frame(ps.NT_HELLO, ok_payload,
                                   magic=0x50435400)),
            ("bad version", ps.frame(ps.NT_HELLO, ok_payload, version=2)),
            ("unknown type 99", ps.frame(99, ok_payload)),
            ("type 0", ps.frame(0, ok_payload)),
            ("REQ after the challenge",
             ps.frame(ps.NT_REQ, {"op": "fetch", "job": job, "step": 10,
                                  "owner": 0, "worker": 0}, req_id=1)),
            ("catalog REQ after the challenge",
             ps.frame(ps.NT_REQ, {"op": "catalog", "job": job, "nodes": 3,
                                  "holds": [[0, 99, "00" * 32]]}, req_id=1)),
            ("FILE after the challenge",
             ps.file_frame("x", b"data")),
            ("WELCOME from the client", ps.frame(ps.NT_WELCOME, {"rank": 0})),
            ("HELLO that is not JSON", ps.frame(ps.NT_HELLO, b"\xff\xfe")),
            ("HELLO JSON array", ps.frame(ps.NT_HELLO, b"[1]")),
            ("HELLO with a bad purpose", ps.frame(ps.NT_HELLO, ps.jbytes(
                {"rank": 0, "purpose": "admin", "nonce": "00" * 32,
                 "mac": "00" * 32}))),
            ("HELLO rank out of range", ps.frame(ps.NT_HELLO, ps.jbytes(
                {"rank": 70000, "purpose": "data", "nonce": "00" * 32,
                 "mac": "00" * 32}))),
        ]
        addrs = [c.addrs[1], c.addrs[0]]          # a node and the coordinator
        # the silent connections go first: they run out the handshake timer
        # while the others are tried
        silent = []
        for a in addrs:
            w = ps.Wire(a)
            self.addCleanup(w.close)
            w.challenge()
            silent.append((a, w, time.monotonic()))
        silent_nochallenge = ps.Wire(c.addrs[1])       # not even read
        self.addCleanup(silent_nochallenge.close)
        t_nc = time.monotonic()
        for a in addrs:
            for what, data in cases:
                with ps.Wire(a) as w:
                    w.challenge()
                    try:
                        w.send(data)
                        if what.endswith("then close"):
                            w.sock.shutdown(socket.SHUT_WR)
                    except ps.Closed:
                        pass
                    self.assertTrue(w.wait_closed(10),
                                    "%s: %s not dropped" % (a, what))
                    self.assertEqual(w.leftover, b"",
                                     "%s: %s got an answer" % (a, what))
            # many bad connections at once
            ws = []
            for i in range(50):
                w = ps.Wire(a)
                self.addCleanup(w.close)
                ws.append(w)
            for w in ws:
                w.challenge()
                w.send(os.urandom(64))
            for w in ws:
                self.assertTrue(w.wait_closed(10), "burst: not dropped")
                w.close()
        for a, w, t0 in silent:
            self.assertTrue(w.wait_closed(15), "%s: silent connection kept "
                            "open past the handshake timeout" % a)
            dt = time.monotonic() - t0
            self.assertGreaterEqual(dt, 3.0, "dropped before any timeout")
            self.assertLessEqual(dt, 12.0)
            self.assertEqual(w.leftover, b"")
        self.assertTrue(silent_nochallenge.wait_closed(15))
        self.assertGreaterEqual(time.monotonic() - t_nc, 3.0)
        for r in range(n):
            c.nodes[r].check_alive()
            self.assertEqual(admin_ls(c.nodes[r].ramdir), ls_before[r],
                             "node %d: catalog changed" % r)
            added, removed, changed = ps.tree_diff(
                before[r], ps.ramdir_tree(c.nodes[r].ramdir))
            self.assertEqual((added, removed, changed), ([], [], []),
                             "node %d: RAMDIR changed" % r)
        self.assertRegex(c.nodes[1].log_text(), r"WARN net: .*bad frame header")
        self.assertRegex(c.nodes[1].log_text(), r"handshake timeout")
        # the daemons keep serving: save, replicate, restart, restore
        c.save(job, 20)
        c.wait_replicated(job, 20)
        self.assert_placement(job, 20)
        self.restart_and_verify(job, 20)

    # -- timing ------------------------------------------------------------------

    def test_restore_256mib_shard_from_peer_timing(self):
        """Prints how long a wiped node takes to get a 256 MiB shard back
        from its peer (job start to markers, and the daemon's own numbers);
        the bytes are checked, the time is not asserted."""
        job = "big"
        total = 256 * MiB
        # shard_files: params = size, opt = size // 4 + 13, plus ~40 bytes
        size = (total - 13 - 64) * 4 // 5
        c = self.make_cluster(2, 1, ram_size="1G")
        self.assertEqual(c.job_start(job), {0: 0, 1: 0})
        t0 = time.monotonic()
        c.save(job, 1, size=size)
        t_save = time.monotonic() - t0
        c.wait_replicated(job, 1, timeout=120)
        t_repl = time.monotonic() - t0
        shard = harness.find_shard(admin_ls(c.nodes[1].ramdir), 1, job=job,
                                   rank=1)
        nbytes = shard["bytes"]
        self.kill_wipe_start([1])
        t1 = time.monotonic()
        got = c.job_start(job, timeout=120)
        t_restore = time.monotonic() - t1
        self.assertEqual(got, {0: 1, 1: 1})
        log = c.nodes[1].log_text()
        m = re.search(r"restore job=%s step=1 source=(\w+) ready_ms=([\d.]+)"
                      % job, log)
        self.assertTrue(m and m.group(1) == "peer", m and m.group(0))
        repl = re.findall(r"replicated job=%s step=1 to rank \d+ bytes=(\d+) "
                          r"secs=([\d.]+)" % job, c.nodes[0].log_text())
        t2 = time.monotonic()
        c.restore_and_verify(job, 1, 1, size=size)
        t_verify = time.monotonic() - t2
        sys.stdout.write(
            "\n  [timing] shard of %.1f MiB: save on 2 nodes %.2f s; "
            "save+replicate %.2f s (daemon: push %s s); wiped node restore "
            "from peer: job start -> markers %.2f s (%.0f MiB/s), daemon "
            "ready_ms=%s; read back + compare %.2f s\n"
            % (nbytes / MiB, t_save, t_repl,
               repl[0][1] if repl else "?", t_restore,
               nbytes / MiB / t_restore, m.group(2), t_verify))
        self.assertAlmostEqual(nbytes, total, delta=MiB)


if __name__ == "__main__":
    harness.main()
