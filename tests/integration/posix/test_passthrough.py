"""Kernel FUSE passthrough for committed and restored files (issue 14).

With libfuse >= 3.17 and a kernel that offers FUSE passthrough, a read-only
open of a file of a committed step (or of the store view that .restore
markers point into) gets a backing file: the kernel reads RAMDIR's tmpfs
itself, and the daemon sees no READ request at all, not even for the first
read. Writes are never passed through: committed files stay EROFS, and a
writer still open at the commit rename keeps getting EROFS.

The observable is libfuse's debug log (-o debug), as in test_kcache.py:
Base.ops(fn) lists the opcodes fn() caused. A positive control (a file
outside any committed step) shows READs are seen when they happen.

With libfuse 3.14 (no passthrough; the daemon logs "passthrough reads of
committed files: off") the same tests check bytes and EROFS only, and the
control (which needs passthrough to mean anything) is skipped.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/posix/test_passthrough.py [-k NAME]
"""

import errno
import mmap
import os
import sys

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import read_file, write_file  # noqa: E402
from test_kcache import Base, pattern  # noqa: E402


class Passthrough(Base):

    def setUp(self):
        super().setUp()
        t = harness.wait_until(
            lambda: "passthrough reads of committed files:" in self.fs.log_text()
            and self.fs.log_text(), 10, "the INIT passthrough log line")
        self.pt = "passthrough reads of committed files: on" in t

    def reads(self, fn):
        """The READs fn() caused: none when passed through."""
        return [o for o in self.ops(fn) if o == "READ"]

    def no_reads(self, fn, msg=None):
        """fn() sends no READ (with passthrough; without, it just runs)."""
        if self.pt:
            self.assertEqual(self.reads(fn), [], msg)
        else:
            fn()

    def need_pt(self):
        if not self.pt:
            self.skipTest("no FUSE passthrough (libfuse < 3.17 or kernel)")

    def test_control_uncommitted_file_is_read_by_the_daemon(self):
        os.mkdir(self.m("5.tmp"))
        p = self.m("5.tmp", "w")
        data = pattern(5, 256 * 1024)
        write_file(p, data)
        self.need_pt()
        got = []
        self.assertTrue(self.reads(lambda: got.append(read_file(p))),
                        "a file outside committed steps is read by the daemon")
        self.assertEqual(got[0], data)

    def test_first_read_of_committed_file_sends_no_read(self):
        data = pattern(1, 3 * 1024 * 1024 + 17)
        self.commit(1, {"a/w": data})
        p = self.m("1", "a", "w")
        got = []
        self.no_reads(lambda: got.append(read_file(p)),
                      "the first read of a committed file goes past the daemon")
        self.assertEqual(got[0], data)
        # pread at odd offsets, and a shared read-only mapping
        fd = os.open(p, os.O_RDONLY)
        try:
            for off in (0, 1, 4095, 1 << 20, len(data) - 5):
                self.assertEqual(os.pread(fd, 9000, off), data[off:off + 9000])
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mm:
                self.assertEqual(mm[:], data)
        finally:
            os.close(fd)

    def test_store_view_read_sends_no_read(self):
        data = pattern(2, 512 * 1024)
        self.commit(1, {"d/w": data})
        p = self.m(".mtcfs", "default", "1", "n0-w0", "d", "w")
        got = []
        self.no_reads(lambda: got.append(read_file(p)))
        self.assertEqual(got[0], data)

    def test_committed_file_stays_read_only(self):
        self.commit(1, {"w": b"committed"})
        p = self.m("1", "w")
        fd = os.open(p, os.O_RDONLY)     # a passthrough open is held
        try:
            self.assertEqual(os.pread(fd, 100, 0), b"committed")
            for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC):
                self.assertErrno(errno.EROFS, os.open, p, flags)
            self.assertErrno(errno.EROFS, os.truncate, p, 1)
        finally:
            os.close(fd)
        self.assertEqual(read_file(p), b"committed")

    def test_writer_open_at_the_rename(self):
        # a writer still open when its step is committed: its writes fail
        # with EROFS, readers opened meanwhile get the exact bytes (through
        # the daemon: the kernel allows no passthrough open beside a cached
        # one), and once it is closed reads pass through again.
        tmp = self.m("3.tmp")
        os.mkdir(tmp)
        data = pattern(3, 200000)
        wfd = os.open(os.path.join(tmp, "w"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(wfd, data)
            rfd = os.open(os.path.join(tmp, "w"), os.O_RDONLY)   # reader from before
            os.rename(tmp, self.m("3"))
            self.wait_committed(3)
            self.assertErrno(errno.EROFS, os.pwrite, wfd, b"x", 0)
            self.assertEqual(os.pread(rfd, len(data) + 1, 0), data)
            self.assertEqual(read_file(self.m("3", "w")), data)
            os.close(rfd)
        finally:
            os.close(wfd)
        got = []
        self.no_reads(lambda: got.append(read_file(self.m("3", "w"))))
        self.assertEqual(got[0], data)

    def test_restored_step_read_sends_no_read(self):
        write_file(self.m("replicator.yaml"),
                   b"job-name: pt\nnode-rank: 0\nnodes: 1\n")
        harness.wait_until(
            lambda: os.path.lexists(self.m("pt-s0-n0-w0.restore")), 30,
            "the job's .restore marker", check=self.fs.check_alive)
        data = pattern(7, 1024 * 1024 + 3)
        tmp = self.m("7.tmp")
        os.mkdir(tmp)
        write_file(os.path.join(tmp, "w"), data)
        os.rename(tmp, self.m("7"))
        self.wait_committed(7, job="pt")
        self.fs.restart()
        self.marks = 0
        write_file(self.m("replicator.yaml"),
                   b"job-name: pt\nnode-rank: 0\nnodes: 1\n")
        marker = self.m("pt-s7-n0-w0.restore")
        harness.wait_until(lambda: os.path.lexists(marker), 30,
                           "the restore marker of step 7", check=self.fs.check_alive)
        p = os.path.join(marker, "w")
        got = []
        self.no_reads(lambda: got.append(read_file(p)),
                      "a restored file is read past the daemon")
        self.assertEqual(got[0], data)
        self.assertErrno(errno.EROFS, os.open, p, os.O_WRONLY)


if __name__ == "__main__":
    harness.main()
