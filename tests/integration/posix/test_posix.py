"""DESIGN §3.4 on a real mount: the filesystem semantics writers rely on.

Each test gets its own daemon and works in MNT/w (a name that is never a
step), so nothing here touches commit detection.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/posix/test_posix.py [-k NAME]
"""

import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import mmap
import os
import random
import stat
import struct
import sys
import threading
import time

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import read_file, write_file  # noqa: E402

MiB = 1 << 20


def pattern(seed, n):
    """n reproducible pseudo-random bytes."""
    return random.Random(seed).randbytes(n)


def pack_flock(l_type, start=0, length=0, whence=os.SEEK_SET, pid=0):
    # struct flock on Linux 64-bit: short, short, off_t, off_t, pid_t (+pad)
    return struct.pack("hhqqi4x", l_type, whence, start, length, pid)


def unpack_flock(buf):
    l_type, whence, start, length, pid = struct.unpack("hhqqi4x", buf)
    return l_type, start, length, pid


def in_child(fn):
    """Run fn() in a forked child; return its int result (exit status)."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = fn()
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


class Posix(harness.MountTestCase):

    def setUp(self):
        super().setUp()
        self.d = os.path.join(self.mnt, "w")
        os.mkdir(self.d)

    def p(self, *parts):
        return os.path.join(self.d, *parts)

    # --- read-ahead ---------------------------------------------------------

    def test_readahead_raised_after_init(self):
        """The kernel's read-ahead on the mount is 1 MiB, not the 128 KiB
        default that processing INIT's reply would restore (cold 1 GiB
        reads: 2.3 -> 4.0 GB/s)."""
        st = os.stat(self.mnt)   # the mount was used (setUp mkdir'd in it too)
        bdi = "/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(st.st_dev), os.minor(st.st_dev))
        self.assertEqual(read_file(bdi).strip(), b"1024")

    def test_readahead_in_place_before_the_first_reply(self):
        """Deterministic: the first request after INIT sets it before it is
        answered, so no file of the mount is ever opened with the 128 KiB
        window. Checked right after the first reply, on fresh mounts, with
        no waiting."""
        for _ in range(5):
            d = self.new_daemon()
            d.start()
            st = os.stat(d.mnt)          # the first request of this mount
            bdi = "/sys/class/bdi/%d:%d/read_ahead_kb" % (
                os.major(st.st_dev), os.minor(st.st_dev))
            self.assertEqual(read_file(bdi).strip(), b"1024", bdi)
            d.stop()

    # --- rename -----------------------------------------------------------

    def test_rename_nonempty_directory(self):
        tree = {"a/f1": b"one", "a/b/f2": b"two" * 1000, "a/b/c/f3": b"",
                "a/b/c/d/f4": pattern(1, 70000)}
        for rel, data in tree.items():
            os.makedirs(os.path.dirname(self.p(rel)), exist_ok=True)
            write_file(self.p(rel), data)
        os.rename(self.p("a"), self.p("z"))
        self.assertFalse(os.path.exists(self.p("a")))
        got = harness.read_tree(self.p("z"))
        self.assertEqual(got, {k[2:]: v for k, v in tree.items()})
        # move into another directory, and a deep subtree out of it again
        os.mkdir(self.p("parent"))
        os.rename(self.p("z"), self.p("parent", "z2"))
        os.rename(self.p("parent", "z2", "b", "c"), self.p("c"))
        self.assertEqual(read_file(self.p("c", "d", "f4")), tree["a/b/c/d/f4"])
        self.assertEqual(sorted(os.listdir(self.p("parent", "z2", "b"))),
                         ["f2"])
        # over an empty directory: allowed; over a non-empty one: ENOTEMPTY
        os.mkdir(self.p("empty"))
        os.rename(self.p("c"), self.p("empty"))
        self.assertEqual(sorted(os.listdir(self.p("empty"))), ["d", "f3"])
        self.assertErrno(errno.ENOTEMPTY, os.rename, self.p("parent", "z2"),
                         self.p("empty"))
        # a directory into its own subtree: EINVAL
        self.assertErrno(errno.EINVAL, os.rename, self.p("parent"),
                         self.p("parent", "z2", "x"))
        st = os.stat(self.p("empty", "d"))
        self.assertTrue(stat.S_ISDIR(st.st_mode))

    def test_rename_file_over_existing(self):
        write_file(self.p("old"), b"old contents")
        write_file(self.p("new"), b"new")
        fd = os.open(self.p("old"), os.O_RDONLY)     # holds the replaced file
        try:
            ino_new = os.stat(self.p("new")).st_ino
            os.rename(self.p("new"), self.p("old"))
            self.assertEqual(read_file(self.p("old")), b"new")
            self.assertEqual(os.stat(self.p("old")).st_ino, ino_new)
            self.assertFalse(os.path.exists(self.p("new")))
            self.assertEqual(os.pread(fd, 100, 0), b"old contents")
        finally:
            os.close(fd)
        self.assertEqual(sorted(os.listdir(self.d)), ["old"])
        # rename to itself is a no-op
        os.rename(self.p("old"), self.p("old"))
        self.assertEqual(read_file(self.p("old")), b"new")
        # a file over a directory / a directory over a file
        os.mkdir(self.p("dir"))
        self.assertErrno(errno.EISDIR, os.rename, self.p("old"), self.p("dir"))
        self.assertErrno(errno.ENOTDIR, os.rename, self.p("dir"),
                         self.p("old"))
        self.assertErrno(errno.ENOENT, os.rename, self.p("nope"), self.p("x"))

    def test_rename_open_file(self):
        fd = os.open(self.p("f.tmp"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"before-")
            os.rename(self.p("f.tmp"), self.p("f"))
            os.write(fd, b"after")
            self.assertEqual(os.pread(fd, 100, 0), b"before-after")
            self.assertEqual(os.fstat(fd).st_size, 12)
            os.fsync(fd)
            self.assertEqual(read_file(self.p("f")), b"before-after")
            # rename again while open, into a subdirectory
            os.mkdir(self.p("sub"))
            os.rename(self.p("f"), self.p("sub", "g"))
            os.pwrite(fd, b"B", 0)
            os.ftruncate(fd, 20)
            self.assertEqual(os.fstat(fd).st_size, 20)
        finally:
            os.close(fd)
        self.assertEqual(read_file(self.p("sub", "g")),
                         b"Before-after" + bytes(8))
        self.assertEqual(os.listdir(self.d), ["sub"])

    def test_rename_symlinks(self):
        write_file(self.p("target"), b"T")
        os.symlink("target", self.p("s1"))
        os.rename(self.p("s1"), self.p("s2"))
        self.assertTrue(os.path.islink(self.p("s2")))
        self.assertFalse(os.path.lexists(self.p("s1")))
        self.assertEqual(os.readlink(self.p("s2")), "target")
        self.assertEqual(read_file(self.p("s2")), b"T")
        # over an existing symlink: the link is replaced, not its target
        os.symlink("elsewhere", self.p("s3"))
        os.rename(self.p("s2"), self.p("s3"))
        self.assertEqual(os.readlink(self.p("s3")), "target")
        self.assertEqual(read_file(self.p("target")), b"T")
        # a dangling symlink renames too, and over a regular file
        os.symlink("missing/x", self.p("dangling"))
        os.rename(self.p("dangling"), self.p("target2"))
        self.assertEqual(os.readlink(self.p("target2")), "missing/x")
        write_file(self.p("plain"), b"p")
        os.rename(self.p("s3"), self.p("plain"))
        self.assertTrue(os.path.islink(self.p("plain")))
        self.assertEqual(read_file(self.p("plain")), b"T")
        self.assertEqual(sorted(os.listdir(self.d)),
                         ["plain", "target", "target2"])
        st = os.lstat(self.p("plain"))
        self.assertTrue(stat.S_ISLNK(st.st_mode))
        self.assertEqual(st.st_size, len("target"))

    def test_relative_symlinks_inside_mount(self):
        os.makedirs(self.p("steps", "5.orbax-checkpoint-tmp-1", "state"))
        write_file(self.p("steps", "5.orbax-checkpoint-tmp-1", "state", "a"),
                   b"array")
        # like the synthesized .restore entries: relative target inside DIR
        os.symlink("steps/5.orbax-checkpoint-tmp-1", self.p("ckpt"))
        os.mkdir(self.p("x"))
        os.symlink("../steps/5.orbax-checkpoint-tmp-1/state/a",
                   self.p("x", "file-link"))
        self.assertEqual(os.readlink(self.p("ckpt")),
                         "steps/5.orbax-checkpoint-tmp-1")
        self.assertEqual(read_file(self.p("ckpt", "state", "a")), b"array")
        self.assertEqual(read_file(self.p("x", "file-link")), b"array")
        self.assertEqual(os.listdir(self.p("ckpt", "state")), ["a"])
        self.assertEqual(os.path.realpath(self.p("x", "file-link")),
                         os.path.realpath(self.p(
                             "steps", "5.orbax-checkpoint-tmp-1", "state",
                             "a")))
        self.assertTrue(os.path.isdir(self.p("ckpt")))
        self.assertTrue(os.path.islink(self.p("ckpt")))
        # a chain of relative links, and one to a directory then ".."
        os.symlink("x/file-link", self.p("chain"))
        self.assertEqual(read_file(self.p("chain")), b"array")
        self.assertEqual(sorted(os.listdir(self.p("ckpt", "state", "..",
                                                  ".."))),
                         ["5.orbax-checkpoint-tmp-1"])
        # writing through a link writes the target
        with open(self.p("x", "file-link"), "ab") as f:
            f.write(b"+")
        self.assertEqual(read_file(self.p("steps", "5.orbax-checkpoint-tmp-1",
                                          "state", "a")), b"array+")
        # unlinking a link leaves the target
        os.unlink(self.p("chain"))
        self.assertTrue(os.path.exists(self.p("x", "file-link")))
        # O_NOFOLLOW on a link: ELOOP
        self.assertErrno(errno.ELOOP, os.open, self.p("x", "file-link"),
                         os.O_RDONLY | os.O_NOFOLLOW)

    # --- sizes and offsets -------------------------------------------------

    def test_o_trunc_and_ftruncate(self):
        write_file(self.p("f"), b"x" * 100)
        fd = os.open(self.p("f"), os.O_WRONLY | os.O_TRUNC)
        try:
            self.assertEqual(os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)
        self.assertEqual(os.stat(self.p("f")).st_size, 0)
        self.assertEqual(read_file(self.p("f")), b"")
        fd = os.open(self.p("f"), os.O_RDWR)
        try:
            os.write(fd, b"abcdef")
            os.ftruncate(fd, 3 * MiB + 5)               # grow: zeros
            self.assertEqual(os.fstat(fd).st_size, 3 * MiB + 5)
            self.assertEqual(os.stat(self.p("f")).st_size, 3 * MiB + 5)
            self.assertEqual(os.pread(fd, 10, 0), b"abcdef\0\0\0\0")
            self.assertEqual(os.pread(fd, 4096, 3 * MiB - 100),
                             bytes(105))
            os.ftruncate(fd, 4)                         # shrink
            self.assertEqual(os.fstat(fd).st_size, 4)
            self.assertEqual(os.pread(fd, 100, 0), b"abcd")
            os.ftruncate(fd, 8)                         # regrow: zeros, not "ef"
            self.assertEqual(os.pread(fd, 100, 0), b"abcd\0\0\0\0")
            os.ftruncate(fd, 0)
            self.assertEqual(os.pread(fd, 100, 0), b"")
            # file position is not moved by ftruncate: next write makes a hole
            os.write(fd, b"Z")
        finally:
            os.close(fd)
        self.assertEqual(read_file(self.p("f")), bytes(6) + b"Z")
        os.truncate(self.p("f"), 2)
        self.assertEqual(read_file(self.p("f")), b"\0\0")
        os.truncate(self.p("f"), 1000)
        self.assertEqual(read_file(self.p("f")), bytes(1000))
        # O_TRUNC together with O_CREAT on an existing file, through Python
        with open(self.p("f"), "wb") as f:
            f.write(b"new")
        self.assertEqual(read_file(self.p("f")), b"new")

    def test_offset_writes_holes_and_rewrites(self):
        model = bytearray()

        def pw(fd, data, off):
            self.assertEqual(os.pwrite(fd, data, off), len(data))
            if len(model) < off + len(data):
                model.extend(bytes(off + len(data) - len(model)))
            model[off:off + len(data)] = data

        fd = os.open(self.p("h5"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            pw(fd, b"\x89HDF\r\n\x1a\n" + bytes(504), 0)    # superblock
            pw(fd, pattern(2, 3000), 5 * MiB + 3)           # far, leaves a hole
            pw(fd, pattern(3, 100), 1 * MiB)                # inside the hole
            for i in range(5):                              # rewrite offset 0
                pw(fd, bytes([i]) * 512, 0)
            pw(fd, pattern(4, 131072 + 17), 4096 - 7)       # unaligned, crossing
            pw(fd, b"tail", 8 * MiB)
            self.assertEqual(os.fstat(fd).st_size, len(model))
            self.assertEqual(os.pread(fd, 4096, 2 * MiB), bytes(4096))
            self.assertEqual(os.pread(fd, len(model) + 10, 0), bytes(model))
        finally:
            os.close(fd)
        self.assertEqual(os.stat(self.p("h5")).st_size, 8 * MiB + 4)
        data = read_file(self.p("h5"))
        self.assertEqual(hashlib.sha256(data).hexdigest(),
                         hashlib.sha256(model).hexdigest())
        # lseek(SEEK_END) + write, and O_APPEND
        fd = os.open(self.p("h5"), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"APP")
        finally:
            os.close(fd)
        self.assertEqual(read_file(self.p("h5"))[-7:], b"tailAPP")

    def test_short_reads_at_eof(self):
        write_file(self.p("f"), b"0123456789")
        fd = os.open(self.p("f"), os.O_RDONLY)
        try:
            self.assertEqual(os.pread(fd, 100, 5), b"56789")
            self.assertEqual(os.pread(fd, 100, 10), b"")
            self.assertEqual(os.pread(fd, 100, 1 << 40), b"")
            self.assertEqual(os.read(fd, 4), b"0123")
            self.assertEqual(os.read(fd, 1000), b"456789")
            self.assertEqual(os.read(fd, 1000), b"")
            # the file grows through another fd: the reader sees the new size
            with open(self.p("f"), "ab") as w:
                w.write(b"abc")
            self.assertEqual(os.read(fd, 1000), b"abc")
            self.assertEqual(os.fstat(fd).st_size, 13)
            os.truncate(self.p("f"), 4)
            self.assertEqual(os.pread(fd, 100, 0), b"0123")
            self.assertEqual(os.pread(fd, 100, 8), b"")
        finally:
            os.close(fd)
        # an empty file
        write_file(self.p("empty"), b"")
        self.assertEqual(read_file(self.p("empty")), b"")
        # a large read across the end of a bigger file
        big = pattern(5, MiB + 333)
        write_file(self.p("big"), big)
        fd = os.open(self.p("big"), os.O_RDONLY)
        try:
            self.assertEqual(os.pread(fd, 4 * MiB, MiB), big[MiB:])
        finally:
            os.close(fd)

    # --- durability calls ----------------------------------------------------

    def test_fsync_files_and_directories(self):
        fd = os.open(self.p("f"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"part1")
            os.fsync(fd)                     # before the last write
            os.fdatasync(fd)
            os.write(fd, b"part2")
            os.fsync(fd)
        finally:
            os.close(fd)
        self.assertEqual(read_file(self.p("f")), b"part1part2")
        for d in (self.d, self.mnt):
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
                os.fdatasync(dfd)
            finally:
                os.close(dfd)
        # fsync of a read-only fd and of an empty new file
        fd = os.open(self.p("f"), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fd = os.open(self.p("new"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.assertEqual(os.stat(self.p("new")).st_size, 0)
        os.sync()

    def test_o_creat_o_excl(self):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        fd = os.open(self.p("f"), flags, 0o600)
        try:
            os.write(fd, b"mine")
        finally:
            os.close(fd)
        self.assertErrno(errno.EEXIST, os.open, self.p("f"), flags, 0o600)
        self.assertEqual(read_file(self.p("f")), b"mine")
        self.assertEqual(stat.S_IMODE(os.stat(self.p("f")).st_mode), 0o600)
        os.mkdir(self.p("d"))
        self.assertErrno(errno.EEXIST, os.open, self.p("d"), flags, 0o600)
        os.symlink("missing", self.p("dangling"))
        self.assertErrno(errno.EEXIST, os.open, self.p("dangling"), flags,
                         0o600)
        self.assertFalse(os.path.lexists(self.p("missing")))
        # racing creators: exactly one wins
        results = []

        def racer():
            try:
                fd = os.open(self.p("race"), flags, 0o644)
                os.close(fd)
                results.append("won")
            except FileExistsError:
                results.append("lost")
        ts = [threading.Thread(target=racer) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(sorted(results), ["lost"] * 7 + ["won"])
        self.assertErrno(errno.EEXIST, os.mkdir, self.p("d"))

    # --- locks -----------------------------------------------------------------

    def test_flock(self):
        write_file(self.p("lock"), b"")
        fd1 = os.open(self.p("lock"), os.O_RDWR)
        try:
            fcntl.flock(fd1, fcntl.LOCK_EX | fcntl.LOCK_NB)

            def contend():
                fd = os.open(self.p("lock"), os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return 1
                except BlockingIOError:
                    pass
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    return 2
                except BlockingIOError:
                    return 0
                finally:
                    os.close(fd)
            self.assertEqual(in_child(contend), 0,
                             "another process got a conflicting flock")
            # a second open file description in this process conflicts too
            fd2 = os.open(self.p("lock"), os.O_RDWR)
            try:
                with self.assertRaises(BlockingIOError):
                    fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd1, fcntl.LOCK_UN)
                fcntl.flock(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB)

                def shared():
                    fd = os.open(self.p("lock"), os.O_RDONLY)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                        return 0
                    except BlockingIOError:
                        return 1
                    finally:
                        os.close(fd)
                self.assertEqual(in_child(shared), 0, "shared flocks conflict")
            finally:
                os.close(fd2)                 # closing releases its lock
            fcntl.flock(fd1, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd1)
        # released on close: a child gets it now
        self.assertEqual(in_child(lambda: (fcntl.flock(
            os.open(self.p("lock"), os.O_RDWR),
            fcntl.LOCK_EX | fcntl.LOCK_NB), 0)[1]), 0)

    def test_posix_locks_lockf(self):
        write_file(self.p("lock"), bytes(100))
        fd = os.open(self.p("lock"), os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)  # bytes 0..9

            def contend():
                f = os.open(self.p("lock"), os.O_RDWR)
                try:
                    try:
                        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 5)
                        return 1                 # overlapping range: conflict
                    except (BlockingIOError, PermissionError):
                        pass
                    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 10)
                    # F_GETLK reports the holder of bytes 0..9
                    r = fcntl.fcntl(f, fcntl.F_GETLK,
                                    pack_flock(fcntl.F_WRLCK, 0, 10))
                    l_type, start, length, pid = unpack_flock(r)
                    if l_type != fcntl.F_WRLCK or pid != os.getppid():
                        return 3
                    return 0
                finally:
                    os.close(f)
            self.assertEqual(in_child(contend), 0)
            fcntl.lockf(fd, fcntl.LOCK_UN, 10, 0)
            self.assertEqual(in_child(lambda: (fcntl.lockf(
                os.open(self.p("lock"), os.O_RDWR),
                fcntl.LOCK_EX | fcntl.LOCK_NB), 0)[1]), 0)
        finally:
            os.close(fd)

    def test_ofd_locks(self):
        # TensorStore: open K.__lock, F_OFD_SETLK(W) a write lock, ftruncate
        write_file(self.p("k.__lock"), b"")
        fd1 = os.open(self.p("k.__lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fd2 = os.open(self.p("k.__lock"), os.O_RDWR)
        try:
            fcntl.fcntl(fd1, fcntl.F_OFD_SETLKW, pack_flock(fcntl.F_WRLCK))
            os.ftruncate(fd1, 0)
            os.write(fd1, b"payload")
            # another open file description of the same process conflicts
            with self.assertRaises(OSError) as cm:
                fcntl.fcntl(fd2, fcntl.F_OFD_SETLK, pack_flock(fcntl.F_WRLCK))
            self.assertIn(cm.exception.errno, (errno.EAGAIN, errno.EACCES))
            r = fcntl.fcntl(fd2, fcntl.F_OFD_GETLK, pack_flock(fcntl.F_WRLCK))
            self.assertEqual(unpack_flock(r)[0], fcntl.F_WRLCK)
            self.assertEqual(unpack_flock(r)[3], -1)    # OFD: pid is -1

            def contend():
                f = os.open(self.p("k.__lock"), os.O_RDWR)
                try:
                    fcntl.fcntl(f, fcntl.F_OFD_SETLK,
                                pack_flock(fcntl.F_RDLCK))
                    return 1
                except OSError as e:
                    return 0 if e.errno in (errno.EAGAIN, errno.EACCES) else 2
                finally:
                    os.close(f)
            self.assertEqual(in_child(contend), 0)
            fcntl.fcntl(fd1, fcntl.F_OFD_SETLK, pack_flock(fcntl.F_UNLCK))
            fcntl.fcntl(fd2, fcntl.F_OFD_SETLK, pack_flock(fcntl.F_WRLCK))
            r = fcntl.fcntl(fd1, fcntl.F_OFD_GETLK, pack_flock(fcntl.F_WRLCK))
            self.assertEqual(unpack_flock(r)[0], fcntl.F_WRLCK)
        finally:
            os.close(fd2)
            os.close(fd1)
        fd3 = os.open(self.p("k.__lock"), os.O_RDWR)
        try:   # both descriptions closed: the lock is gone
            fcntl.fcntl(fd3, fcntl.F_OFD_SETLK, pack_flock(fcntl.F_WRLCK))
        finally:
            os.close(fd3)
        self.assertEqual(read_file(self.p("k.__lock")), b"payload")

    # --- directory listing ----------------------------------------------------

    def test_readdir_types(self):
        write_file(self.p("file"), b"f")
        os.mkdir(self.p("dir"))
        os.symlink("file", self.p("link"))
        os.symlink("dir", self.p("dirlink"))
        os.symlink("nowhere", self.p("dangling"))
        os.mkfifo(self.p("fifo"))
        want = {"file": "f", "dir": "d", "link": "l", "dirlink": "l",
                "dangling": "l", "fifo": "p"}
        # raw d_type through libc readdir: must not be DT_UNKNOWN
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

        class Dirent(ctypes.Structure):
            _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64),
                        ("d_reclen", ctypes.c_ushort),
                        ("d_type", ctypes.c_ubyte),
                        ("d_name", ctypes.c_char * 256)]
        libc.opendir.restype = ctypes.c_void_p
        libc.opendir.argtypes = [ctypes.c_char_p]
        libc.readdir.restype = ctypes.POINTER(Dirent)
        libc.readdir.argtypes = [ctypes.c_void_p]
        libc.closedir.argtypes = [ctypes.c_void_p]
        dt = {1: "p", 4: "d", 8: "f", 10: "l", 0: "unknown"}
        dirp = libc.opendir(self.d.encode())
        self.assertTrue(dirp)
        raw = {}
        try:
            while True:
                ent = libc.readdir(dirp)
                if not ent:
                    break
                name = ent.contents.d_name.decode()
                raw[name] = dt.get(ent.contents.d_type, ent.contents.d_type)
        finally:
            libc.closedir(dirp)
        self.assertEqual(raw.pop("."), "d")
        self.assertEqual(raw.pop(".."), "d")
        self.assertEqual(raw, want)
        # os.scandir answers from d_type
        got = {}
        with os.scandir(self.d) as it:
            for e in it:
                got[e.name] = ("l" if e.is_symlink() else
                               "d" if e.is_dir(follow_symlinks=False) else
                               "f" if e.is_file(follow_symlinks=False) else
                               "p")
                self.assertEqual(e.inode(), os.lstat(e.path).st_ino,
                                 "d_ino of %s" % e.name)
        self.assertEqual(got, want)
        # a bigger directory: every name exactly once, across several getdents
        os.mkdir(self.p("many"))
        names = {"n%04d-%s" % (i, "x" * (i % 50)) for i in range(1500)}
        for n in names:
            os.close(os.open(self.p("many", n), os.O_CREAT | os.O_WRONLY))
        listed = os.listdir(self.p("many"))
        self.assertEqual(len(listed), len(names))
        self.assertEqual(set(listed), names)
        # removing entries while iterating does not crash or repeat names
        seen = []
        with os.scandir(self.p("many")) as it:
            for i, e in enumerate(it):
                seen.append(e.name)
                if i % 3 == 0:
                    os.unlink(e.path)
        self.assertEqual(len(seen), len(set(seen)))

    # --- concurrency ---------------------------------------------------------------

    def _check_files(self, specs):
        for name, (seed, size) in specs.items():
            got = read_file(self.p("par", name))
            self.assertEqual(len(got), size, name)
            self.assertEqual(hashlib.sha256(got).digest(),
                             hashlib.sha256(pattern(seed, size)).digest(),
                             "contents of %s" % name)

    def test_concurrent_writers_threads(self):
        os.mkdir(self.p("par"))
        specs = {"t%d-f%d" % (t, i): (t * 100 + i, (t * 7919 + i * 104729)
                                      % (3 * MiB) + i)
                 for t in range(8) for i in range(4)}
        errors = []

        def writer(t):
            try:
                for i in range(4):
                    name = "t%d-f%d" % (t, i)
                    data = pattern(*specs[name])
                    fd = os.open(self.p("par", name),
                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    try:
                        step = 65536 + t * 4096 + 1     # unaligned chunks
                        for off in range(0, len(data), step):
                            os.pwrite(fd, data[off:off + step], off)
                        if i % 2:
                            os.fsync(fd)
                    finally:
                        os.close(fd)
            except Exception as e:                      # reported below
                errors.append(repr(e))
        ts = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(sorted(os.listdir(self.p("par"))), sorted(specs))
        self._check_files(specs)

    def test_concurrent_writers_processes(self):
        os.mkdir(self.p("par"))
        specs = {"p%d-f%d" % (p, i): (1000 + p * 10 + i,
                                      (p * 15485863 + i * 32452843)
                                      % (2 * MiB) + 1)
                 for p in range(8) for i in range(3)}
        pids = []
        for p in range(8):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    for i in range(3):
                        name = "p%d-f%d" % (p, i)
                        with open(self.p("par", name), "wb") as f:
                            data = pattern(*specs[name])
                            for off in range(0, len(data), 100000):
                                f.write(data[off:off + 100000])
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                 for pid in pids]
        self.assertEqual(codes, [0] * 8)
        self.assertEqual(sorted(os.listdir(self.p("par"))), sorted(specs))
        self._check_files(specs)

    # --- attributes --------------------------------------------------------------

    def test_chmod_utime_statvfs(self):
        write_file(self.p("f"), b"data")
        os.chmod(self.p("f"), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(self.p("f")).st_mode), 0o600)
        fd = os.open(self.p("f"), os.O_RDONLY)
        try:
            os.fchmod(fd, 0o640)
            self.assertEqual(stat.S_IMODE(os.fstat(fd).st_mode), 0o640)
        finally:
            os.close(fd)
        os.mkdir(self.p("d"))
        os.chmod(self.p("d"), 0o750)
        self.assertEqual(stat.S_IMODE(os.stat(self.p("d")).st_mode), 0o750)
        self.assertTrue(stat.S_ISDIR(os.stat(self.p("d")).st_mode))
        # utime with explicit nanoseconds, then "now"
        a, m = 1_600_000_000_123_456_789, 1_500_000_000_987_654_321
        os.utime(self.p("f"), ns=(a, m))
        st = os.stat(self.p("f"))
        self.assertEqual(st.st_atime_ns, a)
        self.assertEqual(st.st_mtime_ns, m)
        before = time.time_ns()
        os.utime(self.p("f"))
        st = os.stat(self.p("f"))
        self.assertGreaterEqual(st.st_mtime_ns, before - 2_000_000_000)
        self.assertLessEqual(st.st_mtime_ns, time.time_ns() + 2_000_000_000)
        # a write moves mtime forward
        os.utime(self.p("f"), ns=(a, m))
        with open(self.p("f"), "ab") as f:
            f.write(b"!")
        self.assertGreater(os.stat(self.p("f")).st_mtime_ns, m)
        # uid/gid: root creates root-owned files; chown works for root
        st = os.stat(self.p("f"))
        self.assertEqual((st.st_uid, st.st_gid), (os.getuid(), os.getgid()))
        os.chown(self.p("f"), 1234, 5678)
        st = os.stat(self.p("f"))
        self.assertEqual((st.st_uid, st.st_gid), (1234, 5678))
        # statvfs: sane numbers
        sv = os.statvfs(self.mnt)
        self.assertGreater(sv.f_bsize, 0)
        self.assertGreater(sv.f_frsize, 0)
        self.assertGreater(sv.f_blocks, 0)
        self.assertLessEqual(sv.f_bfree, sv.f_blocks)
        self.assertLessEqual(sv.f_bavail, sv.f_bfree)
        self.assertGreaterEqual(sv.f_namemax, 255)
        self.assertEqual(os.statvfs(self.p("f")).f_blocks, sv.f_blocks)
        # st_blocks of a written file is plausible (du works)
        write_file(self.p("g"), bytes(MiB))
        self.assertGreaterEqual(os.stat(self.p("g")).st_blocks * 512, MiB // 2)

    # --- mmap ----------------------------------------------------------------

    def test_mmap_read(self):
        data = pattern(6, 3 * MiB + 1234)
        write_file(self.p("m"), data)
        fd = os.open(self.p("m"), os.O_RDONLY)
        try:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                self.assertEqual(len(mm), len(data))
                self.assertEqual(mm[:], data)
                self.assertEqual(mm[MiB:MiB + 10], data[MiB:MiB + 10])
        finally:
            os.close(fd)

    def test_mmap_of_file_open_for_writing(self):
        w = os.open(self.p("m"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            data = pattern(7, 2 * MiB + 77)
            os.write(w, data)
            fd = os.open(self.p("m"), os.O_RDONLY)
            try:
                with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                    self.assertEqual(mm[:], data)
            finally:
                os.close(fd)
            # the writer goes on; a fresh read-only mapping sees it all
            os.pwrite(w, b"HELLO", 0)
            fd = os.open(self.p("m"), os.O_RDONLY)
            try:
                with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                    self.assertEqual(mm[:5], b"HELLO")
                    self.assertEqual(mm[5:], data[5:])
            finally:
                os.close(fd)
        finally:
            os.close(w)
        self.assertEqual(read_file(self.p("m")), b"HELLO" + data[5:])

    def test_mmap_shared_writable(self):
        # numpy.memmap r+/w+, fio's mmap engine, fsx: a MAP_SHARED writable
        # mapping of a file opened O_RDWR (it was ENODEV under direct_io)
        data = pattern(9, MiB + 3)
        w = os.open(self.p("m"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(w, data)
            with mmap.mmap(w, len(data)) as mm:
                mm[0:5] = b"HELLO"
                mm.flush()
                self.assertEqual(os.pread(w, 5, 0), b"HELLO")
                mm[MiB:MiB + 3] = b"END"
            self.assertEqual(os.pread(w, 3, MiB), b"END")
            # a mapping that grows the file through ftruncate
            os.ftruncate(w, 2 * MiB)
            with mmap.mmap(w, 2 * MiB) as mm:
                mm[2 * MiB - 4:] = b"TAIL"
        finally:
            os.close(w)
        want = b"HELLO" + data[5:MiB] + b"END" + bytes(MiB - 3 - 4) + b"TAIL"
        self.assertEqual(read_file(self.p("m")), want)
        # and what a fresh open, and RAMDIR itself, hold after close
        self.assertEqual(read_file(os.path.join(self.ramdir, "ns", "w", "m")), want)

    def test_mmap_and_read_write_agree_without_msync(self):
        # read-write opens are direct I/O when the kernel allows mapping
        # them (FUSE_CAP_DIRECT_IO_ALLOW_MMAP): a mapping's dirty pages are
        # still seen by read() through another descriptor, and a write()
        # is seen through the mapping, with no msync in between (fsx mixes
        # them like this)
        data = pattern(10, 3 * 4096)
        write_file(self.p("c"), data)
        a = os.open(self.p("c"), os.O_RDWR)
        b = os.open(self.p("c"), os.O_RDWR)
        try:
            with mmap.mmap(a, len(data)) as mm:
                mm[100:105] = b"hello"
                self.assertEqual(os.pread(b, 5, 100), b"hello")
                os.pwrite(b, b"WORLD", 4096 + 7)
                self.assertEqual(mm[4096 + 7:4096 + 12], b"WORLD")
                mm[2 * 4096:2 * 4096 + 3] = b"END"
        finally:
            os.close(a)
            os.close(b)
        want = bytearray(data)
        want[100:105] = b"hello"
        want[4096 + 7:4096 + 12] = b"WORLD"
        want[2 * 4096:2 * 4096 + 3] = b"END"
        self.assertEqual(read_file(self.p("c")), bytes(want))
        self.assertEqual(read_file(os.path.join(self.ramdir, "ns", "w", "c")), bytes(want))

    def test_mmap_write_only_open_still_refused(self):
        # O_WRONLY opens keep direct_io (large-write speed); a mapping
        # needs read access anyway
        w = os.open(self.p("m"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(w, b"x" * 4096)
            with self.assertRaises(OSError) as cm:
                mmap.mmap(w, 4096)
            self.assertIn(cm.exception.errno, (errno.EACCES, errno.ENODEV))
        finally:
            os.close(w)

    # --- xattr / ioctl ------------------------------------------------------------

    def test_getxattr_fast(self):
        write_file(self.p("f"), b"x")
        names = ["user.foo", "security.capability", "system.posix_acl_access",
                 "trusted.overlay.opaque", "security.selinux"]
        t = time.perf_counter()
        for _ in range(20):
            for n in names:
                with self.assertRaises(OSError) as cm:
                    os.getxattr(self.p("f"), n)
                self.assertIn(cm.exception.errno,
                              (errno.ENOTSUP, errno.ENODATA),
                              "getxattr %s: %s" % (n, cm.exception))
                with self.assertRaises(OSError) as cm:
                    os.getxattr(self.d, n)
                self.assertIn(cm.exception.errno,
                              (errno.ENOTSUP, errno.ENODATA))
        dt = time.perf_counter() - t
        self.assertLess(dt, 2.0, "200 getxattr calls took %.2fs" % dt)
        # listxattr: empty or ENOTSUP, never an error or a hang
        try:
            self.assertEqual(os.listxattr(self.p("f")), [])
        except OSError as e:
            self.assertEqual(e.errno, errno.ENOTSUP)

    def test_ioctl_enotty(self):
        write_file(self.p("f"), b"x")
        fd = os.open(self.p("f"), os.O_RDONLY)
        try:
            # a driver-private ioctl: _IOR('m', 0x42, int)
            req = (2 << 30) | (4 << 16) | (ord("m") << 8) | 0x42
            with self.assertRaises(OSError) as cm:
                fcntl.ioctl(fd, req, bytes(4))
            self.assertEqual(cm.exception.errno, errno.ENOTTY,
                             "ioctl: %s" % cm.exception)
        finally:
            os.close(fd)

    # --- big file, links, unlink --------------------------------------------------

    def test_large_file_64mib(self):
        chunk = pattern(8, 4 * MiB)
        h = hashlib.sha256()
        fd = os.open(self.p("big"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for i in range(16):
                block = bytes([i]) + chunk[1:]
                mv = memoryview(block)
                while mv:
                    mv = mv[os.write(fd, mv):]
                h.update(block)
        finally:
            os.close(fd)
        self.assertEqual(os.stat(self.p("big")).st_size, 64 * MiB)
        h2 = hashlib.sha256()
        with open(self.p("big"), "rb") as f:
            while True:
                b = f.read(3 * MiB + 17)
                if not b:
                    break
                h2.update(b)
        self.assertEqual(h2.hexdigest(), h.hexdigest())

    def test_hard_link(self):
        write_file(self.p("a"), b"shared")
        os.mkdir(self.p("sub"))
        os.link(self.p("a"), self.p("sub", "b"))
        sa, sb = os.stat(self.p("a")), os.stat(self.p("sub", "b"))
        self.assertEqual(sa.st_ino, sb.st_ino)
        self.assertEqual(sa.st_nlink, 2)
        self.assertEqual(sb.st_nlink, 2)
        with open(self.p("a"), "ab") as f:
            f.write(b"+more")
        self.assertEqual(read_file(self.p("sub", "b")), b"shared+more")
        os.unlink(self.p("a"))
        self.assertEqual(os.stat(self.p("sub", "b")).st_nlink, 1)
        self.assertEqual(read_file(self.p("sub", "b")), b"shared+more")
        self.assertErrno(errno.EEXIST, os.link, self.p("sub", "b"),
                         self.p("sub", "b"))
        os.mkdir(self.p("d"))
        self.assertErrno(errno.EPERM, os.link, self.p("d"), self.p("d2"))

    def test_unlink_open_file(self):
        fd = os.open(self.p("f"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"still here")
            os.unlink(self.p("f"))
            self.assertFalse(os.path.lexists(self.p("f")))
            # no .fuse_hidden* or other leftovers in the application's view
            self.assertEqual(os.listdir(self.d), [])
            self.assertEqual(os.pread(fd, 100, 0), b"still here")
            os.write(fd, b", and more")
            self.assertEqual(os.fstat(fd).st_size, 20)
            self.assertEqual(os.fstat(fd).st_nlink, 0)
            os.ftruncate(fd, 5)
            self.assertEqual(os.pread(fd, 100, 0), b"still")
            # a new file of the same name is a different file
            write_file(self.p("f"), b"new")
            self.assertEqual(os.pread(fd, 100, 0), b"still")
            self.assertEqual(read_file(self.p("f")), b"new")
        finally:
            os.close(fd)
        self.assertEqual(os.listdir(self.d), ["f"])
        self.assertEqual(read_file(self.p("f")), b"new")
        # an rmdir of a non-empty dir fails, of an empty one works
        os.mkdir(self.p("d"))
        write_file(self.p("d", "x"), b"")
        self.assertErrno(errno.ENOTEMPTY, os.rmdir, self.p("d"))
        os.unlink(self.p("d", "x"))
        os.rmdir(self.p("d"))
        self.assertErrno(errno.ENOENT, os.unlink, self.p("d"))


class MountFlags(harness.MountTestCase):
    """mtcfs as root mounts nosuid,nodev (as fusermount3 does for users): a
    trainer can neither run a set-user-ID program nor open a device node
    through the mount, also when mount.fuse3 passes suid,dev."""

    def test_nosuid_nodev_by_default(self):
        opts = harness.mount_options(self.mnt)
        self.assertTrue({"nosuid", "nodev"} <= opts, opts)
        # a device node can be made (pjdfstest's mknod tests) but not opened
        dev = os.path.join(self.mnt, "null")
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        self.assertTrue(stat.S_ISCHR(os.lstat(dev).st_mode))
        self.assertErrno(errno.EACCES, os.open, dev, os.O_WRONLY)

    def test_suid_dev_options_do_not_override(self):
        # mount.fuse3 passes "suid,dev" on every fstab / mount(8) mount
        d = self.new_daemon(opts=harness.DEFAULT_OPTS + ",suid,dev")
        d.start()
        opts = harness.mount_options(d.mnt)
        self.assertTrue({"nosuid", "nodev"} <= opts, opts)

if __name__ == "__main__":
    harness.main()
