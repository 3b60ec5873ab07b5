"""Erasure-coded peer tier end to end (issue 17): real mtcfs daemons on
loopback mounted with redundancy=rs:K+M, a job saving small shards, nodes
killed -9 with their RAMDIR wiped, then a job restart.

- rs:4+2 on 6 nodes: every loss of 1 or 2 nodes (all 21 patterns, one
  after the other on one cluster, a new protected step before each)
  restores every node's exact bytes; the lost nodes' logs say the shard
  was rebuilt from the erasure code; parity of older steps is dropped
  once a newer step is protected;
- a rebuilt node rebuilds its own parity of the step too: three losses
  of two nodes in a row with no new step restore the same step each time;
- rs:4+1 on 5 nodes: 2 nodes lost (M + 1): nothing is restored (s0
  markers) and the coordinator's log names the short codeword; with a
  file:// bucket holding a backup the job restores the backup instead;
- a corrupt parity fragment on a survivor: passed over, the lost shard
  still rebuilt exactly, the log counts it;
- a node lost while its step is being encoded: that step is never
  protected (older parity kept), and after the restart the job restores
  the older, protected step, rebuilt from the code;
- data parallelism (6 nodes, assume-data-parallelism 2, rs:2+1 over the
  3 units): twins encode nothing and store no parity (RAM: 1.5 S on a
  representative, S on a twin), a lost node whose twin lives is copied
  from the twin, a unit whose both copies are lost is rebuilt from the
  code on both nodes;
- a node lost right after a job restart (issue 22): rs:2+1 on 3 nodes,
  step 2 committed everywhere but never encoded (node 0 killed before its
  manifest left it), restored from RAM: step 1 and its parity stay until
  step 2 is protected again (node 0 sends its manifest again, every node
  rebuilds its parity); a node lost right after the restart costs at most
  step 2, and once step 2 is protected it is rebuilt from its parity;
- an unmount while the replication worker waits between retries (manifest
  sends to dead nodes; a push to a dead peer) takes well under 5 s;
- a shard rebuilt from fragments gets permission bits only: 04755, 02755
  files and a 01777 directory come back 0755, 0755, 01777 (sticky only narrows deletes);
- RAM held per node for one protected step (du of RAMDIR's shards/, the
  parity holdings included) against (1 + M/K) x S;
- fragments checked like shards: mtcfs-admin verify names a parity
  fragment with a flipped payload byte; the start-up scan removes a
  half-written file and a fragment with a broken header.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \\
     /usr/bin/python3 tests/integration/multinode/test_ec_cluster.py [-k NAME]
"""

import errno
import itertools
import json
import os
import re
import shutil
import signal
import sys
import time
import tempfile
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
sys.path.insert(1, os.path.join(INTEG, "security"))  # test_peer_security: the Python peer (one test)
import harness  # noqa: E402
from harness import wait_until  # noqa: E402
from cluster import Cluster, save_step, shard_files  # noqa: E402

KiB = 1 << 10
SIZE = 96 * KiB           # params file; the shard is about 1.25 x this
# warnings the scenarios cause on purpose: sends to, and fetches from,
# nodes that are dead
EXPECTED = (r"ec: .*(failed|refused)|ec restore: |cannot rebuild|"
            r"not erasure coded|connect|Connection refused|"
            r"could not be fetched|held nowhere")


class EcCase(unittest.TestCase):

    def make(self, n, red, extra="", ram_size="256M"):
        m = re.match(r"rs:(\d+)\+", red)
        self.k = int(m.group(1)) if m else None   # None: the yaml sets it
        opts = "redundancy=" + red + ("," + extra if extra else "")
        c = Cluster(n, ram_size=ram_size, restore_timeout=20, extra=opts)
        for d in c.nodes:
            d.extra_args.append("-d")
        self.addCleanup(c.close)
        self.c = c
        c.start()
        return c

    def frags(self, r, job, step=None):
        return harness.parity_files(self.c.nodes[r].ramdir, job, step)

    def wait_protected(self, job, step, ranks=None, timeout=60):
        ranks = range(self.c.n) if ranks is None else ranks
        wait_until(lambda: all("protected" in self.frags(r, job, step)
                               for r in ranks), timeout,
                   "step %d protected on every node" % step)

    def save_protected(self, job, step, size=SIZE):
        self.c.save(job, step, size=size)
        self.wait_protected(job, step)

    def lose(self, ranks):
        for r in ranks:
            self.c.nodes[r].expect_log(EXPECTED)
            self.c.nodes[r].kill9()
        for r in ranks:
            self.c.nodes[r].wipe_ramdir()
            self.c.nodes[r].start()
        for d in self.c.nodes:
            d.expect_log(EXPECTED)

    def restart_verify(self, job, step, lost, size=SIZE):
        c = self.c
        logpos = {r: len(c.nodes[r].log_text()) for r in lost}
        got = c.job_start(job)
        self.assertEqual(got, {r: step for r in range(c.n)}, "restored steps")
        for r in range(c.n):
            c.restore_and_verify(job, r, step, size=size)
        for r in lost:
            log = c.nodes[r].log_text()[logpos[r]:]
            m = re.search(r"restored job=%s step=%d from erasure code rs:\d+\+\d+: "
                          r"(\d+) fragments fetched, (\d+) passed over" % (job, step), log)
            self.assertTrue(m, "node %d's log: %s" % (r, log[-2000:]))
            # the minimum: K members for each of the shard's K pieces, and
            # one more for each corrupt one passed over (was K + M - 1 each)
            self.assertEqual(int(m.group(1)) - int(m.group(2)), self.k * self.k, m.group(0))
        return got

    # -- every loss of up to M nodes -------------------------------------------

    def test_rs42_every_loss_of_up_to_two(self):
        c = self.make(6, "rs:4+2")
        job = "ec42"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(6)})
        step = 1
        self.save_protected(job, step)
        patterns = [p for m in (1, 2) for p in itertools.combinations(range(6), m)]
        for lost in patterns:
            step += 1
            self.save_protected(job, step)
            # parity of the older steps goes once this one is protected
            wait_until(lambda: all(self.frags(r, job) == [str(step)]
                                   for r in range(6)), 30,
                       "only step %d's fragments kept" % step)
            self.lose(lost)
            self.restart_verify(job, step, lost)

    def test_rebuilt_nodes_protect_again(self):
        # a rebuilt node rebuilds its parity of the step as well: three
        # losses of two nodes in a row, with no new step in between,
        # each restore the same step exactly
        c = self.make(6, "rs:4+2")
        job = "ecagain"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(6)})
        self.save_protected(job, 3)
        for lost in ([0, 1], [2, 3], [4, 5]):
            self.lose(lost)
            self.restart_verify(job, 3, lost)
            for r in lost:
                wait_until(lambda: re.search(r"ec: job=%s step=3 parity rebuilt here" % job,
                                             c.nodes[r].log_text()), 30,
                           "node %d's parity of step 3 rebuilt" % r)
            self.wait_protected(job, 3)
            for r in lost:
                frs = [x for x in self.frags(r, job, 3) if x.endswith(".frag")]
                self.assertEqual(len(frs), 2, "node %d's parity: %s" % (r, frs))

    # -- M + 1 lost ----------------------------------------------------------

    def test_rs41_two_lost_nothing_restored(self):
        c = self.make(5, "rs:4+1")
        job = "ec41"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(5)})
        self.save_protected(job, 1)
        self.lose([1, 3])
        steps = json.loads(harness.admin("steps", c.nodes[0].ramdir, "--json"))
        row = [x for x in steps["steps"] if x["step"] == 1][0]
        self.assertFalse(row["complete"], row)
        self.assertEqual(row["missing"], [1, 3])
        self.assertEqual(row["ec"]["rebuilt"], [])
        got = c.job_start(job)
        self.assertEqual(got, {r: 0 for r in range(5)}, "nothing restorable")
        log = c.nodes[0].log_text()
        self.assertRegex(log, r"node [13]'s shard is held nowhere and the "
                         r"erasure code cannot rebuild it: ")

    def test_rs41_two_lost_bucket_fallback(self):
        bucket = tempfile.mkdtemp(prefix="mtcfs-ec-bucket-", dir="/tmp")
        self.addCleanup(shutil.rmtree, bucket, True)
        c = self.make(5, "rs:4+1", extra="bucket=file://" + bucket)
        c.interval = "backup-interval-steps: 1"
        job = "ec41b"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(5)})
        self.save_protected(job, 1)
        wait_until(lambda: re.search(r"backup .* complete", c.nodes[0].log_text()),
                   60, "backup of step 1 complete")
        self.lose([0, 2])
        got = c.job_start(job)
        self.assertEqual(got, {r: 1 for r in range(5)}, "restored from the bucket")
        for r in range(5):
            c.restore_and_verify(job, r, 1, size=SIZE)
        self.assertRegex(c.nodes[2].log_text(), r"restored job=%s step=1 from backup" % job)

    # -- a corrupt fragment ----------------------------------------------------

    def test_corrupt_parity_passed_over(self):
        c = self.make(6, "rs:4+2")
        job = "eccrc"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(6)})
        self.save_protected(job, 7)
        # flip a payload byte of every parity fragment node 1 stores
        d = harness.parity_dir(c.nodes[1].ramdir, job, 7)
        n = 0
        for name in os.listdir(d):
            if name.endswith(".frag"):
                with open(os.path.join(d, name), "r+b") as f:
                    f.seek(400)
                    b = f.read(1)
                    f.seek(400)
                    f.write(bytes([b[0] ^ 0x5a]))
                n += 1
        self.assertEqual(n, 2)
        self.lose([4])
        self.restart_verify(job, 7, [4])
        m = re.search(r"from erasure code rs:4\+2: \d+ fragments fetched, (\d+) passed over",
                      c.nodes[4].log_text())
        self.assertTrue(m and int(m.group(1)) >= 1, "a corrupt fragment was passed over")

    def test_fragments_verified_and_scanned_at_start(self):
        """Fragments are checked like shards: mtcfs-admin verify reads every
        parity fragment and group manifest of its holdings (a flipped payload
        byte is named, exit 1); a daemon that starts finds a half-written
        file (a crash while a fragment was received) and a fragment whose
        header is broken: both are removed, RAM given back, and the step is
        no longer reported protected on that node."""
        c = self.make(3, "rs:2+1")
        job = "ecscan"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(3)})
        self.save_protected(job, 4)
        node = c.nodes[1]
        out = subprocess_admin(["verify", node.ramdir, "--json"])
        self.assertEqual(out[0], 0, out[1])
        js = json.loads(out[1])
        kinds = sorted(f["kind"] for f in js["fragments"])
        self.assertEqual(kinds.count("parity"), 1, js["fragments"])
        self.assertEqual(kinds.count("manifest"), 3, js["fragments"])   # the group's
        self.assertTrue(all(f["result"] == "ok" for f in js["fragments"]), js)
        d = harness.parity_dir(node.ramdir, job, 4)
        frag = [n for n in os.listdir(d) if n.endswith(".frag")][0]
        with open(os.path.join(d, frag), "r+b") as f:
            f.seek(-40, os.SEEK_END)   # inside the payload, before the trailer
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0x01]))
        rc, text = subprocess_admin(["verify", node.ramdir])
        self.assertEqual(rc, 1, text)
        self.assertRegex(text, r"bad\s+%s\s+step 4\s+parity %s: " % (job, re.escape(frag)))
        self.assertIn("1 bad", text)
        rc, text = subprocess_admin(["verify", node.ramdir, "--json"])
        self.assertEqual(json.loads(text)["fragments_bad"], 1)
        # the daemon stops; a crash leaves a half-written file, and a header
        # is broken: the next start removes both
        node.stop()
        with open(os.path.join(d, "g0-c0-s2.frag.tmp"), "wb") as f:
            f.write(os.urandom(64 * KiB))
        with open(os.path.join(d, frag), "r+b") as f:
            f.write(b"XX")   # the magic
        self.assertIn("protected", os.listdir(d))
        mark = node.log_size()
        node.expect_log(r"ec: job=%s step=4: %s is corrupt" % (job, re.escape(frag)))
        node.start()
        m = node.wait_log(r"ec: start-up scan: (\d+) parity fragments in (\d+) job steps "
                          r"\(\d+ bytes\); removed (\d+) half-written files \((\d+) bytes\) "
                          r"and (\d+) corrupt ones", 30, "the start-up scan", since=mark)
        self.assertEqual((m.group(1), m.group(3), m.group(5)), ("0", "1", "1"), m.group(0))
        self.assertGreaterEqual(int(m.group(4)), 64 * KiB)
        left = os.listdir(d)
        self.assertNotIn("g0-c0-s2.frag.tmp", left)
        self.assertNotIn(frag, left)
        self.assertNotIn("protected", left)
        rc, text = subprocess_admin(["verify", node.ramdir])
        self.assertEqual(rc, 0, text)

    # -- a node lost during encoding --------------------------------------------

    def encoding_cut_short(self, job):
        """rs:4+2 on 6 nodes, step 1 protected; node 5 commits step 2 and
        sends its manifest, then dies (kill -9) before the others'
        manifests reach it, so it never sends its fragments; the others
        commit step 2 and try to send theirs."""
        c = self.make(6, "rs:4+2")
        self.assertEqual(c.job_start(job), {r: 0 for r in range(6)})
        self.save_protected(job, 1)
        c.save(job, 2, ranks=[5], size=SIZE)
        wait_until(lambda: all("m5.mf" in self.frags(r, job, 2) for r in range(5)),
                   30, "node 5's manifest of step 2 everywhere")
        for d in c.nodes:
            d.expect_log(EXPECTED)
        c.nodes[5].kill9()
        c.save(job, 2, ranks=range(5), size=SIZE)
        wait_until(lambda: all(re.search(r"ec: job=%s step=2 sent" % job,
                                         c.nodes[r].log_text()) for r in range(5)),
                   90, "the survivors tried to send their fragments of step 2")
        prot = [r for r in range(5) if "protected" in self.frags(r, job, 2)]
        self.assertLess(len(prot), 5, "step 2 is not protected everywhere")
        return c

    def test_node_lost_while_encoding(self):
        job = "ecenc"
        c = self.encoding_cut_short(job)
        for r in range(5):
            self.assertIn("1", self.frags(r, job), "step 1's parity kept on node %d" % r)
        c.nodes[5].wipe_ramdir()
        c.nodes[5].start()
        self.restart_verify(job, 1, [5])

    def test_ram_account_after_rebuild(self):
        # the RAM account (ram_size's) of a node rebuilt from fragments is
        # what it holds: the fragments it fetched and dropped are given back
        size = 1 << 20
        c = self.make(6, "rs:4+2")
        job = "ecacct"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(6)})
        self.save_protected(job, 2, size=size)
        self.lose([3])
        self.restart_verify(job, 2, [3], size=size)
        node = c.nodes[3]
        # the rebuilt node rebuilds its parity of the step after the barrier,
        # in the background: measure once that is done
        wait_until(lambda: re.search(r"ec: job=%s step=2 parity rebuilt here" % job,
                                     node.log_text()), 60, "node 3's parity rebuilt")
        held = du_trees([os.path.join(node.ramdir, d) for d in ("ns", "shards")])
        used = json.loads(harness.admin("status", node.ramdir, "--json"))["ram_used"]
        S = sum(len(v) for v in shard_files(job, 2, 3, size).values())
        self.assertLess(abs(used - held), S // 10,
                        "ram_used %d, held %d (shard %d)" % (used, held, S))

    # -- parity holdings under ram_size ----------------------------------------

    def wait_sent(self, job, step):
        c = self.c
        wait_until(lambda: all(re.search(r"ec: job=%s step=%d sent" % (job, step),
                                         c.nodes[r].log_text()) and
                               not [x for x in self.frags(r, job, step) if x.endswith(".tmp")]
                               for r in range(c.n)), 60, "fragments of step %d sent" % step)

    def fill(self, path, nbytes):
        """Write nbytes into path in 64 KiB writes (the daemon reserves
        each before it lands)."""
        chunk = b"\x5a" * (64 * KiB)
        with open(path, "wb") as f:
            left = nbytes
            while left > 0:
                f.write(chunk[:min(left, len(chunk))])
                f.flush()
                left -= len(chunk)

    def test_parity_reclaimed_by_ram_size_policy(self):
        """A step's parity holding goes under ram_size's pressure by the
        same policy as the step's replicas: a node at its ram_size drops
        an earlier job's parity (after that job's shard) for a write of the
        current job; the parity of the current job's LKG step is never
        dropped: the write then gets ENOSPC, as for shards."""
        size = 1 << 20
        c = self.make(3, "rs:2+1", ram_size="8M")
        self.assertEqual(c.job_start("ecja"), {r: 0 for r in range(3)})
        self.save_protected("ecja", 1, size=size)
        self.wait_sent("ecja", 1)
        self.assertEqual(c.job_start("ecjb"), {r: 0 for r in range(3)})
        self.save_protected("ecjb", 1, size=size)
        self.wait_sent("ecjb", 1)
        node = c.nodes[1]
        node.expect_log(r"RAM tier full|is not the current job")
        a_dir = harness.parity_dir(node.ramdir, "ecja", 1)
        b_dir = harness.parity_dir(node.ramdir, "ecjb", 1)
        a_shard = os.path.join(node.ramdir, "shards", "ecja", "1", "n1-w0")
        self.assertIn("protected", os.listdir(a_dir))
        par_a, par_b, shard_a = du(a_dir), du(b_dir), du(a_shard)
        self.assertGreater(par_a, size // 4)
        sv = os.statvfs(node.mnt)
        free = sv.f_bavail * sv.f_frsize
        # more than job a's shard frees: its parity must go too
        self.fill(os.path.join(node.mnt, "scratch"), free + shard_a + par_a // 2)
        self.assertFalse(os.path.exists(a_shard), "job a's shard dropped first")
        self.assertFalse(os.path.exists(a_dir), "job a's parity dropped for room")
        self.assertRegex(node.log_text(), r"ec: job=ecja step=1 fragments dropped")
        # the LKG's parity is kept: the write is refused
        sv = os.statvfs(node.mnt)
        free = sv.f_bavail * sv.f_frsize
        with self.assertRaises(OSError) as cm:
            self.fill(os.path.join(node.mnt, "scratch2"), free + par_b // 2)
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        self.assertIn("protected", os.listdir(b_dir))
        self.assertEqual(len([x for x in os.listdir(b_dir) if x.endswith(".frag")]), 1)
        used = json.loads(harness.admin("status", node.ramdir, "--json"))["ram_used"]
        self.assertLessEqual(used, 8 << 20)
        rc, text = subprocess_admin(["verify", node.ramdir])
        self.assertEqual(rc, 0, text)

    def test_rebuilt_parity_refused_when_it_does_not_fit(self):
        """The parity a node rebuilds after the barrier is reserved before
        it is written: node 1 comes back without its parity of the LKG step
        and with a ram_size its shard fills, and the rebuild of its parity
        is refused (nothing written, ram_used within ram_size)."""
        size = 1 << 20
        c = self.make(3, "rs:2+1")
        job = "ecfit"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(3)})
        self.save_protected(job, 1, size=size)
        self.save_protected(job, 2, size=size)
        self.wait_sent(job, 2)
        wait_until(lambda: all(self.frags(r, job) == ["2"] for r in range(3)), 30,
                   "step 1's parity dropped once 2 is protected")
        node = c.nodes[1]
        node.stop()
        par = du(harness.parity_dir(node.ramdir, job, 2))
        shutil.rmtree(harness.parity_dir(node.ramdir, job, 2))
        held = du_trees([os.path.join(node.ramdir, d) for d in ("ns", "shards")])
        cap = held + par // 4    # room for the group's manifests, not the parity
        node.opts = re.sub(r"ram_size=[^,]*", "ram_size=%d" % cap, node.opts)
        for d in c.nodes:
            d.expect_log(EXPECTED + r"|RAM tier full|could not be rebuilt")
        node.start()
        self.assertEqual(c.job_start(job), {r: 2 for r in range(3)})
        node.wait_log(r"ec: job=%s step=2: parity cw \d+ slot \d+ refused: no room" % job, 60,
                      "node 1's parity rebuild refused")
        self.assertEqual([x for x in self.frags(1, job, 2) if x.endswith(".frag")], [])
        used = json.loads(harness.admin("status", node.ramdir, "--json"))["ram_used"]
        self.assertLessEqual(used, cap)
        for r in range(3):
            c.restore_and_verify(job, r, 2, size=size)

    # -- bad input -----------------------------------------------------------

    def test_data_fragment_only_from_its_unit(self):
        # rs:4+2 on 6 nodes: codeword 0's data slot 0 is node 2's piece and
        # node 0 stores its first parity; node 3 (an authenticated peer)
        # may not send that slot
        import test_peer_security as ps
        c = self.make(6, "rs:4+2")
        job = "ecforge"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(6)})
        self.save_protected(job, 1)
        c.nodes[0].expect_log(r"ec: data fragment .* refused")
        secret = ps.read_secret(c.secret)
        with ps.Wire(c.addrs[0]) as w:
            w.handshake(secret, rank=3, purpose="data")
            w.send(ps.frame(ps.NT_REQ, {"op": "ec_data", "job": job, "step": 9, "group": 0,
                                        "cw": 0, "slot": 0}, req_id=1))
            w.send(ps.file_frame("fragment", b"x" * 4096))
            with self.assertRaises(ps.Refused) as cm:
                w.recv_json()
        self.assertEqual(cm.exception.errno, errno.EPERM)
        self.assertIn("rank 3 does not hold data slot 0 of codeword 0", cm.exception.text)
        self.assertEqual(self.frags(0, job, 9), [])

    # -- the setting ---------------------------------------------------------

    def test_yaml_key_overrides_mount(self):
        # mounted with replication; the job's replicator.yaml asks rs:2+1
        c = self.make(3, "replication")
        job = "ecyaml"
        self.assertEqual(c.job_start(job, extra="redundancy: rs:2+1"), {r: 0 for r in range(3)})
        self.save_protected(job, 4)
        self.lose([2])
        # mtcfs-admin steps: node 2's shard has no copy, the code rebuilds it
        steps = json.loads(harness.admin("steps", c.nodes[0].ramdir, "--json"))
        row = [x for x in steps["steps"] if x["step"] == 4][0]
        self.assertTrue(row["complete"], row)
        self.assertEqual(row["ec"], {"redundancy": "rs:2+1", "parity": [0, 1],
                                     "rebuilt": [2]})
        self.assertEqual(row["holders"]["2"], [])
        text = harness.admin("steps", c.nodes[0].ramdir)
        self.assertRegex(text, r"\n4 +0 +1 +rs +complete  rs:2\+1 parity 2/3 nodes")
        got = c.job_start(job, extra="redundancy: rs:2+1")
        self.assertEqual(got, {r: 4 for r in range(3)})
        for r in range(3):
            c.restore_and_verify(job, r, 4, size=SIZE)
        self.assertRegex(c.nodes[2].log_text(),
                         r"restored job=%s step=4 from erasure code rs:2\+1" % job)

    def test_yaml_bad_value_fails(self):
        c = self.make(1, "replication")
        mnt = c.nodes[0].mnt
        with open(os.path.join(mnt, "replicator.yaml"), "w") as f:
            f.write(c.yaml("ecbad", 0, "redundancy: rs:4+2x"))
        failed = os.path.join(mnt, "replicator.failed")
        wait_until(lambda: os.path.exists(failed), 30, "replicator.failed")
        with open(failed) as f:
            text = f.read()
        self.assertIn("redundancy: 'rs:4+2x' is neither 'replication' nor 'rs:K+M' (e.g. rs:4+2)",
                      text)
        c.nodes[0].expect_log(r"rs:4\+2x")

    def test_mismatch_named(self):
        c = Cluster(3, ram_size="256M", restore_timeout=20, extra="redundancy=rs:2+1")
        c.nodes[2].opts = c.nodes[2].opts.replace("redundancy=rs:2+1", "redundancy=replication")
        self.addCleanup(c.close)
        self.c = c
        c.start()
        for d in c.nodes:
            d.expect_log(r"runs redundancy")
        c.job_start("ecmis")
        errs = os.path.join(c.nodes[0].mnt, "replicator.errors")
        wait_until(lambda: os.path.exists(errs), 30, "replicator.errors on node 0")
        with open(errs) as f:
            self.assertRegex(f.read(), r"node \d runs redundancy (replication|rs:2\+1), node \d "
                             r"(rs:2\+1|replication): every node of a job needs the same")

    def test_encoding_cut_short_completed_after_restart(self):
        # as above, but node 5 comes back with its RAMDIR: the job restarts
        # on step 2 (every shard held), the parity left incomplete is
        # rebuilt after the restore, and a later loss is rebuilt from it
        job = "ecfix"
        c = self.encoding_cut_short(job)
        c.nodes[5].start()
        self.assertEqual(c.job_start(job), {r: 2 for r in range(6)})
        self.wait_protected(job, 2)
        self.lose([3])
        self.restart_verify(job, 2, [3])

    # -- modes of a rebuilt shard (issue 22) -----------------------------------

    def test_rebuild_drops_setuid_setgid(self):
        # a shard rebuilt from fragments gets no set-id bit, as restores
        # from a peer or the bucket do: a trainer's 04755 binary must not
        # come back 04755 (a directory keeps its sticky bit)
        c = self.make(3, "rs:2+1")
        job = "ecmode"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(3)})
        modes = {"bin/suid": 0o4755, "bin/sgid": 0o2755}
        for r in range(3):
            tmp = os.path.join(c.nodes[r].mnt, "4.orbax-checkpoint-tmp-%d" % r)
            from cluster import write_shard
            write_shard(tmp, job, 4, r, SIZE)
            os.makedirs(os.path.join(tmp, "bin"))
            os.makedirs(os.path.join(tmp, "shared"))
            harness.write_file(os.path.join(tmp, "shared", "f"), b"in a sticky dir\n")
            for rel, mode in modes.items():
                harness.write_file(os.path.join(tmp, rel), b"#!/bin/sh\n")
                os.chmod(os.path.join(tmp, rel), mode)
            os.chmod(os.path.join(tmp, "shared"), 0o1777)
            harness.write_file(os.path.join(tmp, "commit_success.txt"), b"ok\n")
            os.rename(tmp, os.path.join(c.nodes[r].mnt, "4"))
        self.wait_protected(job, 4)
        st = os.stat(os.path.join(c.nodes[1].mnt, "4", "bin", "suid"))
        self.assertEqual(st.st_mode & 0o7777, 0o4755, "inconclusive: the app's own mode")
        self.lose([1])
        self.restart_verify(job, 4, [1])
        d = os.path.join(c.nodes[1].mnt, "4")
        got = {rel: os.stat(os.path.join(d, rel)).st_mode & 0o7777
               for rel in ("bin/suid", "bin/sgid", "shared")}
        self.assertEqual(got, {"bin/suid": 0o755, "bin/sgid": 0o755, "shared": 0o1777})
        with open(os.path.join(d, "shared", "f"), "rb") as f:
            self.assertEqual(f.read(), b"in a sticky dir\n")

    # -- a node lost right after a job restart (issue 22) ----------------------

    def unprotected_after_restart(self, job):
        """rs:2+1 on 3 nodes, step 1 protected. Node 0 commits step 2 while
        nodes 1 and 2 are stopped (SIGSTOP) and is killed -9 before its
        manifest of step 2 left it (its parity holding of step 2 removed from its RAMDIR: the
        kill came before it was written); nodes 1 and 2 then commit step 2.
        Node 0 comes back with its RAMDIR and the job restarts: every node
        restores step 2 from its own RAM, and no parity of step 2 exists."""
        c = self.make(3, "rs:2+1")
        self.assertEqual(c.job_start(job), {r: 0 for r in range(3)})
        self.save_protected(job, 1)
        for d in c.nodes:
            d.expect_log(EXPECTED + r"|cannot report step")
        for r in (1, 2):
            os.kill(c.nodes[r].proc.pid, signal.SIGSTOP)
        try:
            c.save(job, 2, ranks=[0], size=SIZE)
            wait_until(lambda: "m0.mf" in self.frags(0, job, 2), 30,
                       "node 0's manifest of step 2 written")
            c.nodes[0].kill9()
        finally:
            for r in (1, 2):
                os.kill(c.nodes[r].proc.pid, signal.SIGCONT)
        shutil.rmtree(harness.parity_dir(c.nodes[0].ramdir, job, 2))
        c.save(job, 2, ranks=[1, 2], size=SIZE)
        wait_until(lambda: all(c.holds(r, job).get((r, 2)) in harness.COMMITTED_STATES
                               for r in (1, 2)), 30, "step 2 committed on nodes 1 and 2")
        c.nodes[0].start()
        self.assertEqual(c.job_start(job), {r: 2 for r in range(3)}, "restored from RAM")
        return c

    def step1_kept_unless_2_protected(self, job):
        """Until step 2 is protected on every node, every node still holds
        its step 1 shard and its parity of step 1."""
        c = self.c
        for r in range(3):
            prot2 = all("protected" in self.frags(q, job, 2) for q in range(3))
            if prot2:
                return True
            self.assertIn((r, 1), c.holds(r, job), "node %d dropped step 1 while step 2 "
                          "is not protected on every node" % r)
            self.assertIn("protected", self.frags(r, job, 1),
                          "node %d dropped its parity of step 1" % r)
        return False

    def test_node_lost_right_after_restart(self):
        # the restored step is protected again before older steps go: a
        # node lost right after the restart costs at most that step
        job = "ecrst"
        c = self.unprotected_after_restart(job)
        self.step1_kept_unless_2_protected(job)
        for r in range(3):
            c.restore_and_verify(job, r, 2, size=SIZE)
        self.lose([1])
        got = c.job_start(job)
        step = got[0]
        self.assertEqual(got, {r: step for r in range(3)})
        self.assertIn(step, (1, 2), "a step the code rebuilds, never step 0")
        for r in range(3):
            c.restore_and_verify(job, r, step, size=SIZE)
        self.assertRegex(c.nodes[1].log_text(), r"restored job=%s step=%d from erasure code "
                         % (job, step))

    def test_restored_step_protected_again(self):
        # the step restored without parity gets it after the restart (node
        # 0 sends its manifest again, every node rebuilds its parity), is
        # then the safe step, and step 1 goes; a node lost after that is
        # rebuilt from step 2's parity
        job = "ecrst2"
        c = self.unprotected_after_restart(job)
        self.wait_protected(job, 2)
        wait_until(lambda: all(self.frags(r, job) == ["2"] and (r, 1) not in c.holds(r, job)
                               for r in range(3)), 30, "step 1 dropped once 2 is protected")
        for r in range(3):
            c.restore_and_verify(job, r, 2, size=SIZE)
        self.lose([2])
        self.restart_verify(job, 2, [2])

    # -- the daemon's stop during retries (issue 22) ----------------------------

    def test_unmount_during_retries_is_quick(self):
        # node 0 commits steps 2 and 3 with both other nodes dead: its
        # replication worker retries each manifest send (waits of 1 s, 2 s)
        # for ~6 s per step. An unmount then ends the waits at once: the
        # queued jobs run their current attempt only
        c = self.make(3, "rs:2+1")
        job = "ecstop"
        self.assertEqual(c.job_start(job), {r: 0 for r in range(3)})
        self.save_protected(job, 1)
        for d in c.nodes:
            d.expect_log(EXPECTED + r"|cannot report step")
        for r in (1, 2):
            c.nodes[r].kill9()
        c.save(job, 2, ranks=[0], size=SIZE)
        c.save(job, 3, ranks=[0], size=SIZE)
        wait_until(lambda: re.search(r"committed job=%s step=3 rank=0" % job,
                                     c.nodes[0].log_text()), 30, "node 0 committed step 3")
        t0 = time.monotonic()
        c.nodes[0].stop()
        secs = time.monotonic() - t0
        print("unmount with retries pending: %.2f s" % secs)
        self.assertLess(secs, 5.0, "unmount waited for the retries")

    def test_unmount_during_push_retries_is_quick(self):
        # the same under replication: node 0's pushes of steps 2, 3, 4 to
        # the dead node 1 are each retried after 1 s, 2 s, 4 s
        c = Cluster(2, ram_size="256M", restore_timeout=20)
        for d in c.nodes:
            d.extra_args.append("-d")
        self.addCleanup(c.close)
        c.start()
        job = "replstop"
        self.assertEqual(c.job_start(job), {0: 0, 1: 0})
        c.save(job, 1, size=SIZE)
        c.wait_replicated(job, 1)
        for d in c.nodes:
            d.expect_log(r"replicating job=.* failed|cannot report step|connect|"
                         r"Connection refused|could not be replicated")
        c.nodes[1].kill9()
        for step in (2, 3, 4):
            c.save(job, step, ranks=[0], size=SIZE)
        wait_until(lambda: re.search(r"committed job=%s step=4 rank=0" % job,
                                     c.nodes[0].log_text()), 30, "node 0 committed step 4")
        wait_until(lambda: re.search(r"replicating job=%s step=2 to rank 1 failed" % job,
                                     c.nodes[0].log_text()), 30, "node 0's first push failed")
        t0 = time.monotonic()
        c.nodes[0].stop()
        secs = time.monotonic() - t0
        print("unmount with push retries pending: %.2f s" % secs)
        self.assertLess(secs, 2.0, "unmount waited for the push retries")

    # -- data parallelism ------------------------------------------------------

    def dp_save(self, job, step, part, size=SIZE):
        """Every node saves its column's shard: twins r and r + part write
        the same bytes (as data-parallel replicas do)."""
        for r in range(self.c.n):
            save_step(self.c.nodes[r].mnt, job, step, r % part, size)

    def dp_verify(self, job, step, part, size=SIZE):
        c = self.c
        for r in range(c.n):
            mnt = c.nodes[r].mnt
            ms = [x for x in os.listdir(mnt)
                  if x.endswith(".restore") and "-s%d-" % step in x]
            self.assertTrue(ms, "node %d's markers: %s" % (r, os.listdir(mnt)))
            os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, str(step)))
            for rel, data in shard_files(job, step, r % part, size).items():
                with open(os.path.join(mnt, str(step), rel), "rb") as f:
                    self.assertTrue(f.read() == data,
                                    "node %d step %d %s differs" % (r, step, rel))

    def test_data_parallel_twins(self):
        # 6 nodes, assume-data-parallelism 2: columns {0,3} {1,4} {2,5}
        # hold identical shards; rs:2+1 over the 3 units (representatives
        # 0, 1, 2). A twin encodes nothing and stores no parity; a lost
        # node whose twin lives is restored from the twin; a unit whose
        # both copies are lost is rebuilt from the code.
        n, part, size = 6, 3, 1 << 20
        c = self.make(n, "rs:2+1")
        dp = "assume-data-parallelism: 2"
        job = "ecdp"
        self.assertEqual(c.job_start(job, extra=dp), {r: 0 for r in range(n)})
        step = 1
        self.dp_save(job, step, part, size)
        reps, twins = range(part), range(part, n)
        self.wait_protected(job, step, ranks=reps)
        wait_until(lambda: all(re.search(r"ec: job=%s step=%d sent" % (job, step),
                                         c.nodes[r].log_text()) and
                               not [x for x in self.frags(r, job, step) if x.endswith(".tmp")]
                               for r in reps), 60, "fragments sent")
        wait_until(lambda: all(c.holds(r, job).get((r, step)) in harness.COMMITTED_STATES
                               for r in range(n)), 30, "every node's step %d committed" % step)
        S = sum(len(v) for v in shard_files(job, step, 0, size).values())
        for r in reps:
            frs = [x for x in self.frags(r, job, step) if x.endswith(".frag")]
            self.assertEqual(len(frs), 1, "representative %d's parity: %s" % (r, frs))
        for r in twins:
            # identical shards are not encoded twice: no manifest, no
            # fragment, nothing sent from a twin
            self.assertEqual(self.frags(r, job), [], "twin %d's parity holdings" % r)
            self.assertNotRegex(c.nodes[r].log_text(), r"ec: job=%s step=\d+ sent" % job)
        for r in range(n):
            held = du(os.path.join(c.nodes[r].ramdir, "shards", job))   # parity too
            goal = 1.5 if r < part else 1.0
            print("dp rs:2+1 node %d: %.3f x S (goal %.3f)" % (r, held / S, goal))
            self.assertLess(abs(held / S - goal), 0.1 * goal, "node %d" % r)
        # a twin lost: restored from its representative; a representative
        # lost: restored from its twin; both copies of a unit lost (with
        # or without another unit's node): rebuilt from the code
        for lost, from_code in (([4], []), ([0], []), ([2, 3], []),
                                ([1, 4], [1]), ([0, 3, 5], [0])):
            step += 1
            self.dp_save(job, step, part, size)
            self.wait_protected(job, step, ranks=reps)
            logpos = {r: len(c.nodes[r].log_text()) for r in lost}
            self.lose(lost)
            got = c.job_start(job, extra=dp)
            self.assertEqual(got, {r: step for r in range(n)}, "lost %s" % lost)
            self.dp_verify(job, step, part, size)
            for r in lost:
                log = c.nodes[r].log_text()[logpos[r]:]
                if r in from_code:
                    self.assertRegex(log, r"restored job=%s step=%d from erasure code rs:2\+1"
                                     % (job, step), "node %d's log (lost %s)" % (r, lost))
                else:
                    m = re.search(r"restored job=%s step=%d from (rank (\d+)|erasure code)"
                                  % (job, step), log)
                    self.assertTrue(m, "node %d's log (lost %s)" % (r, lost))
                    if r not in from_code and (r + part) % n not in lost:
                        self.assertEqual(m.group(1), "rank %d" % ((r + part) % n),
                                         "node %d restored from its twin (lost %s)" % (r, lost))
            # the representatives rebuild their parity; a twin stores none
            # (it would be the second copy of its representative's)
            self.wait_protected(job, step, ranks=reps)
            for r in reps:
                wait_until(lambda: len([x for x in self.frags(r, job, step)
                                        if x.endswith(".frag")]) == 1, 30,
                           "representative %d's parity of step %d" % (r, step))
            for r in twins:
                frs = [x for x in self.frags(r, job, step) if x.endswith(".frag")]
                self.assertEqual(frs, [], "twin %d's parity of step %d (lost %s)"
                                 % (r, step, lost))

    # -- RAM -------------------------------------------------------------------

    def test_ram_per_node(self):
        size = 2 << 20
        for red, k, m, n in (("rs:4+1", 4, 1, 5), ("rs:4+2", 4, 2, 6)):
            with self.subTest(red=red):
                c = self.make(n, red)
                job = "ecram%d" % m
                self.assertEqual(c.job_start(job), {r: 0 for r in range(n)})
                self.save_protected(job, 3, size=size)
                # and every node done sending (its data fragment in flight
                # is a temporary file of S/K)
                wait_until(lambda: all(re.search(r"ec: job=%s step=3 sent" % job,
                                                 c.nodes[r].log_text()) and
                                       not [x for x in self.frags(r, job, 3) if x.endswith(".tmp")]
                                       for r in range(n)), 60, "fragments sent")
                S = sum(len(v) for v in shard_files(job, 3, 0, size).values())
                for r in range(n):
                    held = du(os.path.join(c.nodes[r].ramdir, "shards", job))   # parity too
                    ratio = held / S
                    print("%s node %d: %.3f x S (goal %.3f)" % (red, r, ratio, 1 + m / k))
                    self.assertLess(abs(ratio - (1 + m / k)), 0.1 * (1 + m / k))
                c.close()


def subprocess_admin(args):
    """(exit code, stdout) of mtcfs-admin ARGS."""
    import subprocess
    r = subprocess.run([harness.MTCFS_ADMIN] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    return r.returncode, r.stdout.decode()


def du_trees(paths):
    """Bytes of the files under paths, each inode once (shards are hard
    links of the namespace's files)."""
    seen, total = set(), 0
    for path in paths:
        for root, dirs, files in os.walk(path):
            for f in files:
                st = os.lstat(os.path.join(root, f))
                if st.st_ino in seen:
                    continue
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total


def du(path):
    return du_trees([path])


if __name__ == "__main__":
    harness.main()
