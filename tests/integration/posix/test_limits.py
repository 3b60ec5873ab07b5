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
     /usr/bin/python3 tests/integration/posix/test_limits.py [-k NAME]
"""

import errno
import os
import signal
import socket
import subprocess
import sys
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
sys.path.insert(1, os.path.join(INTEG, "security"))  # test_peer_security: the Python peer
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
        real = os.path.realpath(d.mnt)     # before the mount: no request
        d.spawn()
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
        p = other.spawn()
        try:
            rc = p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            harness.force_unmount(other.mnt)
            self.fail("a second daemon runs on the RAMDIR of the first")
        finally:
            other.proc = None           # reaped here
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


# --- sparse files ---------------------------------------------------------------

MiB = 1 << 20
SPARSE_SIZE = 256 * MiB
SPARSE_EXTENTS = [(1 * MiB, b"A" * 4096), (200 * MiB + 4096, b"B" * 4096)]


def write_sparse(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, SPARSE_SIZE)
        for off, data in SPARSE_EXTENTS:
            os.pwrite(fd, data, off)
    finally:
        os.close(fd)


def check_sparse(tc, path, what):
    """path has the logical bytes of write_sparse and few blocks."""
    st = os.stat(path)
    tc.assertEqual(st.st_size, SPARSE_SIZE, what)
    tc.assertLess(st.st_blocks * 512, 1 * MiB,
                  "%s: %d bytes allocated for 8 KiB of data"
                  % (what, st.st_blocks * 512))
    want = {off: data for off, data in SPARSE_EXTENTS}
    with open(path, "rb") as f:
        pos = 0
        while pos < SPARSE_SIZE:
            chunk = f.read(16 * MiB)
            tc.assertEqual(len(chunk), min(16 * MiB, SPARSE_SIZE - pos), what)
            for off, data in want.items():
                if pos <= off < pos + len(chunk):
                    tc.assertEqual(chunk[off - pos:off - pos + len(data)], data, what)
                    chunk = (chunk[:off - pos] + bytes(len(data))
                             + chunk[off - pos + len(data):])
            tc.assertEqual(chunk.count(0), len(chunk), "%s: a hole is not zeros" % what)
            pos += len(chunk)


class Sparse(unittest.TestCase):
    def save(self, c, r, step, sparse):
        mnt = c.nodes[r].mnt
        tmp = os.path.join(mnt, "%d.orbax-checkpoint-tmp-%d" % (step, r))
        os.makedirs(os.path.join(tmp, "state"))
        if sparse:
            write_sparse(os.path.join(tmp, "state", "sparse.bin"))
        harness.write_file(os.path.join(tmp, "state", "small"), b"rank %d" % r)
        harness.write_file(os.path.join(tmp, "commit_success.txt"), b"ok\n")
        os.rename(tmp, os.path.join(mnt, str(step)))

    def test_sparse_file_replicates_and_restores_sparse(self):
        # 128M tiers: a dense copy of the 256 MiB file could not even be held
        c = Cluster(2, ram_size="128M")
        self.addCleanup(c.close)
        self.daemons = c.nodes
        c.start()
        c.job_start("sparse")
        self.save(c, 0, 1, sparse=True)
        self.save(c, 1, 1, sparse=False)
        c.wait_replicated("sparse", 1)
        own = os.path.join(harness.shard_dir(c.nodes[0].ramdir, 1, "sparse", 0),
                           "state", "sparse.bin")
        check_sparse(self, own, "the owner's copy")
        replica = os.path.join(harness.shard_dir(c.nodes[1].ramdir, 1, "sparse", 0),
                               "state", "sparse.bin")
        check_sparse(self, replica, "the replica")

        # node 0 comes back empty: its shard is restored from node 1
        n0 = c.nodes[0]
        n0.kill9()
        n0.wipe_ramdir()
        n0.start()
        steps = c.job_start("sparse")
        self.assertEqual(steps, {0: 1, 1: 1})
        restored = os.path.join(harness.shard_dir(n0.ramdir, 1, "sparse", 0),
                                "state", "sparse.bin")
        check_sparse(self, restored, "the copy restored from the peer")
        ms = [x for x in os.listdir(n0.mnt) if x.endswith(".restore")]
        os.replace(os.path.join(n0.mnt, ms[0]), os.path.join(n0.mnt, "1"))
        check_sparse(self, os.path.join(n0.mnt, "1", "state", "sparse.bin"),
                     "the restored file through the mount")


class PunchHole(harness.MountTestCase):
    OPTS = "ram_size=64M"

    def test_punch_hole_on_a_full_tier_frees_space(self):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2
        p = os.path.join(self.mnt, "big")
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            chunk = b"\xaa" * MiB
            n = 0
            try:
                while n < 64:
                    os.pwrite(fd, chunk, n * MiB)
                    n += 1
            except OSError as e:
                self.assertEqual(e.errno, errno.ENOSPC)
            self.assertGreater(n, 32)
            used = os.fstat(fd).st_blocks * 512
            # the tier is full: a hole over most of the file must still go
            rc = libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                MiB, (n - 2) * MiB)
            self.assertEqual(rc, 0, os.strerror(ctypes.get_errno()))
            self.assertEqual(os.fstat(fd).st_size, n * MiB)
            self.assertLess(os.fstat(fd).st_blocks * 512, used - (n - 3) * MiB)
            self.assertEqual(os.pread(fd, 16, 2 * MiB), bytes(16))
            self.assertEqual(os.pread(fd, 16, 0), b"\xaa" * 16)
            # and the space it freed is the tier's again
            os.pwrite(fd, chunk * 8, n * MiB)
        finally:
            os.close(fd)


if __name__ == "__main__":
    harness.main()
