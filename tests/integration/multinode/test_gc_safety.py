"""Garbage collection of older steps waits for the newer step's replicas.

A node drops its steps (own shards and replicas) older than step N only
once N is committed on every node AND every node has pushed its shard of N
to its peers. Before that, a node lost with its RAM would leave no
complete step in the cluster: the older step must survive the window
between "N committed everywhere" and "N replicated everywhere".

- test_window_older_step_survives_until_replicated: 2 nodes, each in its
  own network namespace (tests/fault/matrix.py's Net: a hub bridge, links
  shaped with tc tbf). Step 10 is saved and replicated; the link of node 1
  is slowed to 8 Mbit/s and step 20 (15 MiB shards) is saved on both.
  Once the coordinator says step 20 is complete on all nodes, and while no
  replica of step 20 exists anywhere, node 0 must keep its own step 10 and
  node 1's replica of it (node 1 likewise). Node 1 is then killed -9 and
  wiped, the link healed, node 1 restarted, the job restarted: every node
  restores step 10 with the bytes it wrote. Without network namespaces
  (no CAP_NET_ADMIN, no veth/tc) the test is skipped: nothing else delays
  one node's replication without shaping the whole host's loopback.
- test_normal_link_gc_after_replication: 2 nodes on loopback; steps 10 and
  20; once 20 is replicated both ways, step 10 disappears from both nodes
  (own shards and replicas), and no node dropped it before every push of
  step 20 was done (log timestamps).
- test_stop_gives_waiting_pushes_a_last_try: a daemon stopped while the
  push of its newest step waits for a retry pushes it once more before it
  exits (its peer is back by then), and logs what protects each job's
  newest step (replicated, or NOT protected with the peer away).
- test_node_lost_right_after_restart / test_restored_step_replicated_again
  (issue 22): 3 nodes; node 0 commits step 20 while nodes 1 and 2 are
  stopped (SIGSTOP: its push cannot even authenticate) and is killed -9;
  nodes 1 and 2 commit step 20; node 0 comes back with its RAMDIR and the
  job restores step 20 from RAM, node 0's shard of it held only by node 0.
  Step 10 must stay everywhere until step 20 is replicated again (the
  restart pushes each node's restored shard to its peers again); node 0
  lost right after the restart costs at most step 20, never both.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \\
     /usr/bin/python3 tests/integration/multinode/test_gc_safety.py [-k NAME]
"""

import os
import re
import signal
import socket
import sys
import threading
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
sys.path.insert(1, os.path.join(os.path.dirname(INTEG), "fault"))
import harness  # noqa: E402
from harness import wait_until, admin_ls  # noqa: E402
from cluster import Cluster, MiB  # noqa: E402
import matrix  # noqa: E402  (definitions only; its main() is not run)
# the wire's frames and MACs (a peer that stalls after its handshake)
sys.path.insert(2, os.path.join(INTEG, "security"))
import test_peer_security as wire  # noqa: E402

OLD, NEW = 10, 20
BIG = 12 * MiB            # params 12 MiB + opt 3 MiB: a 15 MiB shard
SLOW_MBIT = 8             # 1 MB/s: ~15 s to push one step-20 shard
HOLD = 2.0                # seconds step 10 must stay after the LKG moved
# With the daemon killed, the kernel still delivers what sits in its socket
# buffer (tcp_wmem max, 4 MiB by default): the shard is well above that, so
# node 1's step 20 never reaches node 0 whole.
TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ")


class Net2(matrix.Net):
    """matrix.Net with the two node namespaces this file needs."""
    MAX_NODES = 2


class _NetReaper:
    """Puts the namespaces on the harness's reap list: they are removed by
    the test's cleanup, at exit and on SIGTERM/SIGHUP like the daemons."""

    def __init__(self, net):
        self.net = net
        harness._LIVE.add(self)

    def close(self):
        harness._LIVE.discard(self)
        try:
            self.net.heal_all()
        finally:
            self.net.close()


class NsDaemon(harness.Daemon):
    """A harness daemon started inside a network namespace (nsenter --net
    execs mtcfs: the pid is the daemon's; mounts stay in the host's mount
    namespace, so the test sees the FUSE mount and RAMDIR as usual)."""

    def __init__(self, *a, wrap=(), **kw):
        super().__init__(*a, **kw)
        self.wrap = list(wrap)

    def argv(self):
        return self.wrap + super().argv()


class NetCluster(Cluster):
    """cluster.Cluster whose node r listens on its namespace's address."""

    def __init__(self, n, net, ram_size="1G", restore_timeout=15):
        super().__init__(n, ram_size=ram_size, restore_timeout=restore_timeout,
                         hosts=[net.addr(r) for r in range(n)],
                         make_node=lambda r, **kw: NsDaemon(wrap=net.wrap(r), **kw))


def _ts(line):
    m = TS.match(line)
    return m.group(1) if m else None


class GcSafety(unittest.TestCase):

    def track(self, c):
        for d in c.nodes:
            d.extra_args.append("-d")      # INFO lines: the test reads them
        self.daemons = list(c.nodes)
        self.addCleanup(c.close)
        self.c = c
        return c

    def held(self, r, job):
        """{(owner, step)} node r holds committed (own shard or replica)."""
        return {(s["rank"], s["step"])
                for s in admin_ls(self.c.nodes[r].ramdir)["shards"]
                if s["job"] == job and s["state"] in harness.COMMITTED_STATES}

    def log_has(self, r, regex):
        return re.search(regex, self.c.nodes[r].log_text(), re.M)

    # -- 1: the window between "committed everywhere" and "replicated" -------

    def test_window_older_step_survives_until_replicated(self):
        if os.geteuid() != 0:
            self.skipTest("needs root (network namespaces, tc)")
        net = Net2()
        if net.mode != "netns":
            self.skipTest("cannot shape one node's link: %s" % net.why_not)
        self.addCleanup(_NetReaper(net).close)
        job = "gcwin"
        c = self.track(NetCluster(2, net))
        # cleanups run last-in first-out: the link is healed before the
        # daemons stop, so none of them waits on a push at 1 MB/s
        self.addCleanup(net.heal_all)
        c.start()
        self.assertEqual(c.job_start(job), {0: 0, 1: 0}, "fresh job start")
        c.save(job, OLD)
        c.wait_replicated(job, OLD)
        for r in range(2):
            self.assertLessEqual({(0, OLD), (1, OLD)}, self.held(r, job),
                                 "node %d after step %d was replicated"
                                 % (r, OLD))

        net.slow(1, SLOW_MBIT)
        t0 = time.monotonic()
        c.save(job, NEW, size=BIG)
        wait_until(lambda: self.log_has(
            0, r"INFO coord: job %s: step %d is complete on all 2 nodes"
            % (job, NEW)), 30, "node 0's coordinator: step %d complete on "
            "all nodes" % NEW, check=c.nodes[0].check_alive)
        for r in range(2):
            # the LKG reached the node's engine: its routine GC has run
            wait_until(lambda: self.log_has(
                r, r"INFO engine: job %s: step %d complete on every node"
                % (job, NEW)), 15, "node %d learns step %d is complete on "
                "every node" % (r, NEW), check=c.nodes[r].check_alive)
        t_lkg = time.monotonic() - t0

        def replica_of_new():
            """Evidence that a replica of step 20 exists (log or catalog)."""
            out = []
            for r in range(2):
                m = self.log_has(r, r"^.*replica job=%s step=%d .*$"
                                 % (job, NEW))
                if m:
                    out.append("node %d log: %s" % (r, m.group(0)))
                if (1 - r, NEW) in self.held(r, job):
                    out.append("node %d holds node %d's step %d"
                               % (r, 1 - r, NEW))
            return out

        def inconclusive(when):
            ev = replica_of_new()
            if ev:
                self.fail("inconclusive: a replica of step %d already exists "
                          "%s (%.1f s after the save): the link was not slow "
                          "enough (%d Mbit/s, %d MiB shards): %s"
                          % (NEW, when, time.monotonic() - t0, SLOW_MBIT,
                             BIG * 5 // 4 // MiB, "; ".join(ev)))
        inconclusive("when the coordinator declared it complete")

        # For HOLD seconds after every node learned that step 20 is complete
        # everywhere, with no replica of 20 anywhere, step 10 stays complete:
        # node 0 keeps its own shard and node 1's replica (node 1 likewise).
        want = {0: {(0, OLD), (1, OLD)}, 1: {(1, OLD), (0, OLD)}}
        deadline = time.monotonic() + HOLD
        while True:
            for r in (0, 1):
                have = self.held(r, job)
                missing = want[r] - have
                if missing:
                    inconclusive("after node %d dropped step %d" % (r, OLD))
                    self.fail(
                        "node %d has dropped step %d while no replica of step "
                        "%d exists yet (step %d complete on every node %.1f s "
                        "after the save): missing %s; it holds %s. Step %d "
                        "was the only complete step: a node lost now leaves "
                        "nothing to restore. gc log: %s"
                        % (r, OLD, NEW, NEW, t_lkg,
                           ", ".join("%s step %d" % (
                               "its own" if o == r else "node %d's" % o, s)
                               for o, s in sorted(missing)),
                           sorted(have), OLD,
                           re.findall(r"^.*INFO gc: dropped.*step=%d .*$"
                                      % OLD, c.nodes[r].log_text(), re.M)))
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        inconclusive("at the end of the %.0f s hold" % HOLD)

        # node 1 is lost with its RAM; its step 20 exists nowhere else
        c.nodes[1].kill9()
        c.nodes[1].wipe_ramdir()
        net.heal(1)
        c.nodes[1].start()
        self.assertNotIn((1, NEW), self.held(0, job),
                         "inconclusive: node 1's step %d reached node 0 whole "
                         "after node 1 was killed" % NEW)
        # node 0 may log that its step 20 could not reach the dead node 1
        c.nodes[0].expect_log(r"job %s step %d: could not be replicated"
                              % (job, NEW))
        got = c.job_start(job)
        self.assertEqual(got, {0: OLD, 1: OLD},
                         "restored step per node after node 1 was wiped "
                         "(step %d is incomplete, step %d must still be "
                         "complete)" % (NEW, OLD))
        for r in range(2):
            c.restore_and_verify(job, r, OLD)
        m = self.log_has(1, r"restore job=%s step=%d source=(\w+)"
                         % (job, OLD))
        self.assertTrue(m and m.group(1) == "peer",
                        "node 1 restores step %d from its peer: %s"
                        % (OLD, m and m.group(0)))

    # -- 2: the normal path: GC still happens, after replication ------------

    def test_normal_link_gc_after_replication(self):
        job = "gcnorm"
        c = self.track(Cluster(2))
        c.start()
        self.assertEqual(c.job_start(job), {0: 0, 1: 0}, "fresh job start")
        c.save(job, OLD)
        c.save(job, NEW)
        c.wait_replicated(job, NEW)
        last = {}

        def old_gone():
            h = {r: self.held(r, job) for r in range(2)}
            last["h"] = h
            return all(st != OLD for r in h for _, st in h[r])
        try:
            wait_until(old_gone, 30, "step %d dropped on both nodes" % OLD)
        except AssertionError as e:
            self.fail("%s: still held (owner, step) per node: %s"
                      % (e, last.get("h")))
        for r in range(2):
            self.assertEqual(self.held(r, job), {(0, NEW), (1, NEW)},
                             "node %d keeps step %d, own and replica"
                             % (r, NEW))
        # no node dropped step 10 before both pushes of step 20 were done
        pushed = []
        for r in range(2):
            m = self.log_has(r, r"^.*INFO engine: replicated job=%s step=%d "
                             r"to rank %d .*$" % (job, NEW, 1 - r))
            self.assertTrue(m, "node %d logs its push of step %d" % (r, NEW))
            pushed.append(_ts(m.group(0)))
        for r in range(2):
            def drop_lines():
                d = re.findall(r"^.*INFO gc: dropped (?:replica )?job=%s "
                               r"step=%d .*$" % (job, OLD),
                               c.nodes[r].log_text(), re.M)
                return d if len(d) == 2 else None
            # the catalog forgets a shard just before the line is logged
            drops = wait_until(drop_lines, 10, "node %d logs the drops of "
                               "its own step %d and its replica" % (r, OLD))
            for d in drops:
                self.assertGreaterEqual(
                    _ts(d), max(pushed),
                    "node %d dropped step %d before every push of step %d "
                    "was done (pushes done at %s): %s"
                    % (r, OLD, NEW, pushed, d))


    # -- 2b: a stop (node drain, preemption) protects first ------------------

    def test_stop_gives_waiting_pushes_a_last_try(self):
        """A daemon stopped (SIGTERM: a node drain or a preemption) while a
        push of its newest step waits to be retried gives it one last try
        before it exits, and says what protects each job's newest step:
        node 1 is away while node 0 commits step 20 (its pushes fail; the
        next retry is 8 s off), node 1 comes back, node 0 gets SIGTERM at
        once: node 1 holds node 0's step 20 (before, the waiting push was
        dropped at the stop), and node 0's log says step 20 is replicated.
        Stopped again with its peer away, a node says its newest step is
        NOT protected."""
        job = "gcstop"
        c = self.track(Cluster(2))
        c.start()
        self.assertEqual(c.job_start(job), {0: 0, 1: 0}, "fresh job start")
        c.save(job, OLD)
        c.wait_replicated(job, OLD)
        node0, node1 = c.nodes
        for d in c.nodes:
            d.expect_log(r"cannot report step|replicating job=.* failed|"
                         r"could not be replicated")
        node1.stop()
        mark = node0.log_size()
        c.save(job, NEW, ranks=[0])
        # attempts at 0, 1, 3 and 7 s: the next one is 8 s after the fourth
        wait_until(lambda: len(re.findall(r"replicating job=%s step=%d to rank 1 failed"
                                          % (job, NEW), node0.log_from(mark))) >= 4,
                   30, "node 0's fourth push of step %d failing" % NEW)
        node1.start()
        self.assertNotIn((0, NEW), self.held(1, job), "inconclusive: pushed before the stop")
        t0 = time.monotonic()
        os.kill(node0.proc.pid, signal.SIGTERM)   # what the kubelet sends on a drain
        wait_until(lambda: node0.proc.poll() is not None, 20, "node 0 exiting on SIGTERM")
        self.assertLess(time.monotonic() - t0, 10, "the stop waited")
        node0.stop()      # reaps it, checks its log and exit code
        log = node0.log_from(mark)
        self.assertRegex(log, r"stopping: job=%s step=%d is not replicated to every peer yet: "
                         r"one last push" % (job, NEW))
        self.assertRegex(log, r"INFO engine: replicated job=%s step=%d to rank 1 " % (job, NEW))
        self.assertRegex(log, r"INFO engine: stopping: job=%s step=%d \(this node's newest\) "
                         r"is replicated to its peers" % (job, NEW))
        self.assertIn((0, NEW), self.held(1, job), "node 1 holds node 0's step %d" % NEW)
        # node 1 away again: node 1's own newest step (it holds only 10 of
        # its own) was replicated; a step 30 of node 1's alone is not
        node0.start()
        node0.stop()
        mark1 = node1.log_size()
        c.save(job, 30, ranks=[1])
        wait_until(lambda: re.search(r"replicating job=%s step=30 to rank 0 failed" % job,
                                     node1.log_from(mark1)), 30, "node 1's push of step 30 failing")
        node1.stop()
        self.assertRegex(node1.log_from(mark1),
                         r"WARN engine: stopping: job=%s step=30 \(this node's newest\) is NOT "
                         r"protected: this node holds its only copy" % job)

    def test_stop_cuts_last_pushes_at_stop_timeout(self):
        """A peer that accepts a push and then stops answering (a wedged
        process, a half-open connection) held a stopping daemon up to the
        60 s a push waits for an answer: past the 30 s of a drain's or a
        preemption's grace it is killed before it says what protects its
        steps. With stop_timeout=3 the stop cuts the push at 3 s and the
        report is out: node 1 is replaced by a listener that does the
        handshake with the cluster's secret, reads the push request of node
        0's step 20 and never answers; SIGTERM to node 0 ends it within
        10 s, its log says the push was cut and that step 20 is NOT
        protected."""
        job = "gccut"
        c = self.track(Cluster(2, extra="stop_timeout=3"))
        c.start()
        self.assertEqual(c.job_start(job), {0: 0, 1: 0}, "fresh job start")
        c.save(job, OLD)
        c.wait_replicated(job, OLD)
        node0, node1 = c.nodes
        node0.expect_log(r"cannot report step|replicating job=.* failed|could not be replicated|"
                         r"last pushes are still running")
        secret = wire.read_secret(c.secret)
        host, port = c.addrs[1].rsplit(":", 1)
        node1.stop()
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((host, int(port)))
        ls.listen(16)
        held, pushed = [], threading.Event()
        self.addCleanup(lambda: [x.close() for x in held + [ls]])

        def stall():
            while True:
                try:
                    s, _ = ls.accept()
                except OSError:
                    return
                held.append(s)
                w = wire.Wire.__new__(wire.Wire)
                w.sock = s
                try:
                    nonce_s = os.urandom(wire.NONCE_LEN)
                    w.send(wire.frame(wire.NT_CHALLENGE, nonce_s))
                    ftype, _, hello = w.recv_json()
                    nonce_c = bytes.fromhex(hello["nonce"])
                    w.send(wire.frame(wire.NT_WELCOME, {
                        "rank": 1, "mac": wire.welcome_mac(secret, nonce_c, nonce_s, 1).hex()}))
                    ftype, _, req = w.recv_json()
                    if req.get("op") == "push" and req.get("key", {}).get("step") == NEW:
                        pushed.set()
                except (OSError, AssertionError, ValueError, KeyError, wire.Closed,
                        wire.Refused):
                    pass        # the connection stays open, unanswered
        threading.Thread(target=stall, daemon=True).start()
        mark = node0.log_size()
        c.save(job, NEW, ranks=[0])
        self.assertTrue(pushed.wait(30), "node 0's push of step %d reaching the listener" % NEW)
        t0 = time.monotonic()
        os.kill(node0.proc.pid, signal.SIGTERM)
        wait_until(lambda: node0.proc.poll() is not None, 60, "node 0 exiting on SIGTERM")
        took = time.monotonic() - t0
        node0.stop()
        log = node0.log_from(mark)
        self.assertLess(took, 10, "the stop waited %.1f s for a peer that never answers" % took)
        self.assertRegex(log, r"WARN engine: stopping: the last pushes are still running after "
                         r"the stop budget \(stop_timeout=3 s\): cut")
        self.assertRegex(log, r"WARN engine: stopping: job=%s step=%d \(this node's newest\) is "
                         r"NOT protected" % (job, NEW))

    # -- 3: a node lost right after a job restart (issue 22) -----------------

    def unreplicated_after_restart(self, job):
        c = self.track(Cluster(3))
        c.start()
        self.assertEqual(c.job_start(job), {r: 0 for r in range(3)}, "fresh job start")
        c.save(job, OLD)
        c.wait_replicated(job, OLD)
        for d in c.nodes:
            d.expect_log(r"cannot report step|could not be replicated|"
                         r"replicating job=.* failed")
        for r in (1, 2):
            os.kill(c.nodes[r].proc.pid, signal.SIGSTOP)
        try:
            c.save(job, NEW, ranks=[0])
            wait_until(lambda: (0, NEW) in self.held(0, job), 30,
                       "node 0 committed step %d" % NEW)
            c.nodes[0].kill9()
        finally:
            for r in (1, 2):
                os.kill(c.nodes[r].proc.pid, signal.SIGCONT)
        c.save(job, NEW, ranks=[1, 2])
        wait_until(lambda: all((r, NEW) in self.held(r, job) for r in (1, 2)), 30,
                   "step %d committed on nodes 1 and 2" % NEW)
        for r in (1, 2):
            self.assertNotIn((0, NEW), self.held(r, job),
                             "inconclusive: node 0's step %d reached node %d" % (NEW, r))
        c.nodes[0].start()
        self.assertEqual(c.job_start(job), {r: NEW for r in range(3)}, "restored from RAM")
        return c

    def test_node_lost_right_after_restart(self):
        job = "gcrst"
        c = self.unreplicated_after_restart(job)
        # until node 0's shard of step 20 is held by another node again,
        # every node keeps step 10 (its own, and its replicas)
        h = {r: self.held(r, job) for r in range(3)}
        if not any((0, NEW) in h[r] for r in (1, 2)):
            for r in range(3):
                self.assertIn((r, OLD), h[r], "node %d dropped step %d while node 0's "
                              "step %d is held by node 0 only: %s" % (r, OLD, NEW, h))
        for r in range(3):
            c.restore_and_verify(job, r, NEW)
        c.nodes[0].kill9()
        c.nodes[0].wipe_ramdir()
        c.nodes[0].start()
        got = c.job_start(job)
        step = got[0]
        self.assertEqual(got, {r: step for r in range(3)})
        self.assertIn(step, (OLD, NEW), "a step the copies left allow, never nothing")
        for r in range(3):
            c.restore_and_verify(job, r, step)

    def test_restored_step_replicated_again(self):
        job = "gcrst2"
        c = self.unreplicated_after_restart(job)
        wait_until(lambda: any((0, NEW) in self.held(r, job) for r in (1, 2)), 30,
                   "node 0's restored step %d pushed to its peer again" % NEW)
        wait_until(lambda: all(st == NEW for r in range(3) for _, st in self.held(r, job)),
                   30, "step %d dropped once step %d is replicated again" % (OLD, NEW))
        self.assertRegex(c.nodes[0].log_text(), r"job %s step %d: the restored shard is replicated "
                         r"again \(peers: 1\)" % (job, NEW))
        c.nodes[0].kill9()
        c.nodes[0].wipe_ramdir()
        c.nodes[0].start()
        self.assertEqual(c.job_start(job), {r: NEW for r in range(3)})
        for r in range(3):
            c.restore_and_verify(job, r, NEW)

if __name__ == "__main__":
    harness.main()
