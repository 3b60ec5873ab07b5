"""Packaging and deployment (issue 7), tested with real parts where this
machine has them:

- Deb: `cpack -G DEB` in MTCFS_BUILD, `dpkg -i`, then the installed
  /usr/bin/mtcfs through `mount -t fuse.mtcfs`, the fstab example through
  `mount -a -T`, and the systemd mount units through the mount(8) call
  systemd makes; a step committed on each, `dpkg -P` at the end. Binaries
  in /usr/local/bin (test_install, a developer's install) would shadow the
  package's for mount(8): they are moved away meanwhile and put back.
- Sidecar: the Kubernetes sidecar's own shell script and probe/preStop
  commands, taken from the rendered JobSet, run here against the built
  mtcfs: options, rank arithmetic, refusing the placeholder secret, and a
  real mount that commits a step and unmounts through preStop.
- Kubernetes: packaging/k8s rendered (kubectl kustomize when installed, else
  a small renderer of the features used, which must agree with kubectl when
  both are there) and the objects checked.
- Dockerfile: stages, FROM, COPY sources against the repository and the
  .dockerignore, build packages covering every pkg-config module of
  CMakeLists.txt.
- Man pages: roff without warnings, every option of `mtcfs --help` and every
  command of `mtcfs-admin --help` documented.

Needs root (dpkg, mounts) for Deb and Sidecar; python3-yaml (Debian) for the
manifests.
"""
import configparser
import copy
import fcntl
import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import wait_until, mount_fstype, force_unmount  # noqa: E402

try:
    import yaml
except ImportError:            # reported by the tests that need it
    yaml = None

REPO = harness.REPO
BUILD = harness.BUILD
PKG = os.path.join(REPO, "packaging")
K8S = os.path.join(PKG, "k8s", "sidecar")
DEB_BIN = "/usr/bin/mtcfs"
DEB_ADMIN = "/usr/bin/mtcfs-admin"
LOCAL_BINS = ["/usr/local/bin/mtcfs", "/usr/local/bin/mtcfs-admin"]
LOCAL_BIN_LOCK = "/run/lock/mtcfs-local-bin.lock"
COMMITTED = harness.COMMITTED_STATES


def run(argv, timeout=120, check=False, **kw):
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError("%s failed (rc=%d):\n%s" % (
            " ".join(argv), r.returncode, r.stdout.decode(errors="replace")))
    return r


def need_root(tc):
    if os.geteuid() != 0:
        tc.skipTest("needs root")


def need_yaml(tc):
    if yaml is None:
        tc.fail("python3-yaml is missing (apt-get install python3-yaml; "
                "packaging/install-deps.sh lists it)")


def project_version():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        m = re.search(r"project\(\s*mtcfs\s+VERSION\s+([0-9.]+)", f.read())
    return m.group(1)


def os_release():
    out = {}
    with open("/etc/os-release") as f:
        for ln in f:
            k, _, v = ln.strip().partition("=")
            out[k] = v.strip('"')
    return out


def fuse_version():
    r = run(["pkg-config", "--modversion", "fuse3"])
    return tuple(int(x) for x in r.stdout.decode().strip().split(".")[:2])


def deb_version():
    """The package's version: the project's, the Debian release it was built
    on, and the libfuse when it has no passthrough (Packaging.cmake): one
    name and version is one build."""
    v = project_version()
    osr = os_release()
    if osr.get("ID") == "debian" and osr.get("VERSION_ID"):
        v += "+deb" + osr["VERSION_ID"]
        fv = fuse_version()
        if fv < (3, 17):
            v += ".fuse%d%d" % fv
    return v


def daemon_pids(exe, ramdir):
    """pids of processes running exe whose argv names ramdir."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            if os.readlink("/proc/%s/exe" % p) != exe:
                continue
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.fsencode(ramdir) in argv:
            out.append(int(p))
    return out


def kill_and_wait(pids, timeout=10):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
            os.path.exists("/proc/%d" % p) for p in pids):
        time.sleep(0.05)


def ls_json(admin, ramdir):
    r = subprocess.run([admin, "ls", ramdir, "--json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    if r.returncode != 0:
        raise AssertionError("%s ls %s: rc=%d %s" % (admin, ramdir, r.returncode,
                                                     r.stderr.decode()))
    return json.loads(r.stdout)


def commit_step(tc, mnt, ramdir, step, admin):
    """The Orbax-style save the issue names: mkdir STEP.tmp, write, rename
    to STEP; then poll mtcfs-admin ls --json until the shard is committed."""
    tmp = os.path.join(mnt, "%d.tmp" % step)
    os.mkdir(tmp)
    data = os.urandom(300 * 1024 + step)
    with open(os.path.join(tmp, "shard.bin"), "wb") as f:
        f.write(data)
    os.rename(tmp, os.path.join(mnt, str(step)))

    def committed():
        for s in ls_json(admin, ramdir)["shards"]:
            if s["step"] == step and s["own"] and s["state"] in COMMITTED:
                return s
        return None
    shard = wait_until(committed, harness.COMMIT_TIMEOUT,
                       "step %d committed (%s ls --json)" % (step, admin))
    tc.assertEqual([(f["path"], f["size"]) for f in shard["files"]],
                   [("shard.bin", len(data))])
    with open(os.path.join(mnt, str(step), "shard.bin"), "rb") as f:
        tc.assertEqual(f.read(), data)


def free_port():
    return harness.free_ports(1)[0]


class Undo:
    """Steps that put the machine back (unmount, dpkg -P, move binaries
    back), run last-in first-out by close(): from the test's cleanup, and
    also from the harness when the run is killed (SIGTERM/SIGHUP from
    ctest's timeout) or exits, since the harness closes every object in
    harness._LIVE then."""

    def __init__(self, tc):
        self.steps = []
        harness._LIVE.add(self)
        tc.addCleanup(self.close)

    def push(self, fn, *args):
        self.steps.append((fn, args))

    def close(self):
        harness._LIVE.discard(self)
        while self.steps:
            fn, args = self.steps.pop()
            try:
                fn(*args)
            except Exception as e:          # go on undoing the rest
                sys.stderr.write("undo %s%r: %s\n" % (fn.__name__, args, e))


# --- man pages ----------------------------------------------------------------

def roff_text(path):
    with open(path) as f:
        t = f.read()
    return t.replace("\\-", "-").replace("\\&", "").replace("\\fR", "")


class ManPages(unittest.TestCase):
    PAGES = [os.path.join(PKG, "man", p) for p in ("mtcfs.8", "mtcfs-admin.8")]

    def test_roff_renders_without_warnings(self):
        if not shutil.which("groff"):
            self.skipTest("groff not installed")
        for p in self.PAGES:
            r = subprocess.run(["groff", "-t", "-man", "-ww", "-z", "-Tutf8", p],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.assertEqual((r.returncode, r.stderr.decode()), (0, ""), p)

    def test_version_in_header(self):
        v = project_version()
        for p in self.PAGES:
            th = [ln for ln in open(p) if ln.startswith(".TH ")][0]
            self.assertIn('"mtcfs %s"' % v, th, p)

    def test_every_mount_option_documented(self):
        out = run([harness.MTCFS_BIN, "--help"], check=True).stdout.decode()
        opts = re.findall(r"^\s+-o\s+([a-z_]+)", out, re.M)
        self.assertIn("ram_size", opts)
        page = roff_text(self.PAGES[0])
        for o in opts:
            self.assertRegex(page, re.compile(r"^\.TP\n\.B[IR]? %s\b" % re.escape(o), re.M),
                             "mtcfs.8 does not document -o %s" % o)
        flags = re.findall(r"^\s+(-[a-zA-Z])\s", out, re.M)
        self.assertIn("-f", flags)
        for flag in flags:
            self.assertRegex(page, re.compile(r"^\.TP\n\.B[IR]? %s\b" % re.escape(flag), re.M),
                             "mtcfs.8 does not document %s" % flag)

    def test_every_admin_command_documented(self):
        out = run([harness.MTCFS_ADMIN, "--help"], check=True).stdout.decode()
        cmds = re.findall(r"^  ([a-z][a-z-]*)\b", out, re.M)
        self.assertIn("ls", cmds)
        page = roff_text(self.PAGES[1])
        for c in cmds:
            self.assertRegex(page, r'\.TP\n\.B[IR]? "?%s\b' % re.escape(c),
                             "mtcfs-admin.8 does not document %s" % c)


# --- the .deb -------------------------------------------------------------------

def escape_unit_path(path):
    """systemd-escape --path for plain paths (letters, digits, '/', '_', '.')."""
    if shutil.which("systemd-escape"):
        return run(["systemd-escape", "--path", path],
                   check=True).stdout.decode().strip()
    return path.strip("/").replace("-", "\\x2d").replace("/", "-")


def read_unit(path):
    cp = configparser.ConfigParser(strict=False, interpolation=None,
                                   delimiters=("=",), comment_prefixes=("#", ";"))
    cp.optionxform = str
    with open(path) as f:
        cp.read_file(f)
    return cp


class Deb(unittest.TestCase):
    """Build, install, use and remove the package (one test: it is a
    sequence on the machine's package database)."""

    def setUp(self):
        need_root(self)
        for tool in ("cpack", "dpkg", "dpkg-deb", "mount.fuse3"):
            if not shutil.which(tool):
                self.skipTest("%s not installed" % tool)
        st = run(["dpkg-query", "-W", "-f=${Status}", "mtcfs"]).stdout.decode()
        if "installed" in st and "not-installed" not in st:
            self.skipTest("a package mtcfs is installed on this machine "
                          "already; not replacing it")
        if os.path.lexists(DEB_BIN) or os.path.lexists(DEB_ADMIN):
            self.skipTest("%s exists and is not from a package mtcfs; "
                          "not overwriting it" % DEB_BIN)
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-pkg-")
        self.undo = Undo(self)
        self.undo.push(shutil.rmtree, self.tmp, True)

    def put_local_bins_aside(self):
        """mount(8) runs helpers with sh's default PATH, /usr/local/bin
        first: binaries there would be started instead of the package's.
        Holds LOCAL_BIN_LOCK meanwhile (other tests that install to
        /usr/local may take it too); never deletes what it finds there at
        the end: something new there is somebody else's."""
        lock = os.open(LOCAL_BIN_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.undo.push(os.close, lock)
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = []
        for p in LOCAL_BINS:
            if os.path.lexists(p):
                bak = os.path.join(self.tmp, "local-" + os.path.basename(p))
                shutil.move(p, bak)
                saved.append((bak, p))

        def restore_local_bins():
            for bak, p in saved:
                if os.path.lexists(p):
                    sys.stderr.write("%s reappeared meanwhile; keeping it, not the "
                                     "copy this test moved away\n" % p)
                else:
                    shutil.move(bak, p)
        self.undo.push(restore_local_bins)

    def build_deb(self):
        out = os.path.join(self.tmp, "cpack")
        t0 = time.monotonic()
        run(["cpack", "--config", os.path.join(BUILD, "CPackConfig.cmake"),
             "-G", "DEB", "-B", out], timeout=300, check=True)
        sys.stdout.write("  cpack -G DEB: %.1fs\n" % (time.monotonic() - t0))
        debs = [f for f in os.listdir(out) if f.endswith(".deb")]
        self.assertEqual(len(debs), 1, debs)
        self.assertRegex(debs[0], r"^mtcfs_%s_[a-z0-9]+\.deb$"
                         % re.escape(deb_version()))
        return os.path.join(out, debs[0])

    def check_control(self, deb):
        ctl = run(["dpkg-deb", "-f", deb, "Package", "Version", "Depends"],
                  check=True).stdout.decode()
        fields = dict(ln.split(": ", 1) for ln in ctl.strip().splitlines())
        self.assertEqual(fields["Package"], "mtcfs")
        self.assertEqual(fields["Version"], deb_version())
        deps = {d.strip().split()[0] for alt in fields["Depends"].split(",")
                for d in alt.split("|")}
        self.assertIn("fuse3", deps)          # mount.fuse3, fusermount3
        files = run(["dpkg-deb", "-c", deb], check=True).stdout.decode()
        carried = set(re.findall(r"\./usr/lib/[^/\s]+/mtcfs/([^/\s]+)\n", files))
        if deb_version().endswith("+deb12") and fortified_build():
            # bookworm's archive has no libfuse 3.17: the package carries it
            # (the release build's package; a sanitizer build's binaries
            # depend on the sanitizer runtimes and are not what ships)
            self.assertEqual(carried, {"libfuse3.so.4"})
            self.assertNotIn("libfuse3-4", deps)
        elif not deb_version().endswith("+deb12"):
            self.assertEqual(carried, set())
        # every shared library the built binaries load comes from a
        # package the .deb depends on, or is carried by it
        for b in (harness.MTCFS_BIN, harness.MTCFS_ADMIN):
            for name, lib in self.needed_packages(b):
                if name in carried:
                    continue
                self.assertTrue(lib & deps, "%s needs one of %s; Depends: %s"
                                % (b, sorted(lib), fields["Depends"]))
        for f in ("./usr/bin/mtcfs", "./usr/bin/mtcfs-admin",
                  "./usr/share/man/man8/mtcfs.8", "./usr/share/man/man8/mtcfs-admin.8",
                  "./usr/share/doc/mtcfs/deploy.md",
                  "./usr/share/doc/mtcfs/examples/fstab.example",
                  "./usr/share/doc/mtcfs/examples/ckpt.mount"):
            self.assertRegex(files, r"\s%s(\.gz)?\n" % re.escape(f))

    @staticmethod
    def needed_packages(binary):
        """[(soname, {packages providing it})] for every library binary names in
        its NEEDED entries (what dpkg-shlibdeps looks at), not the
        libraries those load in turn."""
        out = run(["readelf", "-d", binary], check=True).stdout.decode()
        res = []
        for m in re.finditer(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out):
            name = m.group(1)
            r = run(["dpkg-query", "-S", "*/" + name])
            pk = set()
            for ln in r.stdout.decode().splitlines():
                if ":" in ln and ln.rstrip().endswith("/" + name):
                    for p in ln.split(": ", 1)[0].split(", "):
                        pk.add(p.split(":")[0])
            if pk:
                res.append((name, pk))
        return res

    def mounted_by_package(self, ramdir, mnt):
        """The mount is up, served by the package's /usr/bin/mtcfs."""
        wait_until(lambda: mount_fstype(mnt) == "fuse.mtcfs", 30, "mounted")
        pids = wait_until(lambda: daemon_pids(DEB_BIN, ramdir), 10,
                          "a /usr/bin/mtcfs process for " + ramdir)
        self.undo.push(kill_and_wait, pids)
        return pids

    def unmount_and_wait(self, mnt, pids):
        run(["umount", mnt], check=True)
        wait_until(lambda: not any(os.path.exists("/proc/%d" % p) for p in pids),
                   30, "mtcfs exited after umount")
        self.assertIsNone(mount_fstype(mnt))

    def test_deb_install_mount_fstab_systemd_remove(self):
        self.put_local_bins_aside()
        deb = self.build_deb()
        self.check_control(deb)

        def purge():
            r = run(["dpkg", "-P", "mtcfs"], timeout=120)
            if r.returncode != 0:
                sys.stderr.write("dpkg -P mtcfs: %s\n" % r.stdout.decode())
        t0 = time.monotonic()
        self.undo.push(purge)
        r = run(["dpkg", "-i", deb], timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        sys.stdout.write("  dpkg -i: %.1fs\n" % (time.monotonic() - t0))
        for b in (DEB_BIN, DEB_ADMIN):
            self.assertTrue(os.access(b, os.X_OK), b)
        self.assertIn(b"mtcfs %s" % project_version().encode(),
                      run([DEB_BIN, "--version"], check=True).stdout)
        for page in ("mtcfs.8.gz", "mtcfs-admin.8.gz"):
            self.assertTrue(os.path.exists("/usr/share/man/man8/" + page), page)

        # 1. mount -t fuse.mtcfs
        ramdir = tempfile.mkdtemp(prefix="mtcfs-pkg-ram-", dir="/dev/shm")
        mnt = os.path.join(self.tmp, "mnt")
        os.mkdir(mnt)
        self.undo.push(shutil.rmtree, ramdir, True)
        self.undo.push(force_unmount, mnt)
        r = run(["mount", "-t", "fuse.mtcfs", ramdir, mnt, "-o", "ram_size=256M"])
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        pids = self.mounted_by_package(ramdir, mnt)
        commit_step(self, mnt, ramdir, 5, DEB_ADMIN)
        self.unmount_and_wait(mnt, pids)
        self.assertEqual(
            [s["state"] for s in ls_json(DEB_ADMIN, ramdir)["shards"] if s["step"] == 5],
            ["committed"])

        # 2. the fstab example, through mount -a -T
        self.fstab_example()
        # 3. the systemd mount units, as systemd would mount them
        self.systemd_units()

        # 4. remove: nothing of the package stays
        purge()
        self.assertFalse(os.path.lexists(DEB_BIN))
        self.assertFalse(os.path.lexists("/usr/share/man/man8/mtcfs.8.gz"))
        self.assertNotIn(b"ii", run(["dpkg-query", "-W", "-f=${Status}", "mtcfs"]).stdout)

    def fstab_example(self):
        """The two lines of fstab.example with this test's paths and sizes."""
        with open(os.path.join(PKG, "systemd", "fstab.example")) as f:
            lines = [ln for ln in f if ln.strip() and not ln.startswith("#")]
        self.assertEqual(len(lines), 2, lines)
        base = os.path.join(self.tmp, "fstab")
        ram, ckpt = os.path.join(base, "ram"), os.path.join(base, "ckpt")
        os.makedirs(ram)
        os.makedirs(ckpt)
        text = "".join(lines)
        self.assertIn("nofail", text)
        text = text.replace("/var/lib/mtcfs/ram", ram).replace("/ckpt", ckpt)
        text = re.sub(r"\bsize=\d+G", "size=300M", text)
        text = re.sub(r"\bram_size=\d+G", "ram_size=256M", text)
        fstab = os.path.join(base, "fstab")
        with open(fstab, "w") as f:
            f.write(text)
        self.undo.push(force_unmount, ram)
        self.undo.push(force_unmount, ckpt)
        r = run(["mount", "-a", "-T", fstab, "-v"])
        self.assertEqual(r.returncode, 0, r.stdout.decode() + text)
        self.assertEqual(mount_fstype(ram), "tmpfs")
        pids = self.mounted_by_package(ram, ckpt)
        with open("/proc/%d/cmdline" % pids[0], "rb") as f:
            argv = f.read().decode().split("\0")
        # mount.fuse3 keeps nofail and x-systemd.* from the daemon
        self.assertNotRegex(" ".join(argv), r"nofail|x-systemd")
        commit_step(self, ckpt, ram, 6, DEB_ADMIN)
        self.unmount_and_wait(ckpt, pids)
        run(["umount", ram], check=True)

    def systemd_units(self):
        """ckpt.mount + var-lib-mtcfs-ram.mount: names match their Where=,
        and their What/Where/Type/Options mount (systemd runs
        `mount WHAT WHERE -t TYPE -o OPTIONS`)."""
        sd = os.path.join(PKG, "systemd")
        units = {}
        for name in ("var-lib-mtcfs-ram.mount", "ckpt.mount"):
            m = read_unit(os.path.join(sd, name))["Mount"]
            self.assertEqual(escape_unit_path(m["Where"]) + ".mount", name)
            units[name] = dict(m)
        ckpt_unit = read_unit(os.path.join(sd, "ckpt.mount"))["Unit"]
        self.assertIn("var-lib-mtcfs-ram.mount", ckpt_unit["Requires"])
        svc = read_unit(os.path.join(sd, "mtcfs-ckpt.service"))["Service"]
        self.assertTrue(svc["ExecStart"].startswith(DEB_BIN + " -f "))
        base = os.path.join(self.tmp, "systemd")
        paths = {"/var/lib/mtcfs/ram": os.path.join(base, "ram"),
                 "/ckpt": os.path.join(base, "ckpt")}
        for p in paths.values():
            os.makedirs(p)
            self.undo.push(force_unmount, p)

        def local(s):
            for a, b in paths.items():
                s = s.replace(a, b)
            return s
        order = ["var-lib-mtcfs-ram.mount", "ckpt.mount"]
        for name in order:
            u = units[name]
            opts = re.sub(r"\bsize=\d+G", "size=300M", u["Options"])
            opts = re.sub(r"\bram_size=\d+G", "ram_size=256M", opts)
            r = run(["mount", local(u["What"]), local(u["Where"]), "-t", u["Type"],
                     "-o", opts])
            self.assertEqual(r.returncode, 0, "%s: %s" % (name, r.stdout.decode()))
        ram, ckpt = paths["/var/lib/mtcfs/ram"], paths["/ckpt"]
        self.assertEqual(mount_fstype(ram), "tmpfs")
        pids = self.mounted_by_package(ram, ckpt)
        commit_step(self, ckpt, ram, 7, DEB_ADMIN)
        self.unmount_and_wait(ckpt, pids)
        run(["umount", ram], check=True)


# --- Kubernetes manifests -----------------------------------------------------

def _ptr(path):
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json6902(doc, ops):
    """add / replace / remove / test, enough for the patches used here."""
    for op in ops:
        keys = _ptr(op["path"])
        parent = doc
        for k in keys[:-1]:
            parent = parent[int(k)] if isinstance(parent, list) else parent[k]
        last = keys[-1]
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if op["op"] == "add":
                parent.insert(idx, copy.deepcopy(op["value"]))
            elif op["op"] == "replace":
                parent[idx] = copy.deepcopy(op["value"])
            elif op["op"] == "remove":
                del parent[idx]
            elif op["op"] == "test":
                assert parent[idx] == op["value"], op
            else:
                raise AssertionError("unsupported patch op %s" % op)
        else:
            if op["op"] in ("add", "replace"):
                parent[last] = copy.deepcopy(op["value"])
            elif op["op"] == "remove":
                del parent[last]
            elif op["op"] == "test":
                assert parent[last] == op["value"], op
            else:
                raise AssertionError("unsupported patch op %s" % op)
    return doc


def render_py(directory):
    """The kustomize subset packaging/k8s uses: resources (files and
    kustomization directories) and JSON6902 patches with a target. Anything
    else fails, so a new feature in the tree is noticed here."""
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    allowed = {"apiVersion", "kind", "resources", "patches"}
    extra = set(k) - allowed
    assert not extra, "%s: kustomize features the test renderer lacks: %s" % (
        directory, sorted(extra))
    objs = []
    for res in k.get("resources", []):
        p = os.path.normpath(os.path.join(directory, res))
        if os.path.isdir(p):
            objs += render_py(p)
        else:
            with open(p) as f:
                objs += [d for d in yaml.safe_load_all(f) if d]
    for pt in k.get("patches", []):
        tgt = pt["target"]
        ops = yaml.safe_load(pt["patch"])
        hits = 0
        for o in objs:
            if o["kind"] == tgt.get("kind", o["kind"]) and \
                    o["metadata"]["name"] == tgt.get("name", o["metadata"]["name"]) and \
                    o["apiVersion"].split("/")[0] == tgt.get("group", o["apiVersion"].split("/")[0]):
                json6902(o, ops)
                hits += 1
        assert hits, "patch target %s matches nothing" % tgt
    return objs


def render(directory):
    """(objects, how): kubectl kustomize when available (and then the
    Python renderer must agree with it), else the Python renderer."""
    mine = render_py(directory)
    if not shutil.which("kubectl"):
        return mine, "python"
    r = run(["kubectl", "kustomize", directory], check=True)
    theirs = [d for d in yaml.safe_load_all(r.stdout) if d]

    def key(o):
        return (o["kind"], o["metadata"]["name"])
    assert sorted(map(key, theirs)) == sorted(map(key, mine)), (theirs, mine)
    a = {key(o): o for o in theirs}
    for o in mine:
        assert a[key(o)] == o, "kubectl kustomize and the test renderer " \
            "disagree on %s %s" % key(o)
    return theirs, "kubectl"


def by_kind(objs):
    out = {}
    for o in objs:
        out.setdefault(o["kind"], []).append(o)
    return out


def k8s_quantity(q):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}
    m = re.fullmatch(r"([0-9.]+)([KMGT]i?|)", str(q))
    assert m, q
    return float(m.group(1)) * units[m.group(2)]


def mtcfs_size(s):
    m = re.fullmatch(r"([0-9.]+)([kKmMgGtT]?)i?[bB]?", s)
    assert m, s
    return float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")


def probe_cmd(container, which):
    if which == "preStop":
        return container["lifecycle"]["preStop"]["exec"]["command"]
    return container[which]["exec"]["command"]


class Manifests(unittest.TestCase):
    def setUp(self):
        need_yaml(self)
        objs, self.how = render(K8S)
        self.k = by_kind(objs)
        self.js = self.k["JobSet"][0]
        self.rj = self.js["spec"]["replicatedJobs"][0]
        self.job = self.rj["template"]["spec"]
        self.pod = self.job["template"]["spec"]
        self.side = [c for c in self.pod["initContainers"] if c["name"] == "mtcfs"][0]
        self.trainer = [c for c in self.pod["containers"] if c["name"] == "trainer"][0]
        self.cm = self.k["ConfigMap"][0]
        self.svc = self.k["Service"][0]

    def env(self, c):
        return {e["name"]: e for e in c.get("env", [])}

    def test_objects(self):
        sys.stdout.write("  rendered with %s\n" % self.how)
        self.assertEqual(sorted(self.k), ["ConfigMap", "JobSet", "Secret",
                                          "Service", "ServiceAccount"])
        self.assertEqual(self.js["apiVersion"], "jobset.x-k8s.io/v1alpha2")
        self.assertEqual(self.pod["serviceAccountName"],
                         self.k["ServiceAccount"][0]["metadata"]["name"])
        self.assertIn("iam.gke.io/gcp-service-account",
                      self.k["ServiceAccount"][0]["metadata"]["annotations"])
        sec = self.k["Secret"][0]
        self.assertEqual(set(sec["stringData"]), {"peer-secret", "gcs-key.json"})

    def test_headless_service_and_coordinator_name(self):
        spec = self.svc["spec"]
        self.assertEqual(spec["clusterIP"], "None")
        self.assertTrue(spec["publishNotReadyAddresses"])
        name = self.svc["metadata"]["name"]
        self.assertEqual(self.js["spec"]["network"]["subdomain"], name)
        self.assertTrue(self.js["spec"]["network"]["enableDNSHostnames"])
        self.assertEqual(spec["selector"],
                         {"jobset.sigs.k8s.io/jobset-name": self.js["metadata"]["name"]})
        port = int(self.cm["data"]["peer_port"])
        self.assertIn(port, [p["port"] for p in spec["ports"]])
        self.assertIn(port, [p["containerPort"] for p in self.side["ports"]])
        # rank 0's pod: <jobset>-<replicatedJob>-<jobIndex 0>-<podIndex 0>.<service>
        self.assertEqual(self.cm["data"]["coordinator"], "%s-%s-0-0.%s:%d" % (
            self.js["metadata"]["name"], self.rj["name"], name, port))

    def test_configmap_keys_used_by_sidecar(self):
        data = self.cm["data"]
        self.assertEqual(set(data), {"ram_size", "peer_port", "coordinator",
                                     "restore_timeout", "bucket", "extra_options",
                                     "pipe_max_size"})
        refs = {e["valueFrom"]["configMapKeyRef"]["key"]
                for e in self.side["env"] if "configMapKeyRef" in e.get("valueFrom", {})}
        self.assertEqual(refs, set(data))
        for e in self.side["env"]:
            ref = e.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                self.assertEqual(ref["name"], self.cm["metadata"]["name"])

    def test_sidecar(self):
        c = self.side
        self.assertEqual(c["restartPolicy"], "Always")      # native sidecar
        sc = c["securityContext"]
        self.assertTrue(sc["privileged"])                    # Bidirectional needs it
        self.assertEqual(sc["runAsUser"], 0)
        self.assertIn("SYS_ADMIN", sc["capabilities"]["add"])
        env = self.env(c)
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        self.assertEqual(mounts["ckpt"]["mountPath"], env["MTCFS_CKPT_DIR"]["value"])
        self.assertEqual(mounts["ckpt"]["mountPropagation"], "Bidirectional")
        self.assertEqual(mounts["ram"]["mountPath"], env["MTCFS_RAMDIR"]["value"])
        self.assertEqual(mounts["fuse"]["mountPath"], "/dev/fuse")
        self.assertEqual(mounts["mtcfs-secrets"]["mountPath"],
                         env["MTCFS_SECRET_DIR"]["value"])
        self.assertTrue(mounts["mtcfs-secrets"]["readOnly"])
        self.assertEqual(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
        self.assertEqual(env["COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.annotations['batch.kubernetes.io/job-completion-index']")
        self.assertEqual(env["JOB_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.annotations['jobset.sigs.k8s.io/job-index']")
        self.assertEqual(int(env["PODS_PER_JOB"]["value"]), self.job["parallelism"])
        self.assertEqual(self.job["completionMode"], "Indexed")
        ckpt = env["MTCFS_CKPT_DIR"]["value"]
        ready = "grep -q ' %s fuse.mtcfs ' /proc/mounts" % ckpt
        for which in ("startupProbe", "readinessProbe"):
            self.assertEqual(probe_cmd(c, which), ["/bin/sh", "-c", ready], which)
        self.assertIn("umount %s" % ckpt, probe_cmd(c, "preStop")[2])
        self.assertNotIn("livenessProbe", c)
        self.assertIn("exec mtcfs -f", c["args"][0])

    def test_trainer(self):
        t = self.trainer
        mounts = {m["name"]: m for m in t["volumeMounts"]}
        self.assertEqual(set(mounts), {"ckpt"})
        self.assertEqual(mounts["ckpt"]["mountPropagation"], "HostToContainer")
        self.assertEqual(mounts["ckpt"]["mountPath"], self.env(t)["CHECKPOINT_DIR"]["value"])
        self.assertNotIn("securityContext", t)            # not privileged
        self.assertEqual(int(self.env(t)["NNODES"]["value"]),
                         self.job["parallelism"] * self.rj["replicas"])

    def test_volumes_and_memory_sizing(self):
        vols = {v["name"]: v for v in self.pod["volumes"]}
        self.assertEqual(vols["ram"]["emptyDir"]["medium"], "Memory")
        self.assertEqual(vols["ckpt"]["emptyDir"], {})
        self.assertEqual(vols["fuse"]["hostPath"], {"path": "/dev/fuse", "type": "CharDevice"})
        self.assertEqual(vols["mtcfs-secrets"]["secret"]["secretName"],
                         self.k["Secret"][0]["metadata"]["name"])
        self.assertEqual(vols["mtcfs-secrets"]["secret"]["defaultMode"], 0o400)
        ram = mtcfs_size(self.cm["data"]["ram_size"])
        limit = k8s_quantity(vols["ram"]["emptyDir"]["sizeLimit"])
        res = self.side["resources"]
        mem_req = k8s_quantity(res["requests"]["memory"])
        mem_lim = k8s_quantity(res["limits"]["memory"])
        # the documented formula: sizeLimit = ram_size + 4Gi, memory = sizeLimit + 2Gi
        self.assertEqual(limit, ram + 4 * 2**30)
        self.assertEqual(mem_lim, limit + 2 * 2**30)
        self.assertEqual(mem_req, mem_lim)       # tmpfs pages cannot be reclaimed
        # ram_size = 1.1 x 2 x (1 + k) x S with the example's S = 40Gi, k = 1
        self.assertAlmostEqual(ram, 1.1 * 2 * 2 * 40 * 2**30, delta=2**30)

    def test_node_ram_variant(self):
        objs, _ = render(os.path.join(K8S, "node-ram"))
        js = by_kind(objs)["JobSet"][0]
        pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(vols["ram"], {"name": "ram", "hostPath": {
            "path": "/dev/shm/mtcfs/%s" % js["metadata"]["name"],
            "type": "DirectoryOrCreate"}})
        self.assertEqual(vols["ckpt"]["emptyDir"], {})


# --- the sidecar's script, run here -------------------------------------------------

class Sidecar(unittest.TestCase):
    def setUp(self):
        need_yaml(self)
        objs, _ = render(K8S)
        k = by_kind(objs)
        pod = k["JobSet"][0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        self.side = [c for c in pod["initContainers"] if c["name"] == "mtcfs"][0]
        self.cm = k["ConfigMap"][0]["data"]
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-sidecar-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.secdir = os.path.join(self.tmp, "secret")
        os.mkdir(self.secdir)
        with open(os.path.join(self.secdir, "peer-secret"), "w") as f:
            f.write(os.urandom(16).hex() + "\n")
        with open(os.path.join(self.secdir, "gcs-key.json"), "w") as f:
            pass
        self.bindir = os.path.join(self.tmp, "bin")
        os.mkdir(self.bindir)

    def script(self):
        self.assertEqual(self.side["command"], ["/bin/sh", "-c"])
        return self.side["args"][0]

    def env(self, **over):
        """The container's environment as Kubernetes would set it, with
        this machine's paths."""
        e = {"PATH": self.bindir + ":/usr/sbin:/usr/bin:/sbin:/bin"}
        for v in self.side["env"]:
            if "value" in v:
                e[v["name"]] = v["value"]
            elif "configMapKeyRef" in v["valueFrom"]:
                e[v["name"]] = self.cm[v["valueFrom"]["configMapKeyRef"]["key"]]
        e.update(POD_IP="127.0.0.1", JOB_INDEX="0", COMPLETION_INDEX="0",
                 MTCFS_SECRET_DIR=self.secdir, MTCFS_PIPE_MAX_SIZE="")
        e.update(over)
        return e

    def fake_mtcfs(self):
        out = os.path.join(self.tmp, "argv")
        p = os.path.join(self.bindir, "mtcfs")
        with open(p, "w") as f:
            f.write('#!/bin/sh\nprintf "%%s\\n" "$@" > %s\n' % out)
        os.chmod(p, 0o755)
        return out

    def run_script(self, env):
        return subprocess.run(["/bin/sh", "-c", self.script()], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=30)

    def test_options_and_rank(self):
        out = self.fake_mtcfs()
        ram, ckpt = os.path.join(self.tmp, "ram"), os.path.join(self.tmp, "ckpt")
        r = self.run_script(self.env(MTCFS_RAMDIR=ram, MTCFS_CKPT_DIR=ckpt,
                                     JOB_INDEX="1", COMPLETION_INDEX="2",
                                     PODS_PER_JOB="4"))
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        argv = open(out).read().splitlines()
        self.assertEqual(argv[0:2], ["-f", "-o"])
        self.assertEqual(argv[3:], [ram, ckpt])
        opts = argv[2].split(",")
        port = self.cm["peer_port"]
        self.assertEqual(opts, [
            "ram_size=" + self.cm["ram_size"], "listen=127.0.0.1:" + port,
            "coordinator=" + self.cm["coordinator"], "rank=6",     # 1 x 4 + 2
            "secret_file=%s/peer-secret" % self.secdir,
            "restore_timeout=" + self.cm["restore_timeout"]])
        # IPv6 pod IP, a bucket with a key file, extra options
        with open(os.path.join(self.secdir, "gcs-key.json"), "w") as f:
            f.write("{}")
        r = self.run_script(self.env(POD_IP="fd00::7", MTCFS_BUCKET="gs://b/p",
                                     MTCFS_EXTRA_OPTIONS="jax_init_info"))
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        opts = open(out).read().splitlines()[2].split(",")
        self.assertIn("listen=[fd00::7]:" + port, opts)
        self.assertIn("rank=0", opts)
        self.assertEqual(opts[-3:], ["bucket=gs://b/p",
                                     "gcs_key_file=%s/gcs-key.json" % self.secdir,
                                     "jax_init_info"])
        self.assertFalse([o for o in opts if o.startswith("tls_")])
        # a certificate in the Secret turns on mutual TLS; all three or none
        for name in ("tls.crt", "tls.key"):
            with open(os.path.join(self.secdir, name), "w") as f:
                f.write("PEM\n")
        r = self.run_script(self.env())
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        opts = open(out).read().splitlines()[2].split(",")
        self.assertFalse([o for o in opts if o.startswith("tls_")])
        with open(os.path.join(self.secdir, "ca.crt"), "w") as f:
            f.write("PEM\n")
        r = self.run_script(self.env())
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        opts = open(out).read().splitlines()[2].split(",")
        self.assertEqual([o for o in opts if o.startswith("tls_")],
                         ["tls_cert=%s/tls.crt" % self.secdir,
                          "tls_key=%s/tls.key" % self.secdir,
                          "tls_ca=%s/ca.crt" % self.secdir])

    def test_refuses_placeholder_secret(self):
        out = self.fake_mtcfs()
        with open(os.path.join(self.secdir, "peer-secret"), "w") as f:
            f.write(self.secret_placeholder() + "\n")
        r = self.run_script(self.env())
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"placeholder", r.stderr)
        self.assertFalse(os.path.exists(out))

    def secret_placeholder(self):
        with open(os.path.join(K8S, "base", "secret.yaml")) as f:
            return yaml.safe_load(f)["stringData"]["peer-secret"]

    def test_real_mount_probes_prestop(self):
        """The script starts the built mtcfs as the sidecar would (rank 0,
        its own coordinator, a file:// bucket); the startup probe sees the
        mount; a step commits; preStop unmounts and mtcfs exits 0."""
        need_root(self)
        os.symlink(os.path.abspath(harness.MTCFS_BIN), os.path.join(self.bindir, "mtcfs"))
        ram = tempfile.mkdtemp(prefix="mtcfs-sidecar-ram-", dir="/dev/shm")
        self.addCleanup(shutil.rmtree, ram, True)
        ckpt = os.path.join(self.tmp, "ckpt")
        os.mkdir(ckpt)
        port = free_port()
        bucket = os.path.join(self.tmp, "bucket")
        os.mkdir(bucket)
        env = self.env(MTCFS_RAMDIR=ram, MTCFS_CKPT_DIR=ckpt, MTCFS_PEER_PORT=str(port),
                       MTCFS_COORDINATOR="127.0.0.1:%d" % port, MTCFS_RAM_SIZE="256M",
                       MTCFS_BUCKET="file://" + bucket)
        log = open(os.path.join(self.tmp, "sidecar.log"), "w+b")
        p = subprocess.Popen(["/bin/sh", "-c", self.script()], env=env,
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

        def stop_sidecar():
            force_unmount(ckpt)
            if p.poll() is None:
                p.kill()
            p.wait(10)
        Undo(self).push(stop_sidecar)

        def here(cmd):      # the container's /ckpt -> this test's
            return [re.sub(r"(?<=[ '])/ckpt(?=[ ';]|$)", ckpt, a) for a in cmd]

        def probe_ok():
            if p.poll() is not None:
                log.seek(0)
                raise AssertionError("sidecar exited %s:\n%s" % (
                    p.returncode, log.read().decode(errors="replace")))
            return run(here(probe_cmd(self.side, "startupProbe"))).returncode == 0
        wait_until(probe_ok, harness.READY_TIMEOUT, "the startup probe")
        self.assertEqual(run(here(probe_cmd(self.side, "readinessProbe"))).returncode, 0)
        commit_step(self, ckpt, ram, 9, harness.MTCFS_ADMIN)
        r = run(here(probe_cmd(self.side, "preStop")))
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        self.assertEqual(p.wait(harness.EXIT_TIMEOUT), 0)
        self.assertIsNone(mount_fstype(ckpt))
        self.assertNotEqual(run(here(probe_cmd(self.side, "readinessProbe"))).returncode, 0)
        log.seek(0)
        text = log.read().decode(errors="replace")
        self.assertIn("mtcfs-sidecar: rank 0: mtcfs -f -o ram_size=256M,listen=127.0.0.1:%d,"
                      % port, text)
        self.assertIn(",bucket=file://%s " % bucket, text)   # the empty key file is not used
        self.assertNotRegex(text, harness.BAD_LOG)


def fortified_build():
    """Whether BUILD compiles with _FORTIFY_SOURCE (not Debug, not a
    sanitizer build), as read from its CMakeCache.txt."""
    cache = {}
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            for ln in f:
                m = re.match(r"^(\w+):\w+=(.*)$", ln.strip())
                if m:
                    cache[m.group(1)] = m.group(2)
    except OSError:
        return True
    on = ("ON", "1", "TRUE", "YES")
    return (cache.get("CMAKE_BUILD_TYPE", "") != "Debug" and
            cache.get("MTCFS_SANITIZE", "OFF").upper() not in on and
            cache.get("MTCFS_TSAN", "OFF").upper() not in on)


class DebLint(unittest.TestCase):
    """The .deb that packaging/Packaging.cmake builds is lintian clean,
    informational tags included: a copyright file (Apache-2.0, the common
    licence), a changelog.gz for this native version, a Maintainer with a
    mail host, the hardening that lintian checks in the binaries (PIE,
    relro + bindnow, fortify, stack protector), man pages gzipped."""

    def test_lintian_clean(self):
        for tool in ("cpack", "dpkg-deb"):
            if not shutil.which(tool):
                self.skipTest("%s not installed" % tool)
        if not shutil.which("lintian"):
            self.fail("lintian is missing (apt-get install lintian; "
                      "packaging/install-deps.sh lists it)")
        tmp = tempfile.mkdtemp(prefix="mtcfs-lint-")
        self.addCleanup(shutil.rmtree, tmp, True)
        run(["cpack", "--config", os.path.join(BUILD, "CPackConfig.cmake"),
             "-G", "DEB", "-B", tmp], timeout=300, check=True)
        deb = [os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".deb")]
        self.assertEqual(len(deb), 1, deb)
        r = run(["lintian", "--tag-display-limit", "0", "-I", "-E",
                 "--fail-on", "error,warning,info", deb[0]], timeout=300)
        tags = [ln for ln in r.stdout.decode(errors="replace").splitlines()
                if re.match(r"^[EWIXPO]: ", ln)]
        if not fortified_build():
            # Debug and sanitizer builds leave _FORTIFY_SOURCE out on purpose
            # (packaging/Packaging.cmake): that one tag is expected there, on
            # every binary, and nothing else is allowed
            nofort = [t for t in tags if t.startswith("I: mtcfs: hardening-no-fortify-functions ")]
            self.assertTrue(nofort, tags)
            tags = [t for t in tags if t not in nofort]
        else:
            self.assertEqual(r.returncode, 0, r.stdout.decode(errors="replace"))
        self.assertEqual(tags, [], "lintian:\n" + "\n".join(tags))
        files = run(["dpkg-deb", "-c", deb[0]], check=True).stdout.decode()
        for f in ("usr/share/doc/mtcfs/copyright", "usr/share/doc/mtcfs/changelog.gz",
                  "usr/share/man/man8/mtcfs.8.gz", "usr/share/man/man8/mtcfs-admin.8.gz"):
            self.assertRegex(files, r"\s\./%s\n" % re.escape(f))
        maint = run(["dpkg-deb", "-f", deb[0], "Maintainer"], check=True).stdout.decode()
        self.assertRegex(maint.strip(), r"^[^<>]+ <[^@<>\s]+@[a-z0-9-]+(\.[a-z0-9-]+)+>$")
        self.assertNotIn("localhost", maint)
        # the licence in the repository is the one the package names
        with open(os.path.join(REPO, "LICENSE")) as f:
            self.assertIn("Apache License\n                           Version 2.0", f.read())


# --- systemd ----------------------------------------------------------------------

SYSTEMD_DIR = os.path.join(PKG, "systemd")
# directives that give a unit's processes a mount namespace of their own: a
# FUSE mount made in one stays there, invisible to the host
MOUNT_NS_DIRECTIVES = ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
                       "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths",
                       "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
                       "ProtectControlGroups", "ProtectProc", "ProcSubset", "PrivateMounts",
                       "BindPaths", "BindReadOnlyPaths", "TemporaryFileSystem",
                       "ProtectHostname", "ProtectClock", "RootDirectory", "MountFlags")


def unit_directives(path):
    """{section: [(key, value)]} of a unit file, comments skipped."""
    out, sec = {}, None
    with open(path) as f:
        for ln in f:
            ln = ln.strip()
            if not ln or ln[0] in "#;":
                continue
            if ln.startswith("[") and ln.endswith("]"):
                sec = ln[1:-1]
                out.setdefault(sec, [])
                continue
            k, _, v = ln.partition("=")
            out[sec].append((k.strip(), v.strip()))
    return out


class Systemd(unittest.TestCase):
    def units(self):
        us = sorted(f for f in os.listdir(SYSTEMD_DIR)
                    if f.endswith((".service", ".mount", ".socket", ".timer")))
        self.assertIn("mtcfs-ckpt.service", us)
        self.assertIn("ckpt.mount", us)
        return us

    def test_units_verify(self):
        """systemd-analyze verify is silent on every shipped unit. Where
        /usr/bin/mtcfs is not installed, a copy of the unit names the built
        binary instead (verify checks that ExecStart= is executable)."""
        if not shutil.which("systemd-analyze"):
            self.fail("systemd-analyze is missing (apt-get install systemd; "
                      "packaging/install-deps.sh lists it)")
        tmp = tempfile.mkdtemp(prefix="mtcfs-units-")
        self.addCleanup(shutil.rmtree, tmp, True)
        for u in self.units():
            with open(os.path.join(SYSTEMD_DIR, u)) as f:
                text = f.read()
            if not os.access(DEB_BIN, os.X_OK):
                text = text.replace(DEB_BIN + " ", os.path.abspath(harness.MTCFS_BIN) + " ")
            with open(os.path.join(tmp, u), "w") as f:
                f.write(text)
        for u in self.units():
            r = run(["systemd-analyze", "verify", "--man=no", os.path.join(tmp, u)],
                    timeout=60)
            self.assertEqual((r.returncode, r.stdout.decode(errors="replace")), (0, ""),
                             "systemd-analyze verify %s" % u)

    def test_service_notify_and_hardening(self):
        svc = unit_directives(os.path.join(SYSTEMD_DIR, "mtcfs-ckpt.service"))["Service"]
        d = dict(svc)
        self.assertEqual(d.get("Type"), "notify")
        self.assertEqual(d.get("NotifyAccess"), "main")
        self.assertRegex(d["ExecStart"], r"^/usr/bin/mtcfs -f ")   # -f: the main PID notifies
        for k, v in (("NoNewPrivileges", "yes"), ("DevicePolicy", "closed"),
                     ("DeviceAllow", "/dev/fuse rw"), ("RestrictSUIDSGID", "yes"),
                     ("RestrictNamespaces", "yes"), ("LockPersonality", "yes"),
                     ("MemoryDenyWriteExecute", "yes"), ("RestrictRealtime", "yes"),
                     ("SystemCallArchitectures", "native")):
            self.assertEqual(d.get(k), v, k)
        self.assertIn("CAP_SYS_ADMIN", d["CapabilityBoundingSet"].split())
        for u in self.units():
            for sec in unit_directives(os.path.join(SYSTEMD_DIR, u)).values():
                bad = [k for k, _ in sec if k in MOUNT_NS_DIRECTIVES]
                self.assertEqual(bad, [], "%s: mount-namespace directives" % u)

    def test_notify_ready_after_mount_answers(self):
        """A fake NOTIFY_SOCKET: mtcfs sends READY=1 (with its MAINPID) only
        when the mount is there and answers, and STOPPING=1 at unmount."""
        need_root(self)
        tmp = tempfile.mkdtemp(prefix="mtcfs-notify-")
        self.addCleanup(shutil.rmtree, tmp, True)
        path = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(sock.close)
        sock.bind(path)
        d = harness.Daemon(env=dict(os.environ, NOTIFY_SOCKET=path))
        self.addCleanup(d.close)
        started = []
        t = threading.Thread(target=lambda: started.append(d.start()), daemon=True)
        t.start()
        self.addCleanup(t.join, harness.READY_TIMEOUT)
        sock.settimeout(harness.READY_TIMEOUT)
        msg = sock.recv(4096).decode()
        # at this moment the mount is in the table and answers a lookup
        self.assertEqual(mount_fstype(d.mnt), "fuse.mtcfs")
        res = []
        st = threading.Thread(target=lambda: res.append(os.listdir(d.mnt)), daemon=True)
        st.start()
        st.join(5)
        self.assertEqual(len(res), 1, "the mount did not answer within 5 s of READY=1")
        fields = dict(ln.split("=", 1) for ln in msg.split("\n") if "=" in ln)
        self.assertEqual(fields.get("READY"), "1", msg)
        t.join(harness.READY_TIMEOUT)
        self.assertTrue(started, "the daemon did not start")
        self.assertEqual(int(fields["MAINPID"]), d.proc.pid)
        self.assertIn(d.mnt, fields.get("STATUS", ""))
        self.assertIn("serving ramdir=", d.log_text())
        sock.settimeout(0.2)
        with self.assertRaises(socket.timeout):      # READY=1 is sent once
            sock.recv(4096)
        d.stop()
        sock.settimeout(5)
        msg = sock.recv(4096).decode()
        self.assertIn("STOPPING=1", msg.split("\n"))


# --- Dockerfile -------------------------------------------------------------------

def dockerfile_instructions(path):
    """[(lineno, INSTRUCTION, args)] with continuations joined, comments and
    the parser directive skipped."""
    out, cur, start = [], "", 0
    with open(path) as f:
        for n, ln in enumerate(f, 1):
            s = ln.rstrip("\n")
            if not cur and (not s.strip() or s.lstrip().startswith("#")):
                continue
            if cur and s.lstrip().startswith("#"):
                continue                      # comment inside a continuation
            if not cur:
                start = n
            if s.endswith("\\"):
                cur += s[:-1] + " "
                continue
            cur += s
            ins, _, args = cur.strip().partition(" ")
            out.append((start, ins.upper(), args.strip()))
            cur = ""
    assert not cur, "unterminated continuation"
    return out


def dockerignore_patterns(path):
    pats = []
    if os.path.exists(path):
        for ln in open(path):
            ln = ln.strip()
            if ln and not ln.startswith("#"):
                pats.append(ln.rstrip("/"))
    return pats


def ignored(rel, pats):
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        for p in pats:
            if p.startswith("**/"):
                if fnmatch.fnmatch(parts[i - 1], p[3:]):
                    return True
            elif fnmatch.fnmatch(prefix, p):
                return True
    return False


IMAGE_REF = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*"
                       r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


class Dockerfile(unittest.TestCase):
    PATH = os.path.join(PKG, "container", "Dockerfile")

    def setUp(self):
        self.ins = dockerfile_instructions(self.PATH)
        self.ignore = dockerignore_patterns(self.PATH + ".dockerignore")

    def stages(self):
        """[(name or None, image, [instructions])]; ARG defaults applied."""
        args, stages = {}, []
        for n, ins, a in self.ins:
            if ins == "ARG" and not stages:
                k, _, v = a.partition("=")
                args[k] = v
            elif ins == "FROM":
                m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", a, re.I)
                self.assertTrue(m, "line %d: FROM %s" % (n, a))
                image = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                               lambda x: args[x.group(1) or x.group(2)], m.group(1))
                stages.append([m.group(2), image, []])
            else:
                self.assertTrue(stages, "line %d: %s before FROM" % (n, ins))
                stages[-1][2].append((n, ins, a))
        return stages

    def test_stages_and_from(self):
        st = self.stages()
        self.assertGreaterEqual(len(st), 2)                   # multi-stage
        names = [s[0] for s in st]
        self.assertEqual(len(set(n for n in names if n)), len([n for n in names if n]))
        for name, image, _ in st:
            self.assertRegex(image, IMAGE_REF)
            # Debian 13: its own libfuse 3.17 gives the image passthrough
            self.assertTrue(image.startswith("debian:trixie"), image)
        final = st[-1][2]
        self.assertFalse(any(ins == "RUN" and "-dev" in a and "apt-get" in a
                             for _, ins, a in final), "no -dev packages in the final image")
        self.assertTrue(any(ins == "CMD" for _, ins, _ in final))

    def test_no_registry_frontend(self):
        """No `# syntax=` line: with one, BuildKit pulls that frontend image
        from Docker Hub before anything else (fails offline); the classic
        builder that build-image uses would ignore it anyway."""
        with open(os.path.join(PKG, "container", "Dockerfile")) as f:
            self.assertNotRegex(f.read(), r"(?im)^#\s*syntax\s*=")

    def test_copy_sources(self):
        st = self.stages()
        seen = []
        for name, _, body in st:
            for n, ins, a in body:
                if ins not in ("COPY", "ADD"):
                    continue
                toks = shlex.split(a)
                flags = [t for t in toks if t.startswith("--")]
                srcs = [t for t in toks if not t.startswith("--")][:-1]
                self.assertTrue(srcs, "line %d: %s %s" % (n, ins, a))
                frm = [f.split("=", 1)[1] for f in flags if f.startswith("--from=")]
                if frm:
                    self.assertIn(frm[0], seen, "line %d: --from=%s is not an earlier stage"
                                  % (n, frm[0]))
                    continue
                for s in srcs:
                    rel = os.path.normpath(s)
                    rel = "" if rel == "." else rel
                    self.assertTrue(os.path.exists(os.path.join(REPO, rel)),
                                    "line %d: COPY source %s is not in the repository" % (n, s))
                    if rel:
                        self.assertFalse(ignored(rel, self.ignore),
                                         "line %d: %s is excluded by the .dockerignore" % (n, s))
            seen.append(name)

    def test_build_stage_covers_cmake_dependencies(self):
        """Every pkg-config module CMakeLists.txt requires comes from a
        package the build stage installs (found through dpkg -S of the .pc
        file here)."""
        if not shutil.which("pkg-config") or not shutil.which("dpkg-query"):
            self.skipTest("pkg-config or dpkg missing")
        cm = open(os.path.join(REPO, "CMakeLists.txt")).read()
        mods = []
        for m in re.finditer(r"pkg_check_modules\(\s*\w+\s+REQUIRED\s+(?:IMPORTED_TARGET\s+)?([^\s)]+)", cm):
            mods.append(m.group(1))
        self.assertIn("fuse3", mods)
        build = self.stages()[0][2]
        text = " ".join(a for _, ins, a in build if ins == "RUN")
        for mod in mods:
            d = run(["pkg-config", "--variable=pcfiledir", mod]).stdout.decode().strip()
            pc = os.path.join(d, mod + ".pc")
            r = run(["dpkg-query", "-S", pc])
            if r.returncode != 0:
                r = run(["dpkg-query", "-S", os.path.realpath(pc)])
            self.assertEqual(r.returncode, 0, "no package owns %s" % pc)
            pkgs = {p.split(":")[0] for p in r.stdout.decode().split(": ", 1)[0].split(", ")}
            self.assertTrue(any(re.search(r"(^|\s)%s(\s|$)" % re.escape(p), text) for p in pkgs),
                            "build stage installs none of %s (pkg-config %s)" % (sorted(pkgs), mod))
        for tool in ("cmake", "build-essential", "pkg-config", "dpkg-dev", "file"):
            self.assertRegex(text, r"(^|\s)%s(\s|$)" % re.escape(tool))

    def test_packages_exist_in_debian(self):
        """apt-get install lines name packages apt knows (local lists)."""
        if not shutil.which("apt-cache") or \
                run(["apt-cache", "show", "--no-all-versions", "fuse3"]).returncode != 0:
            self.skipTest("no apt package lists here")
        for _, _, body in self.stages():
            for n, ins, a in body:
                if ins != "RUN":
                    continue
                for m in re.finditer(r"apt-get install ((?:-\S+\s+)*)([^&|;]+)", a):
                    for pkg in m.group(2).split():
                        if pkg.startswith("/") or pkg.startswith("-"):
                            continue
                        r = run(["apt-cache", "show", "--no-all-versions", pkg])
                        self.assertEqual(r.returncode, 0, "line %d: unknown package %s" % (n, pkg))

    def test_final_stage_installs_the_deb_of_the_build_stage(self):
        st = self.stages()
        build_run = " ".join(a for _, ins, a in st[0][2] if ins == "RUN")
        self.assertIn("cpack --config /build/CPackConfig.cmake -G DEB", build_run)
        final = " ".join("%s %s" % (ins, a) for _, ins, a in st[-1][2])
        self.assertIn("COPY --from=%s /deb/" % st[0][0], final)
        self.assertRegex(final, r"apt-get install .*/tmp/deb/mtcfs_\*\.deb")

    def test_final_stage_has_a_ca_bundle(self):
        """gs:// goes over HTTPS: libcurl verifies the server against the CA
        bundle, which only ca-certificates brings (libcurl merely Recommends
        it and the image installs with --no-install-recommends)."""
        final = " ".join(a for _, ins, a in self.stages()[-1][2] if ins == "RUN")
        m = re.search(r"apt-get install ((?:-\S+\s+)*)([^&|;]+)", final)
        self.assertTrue(m, "the final stage installs nothing with apt-get")
        self.assertIn("ca-certificates", m.group(2).split())


if __name__ == "__main__":
    harness.main()
