"""Replays of the exact operation sequences of the applications (DESIGN §3.3).

Each test writes a step the way Orbax/TensorStore, the PyTorch reference,
DCP, torch.save or HDF5 do, commits it, and checks with
`mtcfs-admin ls --json` that the shard's manifest equals the bytes written
(paths, sizes, CRC32C, modes), then that the step is read-only (EROFS).

Negative cases are checked against a barrier: after the operations that
must NOT commit anything, a control step is committed by rename and waited
for; only then is the catalog asserted to hold nothing else (commit
detection is ordered, so anything wrongly detected earlier would show).

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/apps/test_app_sequences.py [-k NAME]
"""

import errno
import fcntl
import json
import os
import random
import stat
import struct
import sys
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
import crc32c as crcmod  # noqa: E402
from harness import (assert_manifest, assert_shard_on_disk, read_file,  # noqa
                     read_tree, write_file)

MiB = 1 << 20
FILE_MODE = 0o644          # 0666 & ~umask 022 (harness.main sets the umask)
DIR_MODE = 0o755


def pattern(seed, n):
    return random.Random(seed).randbytes(n)


def flock_struct(l_type):
    return struct.pack("hhqqi4x", l_type, os.SEEK_SET, 0, 0, 0)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd, data):
    mv = memoryview(data)
    while mv:
        mv = mv[os.write(fd, mv):]


def modes_of(root):
    """{relpath: permission bits} of everything under root (files, dirs)."""
    out = {}
    for dp, dns, fns in os.walk(root):
        for n in dns + fns:
            p = os.path.join(dp, n)
            out[os.path.relpath(p, root)] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


class AppCase(harness.MountTestCase):
    # the listings below are the app's files only
    OPTS = harness.DEFAULT_OPTS + ",no_jax_init_info"

    def m(self, *parts):
        return os.path.join(self.mnt, *parts)

    def commit_by_rename(self, src, step):
        """rename(MNT/src, MNT/<step>); returns its duration in seconds."""
        t = time.perf_counter()
        os.rename(self.m(src), self.m(str(step)))
        return time.perf_counter() - t

    def barrier(self, step=100000):
        """Commit a control step by rename and wait for it (see module doc)."""
        tmp = self.m("%d.orbax-checkpoint-tmp-barrier" % step)
        os.mkdir(tmp)
        write_file(os.path.join(tmp, "x"), b"barrier")
        os.rename(tmp, self.m(str(step)))
        s = self.wait_committed(step)
        assert_manifest(self, s, {"x": b"barrier"})
        return step

    def assert_steps(self, steps):
        self.assertEqual(harness.shard_steps(self.ramdir), sorted(steps),
                         "steps in mtcfs-admin ls")

    def check_committed(self, step, files, dirs=(), modes=None):
        """Wait for step, then: manifest == files, shard bytes, view."""
        s = self.wait_committed(step)
        assert_manifest(self, s, files, dirs=dirs, modes=modes)
        assert_shard_on_disk(self, self.ramdir, step, files)
        self.assertEqual(read_tree(self.m(str(step))),
                         {p: bytes(v) for p, v in files.items()},
                         "the application's view of step %d" % step)
        return s

    def assert_erofs(self, fn, *args):
        return self.assertErrno(errno.EROFS, fn, *args)

    # --- TensorStore's file kvstore ----------------------------------------

    def ts_write(self, dirpath, key, value):
        """TensorStore file kvstore write of key under dirpath.

        The `K.__lock` file is both the lock and the temp file: open with
        O_CREAT, OFD write lock (retry if the lock file was replaced
        meanwhile), ftruncate, write, fsync, rename over K, fsync the
        directory, unlock, close.
        """
        full = os.path.join(dirpath, key)
        d = os.path.dirname(full)
        os.makedirs(d, exist_ok=True)
        lock_path = full + ".__lock"
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                         0o666)
            fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, flock_struct(fcntl.F_WRLCK))
            try:
                same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            os.ftruncate(fd, 0)
            write_all(fd, value)
            os.fsync(fd)
            os.rename(lock_path, full)
            fsync_dir(d)
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, flock_struct(fcntl.F_UNLCK))
        finally:
            os.close(fd)

    def ts_write_separate_lock(self, dirpath, key, value):
        """Variant: lock file kept apart, data via K.tmp, lock unlinked."""
        full = os.path.join(dirpath, key)
        d = os.path.dirname(full)
        os.makedirs(d, exist_ok=True)
        lock_path = full + ".__lock"
        lfd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.fcntl(lfd, fcntl.F_OFD_SETLKW, flock_struct(fcntl.F_WRLCK))
            os.ftruncate(lfd, 0)
            tmp = full + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                write_all(fd, value)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, full)
            fsync_dir(d)
            os.unlink(lock_path)
            fcntl.fcntl(lfd, fcntl.F_OFD_SETLK, flock_struct(fcntl.F_UNLCK))
        finally:
            os.close(lfd)


class OrbaxTensorStore(AppCase):

    def test_orbax_tensorstore_save(self):
        tmp = "5.orbax-checkpoint-tmp-1234"
        self.assertEqual(os.listdir(self.mnt), [])
        os.mkdir(self.m(tmp))
        item_tmp = self.m(tmp, "state.orbax-checkpoint-tmp-99")
        os.mkdir(item_tmp)
        files = {}

        def ts(key, value, separate=False):
            (self.ts_write_separate_lock if separate else self.ts_write)(
                item_tmp, key, value)
            files["state/" + key] = value

        kernel_meta = json.dumps({"chunks": [64, 64], "dtype": "<f4",
                                  "shape": [128, 64], "zarr_format": 2,
                                  "dimension_separator": "."}).encode()
        ts("params.dense.kernel/.zarray", b"{}")            # rewritten below
        ts("params.dense.kernel/.zarray", kernel_meta)      # rename over K
        ts("params.dense.kernel/0.0", pattern(10, 64 * 64 * 4))
        ts("params.dense.kernel/1.0", pattern(11, 64 * 64 * 4))
        ts("params.dense.bias/.zarray", b'{"shape":[64]}', separate=True)
        ts("params.dense.bias/0", pattern(12, 256), separate=True)
        # OCDBT layout, also written through the kvstore
        ts("ocdbt.process_0/d/7c2f0e5d1b9a4c3e8f6a", pattern(13, 300000))
        ts("ocdbt.process_0/manifest.ocdbt", pattern(14, 120))
        ts("manifest.ocdbt", pattern(15, 99))
        ts("step.scalar/0", b"\x05\x00\x00\x00")
        # Orbax's own metadata files: plain writes
        tree_meta = json.dumps({"tree_metadata": {"params": {}},
                                "use_zarr3": False}).encode()
        write_file(os.path.join(item_tmp, "_METADATA"), tree_meta)
        files["state/_METADATA"] = tree_meta
        write_file(os.path.join(item_tmp, "_sharding"), b'{"a":"b"}')
        files["state/_sharding"] = b'{"a":"b"}'
        self.assertEqual([n for n in os.listdir(item_tmp)
                          if n.endswith(".__lock") or n.endswith(".tmp")], [])
        # the item directory is renamed to its final name
        os.rename(item_tmp, self.m(tmp, "state"))
        fsync_dir(self.m(tmp))
        ckpt_meta = json.dumps({"item_handlers": {"state": "PyTreeHandler"},
                                "init_timestamp_nsecs": 1,
                                "commit_timestamp_nsecs": 2}).encode()
        write_file(self.m(tmp, "_CHECKPOINT_METADATA"), ckpt_meta)
        files["_CHECKPOINT_METADATA"] = ckpt_meta
        ok = b"Checkpoint commit was successful to " + self.m("5").encode()
        write_file(self.m(tmp, "commit_success.txt"), ok)
        files["commit_success.txt"] = ok
        # nothing is a step yet (the tmp name contains .orbax-checkpoint-tmp)
        self.assertEqual(harness.shard_steps(self.ramdir), [])
        modes = modes_of(self.m(tmp))
        self.commit_by_rename(tmp, 5)
        self.assertEqual(os.listdir(self.mnt), ["5"])
        s = self.check_committed(5, files, modes=modes)
        names = sorted(e["path"] for e in s["files"])
        self.assertFalse([n for n in names if ".__lock" in n
                          or "orbax-checkpoint-tmp" in n or n.endswith(".tmp")],
                         names)
        self.assert_steps([5])
        for e in s["files"]:
            if e["type"] == "dir":
                self.assertEqual(e.get("mode"), DIR_MODE, e["path"])


class PyTorch(AppCase):

    def test_pytorch_reference_save(self):
        os.close(os.open(self.m("step=7-unfinished"),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        os.makedirs(self.m("step=7", "0"))
        files = {"0/__0_0.distcp": pattern(20, 3 * MiB + 11),
                 "0/__0_1.distcp": pattern(21, 777777),
                 "0/.metadata": pattern(22, 4321)}
        for rel, data in files.items():
            with open(self.m("step=7", rel), "wb") as f:
                for off in range(0, len(data), 256 * 1024):
                    f.write(data[off:off + 256 * 1024])
                f.flush()
                os.fsync(f.fileno())
        os.unlink(self.m("step=7-unfinished"))
        self.assertEqual(harness.shard_steps(self.ramdir), [])
        self.commit_by_rename("step=7", 7)
        self.assertEqual(sorted(os.listdir(self.mnt)), ["7"])
        self.check_committed(7, files,
                             modes={p: FILE_MODE for p in files} | {
                                 "0": DIR_MODE})

    def test_dcp_metadata_tmp_rename(self):
        os.makedirs(self.m("step=8"))
        files = {"__0_0.distcp": pattern(30, 2 * MiB + 5),
                 "__1_0.distcp": pattern(31, 65536)}
        for rel, data in files.items():
            fd = os.open(self.m("step=8", rel),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        # an older .metadata that the rename replaces
        write_file(self.m("step=8", ".metadata"), b"stale metadata")
        meta = pattern(32, 50000)
        fd = os.open(self.m("step=8", ".metadata.tmp"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, meta[:20000])
            os.fsync(fd)                     # fsync BEFORE the last write
            write_all(fd, meta[20000:])
        finally:
            os.close(fd)
        os.rename(self.m("step=8", ".metadata.tmp"),
                  self.m("step=8", ".metadata"))
        fsync_dir(self.m("step=8"))
        files[".metadata"] = meta
        self.commit_by_rename("step=8", 8)
        self.check_committed(8, files)

    def test_torch_save_single_file(self):
        os.mkdir(self.m("tmp-step-10"))
        body = [pattern(40 + i, MiB) for i in range(10)] + [pattern(50, 12345)]
        header = b"PK\x03\x04" + b"\x00" * 60
        with open(self.m("tmp-step-10", "model.pt"), "wb") as f:
            f.write(b"\xff" * len(header))       # placeholder header
            for chunk in body:
                f.write(chunk)
            f.seek(0)
            f.write(header)                      # rewrite the header at the end
        data = header + b"".join(body)
        self.assertEqual(read_file(self.m("tmp-step-10", "model.pt")), data)
        self.commit_by_rename("tmp-step-10", 10)
        self.check_committed(10, {"model.pt": data},
                             modes={"model.pt": FILE_MODE})


class HDF5(AppCase):

    def test_hdf5_scattered_writes(self):
        os.mkdir(self.m("h5-tmp"))
        rng = random.Random(60)
        model = bytearray()
        fd = os.open(self.m("h5-tmp", "data.h5"),
                     os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

        def pw(data, off):
            self.assertEqual(os.pwrite(fd, data, off), len(data))
            if len(model) < off + len(data):
                model.extend(bytes(off + len(data) - len(model)))
            model[off:off + len(data)] = data
        try:
            pw(b"\x89HDF\r\n\x1a\n" + bytes(504), 0)
            for i in range(300):
                if i % 10 == 0:                  # superblock/header rewrites
                    pw(rng.randbytes(rng.randint(1, 512)), 0)
                else:
                    off = rng.randrange(0, 24 * MiB)
                    pw(rng.randbytes(rng.randint(1, 96 * 1024)), off)
                if i == 150:
                    os.fsync(fd)
            pw(b"EOA", 30 * MiB)                 # leaves a hole before it
            pw(bytes(range(256)) * 2, 0)         # final header, 0..512
            os.fsync(fd)
        finally:
            os.close(fd)
        self.assertEqual(os.stat(self.m("h5-tmp", "data.h5")).st_size,
                         len(model))
        small = pattern(61, 1000)
        write_file(self.m("h5-tmp", "aux.h5"), small)
        self.commit_by_rename("h5-tmp", 12)
        self.check_committed(12, {"data.h5": bytes(model), "aux.h5": small})


class CommitSuccessInPlace(AppCase):

    def test_commit_success_txt_in_place(self):
        os.mkdir(self.m("9"))
        os.mkdir(self.m("9", "sub"))
        files = {"a.bin": pattern(70, 100000), "sub/b.bin": pattern(71, 5),
                 "sub/empty": b""}
        for rel, data in files.items():
            write_file(self.m("9", rel), data)
        ok = b"Checkpoint commit was successful"
        fd = os.open(self.m("9", "commit_success.txt"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, ok)
            os.fsync(fd)
            # still open: step 9 must not be committed, even after a barrier
            self.barrier(100)
            self.assertEqual(harness.shard_steps(self.ramdir), [100])
            write_file(self.m("9", "late"), b"still writable")
            files["late"] = b"still writable"
        finally:
            os.close(fd)
        files["commit_success.txt"] = ok
        self.check_committed(9, files)
        self.assert_steps([9, 100])
        self.assert_erofs(os.open, self.m("9", "more"),
                          os.O_WRONLY | os.O_CREAT, 0o644)


class CommitSuccessRenamed(AppCase):
    """commit_success.txt written as a tmp and renamed into a digits
    directory created in place commits it (DESIGN §3.3)."""

    def test_commit_success_renamed_into_place(self):
        os.mkdir(self.m("9"))
        files = {"a.bin": pattern(80, 70000), "meta/x.json": b'{"k": 1}'}
        for rel, data in files.items():
            os.makedirs(os.path.dirname(self.m("9", rel)), exist_ok=True)
            write_file(self.m("9", rel), data)
        ok = b"Checkpoint commit was successful"
        write_file(self.m("9", "commit_success.txt.tmp"), ok)
        self.barrier(100)
        self.assert_steps([100])        # the tmp name commits nothing
        os.rename(self.m("9", "commit_success.txt.tmp"),
                  self.m("9", "commit_success.txt"))
        files["commit_success.txt"] = ok
        self.check_committed(9, files)
        self.assert_erofs(os.open, self.m("9", "more"),
                          os.O_WRONLY | os.O_CREAT, 0o644)

    def test_renamed_while_still_open_commits_on_close(self):
        os.mkdir(self.m("10"))
        write_file(self.m("10", "a"), b"ten")
        fd = os.open(self.m("10", "c.tmp"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, b"o")
            os.rename(self.m("10", "c.tmp"), self.m("10", "commit_success.txt"))
            write_all(fd, b"k")
            self.barrier(100)
            self.assert_steps([100])    # still open: not complete yet
        finally:
            os.close(fd)
        self.check_committed(10, {"a": b"ten", "commit_success.txt": b"ok"})


class StepNames(AppCase):
    """Step directory names are the digits as written (Orbax's
    step_format_fixed_length): "05" is step 5 under its own name; numbers
    above 2^63-1 are not steps."""

    YAML = ("job-name: default\nframework: orbax\nnode-rank: 0\nnodes: 1\n"
            "peers-per-node: 1\nbackup-interval-minutes: 30\n")

    def save(self, name, files):
        tmp = self.m(name + ".orbax-checkpoint-tmp-7")
        for rel, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            write_file(os.path.join(tmp, rel), data)
        os.rename(tmp, self.m(name))

    def restart_job(self):
        """A new replicator.yaml; returns the sorted .restore markers."""
        y = self.m("replicator.yaml")
        harness.wait_until(lambda: not os.path.exists(y), 30, "yaml absent")
        for n in os.listdir(self.mnt):  # the previous run's markers, consumed
            if n.endswith(".restore"):
                os.unlink(self.m(n))
        write_file(y + ".tmp", self.YAML.encode())
        os.rename(y + ".tmp", y)
        harness.wait_until(lambda: not os.path.exists(y), 30, "yaml consumed",
                           check=self.fs.check_alive)

        def markers():
            if os.path.exists(self.m("replicator.failed")):
                self.fail(read_file(self.m("replicator.failed")))
            return sorted(n for n in os.listdir(self.mnt)
                          if n.endswith(".restore")) or None
        return harness.wait_until(markers, 30, ".restore markers",
                                  check=self.fs.check_alive)

    def assert_restored(self, name, files):
        """Exactly one marker, spelled with the step's name, whose relative
        symlink holds exactly the files; renamed to the name, it reads."""
        want = "default-s%s-n0-w0.restore" % name
        self.assertEqual(self.restart_job(), [want])
        self.assertEqual(read_file(self.m("replicator.prerestore")),
                         b"restore-step: %d\n" % int(name))
        self.assertFalse(os.readlink(self.m(want)).startswith("/"))
        os.replace(self.m(want), self.m(name))     # what the app does
        self.assertEqual(read_tree(self.m(name)),
                         {p: bytes(v) for p, v in files.items()})

    def check_named(self, name, files):
        s = self.wait_committed(int(name))
        assert_manifest(self, s, files)
        self.assertEqual(read_tree(self.m(name)),
                         {p: bytes(v) for p, v in files.items()})
        self.assert_erofs(os.open, self.m(name, "new"),
                          os.O_WRONLY | os.O_CREAT, 0o644)

    def test_zero_padded_05_commits_and_restores_as_05(self):
        files = {"state/a": pattern(90, 5000), "commit_success.txt": b"ok"}
        self.save("05", files)
        self.check_named("05", files)
        self.fs.restart()               # the name survives a restart
        self.assert_restored("05", files)

    def test_zero_padded_00000100_commits_and_restores(self):
        old = {"f": b"three"}
        self.save("00000003", old)
        self.check_named("00000003", old)
        files = {"f": pattern(91, 12345), "d/g": b"g"}
        self.save("00000100", files)
        self.check_named("00000100", files)
        self.assert_steps([3, 100])
        self.assert_restored("00000100", files)

    def test_padded_in_place_with_commit_success(self):
        os.mkdir(self.m("007"))
        write_file(self.m("007", "w"), b"seven")
        write_file(self.m("007", "commit_success.txt"), b"ok")
        self.check_named("007", {"w": b"seven", "commit_success.txt": b"ok"})

    def test_5_and_05_do_not_clobber(self):
        five = {"f": b"plain five"}
        self.save("5", five)
        self.check_named("5", five)
        # another spelling of a committed step that is still in view fails
        tmp = self.m("05.orbax-checkpoint-tmp-1")
        os.mkdir(tmp)
        write_file(os.path.join(tmp, "f"), b"padded five")
        self.assertErrno(errno.EEXIST, os.rename, tmp, self.m("05"))
        self.barrier(4)                 # lower: step 5 stays the newest
        s = harness.find_shard(harness.admin_ls(self.ramdir), 5)
        assert_manifest(self, s, five)
        self.assertEqual(read_file(self.m("5", "f")), b"plain five")
        # once the app deleted "5", "05" commits step 5 anew
        os.unlink(self.m("5", "f"))
        os.rmdir(self.m("5"))
        os.rename(tmp, self.m("05"))
        padded = {"f": b"padded five"}

        def replaced():
            sh = harness.find_shard(harness.admin_ls(self.ramdir), 5)
            return sh if sh and sh["state"] in harness.COMMITTED_STATES and \
                sh["bytes"] == len(padded["f"]) else None
        assert_manifest(self, harness.wait_until(replaced, 30, "05 sealed"),
                        padded)
        self.assertEqual(read_file(self.m("05", "f")), b"padded five")
        self.assert_steps([4, 5])
        self.assert_restored("05", padded)

    def test_above_int64_is_never_a_step(self):
        good = {"f": b"a real step"}
        self.save("7", good)
        self.check_named("7", good)
        for name in ("99999999999999999999", "9223372036854775808",
                     "18446744073709551615", "0" * 65 + "1"):
            self.save(name, {"x": b"not a step"})
        os.mkdir(self.m("9999999999999999999"))
        write_file(self.m("9999999999999999999", "commit_success.txt"), b"ok")
        self.barrier(8)
        self.assert_steps([7, 8])
        # still ordinary, writable directories
        write_file(self.m("99999999999999999999", "x"), b"writable")
        write_file(self.m("9223372036854775808", "x"), b"writable")
        # and the restore is unharmed: the newest real step comes back
        self.assertEqual(self.restart_job(), ["default-s8-n0-w0.restore"])
        os.replace(self.m("default-s8-n0-w0.restore"), self.m("8"))
        self.assertEqual(read_tree(self.m("8")), {"x": b"barrier"})


class StepNamesCluster(unittest.TestCase):
    """The same rules on two nodes: a name above 2^63-1 on one node does
    not reach the job-wide plan; padded names restore under their names."""

    def start(self):
        from cluster import Cluster
        c = Cluster(2)
        for d in c.nodes:
            d.extra_args.append("-d")      # INFO lines: evidence on failure
        self.daemons = list(c.nodes)
        self.addCleanup(c.close)
        return c.start()

    def test_huge_name_does_not_break_the_cluster_restore(self):
        c = self.start()
        job = "huge"
        c.job_start(job)
        c.save(job, 3)
        c.wait_replicated(job, 3)
        mnt = c.nodes[0].mnt
        for name in ("9223372036854775808", "99999999999999999999"):
            os.mkdir(os.path.join(mnt, name + ".tmp"))
            write_file(os.path.join(mnt, name + ".tmp", "x"), b"not a step")
            os.rename(os.path.join(mnt, name + ".tmp"), os.path.join(mnt, name))
        c.save(job, 4, ranks=[0])           # a barrier on node 0
        c.nodes[0].check_alive()
        harness.wait_committed(c.nodes[0].ramdir, 4, job=job)
        self.assertEqual(harness.shard_steps(c.nodes[0].ramdir, job)[-1], 4)
        self.assertEqual(c.job_start(job), {0: 3, 1: 3})
        for r in (0, 1):
            c.restore_and_verify(job, r, 3)

    def test_padded_names_restore_on_every_node(self):
        c = self.start()
        job = "pad"
        c.job_start(job)
        for r in (0, 1):
            mnt = c.nodes[r].mnt
            for n in os.listdir(mnt):
                if n.endswith(".restore"):
                    os.unlink(os.path.join(mnt, n))
            tmp = os.path.join(mnt, "00000100.orbax-checkpoint-tmp-0")
            os.mkdir(tmp)
            write_file(os.path.join(tmp, "f"), b"node %d" % r)
            os.rename(tmp, os.path.join(mnt, "00000100"))
        c.wait_replicated(job, 100)
        self.assertEqual(c.job_start(job), {0: 100, 1: 100})
        for r in (0, 1):
            mnt = c.nodes[r].mnt
            ms = sorted(n for n in os.listdir(mnt) if n.endswith(".restore"))
            self.assertEqual(ms, ["pad-s00000100-n%d-w0.restore" % r])
            os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, "00000100"))
            self.assertEqual(read_file(os.path.join(mnt, "00000100", "f")),
                             b"node %d" % r)


class Negatives(AppCase):

    def test_never_steps(self):
        # 1. a tmp-named directory, even with commit_success.txt inside
        os.mkdir(self.m("11.orbax-checkpoint-tmp-5"))
        write_file(self.m("11.orbax-checkpoint-tmp-5", "f"), b"x")
        write_file(self.m("11.orbax-checkpoint-tmp-5", "commit_success.txt"),
                   b"ok")
        os.mkdir(self.m("x.tmp"))
        os.rename(self.m("x.tmp"), self.m("14.orbax-checkpoint-tmp"))
        # 2. a <digits> symlink: created, and renamed into place (as Orbax
        #    does with a .restore marker)
        os.mkdir(self.m("real"))
        write_file(self.m("real", "f"), b"y")
        write_file(self.m("real", "commit_success.txt"), b"ok")
        os.symlink("real", self.m("12"))
        os.symlink("real", self.m("default-s13-n0-w0.restore"))
        os.rename(self.m("default-s13-n0-w0.restore"), self.m("13"))
        # 3. a digits directory created in place without commit_success.txt
        os.mkdir(self.m("15"))
        write_file(self.m("15", "f"), b"z")
        write_file(self.m("15", "commit_success.txt.tmp"), b"not it")
        #    and one where commit_success.txt sits in a subdirectory
        os.makedirs(self.m("16", "sub"))
        write_file(self.m("16", "sub", "commit_success.txt"), b"deep")
        # 4. digits directories below the top: by rename and in place
        os.mkdir(self.m("a"))
        os.mkdir(self.m("a", "17.tmp"))
        write_file(self.m("a", "17.tmp", "f"), b"w")
        os.rename(self.m("a", "17.tmp"), self.m("a", "17"))
        os.mkdir(self.m("a", "18"))
        write_file(self.m("a", "18", "commit_success.txt"), b"ok")
        # 5. a digits-named regular file renamed to the top
        write_file(self.m("file.tmp"), b"not a dir")
        os.rename(self.m("file.tmp"), self.m("19"))
        # 6. names that merely contain digits
        for n in ("step=20", "20a", "-21", "22 ", "0x17", "1e3"):
            os.mkdir(self.m(n + ".t"))
            os.rename(self.m(n + ".t"), self.m(n))
        self.barrier()
        self.assert_steps([100000])
        # the namespace is untouched by all this
        self.assertEqual(os.readlink(self.m("12")), "real")
        self.assertEqual(os.readlink(self.m("13")), "real")
        self.assertEqual(read_file(self.m("19")), b"not a dir")
        write_file(self.m("15", "f"), b"still writable")
        write_file(self.m("a", "17", "f"), b"still writable")
        write_file(self.m("11.orbax-checkpoint-tmp-5", "f"), b"writable")

    def test_tmp_dir_renamed_to_tmp_name_then_step(self):
        # renames between non-step names do nothing; the last one commits
        os.mkdir(self.m("30.orbax-checkpoint-tmp-1"))
        write_file(self.m("30.orbax-checkpoint-tmp-1", "f"), b"data")
        os.rename(self.m("30.orbax-checkpoint-tmp-1"),
                  self.m("30.orbax-checkpoint-tmp-2"))
        os.rename(self.m("30.orbax-checkpoint-tmp-2"), self.m("step=30"))
        self.barrier(100001)
        self.assert_steps([100001])
        self.commit_by_rename("step=30", 30)
        self.check_committed(30, {"f": b"data"})


class AfterCommit(AppCase):

    def test_read_only_then_delete(self):
        os.makedirs(self.m("s.tmp", "sub", "deep"))
        files = {"a": pattern(80, 300000), "sub/b": pattern(81, 1000),
                 "sub/deep/c": b"c"}
        for rel, data in files.items():
            write_file(self.m("s.tmp", rel), data)
        write_file(self.m("outside"), b"outside")
        self.commit_by_rename("s.tmp", 5)
        step = self.m("5")
        # read-only from the rename on, before the manifest is sealed
        self.assert_erofs(os.open, os.path.join(step, "a"), os.O_WRONLY)
        self.wait_committed(5)
        a = os.path.join(step, "a")
        # open for write, in every form
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_TRUNC,
                      os.O_WRONLY | os.O_APPEND, os.O_RDONLY | os.O_TRUNC):
            self.assert_erofs(os.open, a, flags)
        self.assert_erofs(os.truncate, a, 0)
        self.assert_erofs(os.truncate, a, 10 * MiB)
        self.assert_erofs(os.chmod, a, 0o600)
        self.assert_erofs(os.chmod, os.path.join(step, "sub"), 0o700)
        self.assert_erofs(os.utime, a)
        self.assert_erofs(os.utime, a, (1, 2))
        # creating names inside, at any depth
        self.assert_erofs(os.open, os.path.join(step, "new"),
                          os.O_WRONLY | os.O_CREAT, 0o644)
        self.assert_erofs(os.open, os.path.join(step, "sub", "deep", "new"),
                          os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.assert_erofs(os.mkdir, os.path.join(step, "newdir"))
        self.assert_erofs(os.mkdir, os.path.join(step, "sub", "newdir"))
        self.assert_erofs(os.symlink, "a", os.path.join(step, "lnk"))
        self.assert_erofs(os.link, self.m("outside"),
                          os.path.join(step, "hard"))
        # renames inside, out of and into the step
        self.assert_erofs(os.rename, a, os.path.join(step, "a2"))
        self.assert_erofs(os.rename, a, os.path.join(step, "sub", "a"))
        self.assert_erofs(os.rename, os.path.join(step, "sub", "b"),
                          os.path.join(step, "a"))
        self.assert_erofs(os.rename, a, self.m("a-out"))
        self.assert_erofs(os.rename, os.path.join(step, "sub"), self.m("sub"))
        self.assert_erofs(os.rename, self.m("outside"),
                          os.path.join(step, "in"))
        self.assert_erofs(os.rename, self.m("outside"), a)
        # nothing changed, and reads work
        self.assertEqual(read_tree(step), files)
        self.assertTrue(os.path.exists(self.m("outside")))
        fd = os.open(a, os.O_RDONLY)
        try:
            self.assertEqual(os.pread(fd, 10, 5), files["a"][5:15])
        finally:
            os.close(fd)
        self.check_committed(5, files)
        # unlink and rmdir only remove names from the application's view
        os.unlink(a)
        self.assertFalse(os.path.exists(a))
        self.assertEqual(sorted(os.listdir(step)), ["sub"])
        s = self.wait_committed(5)
        assert_manifest(self, s, files)
        assert_shard_on_disk(self, self.ramdir, 5, files)
        os.unlink(os.path.join(step, "sub", "deep", "c"))
        os.rmdir(os.path.join(step, "sub", "deep"))
        os.unlink(os.path.join(step, "sub", "b"))
        os.rmdir(os.path.join(step, "sub"))
        os.rmdir(step)
        self.assertEqual(sorted(os.listdir(self.mnt)), ["outside"])
        s = self.wait_committed(5)
        assert_manifest(self, s, files)
        assert_shard_on_disk(self, self.ramdir, 5, files)
        self.assert_steps([5])


class Restart(AppCase):

    def _commit_step(self):
        os.mkdir(self.m("5.orbax-checkpoint-tmp-1"))
        files = {"f": pattern(90, 123456), "d/g": b"g"}
        os.mkdir(self.m("5.orbax-checkpoint-tmp-1", "d"))
        for rel, data in files.items():
            write_file(self.m("5.orbax-checkpoint-tmp-1", rel), data)
        self.commit_by_rename("5.orbax-checkpoint-tmp-1", 5)
        self.check_committed(5, files)
        return files

    def _after_restart(self, files):
        self.check_committed(5, files)
        self.assert_steps([5])
        self.assert_erofs(os.open, self.m("5", "f"), os.O_WRONLY)
        # the new daemon commits new steps
        os.mkdir(self.m("6.orbax-checkpoint-tmp-1"))
        write_file(self.m("6.orbax-checkpoint-tmp-1", "f"), b"six")
        self.commit_by_rename("6.orbax-checkpoint-tmp-1", 6)
        self.check_committed(6, {"f": b"six"})

    def test_committed_step_survives_clean_restart(self):
        files = self._commit_step()
        self.fs.restart()
        self._after_restart(files)

    def test_committed_step_survives_kill9(self):
        files = self._commit_step()
        self.fs.restart(kill=True)
        self._after_restart(files)


class CommitLatency(AppCase):
    OPTS = "ram_size=4G"

    def test_rename_of_1gib_step_is_fast(self):
        tmp = "20.orbax-checkpoint-tmp-1"
        os.mkdir(self.m(tmp))
        body = pattern(100, 64 * MiB - 8)
        body_crc = crcmod.crc32c(body)
        files = {}
        for i in range(16):
            head = struct.pack("<Q", 0x1234567800 + i)
            path = self.m(tmp, "shard-%02d.bin" % i)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, head)
                for off in range(0, len(body), 8 * MiB):
                    write_all(fd, memoryview(body)[off:off + 8 * MiB])
            finally:
                os.close(fd)
            files["shard-%02d.bin" % i] = (64 * MiB, crcmod.crc32c_combine(
                crcmod.crc32c(head), body_crc, len(body)))
        dt = self.commit_by_rename(tmp, 20)
        self.assertLess(dt, 0.050, "commit rename of a 1 GiB step took "
                        "%.1f ms" % (dt * 1000))
        s = self.wait_committed(20, timeout=300)
        assert_manifest(self, s, files)
        self.assertEqual(s["bytes"], 1 << 30)
        sys.stderr.write("[commit rename of 1 GiB: %.2f ms] " % (dt * 1000))


class Crc32c(unittest.TestCase):
    """The checksum the manifest checks rely on (no mount)."""

    def test_check_values(self):
        self.assertEqual(crcmod.crc32c(b"123456789"), 0xE3069283)
        for data, want in crcmod.CHECK_VECTORS:
            self.assertEqual(crcmod.crc32c(data), want, data[:10])
            self.assertEqual(crcmod.crc32c_slow(data), want, data[:10])
        self.assertEqual(crcmod.crc32c_hex(b"123456789"), "e3069283")

    def test_implementations_agree(self):
        crcmod.selftest()


if __name__ == "__main__":
    harness.main()
