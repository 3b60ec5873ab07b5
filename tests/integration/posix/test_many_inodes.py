"""The daemon's descriptors do not grow with the inodes the kernel remembers
(issue 22 item 4).

The FUSE front used to keep one O_PATH descriptor per inode the kernel
remembered (libfuse passthrough_ll's shape): a step of 100k small files made
the writer's creates fail with EMFILE once the daemon reached its
RLIMIT_NOFILE, until root dropped the caches. Now at most an eighth of the
limit stays open and the rest are reopened by file handle. The test runs the
daemon with RLIMIT_NOFILE 4096 (so ~20k files prove the bound quickly), has
an unprivileged trainer (uid 65534) write and commit a step of 20,000 small
files, samples /proc/PID/fd meanwhile, and reads every byte back: through
the kernel's cache, and again after the kernel forgot everything (so every
node is found by handle again). POSIX cases the handles must not break
(hard links, a rename of an open file, an unlinked file still open, a
removed cwd) run with the cache overfull.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/posix/test_many_inodes.py [-k NAME]
"""

import os
import shutil
import subprocess
import sys
import threading
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import read_file, write_file  # noqa: E402

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
PRLIMIT = shutil.which("prlimit")
NOFILE = 4096
NFILES = 20000


class LimitedDaemon(harness.Daemon):
    """mtcfs with RLIMIT_NOFILE NOFILE (prlimit execs it: same PID)."""

    def argv(self):
        return [PRLIMIT, "--nofile=%d:%d" % (NOFILE, NOFILE), "--"] + super().argv()


def fd_count(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return -1


def content(i):
    return ("file %d of the step\n" % i).encode() * (1 + i % 7)


WRITER = r"""
import os, sys
n = int(sys.argv[1])
os.mkdir("1.orbax-checkpoint-tmp")
d = "1.orbax-checkpoint-tmp/item"
os.mkdir(d)
for i in range(n):
    sub = os.path.join(d, "d%03d" % (i // 1000))
    if i % 1000 == 0:
        os.mkdir(sub)
    with open(os.path.join(sub, "f%05d" % i), "wb") as f:
        f.write((("file %d of the step\n" % i).encode()) * (1 + i % 7))
os.rename("1.orbax-checkpoint-tmp", "1")
"""


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


class ManyInodes(harness.MountTestCase):
    def new_daemon(self, **kw):
        d = LimitedDaemon(**kw)
        self.__dict__.setdefault("daemons", []).append(d)
        self.addCleanup(d.close)
        return d

    def setUp(self):
        if SETPRIV is None or PRLIMIT is None:
            self.skipTest("setpriv or prlimit not installed")
        super().setUp()
        os.chmod(self.fs.workdir, 0o755)
        os.chmod(self.mnt, 0o777)
        with open("/proc/%d/limits" % self.fs.proc.pid) as f:
            self.assertIn("Max open files            %d" % NOFILE, f.read())

    def path(self, i):
        return os.path.join(self.mnt, "1", "item", "d%03d" % (i // 1000), "f%05d" % i)

    def test_unprivileged_writer_commits_20k_files_under_4096_fds(self):
        pid = self.fs.proc.pid
        peak = [fd_count(pid)]
        stop = threading.Event()

        def sample():
            while not stop.wait(0.05):
                peak[0] = max(peak[0], fd_count(pid))
        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            r = subprocess.run([SETPRIV, "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY,
                                "--clear-groups", sys.executable, "-c", WRITER, str(NFILES)],
                               cwd=self.mnt, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=500)
            self.assertEqual(r.returncode, 0, "the writer failed: %s"
                             % r.stderr.decode(errors="replace")[-2000:])
            self.wait_committed(1, timeout=300)
            # every byte back, through the names the kernel remembers
            for i in range(NFILES):
                self.assertEqual(read_file(self.path(i)), content(i), self.path(i))
            during = peak[0]
            drop_caches()
            for i in range(NFILES):
                self.assertEqual(read_file(self.path(i)), content(i), self.path(i))
        finally:
            stop.set()
            t.join()
        sys.stderr.write("\n  daemon descriptors: peak %d with %d files (limit %d), "
                         "%d after; %d at rest\n"
                         % (during, NFILES, NOFILE, peak[0], fd_count(pid)))
        # an eighth of the limit for inodes (a quarter bounds it), plus what the rest needs
        self.assertLess(peak[0], NOFILE // 4 + 512)
        harness.admin("verify", self.ramdir)

    def test_posix_cases_with_an_overfull_cache(self):
        d = os.path.join(self.mnt, "w")
        os.mkdir(d)
        a, b = os.path.join(d, "a"), os.path.join(d, "b")
        write_file(a, b"one")
        os.link(a, b)
        fd_open = os.open(a, os.O_RDWR)
        self.addCleanup(os.close, fd_open)
        gone = os.path.join(d, "gone")
        write_file(gone, b"still here")
        fd_gone = os.open(gone, os.O_RDONLY)
        self.addCleanup(os.close, fd_gone)
        os.unlink(gone)
        cwd = os.path.join(d, "cwd")
        os.mkdir(cwd)
        # the kernel now remembers > fd_cap inodes: a, b, gone, cwd were evicted
        many = os.path.join(d, "many")
        os.mkdir(many)
        for i in range(NOFILE // 4 + 200):
            write_file(os.path.join(many, "x%d" % i), b"%d" % i)
        os.rename(a, os.path.join(d, "a2"))
        os.write(fd_open, b"ONE")
        self.assertEqual(read_file(b), b"ONE")
        self.assertEqual(os.stat(b).st_nlink, 2)
        self.assertEqual(os.pread(fd_gone, 100, 0), b"still here")
        self.assertEqual(os.fstat(fd_gone).st_nlink, 0)
        pid = os.fork()
        if pid == 0:   # a removed cwd still answers stat (nlink 0)
            try:
                os.chdir(cwd)
                os.rmdir(cwd)
                for i in range(NOFILE // 4 + 200):
                    os.stat(os.path.join(many, "x%d" % i))
                os._exit(0 if os.stat(".").st_nlink == 0 else 3)
            except BaseException:
                os._exit(2)
        _, st = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(st), 0)
        for i in range(NOFILE // 4 + 200):
            self.assertEqual(read_file(os.path.join(many, "x%d" % i)), b"%d" % i)


if __name__ == "__main__":
    harness.main()
