"""Outside suites (fsx, fio verify) on the mount, as op sequences (issue 13).

fsx (xfstests ltp/fsx.c, 4 seeds x 100,000 ops, default mode with mapped
reads/writes, and -Z O_DIRECT) and fio with verify=crc32c (psync, mmap,
libaio/psync/io_uring O_DIRECT, sequential and random) pass on mtcfs as on
tmpfs. Both tools use one O_RDWR descriptor per file, so they never mix
mtcfs's two open modes: O_WRONLY opens bypass the page cache (direct_io),
O_RDWR and O_RDONLY opens go through it. These tests are the op sequences
that check what the tools do not: bytes written through one kind of
descriptor are what every other descriptor and mapping reads, the commit
holds the result, and a write that runs out of RAM tier is a consistent
short write. They guard the kernel-caching choices in fs/fs_ll.c
(fill_fi, ll_release), which are being changed.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/posix/test_outside_regress.py [-k NAME]
"""

import ctypes
import errno
import mmap
import os
import random
import sys

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402

PG = 4096
MiB = 1 << 20
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def fallocate(fd, mode, off, n):
    if _libc.fallocate(fd, mode, off, n) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def make(path, data):
    harness.write_file(path, data)


class CrossDescriptor(harness.MountTestCase):
    """One file, several descriptors of different open modes at once."""

    def f(self, name, data):
        p = os.path.join(self.mnt, name)
        make(p, data)
        self.addCleanup(lambda: os.path.exists(p) and os.unlink(p))
        return p

    def test_direct_write_seen_by_cached_readers(self):
        for reader in (os.O_RDWR, os.O_RDONLY):
            with self.subTest(reader=reader):
                p = self.f("a%d" % reader, b"A" * 8192)
                r = os.open(p, reader)
                self.assertEqual(os.pread(r, 8192, 0), b"A" * 8192)   # cache it
                w = os.open(p, os.O_WRONLY)
                os.pwrite(w, b"B" * 100, 4000)                      # direct_io
                os.close(w)
                self.assertEqual(os.pread(r, 8192, 0),
                                 b"A" * 4000 + b"B" * 100 + b"A" * 4092)
                os.close(r)

    def test_direct_write_seen_by_a_mapping(self):
        p = self.f("m", b"A" * 8192)
        rw = os.open(p, os.O_RDWR)
        m = mmap.mmap(rw, 8192)
        self.assertEqual(m[:16], b"A" * 16)
        w = os.open(p, os.O_WRONLY)
        os.pwrite(w, b"B" * 100, 10)
        os.close(w)
        self.assertEqual(m[:], b"A" * 10 + b"B" * 100 + b"A" * 8082)
        m.close()
        os.close(rw)

    def test_dirty_mapping_then_direct_write_overlapping(self):
        # the mapping's dirty page is written back before the direct write
        # lands over part of it, not after (which would undo the write)
        p = self.f("d", b"A" * 8192)
        rw = os.open(p, os.O_RDWR)
        m = mmap.mmap(rw, 8192)
        m[0:50] = b"M" * 50
        w = os.open(p, os.O_WRONLY)
        os.pwrite(w, b"B" * 20, 30)
        os.close(w)
        m.close()
        os.close(rw)
        drop_caches()
        self.assertEqual(harness.read_file(p), b"M" * 30 + b"B" * 20 + b"A" * 8142)

    def test_dirty_mapping_seen_by_read_of_another_descriptor(self):
        p = self.f("r", b"A" * 8192)
        rw = os.open(p, os.O_RDWR)
        m = mmap.mmap(rw, 8192)
        os.close(rw)                        # np.memmap keeps only the mapping
        m[100:200] = b"M" * 100
        ro = os.open(p, os.O_RDONLY)
        self.assertEqual(os.pread(ro, 300, 0), b"A" * 100 + b"M" * 100 + b"A" * 100)
        os.close(ro)
        m.close()
        drop_caches()
        self.assertEqual(harness.read_file(p), b"A" * 100 + b"M" * 100 + b"A" * 7992)

    def test_release_of_one_rdwr_handle_keeps_anothers_dirty_mapping(self):
        # closing a read-write handle drops the file's cached pages: a dirty
        # page of a mapping through another handle must be written, not lost
        p = self.f("two", b"A" * 8192)
        a = os.open(p, os.O_RDWR)
        b = os.open(p, os.O_RDWR)
        m = mmap.mmap(b, 8192)
        m[0:10] = b"M" * 10
        os.close(a)
        ro = os.open(p, os.O_RDONLY)       # the open waits behind the release
        os.close(ro)
        self.assertEqual(m[0:20], b"M" * 10 + b"A" * 10)
        m.close()
        os.close(b)
        drop_caches()
        self.assertEqual(harness.read_file(p)[:20], b"M" * 10 + b"A" * 10)

    def test_size_changes_through_direct_io_seen_by_cached_reader(self):
        p = self.f("s", b"A" * 8192)
        rw = os.open(p, os.O_RDWR)
        os.pread(rw, 8192, 0)
        w = os.open(p, os.O_WRONLY)
        os.ftruncate(w, 100)
        os.ftruncate(w, 8192)
        os.close(w)
        self.assertEqual(os.pread(rw, 8192, 0), b"A" * 100 + b"\0" * 8092)
        w = os.open(p, os.O_WRONLY)
        os.pwrite(w, b"B" * 5000, 8192)    # extend past the cached size
        os.close(w)
        self.assertEqual(os.pread(rw, 20000, 8000), b"\0" * 192 + b"B" * 5000)
        w = os.open(p, os.O_WRONLY | os.O_TRUNC)
        os.write(w, b"C" * 10)
        os.close(w)
        self.assertEqual(os.pread(rw, 8192, 0), b"C" * 10)
        os.close(rw)

    def test_punch_and_copy_range_through_direct_io_seen_by_cached_reader(self):
        p = self.f("h", b"A" * 16384)
        src = self.f("h.src", b"S" * 1000)
        rw = os.open(p, os.O_RDWR)
        os.pread(rw, 16384, 0)
        w = os.open(p, os.O_WRONLY)
        fallocate(w, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 4096)
        s = os.open(src, os.O_RDONLY)
        self.assertEqual(os.copy_file_range(s, w, 1000, 0, 500), 1000)
        os.close(s)
        os.close(w)
        self.assertEqual(os.pread(rw, 16384, 0),
                         b"A" * 500 + b"S" * 1000 + b"A" * 2596 + b"\0" * 4096 + b"A" * 8192)
        os.close(rw)

    def test_o_direct_rdwr_write_seen_by_cached_reader(self):
        p = self.f("o", b"A" * 8192)
        ro = os.open(p, os.O_RDONLY)
        os.pread(ro, 8192, 0)
        d = os.open(p, os.O_RDWR | os.O_DIRECT)
        buf = mmap.mmap(-1, PG)             # page-aligned for O_DIRECT
        buf.write(b"D" * PG)
        self.assertEqual(os.pwritev(d, [buf], PG), PG)
        os.close(d)
        self.assertEqual(os.pread(ro, 8192, 0), b"A" * PG + b"D" * PG)
        os.close(ro)
        buf.close()


class MixedRandomOps(harness.MountTestCase):
    """fsx's loop across descriptors: random writes, reads, mapped writes
    (msync'd or left dirty), mapped reads, truncates, punches, fallocates,
    O_TRUNC reopens and copy_file_range through O_WRONLY, O_RDWR,
    O_RDONLY and O_RDWR|O_DIRECT descriptors of one file in a step being
    written, checked against a model after every op; then the commit holds
    the model's bytes."""

    MAXLEN = 256 * 1024
    NOPS = 1500

    def run_ops(self, path, seed):
        R = random.Random(seed)
        model = bytearray()
        make(path, b"")
        modes = {"wo": os.O_WRONLY, "rw": os.O_RDWR, "ro": os.O_RDONLY,
                 "dio": os.O_RDWR | os.O_DIRECT}
        fds = {k: os.open(path, v) for k, v in modes.items()}
        abuf = mmap.mmap(-1, 16 * PG)
        log = []

        def where():
            return "seed %d op %d; last ops:\n  %s" % (seed, len(log), "\n  ".join(log[-8:]))

        for _ in range(self.NOPS):
            c = R.randrange(100)
            size = len(model)
            if c < 25:
                k = R.choice(["wo", "rw", "dio"])
                if k == "dio":
                    off = R.randrange(self.MAXLEN // PG) * PG
                    n = min(R.randrange(1, 16) * PG, self.MAXLEN - off)
                    data = R.randbytes(n)
                    abuf[0:n] = data
                    log.append("%s pwrite %d+%d" % (k, off, n))
                    w = os.pwritev(fds[k], [memoryview(abuf)[0:n]], off)
                else:
                    off = R.randrange(self.MAXLEN)
                    n = R.randrange(1, min(65536, self.MAXLEN - off) + 1)
                    data = R.randbytes(n)
                    log.append("%s pwrite %d+%d" % (k, off, n))
                    w = os.pwrite(fds[k], data, off)
                self.assertEqual(w, n, where())
                if off > len(model):
                    model.extend(bytes(off - len(model)))
                model[off:off + n] = data
            elif c < 45:
                k = R.choice(["rw", "ro"])
                off, n = R.randrange(self.MAXLEN), R.randrange(1, 65536)
                log.append("%s pread %d+%d" % (k, off, n))
                self.assertEqual(os.pread(fds[k], n, off), bytes(model[off:off + n]), where())
            elif c < 50:
                off, n = R.randrange(self.MAXLEN // PG) * PG, R.randrange(1, 16) * PG
                log.append("dio pread %d+%d" % (off, n))
                got = os.preadv(fds["dio"], [memoryview(abuf)[0:n]], off)
                self.assertEqual(bytes(abuf[0:got]), bytes(model[off:off + n]), where())
            elif c < 62 and size:
                off = R.randrange(size)
                n = R.randrange(1, min(65536, size - off) + 1)
                data = R.randbytes(n)
                msync = R.random() < 0.5
                log.append("rw mapwrite %d+%d msync=%s" % (off, n, msync))
                m = mmap.mmap(fds["rw"], size)
                m[off:off + n] = data
                if msync:
                    m.flush()
                m.close()
                model[off:off + n] = data
            elif c < 70 and size:
                off = R.randrange(size)
                n = R.randrange(1, min(65536, size - off) + 1)
                log.append("rw mapread %d+%d" % (off, n))
                m = mmap.mmap(fds["rw"], size, prot=mmap.PROT_READ)
                got = m[off:off + n]
                m.close()
                self.assertEqual(got, bytes(model[off:off + n]), where())
            elif c < 78:
                k = R.choice(["wo", "rw"])
                n = R.randrange(self.MAXLEN)
                log.append("%s ftruncate %d" % (k, n))
                os.ftruncate(fds[k], n)
                if n < len(model):
                    del model[n:]
                else:
                    model.extend(bytes(n - len(model)))
            elif c < 84 and size:
                off = R.randrange(size)
                n = R.randrange(1, min(65536, size - off) + 1)
                k = R.choice(["wo", "rw"])
                log.append("%s punch %d+%d" % (k, off, n))
                fallocate(fds[k], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, n)
                model[off:off + n] = bytes(n)
            elif c < 88:
                off = R.randrange(self.MAXLEN)
                n = R.randrange(1, min(65536, self.MAXLEN - off) + 1)
                keep = R.choice([0, FALLOC_FL_KEEP_SIZE])
                log.append("wo fallocate %d+%d keep=%d" % (off, n, keep))
                fallocate(fds["wo"], keep, off, n)
                if not keep and off + n > len(model):
                    model.extend(bytes(off + n - len(model)))
            elif c < 92:
                log.append("wo reopen O_TRUNC")
                os.close(fds["wo"])
                fds["wo"] = os.open(path, os.O_WRONLY | os.O_TRUNC)
                del model[:]
            elif c < 96:
                k = R.choice(sorted(modes))
                log.append("%s reopen" % k)
                os.close(fds[k])
                fds[k] = os.open(path, modes[k])
            else:
                n = R.randrange(1, 65536)
                off = R.randrange(self.MAXLEN - n)
                data = R.randbytes(n)
                src = path + ".src"
                make(src, data)
                s = os.open(src, os.O_RDONLY)
                log.append("wo copy_file_range %d+%d" % (off, n))
                w = os.copy_file_range(s, fds["wo"], n, 0, off)
                os.close(s)
                os.unlink(src)
                self.assertEqual(w, n, where())
                if off > len(model):
                    model.extend(bytes(off - len(model)))
                model[off:off + n] = data
            self.assertEqual(os.fstat(fds["ro"]).st_size, len(model), where())
        for fd in fds.values():
            os.close(fd)
        abuf.close()
        return bytes(model)

    def test_random_ops_then_commit(self):
        tmp = os.path.join(self.mnt, "9.orbax-checkpoint-tmp-1")
        os.mkdir(tmp)
        want = {}
        for seed in (1, 2):
            name = "f%d" % seed
            want[name] = self.run_ops(os.path.join(tmp, name), seed)
            self.assertEqual(harness.read_file(os.path.join(tmp, name)), want[name])
        os.rename(tmp, os.path.join(self.mnt, "9"))
        shard = self.wait_committed(9)
        harness.assert_manifest(self, shard, want)
        harness.assert_shard_on_disk(self, self.ramdir, 9, want)
        drop_caches()
        for name, data in want.items():
            self.assertEqual(harness.read_file(os.path.join(self.mnt, "9", name)), data)


class ShortWriteAtCapacity(harness.MountTestCase):
    """A write larger than what is left of ram_size: a short write (or
    ENOSPC), and the file holds exactly what the write reported, through
    the same descriptor and after the cache is dropped."""

    OPTS = "ram_size=16M"

    def test_short_write_is_what_the_file_holds(self):
        for mode in (os.O_WRONLY, os.O_RDWR):
            with self.subTest(mode=mode):
                p = os.path.join(self.mnt, "g")
                filler = os.path.join(self.mnt, "filler")
                make(p, b"A" * 65536)
                make(filler, b"F" * (13 * MiB))
                fd = os.open(p, mode)
                try:
                    try:
                        n = os.pwrite(fd, b"B" * (4 * MiB), 0)
                    except OSError as e:
                        self.assertEqual(e.errno, errno.ENOSPC)
                        n = 0
                    self.assertLess(n, 4 * MiB)
                    size = os.fstat(fd).st_size
                    want = b"B" * n + b"A" * max(0, 65536 - n)
                    self.assertEqual(size, len(want))
                    if mode == os.O_RDWR:
                        self.assertEqual(os.pread(fd, 4 * MiB, 0), want)
                finally:
                    os.close(fd)
                drop_caches()
                self.assertEqual(harness.read_file(p), want)
                os.unlink(filler)
                os.unlink(p)


if __name__ == "__main__":
    harness.main()
