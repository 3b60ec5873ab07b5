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
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import wait_until, mount_fstype  # noqa: E402

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


if __name__ == "__main__":
    harness.main()
