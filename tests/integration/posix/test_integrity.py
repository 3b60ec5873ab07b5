"""Integrity holes that outside suites (pjdfstest, fsx, fio) found, issue 13.

- new entries belong to the caller (uid/gid, setgid directories) and get
  exactly the caller's umask, so a trainer that is not root can save;
- committed bytes stay immutable through every name: a hard link from a
  committed step is refused, and one made before the commit turns
  read-only with the step (after the kernel forgot the inode, and after a
  daemon restart on the same RAMDIR);
- MAP_SHARED writable mappings of files opened O_RDWR work, and the commit
  holds the bytes written through them;
- FIFOs, sockets and device nodes in a step are named in replicator.errors
  (the shard holds regular files, directories and symlinks only).

The unprivileged trainer is uid/gid 65534 (setpriv --clear-groups).

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/posix/test_integrity.py [-k NAME]
"""

import errno
import mmap
import os
import random
import shutil
import socket
import stat
import subprocess
import sys
import time

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import read_file, write_file  # noqa: E402

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
MiB = 1 << 20
CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)  # Linux value


def pattern(seed, n):
    return random.Random(seed).randbytes(n)


def drop_caches():
    """Make the kernel forget dentries and inodes (FORGET reaches mtcfs)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


def as_nobody(script, cwd):
    """Run a sh script as uid/gid 65534 without supplementary groups."""
    r = subprocess.run([SETPRIV, "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY,
                        "--clear-groups", "sh", "-ec", script],
                       cwd=cwd, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=60)
    if r.returncode != 0:
        raise AssertionError("as uid %d: %r failed (rc=%d): %s" % (
            NOBODY, script, r.returncode, r.stderr.decode(errors="replace")))
    return r.stdout.decode()


def errors_text(mnt):
    try:
        return read_file(os.path.join(mnt, "replicator.errors")).decode()
    except FileNotFoundError:
        return ""


class Ownership(harness.MountTestCase):
    """Item 1: the caller's uid/gid and umask, not the daemon's."""

    def setUp(self):
        if SETPRIV is None:
            self.skipTest("setpriv not installed")
        super().setUp()
        # the mount lives in the test's private directory: let the trainer
        # reach it, and, like a training pod's volume, write its top
        os.chmod(self.fs.workdir, 0o755)
        os.chmod(self.mnt, 0o777)
        self.d = os.path.join(self.mnt, "w")
        os.mkdir(self.d, 0o777)
        os.chmod(self.d, 0o777)

    def p(self, *parts):
        return os.path.join(self.d, *parts)

    def assertOwned(self, path, uid, gid, mode=None):
        st = os.lstat(path)
        self.assertEqual((st.st_uid, st.st_gid), (uid, gid),
                         "owner of %s" % path)
        if mode is not None:
            self.assertEqual(stat.S_IMODE(st.st_mode), mode,
                             "mode of %s: %o" % (path, stat.S_IMODE(st.st_mode)))

    def test_new_entries_belong_to_the_caller(self):
        as_nobody("umask 022; mkdir d; : > f; ln -s f l; mkfifo p;"
                  "python3 -c 'import os; os.close(os.open(\"o\", os.O_RDWR|os.O_CREAT|os.O_EXCL, 0o640))'",
                  self.d)
        self.assertOwned(self.p("d"), NOBODY, NOBODY, 0o755)
        self.assertOwned(self.p("f"), NOBODY, NOBODY, 0o644)
        self.assertOwned(self.p("l"), NOBODY, NOBODY)
        self.assertOwned(self.p("p"), NOBODY, NOBODY, 0o644)
        self.assertOwned(self.p("o"), NOBODY, NOBODY, 0o640)
        self.assertTrue(stat.S_ISFIFO(os.lstat(self.p("p")).st_mode))
        # and the trainer can go on writing in what it made
        as_nobody("echo hi > d/x; mkdir d/e", self.d)
        self.assertOwned(self.p("d", "x"), NOBODY, NOBODY, 0o644)
        self.assertEqual(read_file(self.p("d", "x")), b"hi\n")

    def test_chown_to_same_owner_updates_ctime(self):
        # chown(f, -1, -1) changes nothing but ctime, as on tmpfs (pjdfstest
        # chown/00.t 1054..1144); the kernel then sends a SETATTR with no
        # attribute bit set, which mtcfs answered without touching the file
        write_file(self.p("f"), b"x")
        os.mkdir(self.p("d"))
        os.symlink("f", self.p("l"))
        cases = [("chown", self.p("f"), lambda: os.chown(self.p("f"), -1, -1)),
                 ("chown dir", self.p("d"), lambda: os.chown(self.p("d"), -1, -1)),
                 ("lchown", self.p("l"), lambda: os.lchown(self.p("l"), -1, -1))]
        fd = os.open(self.p("f"), os.O_RDONLY)
        self.addCleanup(os.close, fd)
        cases.append(("fchown", self.p("f"), lambda: os.fchown(fd, -1, -1)))
        for what, path, op in cases:
            before = os.lstat(path).st_ctime_ns
            # the coarse clock tmpfs stamps with must move past `before`
            deadline = time.monotonic() + 5
            while (time.clock_gettime_ns(CLOCK_REALTIME_COARSE) <= before
                   and time.monotonic() < deadline):
                time.sleep(0.005)
            op()
            after = os.lstat(path).st_ctime_ns
            self.assertGreater(after, before, "%s -1 -1 left ctime of %s" % (what, path))
            self.assertOwned(path, 0, 0)

    def test_open_of_existing_file_keeps_its_owner(self):
        # O_CREAT without O_EXCL on a file root made: opened, not taken over
        write_file(self.p("mine"), b"root's", mode=0o666)
        os.chmod(self.p("mine"), 0o666)
        as_nobody("echo more >> mine", self.d)
        self.assertOwned(self.p("mine"), 0, 0, 0o666)
        self.assertEqual(read_file(self.p("mine")), b"root'smore\n")

    def test_umask_000_and_077(self):
        as_nobody("umask 000; mkdir d0; : > f0; mkfifo p0", self.d)
        self.assertOwned(self.p("d0"), NOBODY, NOBODY, 0o777)
        self.assertOwned(self.p("f0"), NOBODY, NOBODY, 0o666)
        self.assertOwned(self.p("p0"), NOBODY, NOBODY, 0o666)
        as_nobody("umask 077; mkdir d7; : > f7; mkfifo p7", self.d)
        self.assertOwned(self.p("d7"), NOBODY, NOBODY, 0o700)
        self.assertOwned(self.p("f7"), NOBODY, NOBODY, 0o600)
        self.assertOwned(self.p("p7"), NOBODY, NOBODY, 0o600)

    def test_umask_000_as_root(self):
        # the daemon's own umask (022 here, inherited) is not applied on top
        old = os.umask(0)
        try:
            os.mkdir(self.p("r0"), 0o777)
            write_file(self.p("rf0"), b"", mode=0o666)
        finally:
            os.umask(old)
        self.assertOwned(self.p("r0"), 0, 0, 0o777)
        self.assertOwned(self.p("rf0"), 0, 0, 0o666)

    def test_setgid_directory_gid_inherited(self):
        os.mkdir(self.p("g"))
        os.chown(self.p("g"), 0, 4242)
        os.chmod(self.p("g"), 0o2777)
        as_nobody("umask 022; mkdir g/sub; : > g/f; ln -s f g/l", self.d)
        self.assertOwned(self.p("g", "f"), NOBODY, 4242, 0o644)
        self.assertOwned(self.p("g", "l"), NOBODY, 4242)
        st = os.lstat(self.p("g", "sub"))
        self.assertEqual((st.st_uid, st.st_gid), (NOBODY, 4242))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o2755,
                         "a directory in a setgid directory is setgid")
        # root creating there gets the directory's group too
        write_file(self.p("g", "rootf"), b"")
        self.assertOwned(self.p("g", "rootf"), 0, 4242)

    def test_setuid_bits_survive_the_ownership_change(self):
        as_nobody("python3 -c 'import os; os.close(os.open(\"s\", os.O_WRONLY|os.O_CREAT, 0o4755))'",
                  self.d)
        self.assertOwned(self.p("s"), NOBODY, NOBODY, 0o4755)

    def test_write_by_non_owner_clears_setid_bits(self):
        # chmod(2): a write by a process without CAP_FSETID clears S_ISUID
        # (and S_ISGID with group execute); pjdfstest chmod/12.t
        cases = [("wo", 0o4777, "os.O_WRONLY"), ("rw", 0o6777, "os.O_RDWR"),
                 ("ap", 0o2777, "os.O_WRONLY|os.O_APPEND")]
        for name, mode, flags in cases:
            write_file(self.p(name), b"")
            os.chmod(self.p(name), mode)
            out = as_nobody("python3 -c 'import os; fd = os.open(\"%s\", %s); os.write(fd, b\"x\"); "
                            "print(oct(os.fstat(fd).st_mode & 0o7777)); os.close(fd)'" % (name, flags),
                            self.d)
            self.assertEqual(out.strip(), "0o777", "fstat after the write of %s" % name)
            self.assertOwned(self.p(name), 0, 0, 0o777)
        write_file(self.p("tr"), b"abc")
        os.chmod(self.p("tr"), 0o4777)
        as_nobody("truncate -s 1 tr", self.d)
        self.assertOwned(self.p("tr"), 0, 0, 0o777)
        # a set-id file the writer created itself: the same
        out = as_nobody("python3 -c 'import os; fd = os.open(\"new\", os.O_WRONLY|os.O_CREAT|os.O_EXCL, 0o4755); "
                        "os.write(fd, b\"x\"); print(oct(os.fstat(fd).st_mode & 0o7777)); os.close(fd)'",
                        self.d)
        self.assertEqual(out.strip(), "0o755")
        self.assertOwned(self.p("new"), NOBODY, NOBODY, 0o755)
        # root (CAP_FSETID) keeps them
        write_file(self.p("rt"), b"")
        os.chmod(self.p("rt"), 0o4777)
        with open(self.p("rt"), "ab") as f:
            f.write(b"x")
        self.assertOwned(self.p("rt"), 0, 0, 0o4777)

    def test_unprivileged_trainer_saves_a_step(self):
        data = pattern(1, 300000)
        blob = os.path.join(self.fs.workdir, "blob")
        write_file(blob, data)
        as_nobody("umask 022; mkdir 7.orbax-checkpoint-tmp; mkdir 7.orbax-checkpoint-tmp/item;"
                  "cp %s 7.orbax-checkpoint-tmp/item/w;"
                  "mv 7.orbax-checkpoint-tmp 7" % blob, self.mnt)
        shard = self.wait_committed(7)
        harness.assert_manifest(self, shard, {"item/w": data},
                                modes={"item/w": 0o644})
        self.assertOwned(os.path.join(self.mnt, "7", "item", "w"), NOBODY, NOBODY)
        harness.admin("verify", self.ramdir)


class HardLinks(harness.MountTestCase):
    """Item 2: committed bytes are immutable through every name."""

    def m(self, *parts):
        return os.path.join(self.mnt, *parts)

    def commit(self, step, files):
        tmp = self.m("%d.tmp" % step)
        os.mkdir(tmp)
        for name, data in files.items():
            write_file(os.path.join(tmp, name), data)
        return tmp

    def assertReadOnly(self, path, data):
        """Every way of changing path fails with EROFS; bytes unchanged."""
        self.assertErrno(errno.EROFS, os.open, path, os.O_WRONLY | os.O_APPEND)
        self.assertErrno(errno.EROFS, os.open, path, os.O_RDWR)
        self.assertErrno(errno.EROFS, os.truncate, path, 0)
        self.assertErrno(errno.EROFS, os.chmod, path, 0o600)
        self.assertErrno(errno.EROFS, os.utime, path, (1, 1))
        self.assertEqual(read_file(path), data)

    def test_link_from_committed_step_refused(self):
        data = pattern(2, 1000000)
        self.commit(1, {"w": data})
        os.rename(self.m("1.tmp"), self.m("1"))
        self.assertErrno(errno.EROFS, os.link, self.m("1", "w"), self.m("outside"))
        self.wait_committed(1)
        drop_caches()
        self.assertErrno(errno.EROFS, os.link, self.m("1", "w"), self.m("outside"))
        os.mkdir(self.m("2.tmp"))
        self.assertErrno(errno.EROFS, os.link, self.m("1", "w"), self.m("2.tmp", "w"))
        self.assertFalse(os.path.lexists(self.m("outside")))
        harness.admin("verify", self.ramdir)

    def _link_before_commit(self, forget):
        data = pattern(3, 1000000)
        self.commit(1, {"w": data})
        os.link(self.m("1.tmp", "w"), self.m("outside"))
        os.mkdir(self.m("keep"))
        os.link(self.m("1.tmp", "w"), self.m("keep", "other"))
        os.rename(self.m("1.tmp"), self.m("1"))
        shard = self.wait_committed(1)
        harness.assert_manifest(self, shard, {"w": data})
        if forget:
            forget()
        self.assertReadOnly(self.m("outside"), data)
        self.assertReadOnly(self.m("keep", "other"), data)
        self.assertReadOnly(self.m("1", "w"), data)
        # names outside the step are the app's: it may still remove them
        os.unlink(self.m("keep", "other"))
        harness.admin("verify", self.ramdir)
        return data

    def test_link_before_commit_read_only(self):
        self._link_before_commit(None)

    def test_link_before_commit_read_only_after_drop_caches(self):
        self._link_before_commit(drop_caches)

    def test_link_before_commit_read_only_after_restart(self):
        data = self._link_before_commit(None)
        self.fs.restart()
        self.assertReadOnly(self.m("outside"), data)
        drop_caches()
        self.assertReadOnly(self.m("outside"), data)
        harness.admin("verify", self.ramdir)

    def test_link_before_commit_survives_removal_of_the_step_view(self):
        # Orbax's preservation policy deletes old steps from the view; the
        # shard keeps the bytes, and the other name stays read-only
        data = pattern(8, 300000)
        self.commit(1, {"w": data})
        os.link(self.m("1.tmp", "w"), self.m("outside"))
        os.rename(self.m("1.tmp"), self.m("1"))
        self.wait_committed(1)
        shutil.rmtree(self.m("1"))
        drop_caches()
        self.assertReadOnly(self.m("outside"), data)
        self.fs.restart()
        self.assertReadOnly(self.m("outside"), data)
        harness.admin("verify", self.ramdir)

    def test_writer_open_before_commit_stops_at_commit(self):
        data = pattern(4, 200000)
        self.commit(1, {"w": data})
        os.link(self.m("1.tmp", "w"), self.m("outside"))
        fd = os.open(self.m("outside"), os.O_WRONLY | os.O_APPEND)
        try:
            os.rename(self.m("1.tmp"), self.m("1"))
            self.wait_committed(1)
            self.assertErrno(errno.EROFS, os.write, fd, b"zzz")
        finally:
            os.close(fd)
        self.assertEqual(read_file(self.m("outside")), data)
        harness.admin("verify", self.ramdir)

    def test_uncommitted_links_stay_writable(self):
        # a file that only shares an inode with other uncommitted names
        write_file(self.m("a"), b"x")
        os.link(self.m("a"), self.m("b"))
        drop_caches()
        with open(self.m("b"), "ab") as f:
            f.write(b"y")
        self.assertEqual(read_file(self.m("a")), b"xy")


class SharedMmap(harness.MountTestCase):
    """Item 4: MAP_SHARED writable mappings, and the commit sees their bytes."""

    def m(self, *parts):
        return os.path.join(self.mnt, *parts)

    def _commit_mapped(self, close_first):
        os.mkdir(self.m("3.tmp"))
        path = self.m("3.tmp", "arr")
        size = 4 * MiB + 123
        data = bytearray(pattern(5, size))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
        if close_first:
            os.close(fd)   # the mapping outlives the descriptor
        mm[:] = data
        # and sparse rewrites in the middle, as np.memmap r+ does
        for off in (0, MiB + 7, size - 5):
            mm[off:off + 5] = b"HELLO"
            data[off:off + 5] = b"HELLO"
        mm.close()
        if not close_first:
            os.close(fd)
        os.rename(self.m("3.tmp"), self.m("3"))
        shard = self.wait_committed(3)
        harness.assert_manifest(self, shard, {"arr": bytes(data)})
        harness.assert_shard_on_disk(self, self.ramdir, 3, {"arr": bytes(data)})
        self.assertEqual(read_file(self.m("3", "arr")), bytes(data))
        harness.admin("verify", self.ramdir)

    def test_mmap_write_munmap_close_commit(self):
        self._commit_mapped(close_first=False)

    def test_mmap_write_after_close_then_munmap_commit(self):
        self._commit_mapped(close_first=True)

    def test_mapping_open_across_the_commit(self):
        # what was msync'ed before the rename is the step; a later store
        # through the still-open mapping never reaches the shard
        os.mkdir(self.m("5.tmp"))
        path = self.m("5.tmp", "arr")
        data = pattern(7, MiB)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, MiB)
            mm = mmap.mmap(fd, MiB)
            try:
                mm[:] = data
                mm.flush()
                os.rename(self.m("5.tmp"), self.m("5"))
                shard = self.wait_committed(5)
                mm[0:4] = b"LATE"
                try:
                    mm.flush()
                except OSError as e:
                    self.assertIn(e.errno, (errno.EROFS, errno.EIO))
            finally:
                mm.close()
        finally:
            try:
                os.close(fd)
            except OSError as e:   # close reports the failed write-back
                self.assertIn(e.errno, (errno.EROFS, errno.EIO))
        harness.assert_manifest(self, shard, {"arr": data})
        harness.assert_shard_on_disk(self, self.ramdir, 5, {"arr": data})
        # and the mount shows the committed bytes, not the refused store
        self.assertEqual(read_file(self.m("5", "arr")), data)
        harness.admin("verify", self.ramdir)

    def test_rdwr_pages_not_kept_twice(self):
        # what a read-write handle wrote sits in RAMDIR (shmem); once it is
        # closed the mount's own cached copy is dropped, not held beside it
        def file_cache_mib():
            m = {}
            with open("/proc/meminfo") as f:
                for line in f:
                    k, v = line.split(":", 1)
                    m[k] = int(v.split()[0])
            return (m["Cached"] - m["Shmem"]) // 1024
        buf = pattern(9, MiB)
        before = file_cache_mib()
        fd = os.open(self.m("big"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            for _ in range(256):
                os.write(fd, buf)
        finally:
            os.close(fd)
        # other processes' page cache moves too: 128 MiB of slack
        harness.wait_until(lambda: file_cache_mib() - before < 128, 10,
                           "the mount's cached copy of a closed O_RDWR file dropped")
        self.assertEqual(os.stat(os.path.join(self.ramdir, "ns", "big")).st_size, 256 * MiB)

    def test_rdwr_write_visible_to_direct_io_reader(self):
        # write() on an O_RDWR (page cache) open reaches RAMDIR at once
        fd = os.open(self.m("f"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"abcdef")
            with open(os.path.join(self.ramdir, "ns", "f"), "rb") as f:
                self.assertEqual(f.read(), b"abcdef")
            w = os.open(self.m("f"), os.O_WRONLY)
            try:
                os.pwrite(w, b"XY", 2)
            finally:
                os.close(w)
            self.assertEqual(os.pread(fd, 6, 0), b"abXYef")
        finally:
            os.close(fd)


class SpecialFiles(harness.MountTestCase):
    """Item 9: sockets and devices in a step are named, not dropped
    silently; a FIFO is part of the shard."""

    def m(self, *parts):
        return os.path.join(self.mnt, *parts)

    def test_special_files_reported_at_commit(self):
        data = pattern(6, 5000)
        os.makedirs(self.m("4.tmp", "sub"))
        write_file(self.m("4.tmp", "sub", "w"), data)
        os.mkfifo(self.m("4.tmp", "sub", "pipe"), 0o640)
        os.mknod(self.m("4.tmp", "null"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(self.m("4.tmp", "sock"))
        finally:
            s.close()
        os.rename(self.m("4.tmp"), self.m("4"))
        shard = self.wait_committed(4)
        fifos = [e for e in shard["files"] if e.get("type") == "fifo"]
        self.assertEqual([(e["path"], e.get("mode")) for e in fifos], [("sub/pipe", 0o640)])
        shard = dict(shard, files=[e for e in shard["files"] if e.get("type") != "fifo"])
        harness.assert_manifest(self, shard, {"sub/w": data})
        text = harness.wait_until(
            lambda: (lambda t: t if t.count("\n") >= 2 else None)(errors_text(self.mnt)),
            10, "two lines in replicator.errors")
        lines = sorted(text.splitlines())
        self.assertEqual(lines, sorted([
            "step 4: null is a character device: not checkpointed (a shard holds regular files, directories, symlinks and FIFOs only)",
            "step 4: sock is a socket: not checkpointed (a shard holds regular files, directories, symlinks and FIFOs only)",
        ]))
        harness.admin("verify", self.ramdir)


if __name__ == "__main__":
    harness.main()
