"""ram_size: the RAM tier never holds more; policy frees superseded steps
first, then writes fail with ENOSPC, and committed data stays intact."""
import errno
import hashlib
import os
import sys

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import MountTestCase, admin_ls, find_shard, wait_until  # noqa: E402

MiB = 1 << 20


def blob(seed, size):
    out = bytearray()
    h = hashlib.sha256(b"%d" % seed).digest()
    while len(out) < size:
        h = hashlib.sha256(h).digest()
        out += h * 128
    return bytes(out[:size])


def du_ramdir(ramdir):
    """Bytes allocated under RAMDIR's ns/ and shards/, each inode once."""
    seen, total = set(), 0
    for top in ("ns", "shards"):
        for root, dirs, files in os.walk(os.path.join(ramdir, top)):
            for f in files:
                st = os.lstat(os.path.join(root, f))
                if st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
    return total


class RamSize(MountTestCase):
    OPTS = "ram_size=64M"

    def write(self, path, data):
        with open(path, "wb") as f:
            for off in range(0, len(data), MiB):
                f.write(data[off:off + MiB])

    def commit(self, step, data, job="default"):
        tmp = os.path.join(self.mnt, "%d.orbax-checkpoint-tmp-1" % step)
        os.mkdir(tmp)
        self.write(os.path.join(tmp, "w.bin"), data)
        os.rename(tmp, os.path.join(self.mnt, str(step)))
        return self.wait_committed(step, job=job)

    def test_statfs_reports_capacity(self):
        sv = os.statvfs(self.mnt)
        self.assertEqual(sv.f_blocks * sv.f_frsize, 64 * MiB)
        self.assertLessEqual(sv.f_bavail, sv.f_blocks)

    def test_single_write_larger_than_tier(self):
        with open(os.path.join(self.mnt, "big"), "wb") as f:
            with self.assertRaises(OSError) as cm:
                for _ in range(80):
                    f.write(b"\1" * MiB)
                    f.flush()
            self.assertEqual(cm.exception.errno, errno.ENOSPC)
        self.assertLessEqual(du_ramdir(self.ramdir), 64 * MiB)
        # freeing the space makes room again
        os.unlink(os.path.join(self.mnt, "big"))
        self.write(os.path.join(self.mnt, "after"), b"\2" * (40 * MiB))

    def test_reclaim_superseded_then_enospc(self):
        s1, s2 = blob(1, 24 * MiB), blob(2, 24 * MiB)
        self.commit(1, s1)
        self.commit(2, s2)
        # a third step does not fit beside both: step 1 (superseded by 2) goes
        work = os.path.join(self.mnt, "3.orbax-checkpoint-tmp-1")
        os.mkdir(work)
        s3 = blob(3, 24 * MiB)
        self.write(os.path.join(work, "w.bin"), s3)
        ls = admin_ls(self.ramdir)
        self.assertIsNone(find_shard(ls, 1), "step 1 should have been dropped")
        self.assertFalse(os.path.exists(os.path.join(self.mnt, "1")))
        self.assertEqual(find_shard(ls, 2)["state"], "committed")
        self.assertLessEqual(du_ramdir(self.ramdir), 64 * MiB)
        # nothing else may go: the newest committed step and unfinished data
        with self.assertRaises(OSError) as cm:
            self.write(os.path.join(work, "more.bin"), b"\3" * (40 * MiB))
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        self.assertLessEqual(du_ramdir(self.ramdir), 64 * MiB)
        # the committed step is intact, through the mount and in the store
        with open(os.path.join(self.mnt, "2", "w.bin"), "rb") as f:
            self.assertEqual(f.read(), s2)
        with open(os.path.join(harness.shard_dir(self.ramdir, 2), "w.bin"), "rb") as f:
            self.assertEqual(f.read(), s2)
        with open(os.path.join(work, "w.bin"), "rb") as f:
            self.assertEqual(f.read(), s3)
        # the app cleans up its partial file and goes on
        os.unlink(os.path.join(work, "more.bin"))
        os.rename(work, os.path.join(self.mnt, "3"))
        self.wait_committed(3)
        wait_until(lambda: find_shard(admin_ls(self.ramdir), 3), 30, "step 3 listed")
        self.assertEqual(find_shard(admin_ls(self.ramdir), 2)["state"], "committed")

    def configure(self, job):
        """replicator.yaml for a one-node job; wait until it is taken and
        the markers are out."""
        with open(os.path.join(self.mnt, "replicator.yaml"), "w") as f:
            f.write("job-name: %s\nframework: orbax\nnode-rank: 0\nnodes: 1\n" % job)
        wait_until(lambda: not os.path.exists(os.path.join(self.mnt, "replicator.yaml"))
                   and any(n.endswith(".restore") for n in os.listdir(self.mnt)),
                   30, "job %s configured" % job)

    def test_other_job_dropped_before_enospc(self):
        """An earlier job's shards (no longer in the namespace, useless to
        the current job's restores) are dropped, oldest first, before a
        write of the current job is refused; the current job's newest
        committed step is not."""
        a20, b10, b20 = blob(20, 24 * MiB), blob(110, 24 * MiB), blob(120, 24 * MiB)
        self.fs.expect_log(r"is not the current job")
        self.configure("joba")
        self.commit(10, blob(10, 24 * MiB), job="joba")
        self.commit(20, a20, job="joba")
        wait_until(lambda: find_shard(admin_ls(self.ramdir), 10, job="joba") is None,
                   30, "joba step 10 dropped by GC (superseded by 20)")
        self.configure("jobb")
        # the namespace is clean, the earlier job's step is still held
        self.assertFalse(os.path.exists(os.path.join(self.mnt, "20")))
        self.assertIsNotNone(find_shard(admin_ls(self.ramdir), 20, job="joba"))
        self.commit(10, b10, job="jobb")
        # 24 + 24 + 24 MiB do not fit in 64: joba's step goes, not jobb's 10
        self.commit(20, b20, job="jobb")
        ls = admin_ls(self.ramdir)
        self.assertIsNone(find_shard(ls, 20, job="joba"), "joba's step 20 kept")
        self.assertLessEqual(du_ramdir(self.ramdir), 64 * MiB)
        self.assertRegex(self.fs.log_text(),
                         r"job joba is not the current job \(jobb\): step 20 node 0 "
                         r"dropped for room")
        with open(os.path.join(self.mnt, "20", "w.bin"), "rb") as f:
            self.assertEqual(f.read(), b20)
        # with nothing else to drop, the current job's data is never taken
        work = os.path.join(self.mnt, "30.orbax-checkpoint-tmp-1")
        os.mkdir(work)
        with self.assertRaises(OSError) as cm:
            self.write(os.path.join(work, "w.bin"), b"\5" * (40 * MiB))
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        with open(os.path.join(harness.shard_dir(self.ramdir, 20, job="jobb"), "w.bin"),
                  "rb") as f:
            self.assertEqual(f.read(), b20)


if __name__ == "__main__":
    harness.main()
