"""The .deb built the README's way installs with apt on a stock Debian root
of the release it was built on, and works there.

A fresh `debootstrap --variant=minbase` root of this machine's release
(cached under /var/cache/mtcfs-roots/<codename>, used through an overlay so
that every run starts from the stock root) gets the package with
`apt-get install ./mtcfs_*.deb`, which must resolve every dependency from
the release's own archive: on Debian 12 there is no libfuse 3.17 there, so
the package carries its own (Packaging.cmake) and `mtcfs --version` still
reports FUSE passthrough. Then, inside the root: mount, save a step the way
Orbax does, unmount, mount again, restart the job, and read the step back
through its `.restore` marker, byte for byte.

Debian 13's package is built and installed on a stock trixie root by the
container image (test_container.py: its build stage builds the .deb, its
final stage is a fresh debootstrap root that installs it with apt).

Needs root, debootstrap and the network to the Debian archive
(packaging/install-deps.sh installs debootstrap).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import wait_until, mount_fstype  # noqa: E402
from test_packaging import run, os_release, deb_version, Undo, fortified_build  # noqa: E402

ROOTS = os.environ.get("MTCFS_ROOTS", "/var/cache/mtcfs-roots")
MIRROR = os.environ.get("MTCFS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
YAML = ("job-name: debjob\nframework: orbax\nnode-rank: 0\nnodes: 1\n"
        "peer-ranks: []\nbackup-interval-minutes: 30\n")


def stock_root(codename):
    """A minbase debootstrap root of codename, made once and kept: the
    stamp is written last, so a root whose debootstrap was cut short is
    made again."""
    root = os.path.join(ROOTS, codename)
    stamp = os.path.join(root, ".mtcfs-debootstrap-complete")
    if os.path.exists(stamp):
        return root
    os.makedirs(ROOTS, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=codename + ".", dir=ROOTS)
    try:
        t0 = time.monotonic()
        run(["debootstrap", "--variant=minbase", codename, tmp, MIRROR],
            timeout=900, check=True)
        sys.stdout.write("  debootstrap %s: %.0fs\n" % (codename, time.monotonic() - t0))
        with open(os.path.join(tmp, ".mtcfs-debootstrap-complete"), "w") as f:
            f.write(MIRROR + "\n")
        if os.path.exists(root):
            shutil.rmtree(root)
        os.rename(tmp, root)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, True)
    return root


class DebOnStockRelease(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root")
        if not fortified_build():
            # what ships is the release build; a sanitizer build's package
            # would need the sanitizer runtimes in the root
            self.skipTest("a Debug or sanitizer build: the package is the release build's")
        osr = os_release()
        if osr.get("ID") != "debian" or not osr.get("VERSION_CODENAME"):
            self.skipTest("not a Debian release: %s" % osr.get("PRETTY_NAME"))
        for tool in ("debootstrap", "cpack", "chroot"):
            if not shutil.which(tool):
                self.fail("%s is missing (packaging/install-deps.sh installs it)" % tool)
        self.codename = osr["VERSION_CODENAME"]
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-debroot-")
        self.undo = Undo(self)
        self.undo.push(shutil.rmtree, self.tmp, True)

    def mount(self, argv):
        run(["mount"] + argv, check=True)
        self.undo.push(run, ["umount", "-l", argv[-1]])

    def chroot(self, *argv, timeout=600, check=True):
        return run(["chroot", self.root] + list(argv), timeout=timeout, check=check)

    def build_deb(self):
        out = os.path.join(self.tmp, "cpack")
        run(["cpack", "--config", os.path.join(harness.BUILD, "CPackConfig.cmake"),
             "-G", "DEB", "-B", out], timeout=300, check=True)
        debs = [f for f in os.listdir(out) if f.endswith(".deb")]
        self.assertEqual(debs, ["mtcfs_%s_%s.deb" % (
            deb_version(), run(["dpkg", "--print-architecture"]).stdout.decode().strip())])
        return os.path.join(out, debs[0])

    def start(self, ramdir):
        log = open(os.path.join(self.tmp, "mtcfs.log"), "ab")
        p = subprocess.Popen(["chroot", self.root, "/usr/bin/mtcfs", "-f", "-o",
                              "ram_size=256M", ramdir, "/ckpt"],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        self.undo.push(self.reap, p)
        wait_until(lambda: mount_fstype(self.mnt) == "fuse.mtcfs" or p.poll() is not None,
                   60, "the package's mtcfs mounted /ckpt in the root")
        self.assertIsNone(p.poll(), self.log())
        return p

    def stop(self, p):
        run(["fusermount3", "-u", self.mnt], check=True)
        wait_until(lambda: p.poll() is not None, 30, "mtcfs exited after unmount")
        self.assertEqual(p.returncode, 0, self.log())

    def reap(self, p):
        if p.poll() is None:
            harness.force_unmount(self.mnt)
            p.kill()
            p.wait(30)

    def log(self):
        with open(os.path.join(self.tmp, "mtcfs.log"), errors="replace") as f:
            return f.read()

    def new_job(self):
        y = os.path.join(self.mnt, "replicator.yaml")
        with open(y + ".tmp", "w") as f:
            f.write(YAML)
        os.rename(y + ".tmp", y)
        wait_until(lambda: not os.path.exists(y), 30, "replicator.yaml taken")

    def markers(self):
        return sorted(n for n in os.listdir(self.mnt) if n.endswith(".restore"))

    def test_apt_install_mount_save_restore(self):
        deb = self.build_deb()
        stock = stock_root(self.codename)
        # an overlay over the stock root: each run installs into a fresh one
        upper, work, self.root = (os.path.join(self.tmp, n) for n in ("upper", "work", "root"))
        for d in (upper, work, self.root):
            os.mkdir(d)
        self.mount(["-t", "overlay", "overlay", "-o",
                    "lowerdir=%s,upperdir=%s,workdir=%s" % (stock, upper, work), self.root])
        self.mount(["-t", "proc", "proc", os.path.join(self.root, "proc")])
        self.mount(["--rbind", "/dev", os.path.join(self.root, "dev")])
        shutil.copy("/etc/resolv.conf", os.path.join(self.root, "etc", "resolv.conf"))
        shutil.copy(deb, os.path.join(self.root, "tmp"))
        t0 = time.monotonic()
        self.chroot("apt-get", "update", "-q")
        r = self.chroot("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y",
                        "-q", "--no-install-recommends", "/tmp/" + os.path.basename(deb),
                        check=False)
        self.assertEqual(r.returncode, 0, "apt-get install on stock %s:\n%s"
                         % (self.codename, r.stdout.decode(errors="replace")[-4000:]))
        sys.stdout.write("  apt-get install on stock %s: %.0fs\n"
                         % (self.codename, time.monotonic() - t0))
        v = self.chroot("/usr/bin/mtcfs", "--version").stdout.decode()
        self.assertIn("mtcfs %s" % harness_version(), v)
        self.assertIn("FUSE passthrough: available", v)
        self.assertEqual(self.chroot("ldd", "/usr/bin/mtcfs").returncode, 0)
        self.assertNotIn("not found", self.chroot("ldd", "/usr/bin/mtcfs").stdout.decode())
        # gs:// needs the CA bundle: a real dependency, not a Recommends
        self.assertTrue(os.path.getsize(os.path.join(
            self.root, "etc/ssl/certs/ca-certificates.crt")) > 0)

        ramdir = tempfile.mkdtemp(prefix="mtcfs-debroot-ram-", dir="/dev/shm")
        self.undo.push(shutil.rmtree, ramdir, True)
        self.mnt = os.path.join(self.root, "ckpt")
        os.mkdir(self.mnt)
        p = self.start(ramdir)
        self.assertTrue({"nosuid", "nodev"} <= harness.mount_options(self.mnt))
        self.new_job()
        wait_until(lambda: self.markers() == ["debjob-s0-n0-w0.restore"], 60, "s0 marker")
        tmp = os.path.join(self.mnt, "7.orbax-checkpoint-tmp-0")
        os.makedirs(os.path.join(tmp, "state"))
        data = os.urandom((1 << 20) + 7)
        with open(os.path.join(tmp, "state", "w.bin"), "wb") as f:
            f.write(data)
        os.rename(tmp, os.path.join(self.mnt, "7"))
        harness.wait_committed(ramdir, 7, job="debjob")
        # the package's mtcfs-admin reads it too
        self.assertIn(b"debjob", self.chroot("/usr/bin/mtcfs-admin", "ls", ramdir).stdout)
        self.stop(p)

        p = self.start(ramdir)
        self.new_job()
        wait_until(lambda: self.markers() == ["debjob-s7-n0-w0.restore"], 60,
                   "the step-7 marker after the restart")
        os.rename(os.path.join(self.mnt, "debjob-s7-n0-w0.restore"),
                  os.path.join(self.mnt, "7"))
        with open(os.path.join(self.mnt, "7", "state", "w.bin"), "rb") as f:
            self.assertEqual(f.read(), data)
        self.stop(p)
        self.assertNotRegex(self.log(), harness.BAD_LOG)


def harness_version():
    from test_packaging import project_version
    return project_version()


if __name__ == "__main__":
    harness.main()
