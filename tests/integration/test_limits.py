"""Limits and lifetimes of the daemon (issue 13):

- a mount that never served a request still exits promptly on SIGTERM and
  on fusermount3 -u (the read-ahead tuner used to wait for a first request
  forever: docker stop / Kubernetes hung);
- a second daemon on the same RAMDIR refuses to start and names the PID of
  the first (RAMDIR/mtcfs.lock);
- a connection flood on the peer port (no secret) neither breaks the mount
  nor keeps a legitimate peer out;
- sparse files stay sparse on replicas and through a restore from a peer.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/test_limits.py [-k NAME]
"""

import os
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import wait_until, mount_fstype  # noqa: E402
from cluster import Cluster  # noqa: E402
import test_peer_security as wire  # noqa: E402

EXIT_DEADLINE = 5.0


def serving_loop(pid):
    """True once a thread of pid waits in the FUSE device read: the daemon
    is in its request loop (start-up is over). Looked at from /proc, so
    it sends the mount no request."""
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return False
    for t in tids:
        try:
            with open("/proc/%d/task/%s/wchan" % (pid, t)) as f:
                if f.read().strip() == "fuse_dev_do_read":
                    return True
        except OSError:
            pass
    return False


def mounted_at(real_mnt):
    """Is a FUSE mount of mtcfs at real_mnt (already resolved)? Reads
    /proc/mounts only: harness.mount_fstype() resolves the path, and a stat
    of the mount root is a request to the daemon."""
    with open("/proc/mounts") as f:
        return any(ln.split()[1:3] == [real_mnt, "fuse.mtcfs"] for ln in f)


class Lifetime(harness.MountTestCase):
    """The daemon's start and end, with no request ever served."""
    START = False

    def setUp(self):
        super().setUp()
        d = self.fs
        real = os.path.realpath(d.mnt)
        log = open(d.log_path, "ab")
        self.addCleanup(log.close)
        d.proc = subprocess.Popen(d.argv(), stdin=subprocess.DEVNULL,
                                  stdout=log, stderr=log, env=d.env,
                                  start_new_session=True)
        wait_until(lambda: mounted_at(real), 30, "mounted", check=d.check_alive)
        wait_until(lambda: serving_loop(d.proc.pid), 30,
                   "the daemon in its FUSE loop", check=d.check_alive)

    def _wait_exit(self, what):
        proc = self.fs.proc
        try:
            rc = proc.wait(EXIT_DEADLINE)
        except subprocess.TimeoutExpired:
            self.fail("daemon still running %.0fs after %s of an unused mount"
                      % (EXIT_DEADLINE, what))
        self.fs.proc = None
        return rc

    def test_sigterm_without_any_request_exits(self):
        # nothing touches the mount: not even a stat (that would be a request)
        os.kill(self.fs.proc.pid, signal.SIGTERM)
        rc = self._wait_exit("SIGTERM")
        self.assertEqual(rc, 0)
        wait_until(lambda: mount_fstype(self.mnt) is None, EXIT_DEADLINE,
                   "the mount gone after SIGTERM")

    def test_unmount_without_any_request_exits(self):
        r = subprocess.run(["fusermount3", "-u", self.mnt],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.assertEqual(r.returncode, 0, r.stdout)
        rc = self._wait_exit("fusermount3 -u")
        self.assertEqual(rc, 0)
        self.assertIsNone(mount_fstype(self.mnt))

    def test_second_daemon_on_same_ramdir_refused(self):
        with open(os.path.join(self.mnt, "probe"), "wb") as f:
            f.write(b"first")
        other = self.new_daemon(ramdir=self.ramdir, name="second")
        with open(other.log_path, "wb") as log:
            p = subprocess.Popen(other.argv(), stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=log, start_new_session=True)
        try:
            rc = p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            harness.force_unmount(other.mnt)
            self.fail("a second daemon runs on the RAMDIR of the first")
        out = other.log_text()
        self.assertNotEqual(rc, 0, out)
        self.assertIn("RAMDIR %s is in use by another mtcfs (pid %d"
                      % (os.path.realpath(self.ramdir), self.fs.proc.pid), out)
        self.assertIsNone(mount_fstype(other.mnt), "the second one mounted")
        # the first one is unharmed
        with open(os.path.join(self.mnt, "probe"), "rb") as f:
            self.assertEqual(f.read(), b"first")
        # and once it is gone, the RAMDIR is free again
        self.fs.stop()
        other.start()
        with open(os.path.join(other.mnt, "probe"), "rb") as f:
            self.assertEqual(f.read(), b"first")
        with open(os.path.join(self.ramdir, "mtcfs.lock")) as f:
            self.assertEqual(f.read().strip(), str(other.proc.pid))

    def test_splice_only_with_big_enough_pipes(self):
        # what the daemon can get, probed the same way (F_SETPIPE_SZ = 1031)
        import fcntl
        r, w = os.pipe()
        try:
            ok = fcntl.fcntl(r, 1031, (1 << 20) + 8192) > (1 << 20)
        except OSError:
            ok = False
        finally:
            os.close(r)
            os.close(w)
        # the mount serves a 1 MiB write and read either way
        data = os.urandom(1 << 20)
        harness.write_file(os.path.join(self.mnt, "big"), data)
        self.assertEqual(harness.read_file(os.path.join(self.mnt, "big")), data)
        log = self.fs.log_text()
        if ok:
            self.assertNotIn("cannot make pipes", log)
        else:
            self.assertIn("splice is not requested", log)


# --- connection flood ---------------------------------------------------------

FLOOD_NOFILE = 1024            # the flooded daemon's open-file limit
FLOOD_SOURCES = ["127.0.0.%d" % i for i in range(11, 15)]
FLOOD_PER_SOURCE = 300         # 1200 attempts: above both bounds and the limit


def flood_one(addr, src):
    """One connection from src that passes HELLO (no secret: zero MAC).
    Returns the socket, or None when the server closed it at once; raises
    socket.timeout when the server does not answer (its accept stalled)."""
    host, port = addr.rsplit(":", 1)
    s = socket.socket()
    try:
        s.settimeout(2.0)
        s.bind((src, 0))
        s.connect((host, int(port)))
        w = wire.Wire.__new__(wire.Wire)
        w.sock = s
        w.handshake(None, rank=-1, purpose="control")
        return s
    except (wire.Closed, ConnectionError):
        s.close()
        return None
    except BaseException:
        s.close()
        raise


def flood(addr):
    """Bounded flood: FLOOD_PER_SOURCE connections from each source; stops
    by itself, also after 3 unanswered ones. (held sockets, refused,
    stalled)."""
    held, refused, stalled = [], 0, 0
    for src in FLOOD_SOURCES:
        for _ in range(FLOOD_PER_SOURCE):
            try:
                s = flood_one(addr, src)
            except socket.timeout:
                stalled += 1
                if stalled >= 3:
                    return held, refused, stalled
                continue
            if s is None:
                refused += 1
            else:
                held.append(s)
    return held, refused, stalled


class Flood(unittest.TestCase):
    def test_flood_without_secret_keeps_mount_and_peers_working(self):
        c = Cluster(2, secret=False)
        self.addCleanup(c.close)
        n0 = c.nodes[0]
        plain_argv = n0.argv
        n0.argv = lambda: ["prlimit", "--nofile=%d:%d" % (FLOOD_NOFILE, FLOOD_NOFILE),
                           "--"] + plain_argv()
        self.daemons = c.nodes
        c.start()
        c.job_start("flood")
        c.save("flood", 1)
        c.wait_replicated("flood", 1)

        held, refused, stalled = flood(c.addrs[0])
        sys.stderr.write("flood: %d held, %d refused, %d stalled\n" % (len(held), refused, stalled))
        try:
            # the mount still works while the flood holds its connections
            for i in range(20):
                p = os.path.join(n0.mnt, "after-flood-%d" % i)
                harness.write_file(p, b"x%d" % i * 1000)
                self.assertEqual(harness.read_file(p), b"x%d" % i * 1000)
            self.assertEqual(stalled, 0, "the daemon stopped answering "
                             "(%d connections held)" % len(held))
            self.assertGreater(refused, 0)
            self.assertLess(len(held), FLOOD_NOFILE // 2)
        finally:
            for s in held:
                s.close()
        self.assertRegex(n0.log_text(), r"refused \d+ connection\(s\) in the last "
                         r"second; the last from 127\.0\.0\.1[1-4]:")
        # a legitimate peer replicates afterwards, both ways
        c.save("flood", 2)
        c.wait_replicated("flood", 2)


if __name__ == "__main__":
    harness.main()
