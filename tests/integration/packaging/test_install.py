"""cmake --install and `mount -t fuse.mtcfs` through mount.fuse3.

mount(8) runs helpers with an empty PATH, so /bin/sh looks in the default
path (/usr/local/bin among it): the mount part installs to the default
prefix /usr/local and puts back whatever was there before.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import wait_until, mount_fstype, admin_ls, find_shard  # noqa: E402

BUILD = harness.BUILD


def run(argv, **kw):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=120, **kw)


class Install(unittest.TestCase):
    def test_install_layout(self):
        prefix = tempfile.mkdtemp(prefix="mtcfs-prefix-")
        self.addCleanup(shutil.rmtree, prefix, True)
        r = run(["cmake", "--install", BUILD, "--prefix", prefix])
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        for b in ("mtcfs", "mtcfs-admin"):
            p = os.path.join(prefix, "bin", b)
            self.assertTrue(os.access(p, os.X_OK), p)
        r = run([os.path.join(prefix, "bin", "mtcfs"), "--version"])
        self.assertEqual(r.returncode, 0)
        self.assertIn(b"mtcfs", r.stdout)
        r = run([os.path.join(prefix, "bin", "mtcfs-admin"), "--help"])
        self.assertEqual(r.returncode, 0)
        self.assertIn(b"ls RAMDIR", r.stdout)

    def test_mount_t_fuse_mtcfs(self):
        bindir = "/usr/local/bin"
        saved = {}
        for b in ("mtcfs", "mtcfs-admin"):
            p = os.path.join(bindir, b)
            if os.path.lexists(p):
                bak = tempfile.mktemp(prefix="mtcfs-bak-")
                shutil.move(p, bak)
                saved[p] = bak

        def restore():
            for b in ("mtcfs", "mtcfs-admin"):
                p = os.path.join(bindir, b)
                if os.path.lexists(p):
                    os.unlink(p)
            for p, bak in saved.items():
                shutil.move(bak, p)
        self.addCleanup(restore)
        r = run(["cmake", "--install", BUILD, "--prefix", "/usr/local"])
        self.assertEqual(r.returncode, 0, r.stdout.decode())

        ramdir = tempfile.mkdtemp(prefix="mtcfs-ram-", dir="/dev/shm")
        mnt = tempfile.mkdtemp(prefix="mtcfs-mnt-")
        self.addCleanup(shutil.rmtree, ramdir, True)
        self.addCleanup(os.rmdir, mnt)
        self.addCleanup(harness.force_unmount, mnt)
        r = run(["mount", "-t", "fuse.mtcfs", ramdir, mnt, "-o", "ram_size=1G"])
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        wait_until(lambda: mount_fstype(mnt) == "fuse.mtcfs", 30, "mounted")
        # fstab and mount(8) get the same nosuid,nodev as a direct start
        self.assertTrue({"nosuid", "nodev"} <= harness.mount_options(mnt))
        # the daemon runs in the background: find it to reap it
        pid = int(subprocess.check_output(["pgrep", "-f", "mtcfs %s" % ramdir]).split()[0])

        step = os.path.join(mnt, "3.orbax-checkpoint-tmp-1")
        os.mkdir(step)
        data = os.urandom(1 << 20)
        with open(os.path.join(step, "w.bin"), "wb") as f:
            f.write(data)
        os.rename(step, os.path.join(mnt, "3"))
        shard = wait_until(lambda: (lambda s: s if s and s["state"] == "committed" else None)(
            find_shard(admin_ls(ramdir), 3)), 30, "step 3 committed")
        self.assertEqual([f["path"] for f in shard["files"]], ["w.bin"])
        with open(os.path.join(mnt, "3", "w.bin"), "rb") as f:
            self.assertEqual(f.read(), data)

        r = run(["umount", mnt])
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        wait_until(lambda: not os.path.exists("/proc/%d" % pid), 30, "daemon exited")
        self.assertIsNone(mount_fstype(mnt))
        # the data is still in RAMDIR for the next mount
        self.assertEqual(find_shard(admin_ls(ramdir), 3)["state"], "committed")


if __name__ == "__main__":
    harness.main()
