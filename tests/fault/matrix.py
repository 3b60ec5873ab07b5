#!/usr/bin/python3
"""mtcfs fault matrix and soak driver (issue 8).

Runs real multi-node mtcfs clusters (one process and one FUSE mount per
node, like tests/integration/cluster.py) with a file:// bucket or the
project's Cloud Storage test server (tests/gcs_server/gcs_server.py) and,
for every cell of the matrix, injects ONE fault at ONE phase of the
checkpoint life cycle, restarts the job, and checks the invariants:

  I1 the restored step is the newest complete one that the surviving
     copies allow (in-cluster copies first, else the newest complete
     backup, else nothing);
  I2 every restored byte equals the byte written (read through the
     .restore markers, the way Orbax does);
  I3 every node restores the same step;
  I4 no committed step is lost while a copy of it survives (the ledger's
     model of the copies that must exist is compared with what is on disk);
  I5 no hang: every wait has a deadline and a message, each cell has a
     hard deadline.

The soak (kill -9 while writing, right after the commit rename, or while
seals, replication, GC and backups run) also checks the RAM tier's own
account (issue 13) after every restart and every job restart:
  I6 a restarted node's ram_used (its start-up recount, logged) equals the
     bytes of its namespace and of the shards its catalog names, measured
     while it was down; a shard directory no record named then (a drop or
     publish cut short) is gone after the start;
  I7 `mtcfs-admin verify` passes on every live node once the job has
     restarted: no shard stuck in `sealing`, none bad.

Phases: writing, commit, replicating, backing-up, restore/planning,
restore/fetching, restore/barrier. Faults: kill -9 (RAMDIR kept / wiped),
kill -9 of the coordinator (rank 0), a cut link (network namespaces with a
blackhole traffic shaper), a peer or the bucket serving corrupt bytes,
bucket 5xx/429/timeouts, the RAM tier full, the file:// bucket's disk full.
See tests/fault/README.md for the cells, how each phase is hit and which
cells are skipped and why.

  matrix.py [--cells REGEX] [--backends file,gs] [--ci] [--list]
            [--soak] [--cycles N] [--seed S] [--json PATH] [--build DIR]
            [--no-netns] [--keep]

Root, /dev/fuse, /usr/bin/python3 standard library only. Exit status 0
when no cell failed and the soak (if asked) had no bad restore.
"""

import argparse
import functools
import hashlib
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
INTEG = os.path.join(REPO, "tests", "integration")
sys.path.insert(0, INTEG)
import gcs  # noqa: E402  (harness itself is imported in main())

KiB = 1024
MiB = 1024 * KiB
MANY_FILES_FROM = 32 * MiB   # content(): bigger steps are many files

# filled by main() once MTCFS_BIN & co are in the environment
harness = None
clmod = None

LOG_ERR_LINE = r"^\d{4}-\d\d-\d\dT\S+Z (ERROR|WARN) "
RESTORE_LINE = re.compile(r"restore job=(\S+) step=(\d+) source=(\w+) ready_ms")
NAME_RE = r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}(?:-\d+)?"


# --- outcome of a cell ----------------------------------------------------------

class Skip(Exception):
    """The cell cannot be run or its phase was not hit: SKIP with a reason."""


class CellFail(AssertionError):
    """An invariant does not hold: FAIL with details and evidence."""


class CellTimeout(BaseException):
    """The cell's hard deadline passed (I5)."""


def deadline_wait(cond, timeout, msg, interval=0.01):
    """harness.wait_until with a message; returns cond()'s value."""
    return harness.wait_until(cond, timeout, msg, interval=interval)


# --- the network: every node in its own network namespace ----------------------

class Net:
    """netns mode: a hub namespace with a bridge; each node r lives in its
    own namespace with a veth to the bridge (10.213.X.(10+r)); the host
    (driver, Cloud Storage server) is 10.213.X.1 on the same bridge. A link
    is cut by a token-bucket shaper of 8 bit/s on both ends of a node's
    veth (packets silently dropped: a pulled cable, not a refused
    connection), slowed by a shaper of a given rate, healed by removing
    the shapers. loopback mode (no netns): every node on 127.0.0.1; cut
    and slow cells are skipped."""

    MAX_NODES = 4

    def __init__(self, use_netns=True):
        self.mode = "loopback"
        self.why_not = "disabled (--no-netns)"
        self.tag = "fm%04x" % (os.getpid() & 0xFFFF)
        self.subnet = self._free_subnet()
        self.host_ip = "127.0.0.1"
        self.made = []
        if use_netns:
            try:
                self._setup()
                self.mode = "netns"
                self.host_ip = self.subnet + ".1"
            except Exception as e:   # no CAP_NET_ADMIN, no veth, no tc ...
                self.why_not = "network namespaces unavailable: %s" % e
                self.close()

    @staticmethod
    def _free_subnet():
        """10.213.X.0/24 not used by an address of this host (another run)."""
        try:
            used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                                  timeout=10).stdout.decode()
        except (OSError, subprocess.TimeoutExpired):
            used = ""
        for i in range(200):
            x = 20 + (os.getpid() + i) % 200
            if " 10.213.%d." % x not in used:
                return "10.213.%d" % x
        return "10.213.%d" % (20 + os.getpid() % 200)

    @staticmethod
    def _sh(*argv, check=True):
        r = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=20)
        if check and r.returncode != 0:
            raise RuntimeError("%s: %s" % (" ".join(argv),
                                           r.stderr.decode(errors="replace").strip()))
        return r

    def ns(self, r):
        return "%sn%d" % (self.tag, r)

    def _setup(self):
        for t in ("ip", "tc", "nsenter"):
            if not shutil.which(t):
                raise RuntimeError("%s not found" % t)
        sh, hub, tag = self._sh, self.tag + "h", self.tag
        sh("ip", "netns", "add", hub)
        self.made.append(hub)
        sh("ip", "-n", hub, "link", "set", "lo", "up")
        sh("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", hub, "link", "set", "br0", "up")
        sh("ip", "link", "add", tag + "H", "type", "veth", "peer", "name", tag + "Hb",
           "netns", hub)
        self.made.append("link:" + tag + "H")
        sh("ip", "-n", hub, "link", "set", tag + "Hb", "master", "br0", "up")
        sh("ip", "addr", "add", self.subnet + ".1/24", "dev", tag + "H")
        sh("ip", "link", "set", tag + "H", "up")
        for r in range(self.MAX_NODES):
            ns = self.ns(r)
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "link", "add", "%sr%da" % (tag, r), "netns", ns, "type", "veth",
               "peer", "name", "%sr%db" % (tag, r), "netns", hub)
            sh("ip", "-n", hub, "link", "set", "%sr%db" % (tag, r), "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", "%s.%d/24" % (self.subnet, 10 + r), "dev",
               "%sr%da" % (tag, r))
            sh("ip", "-n", ns, "link", "set", "%sr%da" % (tag, r), "up")
        # the bridge forwards at once (no STP): prove it with a connect
        import socket
        deadline = time.monotonic() + 10
        probe = subprocess.Popen(
            ["nsenter", "--net=/run/netns/" + self.ns(0), "/usr/bin/python3", "-c",
             "import socket,sys\ns=socket.socket();s.bind(('%s.10',0));s.listen()\n"
             "print(s.getsockname()[1],flush=True)\nc,_=s.accept()" % self.subnet],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            port = int(probe.stdout.readline())
            while True:
                try:
                    socket.create_connection(("%s.10" % self.subnet, port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("host cannot reach a node namespace")
                    time.sleep(0.1)
        finally:
            probe.kill()
            probe.wait()

    def addr(self, r):
        return "%s.%d" % (self.subnet, 10 + r) if self.mode == "netns" else "127.0.0.1"

    def wrap(self, r):
        return ["nsenter", "--net=/run/netns/" + self.ns(r)] if self.mode == "netns" else []

    def _tbf(self, r, spec):
        if self.mode != "netns":
            raise Skip("needs network namespaces: " + self.why_not)
        for ns, dev in ((self.ns(r), "%sr%da" % (self.tag, r)),
                        (self.tag + "h", "%sr%db" % (self.tag, r))):
            if spec is None:
                self._sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
            else:
                self._sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", *spec)

    def cut(self, r):
        self._tbf(r, ["rate", "8bit", "burst", "1600", "limit", "1"])

    def slow(self, r, mbit):
        self._tbf(r, ["rate", "%dmbit" % mbit, "burst", "64kb", "latency", "400ms"])

    def heal(self, r):
        if self.mode == "netns":
            self._tbf(r, None)

    def heal_all(self):
        for r in range(self.MAX_NODES):
            self.heal(r)

    def close(self):
        for m in reversed(self.made):
            if m.startswith("link:"):
                self._sh("ip", "link", "del", m[5:], check=False)
            else:
                self._sh("ip", "netns", "del", m, check=False)
        self.made = []


def hold_fault(secs):
    """Let a fault (a cut link) last secs: its length is what the cell
    is about, so this is the one fixed sleep of a cell, not a wait."""
    time.sleep(secs)


# --- buckets --------------------------------------------------------------------

class FileBucket:
    kind = "file"

    def __init__(self, tmpfs_size=None):
        self.root = tempfile.mkdtemp(prefix="mtcfs-fm-bucket-", dir="/tmp")
        self.tmpfs = False
        if tmpfs_size:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % tmpfs_size,
                                "mtcfs-fm-bucket", self.root], capture_output=True)
            if r.returncode != 0:
                raise Skip("cannot mount a tmpfs for the bucket: %s" % r.stderr.decode())
            self.tmpfs = True
        self.url = "file://" + self.root
        self.filler = None

    def opts(self):
        return "bucket=" + self.url

    def env(self):
        return {}

    def objects(self, prefix=""):
        """{name: size} of the objects under prefix (no temporaries)."""
        out = {}
        for dp, _, fns in os.walk(self.root):
            for fn in fns:
                if fn.startswith(".") or fn == "fm-filler":
                    continue
                rel = os.path.relpath(os.path.join(dp, fn), self.root)
                if rel.startswith(prefix):
                    try:
                        out[rel] = os.path.getsize(os.path.join(dp, fn))
                    except OSError:
                        pass
        return out

    def read(self, name):
        with open(os.path.join(self.root, name), "rb") as f:
            return f.read()

    def corrupt(self, name, offset=0):
        p = os.path.join(self.root, name)
        with open(p, "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0x5A]))

    def fill(self, leave):
        """Fill the tmpfs so that only about `leave` bytes stay free."""
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        n = max(0, free - leave)
        self.filler = os.path.join(self.root, "fm-filler")
        with open(self.filler, "wb") as f:
            while n > 0:
                k = min(n, MiB)
                try:
                    f.write(b"\0" * k)
                    f.flush()
                except OSError:
                    break
                n -= k

    def unfill(self):
        if self.filler and os.path.exists(self.filler):
            os.unlink(self.filler)

    def fault(self, specs):
        raise Skip("the file:// backend has no server to inject HTTP faults into")

    def close(self):
        if self.tmpfs:
            subprocess.run(["umount", "-l", self.root], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


class GcsServer(gcs.GcsServer):
    """The suite's Cloud Storage test server launcher (tests/integration/
    gcs.py), one per driver run. A control call that fails is a driver
    error (RuntimeError), never taken for a failed invariant check (the
    cells catch AssertionError)."""

    def call(self, path, body=None):
        try:
            return super().call(path, body)
        except gcs.GcsServerError as e:
            raise RuntimeError("gcs_server: %s" % e) from None


class GsBucket:
    kind = "gs"
    BUCKET = "mtcfs-fm"

    def __init__(self, srv, prefix):
        self.srv = srv
        self.prefix = prefix.strip("/") + "/"
        self.url = "gs://%s/%s" % (self.BUCKET, self.prefix.rstrip("/"))
        srv.call("/_reset", {"log": True, "faults": True})

    def opts(self):
        return "bucket=" + self.url

    def env(self):
        # quick retries and a short stall timeout against the local server
        return {"STORAGE_EMULATOR_HOST": self.srv.host, "MTCFS_GCS_RETRY": "20,400,8",
                "MTCFS_GCS_TIMEOUTS": "3000,3"}

    def objects(self, prefix=""):
        full = self.prefix + prefix
        return {o["name"][len(self.prefix):]: int(o["size"])
                for o in self.srv.call("/_objects")
                if o["bucket"] == self.BUCKET and o["name"].startswith(full)}

    def read(self, name):
        # the control-free data path, but after the faults of the cell were cleared
        st, data = self.srv.request("GET", "/storage/v1/b/%s/o/%s?alt=media" % (
            self.BUCKET, urllib.parse.quote(self.prefix + name, safe="")), ok=None)
        if st != 200:
            raise RuntimeError("read %s: HTTP %d" % (name, st))
        return data

    def corrupt(self, name, offset=0):
        self.srv.call("/_corrupt", {"bucket": self.BUCKET, "name": self.prefix + name,
                                    "kind": "flip", "offset": offset})

    def fault(self, specs):
        self.srv.call("/_fault", specs)

    def faults(self):
        return self.srv.call("/_faults")

    def clear_faults(self):
        self.srv.call("/_reset", {"log": False, "faults": True})

    def close(self):
        try:
            self.clear_faults()
        except Exception:
            pass


# --- what the job writes -------------------------------------------------------------

def content(job, step, rank, size):
    """The files node `rank` writes for `step`: deterministic, distinct per
    (job, step, rank); a 'params' file of `size` bytes and a few small ones."""
    seed = hashlib.sha256(("%s/%d/%d" % (job, step, rank)).encode()).digest()
    # a non-periodic tail so a misplaced block cannot pass as the right one
    tail = hashlib.sha256(seed + b"tail").digest() * 8
    if size > MANY_FILES_FROM:
        # the soak's big steps (--soak-big): many 1 MiB files, each with
        # its own tail, plus the small ones
        out = {}
        for i in range((size + MiB - 1) // MiB):
            n = min(MiB, size - i * MiB)
            sd = hashlib.sha256(seed + b"%d" % i).digest()
            out["state/params/%03d/%d.0" % (i // 64, i)] = (sd * (n // 32 + 1))[:n] + sd
        out["_CHECKPOINT_METADATA"] = b'{"step": %d, "rank": %d}' % (step, rank)
        out["commit_success.txt"] = b"ok\n"
        return out
    big = (seed * (size // 32 + 1))[:size]
    return {
        "state/params/0.0": big + tail,
        "state/opt/0.0": (seed[::-1] * (size // 128 + 40))[:size // 4 + 13],
        "_CHECKPOINT_METADATA": b'{"step": %d, "rank": %d}' % (step, rank),
        "commit_success.txt": b"ok\n",
    }


def tree_digest(files):
    h = hashlib.sha256()
    for p in sorted(files):
        h.update(p.encode() + b"\0" + hashlib.sha256(files[p]).digest())
    return h.hexdigest()


def read_tree(root):
    """{relpath: bytes} of the regular files under root; None if root is
    not a directory (symlinks are not followed)."""
    if os.path.islink(root) or not os.path.isdir(root):
        return None
    out = {}
    for dp, dns, fns in os.walk(root):
        dns[:] = [d for d in dns if not d.startswith(".")]
        for fn in fns:
            fp = os.path.join(dp, fn)
            if os.path.islink(fp) or not os.path.isfile(fp):
                continue
            try:
                with open(fp, "rb") as f:
                    out[os.path.relpath(fp, root)] = f.read()
            except OSError:
                return None
    return out


# --- the ledger ------------------------------------------------------------------------

class Ledger:
    """What every node wrote and committed, and which copies must exist.

    written[(r, s)]   digest of the files node r wrote for step s
    committed[(r, s)] "yes" (the commit rename returned), "maybe" (it
                      failed: the node died during it)
    sure[(o, s)]      RAM holders of owner o's shard of step s seen in the
                      catalogs (mtcfs-admin ls) as committed, minus the
                      ones wiped or corrupted since
    backups           {name: step} the coordinator logged complete, minus
                      the ones corrupted by the driver
    """

    def __init__(self, job, n, size):
        self.job = job
        self.n = n
        self.size = size
        self.files = {}
        self.written = {}
        self.committed = {}
        self.sure = {}
        self.backups = {}
        self.events = []

    def write(self, r, s, size=None):
        f = content(self.job, s, r, size or self.size)
        self.files[(r, s)] = f
        self.written[(r, s)] = tree_digest(f)
        return f

    def commit(self, r, s, ok):
        self.committed[(r, s)] = "yes" if ok else "maybe"

    def note(self, what):
        self.events.append(what)

    def saw(self, o, s, h):
        self.sure.setdefault((o, s), set()).add(h)

    def wiped(self, h):
        self.note("wiped node %d" % h)
        for v in self.sure.values():
            v.discard(h)

    def corrupted(self, o, s, h):
        self.note("corrupted node %d's copy of owner %d step %d" % (h, o, s))
        self.sure.get((o, s), set()).discard(h)

    def steps(self):
        return sorted({s for (_, s) in self.written})

    def gc_floor(self):
        """The newest step every node committed (or may have): copies of
        older steps may be dropped by policy."""
        best = None
        for s in self.steps():
            if all((r, s) in self.committed for r in range(self.n)):
                best = s
        return best

    def model_cluster_lo(self, live):
        """Newest step whose every shard has a copy the model says must
        still exist on a live node (None)."""
        floor = self.gc_floor()
        best = None
        for s in self.steps():
            if floor is not None and s < floor:
                continue
            if all(self.sure.get((o, s), set()) & set(live) for o in range(self.n)):
                best = s
        return best


# --- a node, a cluster ---------------------------------------------------------------

def make_node_class():
    class FmNode(harness.Daemon):
        """A harness daemon that may run inside a network namespace; the
        daemon's ERROR/WARN lines are evidence, not test failures (the
        faults provoke them); sanitizer reports still fail."""

        def __init__(self, *a, wrap=(), home=None, **kw):
            # the RAMDIR, mount and log live in the cell's own directories
            # (names no other test's cleanup touches)
            ram = tempfile.mkdtemp(prefix="mtcfs-fm-ram-", dir="/dev/shm")
            mnt = os.path.join(home, kw["name"] + ".mnt")
            os.mkdir(mnt)
            super().__init__(ram, mnt, *a, log_path=os.path.join(home, kw["name"] + ".log"),
                             **kw)
            self._own_dirs.append(ram)
            self.wrap = list(wrap)
            self.expect_log(LOG_ERR_LINE)

        def argv(self):
            return self.wrap + super().argv()
    return FmNode


class Ctx:
    """One run of one cell: a cluster of n nodes, a bucket, a ledger."""

    def __init__(self, drv, name, backend, n=3, k=1, size=64 * KiB, ram_size="256M",
                 restore_timeout=6, backups=True, tmpfs_bucket=None, ram_sizes=None,
                 redundancy=None):
        self.drv = drv
        # rs:K+M (one group: n <= Net.MAX_NODES nodes): (K, M), else None
        self.rs = tuple(int(x) for x in redundancy[3:].split("+")) if redundancy else None
        self.rs_protected = set()   # steps seen protected on every node
        self.net = drv.net
        self.name = name
        self.backend = backend
        self.n = n
        self.k = k
        self.size = size
        self.restore_timeout = restore_timeout
        self.job = "fm"
        self.ledger = Ledger(self.job, n, size)
        self.notes = []
        self.checks = []
        self.wiped_nodes = set()
        self.bucket = None
        self.nodes = []
        self.dir = tempfile.mkdtemp(prefix="mtcfs-fm-")
        if backend == "file":
            self.bucket = FileBucket(tmpfs_bucket)
        elif backend == "gs":
            drv.seq += 1        # a fresh prefix: a cluster never sees another's backups
            if tmpfs_bucket:
                raise Skip("disk full applies to the file:// bucket only")
            self.bucket = GsBucket(drv.gcs(), "c%d-%s" % (drv.seq, re.sub(r"\W", "-", name)))
        self.backups = backups and self.bucket is not None
        FmNode = make_node_class()

        def make_node(r, **kw):
            d = FmNode(extra_args=["-d"], wrap=self.net.wrap(r), home=self.dir, **kw)
            if self.bucket is not None:
                d.env.update(self.bucket.env())
            # one backup per minute of the backup clock: 1 s here
            d.env["MTCFS_TEST_MINUTE_SECS"] = "1"
            return d
        # the suite's cluster: ports, peers= table, secret, the nodes
        extra = [self.bucket.opts()] if self.bucket is not None else []
        if redundancy:
            extra.append("redundancy=" + redundancy)
        self.cluster = clmod.Cluster(
            n, ram_size=ram_size, restore_timeout=restore_timeout, k=k,
            extra=",".join(extra),
            hosts=[self.net.addr(r) for r in range(n)], ram_sizes=ram_sizes,
            make_node=make_node)
        self.addrs = self.cluster.addrs
        self.nodes = self.cluster.nodes
        self.running = set()
        self.gen = {}           # bumped when node r is killed

    # -- life cycle --

    def start(self, ranks=None):
        for r in (range(self.n) if ranks is None else ranks):
            self.nodes[r].start()
            self.running.add(r)

    def close(self):
        errs = []
        self.net.heal_all()
        for d in self.nodes:
            try:
                d.close()
            except Exception as e:
                errs.append("%s: %s" % (d.name, e))
        if self.bucket is not None:
            self.bucket.close()
        shutil.rmtree(self.cluster.dir, ignore_errors=True)
        if not self.drv.keep and not any(harness.mount_fstype(d.mnt) for d in self.nodes):
            shutil.rmtree(self.dir, ignore_errors=True)
        return errs

    def kill(self, r, wipe=False):
        self.gen[r] = self.gen.get(r, 0) + 1
        self.nodes[r].kill9()
        self.running.discard(r)
        self.ledger.note("kill -9 node %d%s" % (r, " (RAMDIR wiped)" if wipe else ""))
        if wipe:
            self.nodes[r].wipe_ramdir()
            self.ledger.wiped(r)
            self.wiped_nodes.add(r)

    def restart(self, r):
        self.nodes[r].start()
        self.running.add(r)

    def cut_for(self, r, secs):
        """Cut node r's link for secs, then heal it."""
        self.net.cut(r)
        hold_fault(secs)
        self.net.heal(r)

    def mnt(self, r):
        return self.nodes[r].mnt

    # -- the job as Orbax plays it --

    def yaml(self, r):
        iv = "backup-interval-steps: 1" if self.backups else "backup-interval-minutes: 30"
        if self.n == 3 and self.k == 1:
            # The cells are written for node 2's replicas on node 1; with
            # peers-per-node GKE's placement (which mtcfs follows) puts them
            # on node 0, the coordinator. peer-ranks keeps the topology.
            peers = "peer-ranks: [%d]" % (1 if r == 2 else r ^ 1)
        else:
            peers = "peers-per-node: %d" % self.k
        return ("job-name: %s\nframework: orbax\nnode-rank: %d\nnodes: %d\n"
                "%s\n%s\n" % (self.job, r, self.n, peers, iv))

    def write(self, r, step, size=None):
        """Write node r's step into <step>.orbax-checkpoint-tmp-r (no commit)."""
        files = self.ledger.write(r, step, size)
        tmp = os.path.join(self.mnt(r), "%d.orbax-checkpoint-tmp-%d" % (step, r))
        for rel, data in files.items():
            if rel == "commit_success.txt":
                continue
            p = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            harness.write_file(p, data)
        harness.write_file(os.path.join(tmp, "commit_success.txt"), files["commit_success.txt"])
        return tmp

    def commit(self, r, step):
        tmp = os.path.join(self.mnt(r), "%d.orbax-checkpoint-tmp-%d" % (step, r))
        try:
            os.rename(tmp, os.path.join(self.mnt(r), str(step)))
        except OSError:
            self.ledger.commit(r, step, False)
            raise
        self.ledger.commit(r, step, True)

    def save(self, step, ranks=None, size=None, confirm=True):
        ranks = list(range(self.n)) if ranks is None else ranks
        for r in ranks:
            self.write(r, step, size)
            self.commit(r, step)
        if confirm:
            self.confirm(step, ranks)

    def confirm(self, step, ranks=None, backup=None, timeout=60):
        """Wait until the step is committed on ranks and (every node saved
        it) replicated and backed up; the copies seen go to the ledger."""
        ranks = list(range(self.n)) if ranks is None else ranks
        for r in ranks:
            harness.wait_committed(self.nodes[r].ramdir, step, job=self.job, rank=r,
                                   timeout=timeout)
            self.ledger.saw(r, step, r)
        if len(ranks) == self.n:
            c = self.cl()
            if self.rs:
                # no replicas under rs: every node stores all its parity
                deadline_wait(lambda: all(self.rs_marker(r, step) for r in range(self.n)),
                              timeout, "step %d protected (rs) on every node" % step)
                self.rs_protected.add(step)
            else:
                c.wait_replicated(self.job, step, timeout=timeout)
            self.observe_catalogs()
            if (self.backups if backup is None else backup):
                self.wait_backup(step, timeout=timeout)

    def rs_dir(self, r, step):
        return os.path.join(self.nodes[r].ramdir, "shards", self.job, str(step), "parity")

    def rs_marker(self, r, step):
        """Node r stores all its parity of step (RAMDIR/shards/JOB/STEP/parity/protected)."""
        return os.path.exists(os.path.join(self.rs_dir(r, step), "protected"))

    def cl(self):
        """The cluster.Cluster (its holds(), wait_replicated(), wait_coord())."""
        return self.cluster

    def observe_catalogs(self):
        for h in sorted(self.running):
            try:
                for (o, s), state in self.cl().holds(h, self.job).items():
                    if state in harness.COMMITTED_STATES:
                        self.ledger.saw(o, s, h)
            except AssertionError:
                pass

    def wait_backup(self, step, timeout=60, node=0):
        rx = re.compile(r"backup job=%s name=(%s) step=%d complete" % (self.job, NAME_RE, step))
        d = self.nodes[node]
        m = deadline_wait(lambda: rx.search(d.log_text()), timeout,
                          "backup of step %d complete (rank %d's log)" % (step, node))
        self.ledger.backups[m.group(1)] = step
        return m.group(1)

    def fresh(self, steps=(10, 20), size=None):
        """Start the job (nothing to restore) and save steps on every node."""
        got = self.job_restart(allow_failed=False, label="fresh start", check=False)
        if set(got.values()) != {0}:
            raise CellFail("fresh job start restored %s" % got)
        for s in steps:
            self.save(s, size=size)

    # -- faults on the bucket --

    def lose_all_ram(self):
        """Every node's RAM is gone (the job is rescheduled on new nodes)."""
        for r in sorted(self.running):
            self.kill(r, wipe=True)
        for r in range(self.n):
            if r not in self.wiped_nodes:
                self.nodes[r].wipe_ramdir()
                self.ledger.wiped(r)
                self.wiped_nodes.add(r)
        self.start()

    # -- disk truth ---------------------------------------------------------------

    def stage_dirs(self, r, live_only=True):
        """Staging directories (.nO-wW.in-PID-SEQ) of shards node r is
        receiving; with live_only, only those of its running daemon (a
        killed daemon's leftovers are not 'in flight')."""
        base = os.path.join(self.nodes[r].ramdir, "shards", self.job)
        proc = self.nodes[r].proc
        pid = proc.pid if proc is not None and proc.poll() is None else None
        out = []
        for dp, dns, _ in os.walk(base):
            for d in dns:
                m = re.search(r"\.in-(\d+)-\d+$", d)
                if m and (not live_only or int(m.group(1)) == pid):
                    out.append(os.path.join(dp, d))
        return out

    def ram_used(self, r):
        """Bytes under node r's RAMDIR, each inode once (as mtcfs counts)."""
        seen, n = set(), 0
        for dp, dns, fns in os.walk(self.nodes[r].ramdir):
            for x in dns + fns:
                try:
                    st = os.lstat(os.path.join(dp, x))
                except OSError:
                    continue
                if st.st_ino not in seen and not os.path.isdir(os.path.join(dp, x)):
                    seen.add(st.st_ino)
                    n += st.st_size
        return n

    def remount(self, r, ram_size):
        """Clean restart of node r (unmount, start) with another ram_size."""
        d = self.nodes[r]
        d.stop()
        d.opts = re.sub(r"ram_size=[^,]*", "ram_size=%s" % ram_size, d.opts)
        d.start()

    def scan_ram(self, live):
        """{(owner, step): {holder}}: exact copies (every file byte-equal to
        what the owner wrote) in the RAMDIRs of the live nodes: the shard
        store, and a node's own committed step directory in its namespace
        (sealing may not have linked it into the store before a crash)."""
        copies = {}
        for h in live:
            ram = self.nodes[h].ramdir
            base = os.path.join(ram, "shards", self.job)
            try:
                steps = os.listdir(base)
            except OSError:
                steps = []
            for sd in steps:
                if not sd.isdigit():
                    continue
                try:
                    shard_dirs = os.listdir(os.path.join(base, sd))
                except FileNotFoundError:
                    continue        # GC dropped the step since: settle() scans again
                for nd in shard_dirs:
                    m = re.match(r"^n(\d+)-w0$", nd)
                    if not m:
                        continue
                    o, s = int(m.group(1)), int(sd)
                    want = self.ledger.written.get((o, s))
                    t = read_tree(os.path.join(base, sd, nd))
                    if want and t is not None and tree_digest(t) == want:
                        copies.setdefault((o, s), set()).add(h)
            nsd = os.path.join(ram, "ns")
            try:
                names = os.listdir(nsd)
            except OSError:
                names = []
            for nm in names:
                if not nm.isdigit():
                    continue
                s = int(nm)
                want = self.ledger.written.get((h, s))
                if want and (h, s) in self.ledger.committed:
                    t = read_tree(os.path.join(nsd, nm))
                    if t is not None and tree_digest(t) == want:
                        copies.setdefault((h, s), set()).add(h)
        return copies

    def backup_order(self, name):
        m = re.match(r"^(\d{4}-\d{2}-\d{2}_\d{2}-\d{2})(?:-(\d+))?$", name)
        return (m.group(1), int(m.group(2) or 1)) if m else ("", 0)

    def scan_bucket(self):
        """[(name, step, exact)] of the job's backups, newest first: exact =
        every node has exactly one .meta, all of one step, and its data
        objects are byte-equal to what the node wrote for that step."""
        if self.bucket is None:
            return []
        objs = self.bucket.objects(self.job + "/")
        names = sorted({k.split("/")[1] for k in objs if k.count("/") >= 2},
                       key=self.backup_order, reverse=True)
        out = []
        for b in names:
            if not re.match("^%s$" % NAME_RE, b):
                continue
            base = "%s/%s/" % (self.job, b)
            metas = {}
            for k in objs:
                m = re.match(r"^%s%s-s(\d+)-n(\d+)-w0\.meta$" % (re.escape(base),
                                                                 re.escape(self.job)), k)
                if m:
                    metas.setdefault(int(m.group(2)), []).append((int(m.group(1)), k))
            exact, step, why = True, None, ""
            for r in range(self.n):
                if len(metas.get(r, [])) != 1:
                    exact, why = False, "node %d has %d .meta" % (r, len(metas.get(r, [])))
                    break
                s, k = metas[r][0]
                if step is None:
                    step = s
                if s != step:
                    exact, why = False, "mixed steps"
                    break
                try:
                    h = self.bucket.read(k).decode()
                except Exception as e:
                    exact, why = False, "meta unreadable: %s" % e
                    break
                if (base + h + ".manifest") not in objs:
                    exact, why = False, "node %d: no manifest" % r
                    break
                files = {}
                pre = base + h + ".data/"
                for kk in objs:
                    if kk.startswith(pre):
                        try:
                            files[kk[len(pre):]] = self.bucket.read(kk)
                        except Exception as e:
                            files[kk[len(pre):]] = b"?unreadable %s" % str(e).encode()
                want = self.ledger.written.get((r, s))
                if not want or tree_digest(files) != want:
                    exact, why = False, "node %d's data differs from what it wrote" % r
                    break
            out.append({"name": b, "step": step, "exact": exact, "why": why})
        return out

    def settle(self, live, timeout=30):
        """Wait until no replica or restore is being received on a live node
        and two scans of the RAMDIRs agree; returns the scan."""
        last = [None]
        why = [""]

        def quiet():
            st = {r: self.stage_dirs(r) for r in live}
            st = {r: v for r, v in st.items() if v}
            if st:
                why[0] = "shards still being received: %s" % st
                return None
            s = self.scan_ram(live)
            key = {k: sorted(v) for k, v in s.items()}
            if key == last[0]:
                return (s,)
            why[0] = "copies changed: %s -> %s" % (last[0], key)
            last[0] = key
            # quiet = two scans 0.3 s apart agree: the gap is the
            # definition (no event says "nothing more will arrive")
            time.sleep(0.3)
            return None
        try:
            return deadline_wait(quiet, timeout, "RAMDIRs quiet on nodes %s" % sorted(live))[0]
        except AssertionError as e:
            raise CellFail("I5 %s: %s" % (e, why[0]))

    # -- expectation --------------------------------------------------------------

    def expected(self, live, copies, backups):
        """I1: newest step whose every shard has an exact copy on a live
        node; else the newest exact complete backup; else nothing."""
        best = None
        for s in self.ledger.steps():
            if all(copies.get((o, s), set()) & set(live) for o in range(self.n)):
                best = s
            elif self.rs and s in self.rs_protected:
                # the erasure code (one group of n nodes): a step that was
                # protected everywhere is rebuilt while at most M nodes
                # lack their shard or their parity of it
                whole = [r for r in live if r in copies.get((r, s), set()) and
                         self.rs_marker(r, s)]
                if len(whole) >= self.n - self.rs[1]:
                    best = s
        if best is not None:
            return {"step": best, "source": "cluster", "backup": None}
        for b in backups:       # newest first, as mtcfs orders them
            if b["exact"]:
                return {"step": b["step"], "source": "bucket", "backup": b["name"]}
        return {"step": 0, "source": "none", "backup": None}

    # -- the job restart and the checks ---------------------------------------------

    def _node_attempt(self, r, res, deadline):
        """Node r's application starts the job: it deletes what it read of
        an earlier incarnation (markers, replicator.failed), writes
        replicator.yaml and waits for its markers. Ends with ("killed",)
        when the driver kills the node meanwhile (its application died)."""
        gen = self.gen.get(r, 0)
        mnt = self.mnt(r)
        yaml = os.path.join(mnt, "replicator.yaml")
        failed = os.path.join(mnt, "replicator.failed")

        def gone():
            if self.gen.get(r, 0) != gen:
                res[r] = ("killed", "node %d was killed during this attempt" % r)
                return True
            return False
        try:
            for x in os.listdir(mnt):
                if x.endswith(".restore") or x == "replicator.failed":
                    os.unlink(os.path.join(mnt, x))
            while os.path.exists(yaml):
                if gone():
                    return
                if time.monotonic() > deadline:
                    res[r] = ("timeout", "replicator.yaml never consumed")
                    return
                time.sleep(0.02)
            with open(yaml + ".tmp", "w") as f:
                f.write(self.yaml(r))
            os.rename(yaml + ".tmp", yaml)
            while True:
                if gone():
                    return
                if os.path.exists(failed):
                    try:
                        txt = open(failed).read().strip()
                    except OSError:
                        txt = "?"
                    res[r] = ("failed", txt)
                    return
                if not os.path.exists(yaml):
                    ms = [x for x in os.listdir(mnt) if x.endswith(".restore")]
                    if ms:
                        steps = set()
                        for x in ms:
                            m = re.match(r".*-s(\d+)-n(\d+)-w(\d+)\.restore$", x)
                            steps.add(int(m.group(1)) if m else -1)
                        res[r] = ("ok", ms, steps)
                        return
                if time.monotonic() > deadline:
                    res[r] = ("timeout", "no markers and no replicator.failed")
                    return
                time.sleep(0.02)
        except OSError as e:
            if not gone():
                res[r] = ("error", "%s" % e)

    def attempt(self, ranks, timeout):
        """Every node in ranks writes replicator.yaml at once and waits for
        its markers (or replicator.failed) until the deadline."""
        res = {}
        deadline = time.monotonic() + timeout
        ts = [threading.Thread(target=self._node_attempt, args=(r, res, deadline), daemon=True)
              for r in ranks]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout + 5)
        for r in ranks:
            res.setdefault(r, ("timeout", "the waiting thread did not finish"))
        return res

    def job_restart(self, ranks=None, allow_failed=True, attempts=3, label="restart",
                    check=True, timeout=None, hook=None):
        """The job (re)starts on ranks: replicator.yaml on every node at
        once; when a node reports replicator.failed the whole job restarts
        (as a JobSet does), up to `attempts` times. With check, the
        invariants are verified against the disk truth taken before."""
        ranks = sorted(self.running) if ranks is None else ranks
        timeout = timeout or (2 * self.restore_timeout + 30)
        pre = None
        if check:
            copies = self.settle(ranks)
            backups = self.scan_bucket()
            exp = self.expected(ranks, copies, backups)
            lo = self.ledger.model_cluster_lo(ranks)
            pre = {"copies": {"%d@%d" % k: sorted(v) for k, v in sorted(copies.items())},
                   "backups": backups, "expected": exp, "model_lo": lo}
        if hook is not None:
            hook()      # faults that must not touch the driver's own scan
        pos = {r: self.nodes[r].log_size() for r in ranks}
        t0 = time.monotonic()
        history = []
        for a in range(attempts):
            res = self.attempt(ranks, timeout)
            history.append({r: list(v[:2]) if v[0] != "ok" else ["ok", sorted(v[2])]
                            for r, v in res.items()})
            bad = {r: v for r, v in res.items() if v[0] != "ok"}
            if not bad:
                break
            hung = {r: v for r, v in bad.items() if v[0] in ("timeout", "error")}
            if hung:
                raise CellFail("I5 no hang: %s: node(s) %s: %s (deadline %.0f s)" % (
                    label, sorted(hung), {r: v[1] for r, v in hung.items()}, timeout))
            if not allow_failed:
                raise CellFail("%s: the restore failed with no fault during it: %s" % (
                    label, {r: v[1] for r, v in bad.items()}))
            self.notes.append("%s attempt %d: replicator.failed on %s: %s" % (
                label, a + 1, sorted(bad), list(bad.values())[0][1][:200]))
        else:
            raise CellFail("%s: the job restart failed %d times in a row: %s" % (
                label, attempts, history[-1]))
        secs = time.monotonic() - t0
        got = {r: sorted(res[r][2]) for r in ranks}
        sources = {}
        for r in ranks:
            txt = self.nodes[r].log_from(pos[r])
            m = RESTORE_LINE.findall(txt)
            sources[r] = m[-1][2] if m else "?"
        rec = {"label": label, "secs": round(secs, 2), "got": {str(r): v for r, v in got.items()},
               "sources": {str(r): v for r, v in sources.items()}, "attempts": len(history)}
        if pre is not None:
            rec.update({"expected": pre["expected"], "model_lo": pre["model_lo"],
                        "copies": pre["copies"],
                        "backups": [(b["name"], b["step"], b["exact"]) for b in pre["backups"]]})
        self.checks.append(rec)
        if not check:
            return {r: got[r][0] if len(got[r]) == 1 else got[r] for r in ranks}
        self.verify(ranks, got, pre, label)
        return {r: got[r][0] for r in ranks}

    def verify(self, ranks, got, pre, label):
        exp = pre["expected"]
        # I3: one step everywhere, one marker per node
        for r in ranks:
            if len(got[r]) != 1:
                raise CellFail("I3 %s: node %d has markers of several steps %s" % (label, r, got[r]))
        steps = {got[r][0] for r in ranks}
        if len(steps) != 1:
            raise CellFail("I3 %s: the nodes restored different steps: %s" % (
                label, {r: got[r][0] for r in ranks}))
        step = steps.pop()
        # I4: what the model says must have survived did survive
        lo = pre["model_lo"]
        if lo is not None and (exp["source"] != "cluster" or exp["step"] < lo):
            raise CellFail(
                "I4 %s: the ledger says step %d had a copy of every shard on a live node "
                "(seen in the catalogs, no wipe/corruption since), but the RAMDIRs hold "
                "exact copies only for %s; copies on disk: %s" % (
                    label, lo, exp, pre["copies"]))
        # I1: the newest step the surviving copies allow
        if step != exp["step"]:
            raise CellFail("I1 %s: restored step %d, expected %d (%s%s); exact copies on disk "
                           "(owner@step: holders): %s; backups (name, step, exact): %s" % (
                               label, step, exp["step"], exp["source"],
                               " " + exp["backup"] if exp["backup"] else "", pre["copies"],
                               [(b["name"], b["step"], b["exact"]) for b in pre["backups"]]))
        # prerestore names the backup when the bucket is the source
        for r in ranks:
            pr = self.read_text(r, "replicator.prerestore")
            if step == 0:
                ok = pr.strip() in ("{}", "")
            else:
                ok = re.search(r"restore-step: %d\b" % step, pr) is not None
                if exp["source"] == "bucket":
                    ok = ok and ("restore-backup: %s" % exp["backup"]) in pr
                else:
                    ok = ok and "restore-backup" not in pr
            if not ok:
                raise CellFail("%s: node %d's replicator.prerestore is %r; expected step %d "
                               "from %s %s" % (label, r, pr, step, exp["source"],
                                               exp["backup"] or ""))
        # I2: read every byte through the marker
        for r in ranks:
            mnt = self.mnt(r)
            ms = [x for x in os.listdir(mnt) if x.endswith(".restore")]
            if step == 0:
                p = os.path.join(mnt, "%s-s0-n%d-w0.restore" % (self.job, r))
                if ms != [os.path.basename(p)] or os.path.islink(p) or os.path.getsize(p):
                    raise CellFail("I2 %s: node %d: nothing restored but markers are %s" % (
                        label, r, ms))
                continue
            want = self.ledger.files.get((r, step))
            os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, str(step)))
            have = read_tree(os.path.join(mnt, str(step)) + "/")
            if have != want:
                diff = sorted(set(want or {}) ^ set(have or {})) or sorted(
                    p for p in want if have.get(p) != want[p])
                raise CellFail("I2 %s: node %d: the restored step %d read through its marker "
                               "differs from what it wrote (files %s; read %s)" % (
                                   label, r, step, diff[:5],
                                   "nothing: not a directory" if have is None else
                                   "an empty directory" if not have else
                                   "%d files" % len(have)))
        self.ledger.note("%s: restored %d everywhere" % (label, step))

    def read_text(self, r, name):
        try:
            with open(os.path.join(self.mnt(r), name)) as f:
                return f.read()
        except OSError:
            return ""

    # -- timing hooks ---------------------------------------------------------------

    def wait_stage(self, r, timeout=30, min_bytes=1):
        """Wait until node r receives a shard (a .in- staging directory with
        at least min_bytes in it): the replicating/fetching phase."""
        def staged():
            for d in self.stage_dirs(r):
                n = 0
                for dp, _, fns in os.walk(d):
                    for fn in fns:
                        try:
                            n += os.path.getsize(os.path.join(dp, fn))
                        except OSError:
                            pass
                if n >= min_bytes:
                    return d
            return None
        return deadline_wait(staged, timeout, "node %d receiving a shard (.in- stage)" % r,
                             interval=0.002)

    def evidence(self, lines=25):
        out = {}
        pat = re.compile(r" (ERROR|WARN) |restore job=|plan job=|barrier|restored job=|"
                         r"backup job=|source rank|abandoned|failed")
        for d in self.nodes:
            try:
                txt = d.final_log if d.final_log is not None else d.log_text()
            except OSError:
                txt = ""
            sel = [ln for ln in txt.splitlines() if pat.search(ln)]
            out[d.name] = sel[-lines:]
        return out


# --- the cells ----------------------------------------------------------------------

class Cell:
    def __init__(self, phase, fault, fn=None, backends=("file", "gs"), ci=False, na=None,
                 skip=None, limit=150):
        self.phase = phase
        self.fault = fault
        self.fn = fn
        self.backends = backends
        self.ci = ci
        self.na = na          # not applicable: reason (no run, not counted)
        self.skip = skip      # cannot be hit reliably: reason (SKIP)
        self.limit = limit    # hard deadline in seconds (I5)

    @property
    def name(self):
        return "%s/%s" % (self.phase, self.fault)


PHASES = ["writing", "commit", "replicating", "backing-up", "restore/planning",
          "restore/fetching", "restore/barrier", "protected (rs)", "encoding (rs)"]
FAULTS = ["kill9-keep", "kill9-wipe", "kill-coord", "cut-link", "corrupt",
          "bucket-5xx/429/timeout", "ram-full", "disk-full"]
CELLS = []


def cell(phase, fault, **kw):
    def deco(fn):
        CELLS.append(Cell(phase, fault, fn, **kw))
        return fn
    return deco


def fault_cells(phase, run, kinds):
    """One cell per fault that run(c, fault) handles; kinds: {fault: the
    cell's options}, in the matrix's order."""
    for fault, kw in kinds.items():
        cell(phase, fault, **kw)(functools.partial(run, fault=fault))


def kill_cell(setup):
    """run(c, fault) of a kill cell: setup(c, victim) brings node 2 (the
    coordinator, node 0, for kill-coord) to the phase; it is killed -9
    (RAMDIR kept, or wiped for kill9-wipe), restarted, and the job
    restarts."""
    def run(c, fault):
        victim = 0 if fault == "kill-coord" else 2
        setup(c, victim)
        c.kill(victim, wipe=(fault == "kill9-wipe"))
        c.restart(victim)
        c.job_restart(allow_failed=False)
    return run


def na(phase, fault, why):
    CELLS.append(Cell(phase, fault, na=why))


def skip(phase, fault, why, backends=("file", "gs")):
    CELLS.append(Cell(phase, fault, skip=why, backends=backends))


# .. writing: node 2 has written half of step 30 when the fault hits; the
# other nodes committed 30. Expected: 20 everywhere (30 is incomplete).

def writing_setup(c, victim):
    c.start()
    c.fresh()
    c.save(30, ranks=[r for r in range(c.n) if r != victim], confirm=False)
    c.confirm(30, ranks=[r for r in range(c.n) if r != victim])
    tmp = c.write(victim, 30)
    # half a step: drop commit_success.txt and truncate the big file
    os.unlink(os.path.join(tmp, "commit_success.txt"))
    os.truncate(os.path.join(tmp, "state/params/0.0"), c.size // 2)


fault_cells("writing", kill_cell(writing_setup), {
    "kill9-keep": dict(ci=("file",)), "kill9-wipe": {}, "kill-coord": {}})


@cell("writing", "cut-link")
def c_writing_cut(c):
    """Node 2's link is cut while every node writes and commits step 30;
    healed after the commits: the job restart finds 30 complete (every node
    holds its own shard), whatever the replication did meanwhile."""
    c.start()
    c.fresh()
    c.net.cut(2)
    for r in range(c.n):
        c.write(r, 30)
    for r in range(c.n):
        c.commit(r, 30)
    hold_fault(2.0)
    c.net.heal(2)
    c.confirm(30, backup=False)
    c.job_restart(allow_failed=False)


@cell("writing", "ram-full", ci=("gs",))
def c_writing_ram_full(c):
    """Node 1 holds its own step 20, the replicas of nodes 0 and 2 (steps 20
    and 30); its RAM tier is then made just too small for its own step 30
    (clean remount with ram_size = bytes in use + half a shard). Writing 30
    needs space that only dropping step 20 - the last complete step - would
    give: ENOSPC, never a dropped step 20. The job restart restores 20."""
    c.start()
    c.fresh()
    c.save(30, ranks=[0, 2], confirm=False)
    deadline_wait(lambda: {(0, 30), (2, 30)} <= set(c.cl().holds(1, c.job)), 30,
                  "node 1 holds the replicas of step 30 of nodes 0 and 2")
    c.remount(1, str(c.ram_used(1) + c.size // 2))
    err = None
    try:
        c.write(1, 30)
    except OSError as e:
        err = e
    if err is None:
        raise Skip("phase not hit: node 1's RAM tier took step 30")
    c.notes.append("node 1 writing step 30: %s" % err)
    c.job_restart(allow_failed=False)


na("writing", "corrupt", "nothing committed is read during writing")
na("writing", "bucket-5xx/429/timeout", "no bucket traffic while the application writes")
na("writing", "disk-full", "no bucket traffic while the application writes")


# .. commit: the fault hits right after node 2's commit rename returned (its
# seal, commit report and replication run on workers after the rename).

def commit_setup(c, victim, size=None):
    c.start()
    c.fresh()
    others = [r for r in range(c.n) if r != victim]
    c.save(30, ranks=others, confirm=False)
    c.confirm(30, ranks=others)
    c.write(victim, 30, size)
    c.commit(victim, 30)


fault_cells("commit", kill_cell(commit_setup), {
    "kill9-keep": dict(ci=("gs",)), "kill9-wipe": dict(ci=("file",)), "kill-coord": {}})


@cell("commit", "cut-link")
def c_commit_cut(c):
    """Node 2 commits step 30 while its link is cut (its commit report and
    replica cannot leave); healed 3 s later."""
    c.start()
    c.fresh()
    c.save(30, ranks=[0, 1], confirm=False)
    c.write(2, 30)
    c.net.cut(2)
    c.commit(2, 30)
    hold_fault(3.0)
    c.net.heal(2)
    c.confirm(30, backup=False)
    c.job_restart(allow_failed=False)


na("commit", "corrupt", "nothing is read at the commit")
na("commit", "ram-full", "the commit rename allocates nothing (covered at writing/replicating)")
na("commit", "bucket-5xx/429/timeout", "no bucket traffic at the commit")
na("commit", "disk-full", "no bucket traffic at the commit")


# .. replicating: a big shard over a slowed link; the fault hits while the
# receiver's staging directory fills (seen on disk).

# Large enough that a kill -9 leaves most of it unsent: the kernel still
# delivers what sits in a dead sender's socket buffer (up to tcp_wmem's
# maximum, 4 MiB by default), so a smaller shard would arrive whole.
BIG = 24 * MiB


def replicating_setup(c, sender, receiver):
    c.start()
    c.fresh()
    others = [r for r in range(c.n) if r != sender]
    c.save(30, ranks=others, confirm=False)
    c.confirm(30, ranks=others)
    c.net.slow(sender, 24)
    c.write(sender, 30, BIG)
    c.commit(sender, 30)
    c.wait_stage(receiver, min_bytes=256 * KiB)
    c.notes.append("node %d was receiving node %d's step 30 when the fault hit"
                   % (receiver, sender))


@cell("replicating", "kill9-keep", ci=("file",))
def c_repl_kill_sender_keep(c):
    replicating_setup(c, 2, 1)
    c.kill(2)
    c.net.heal(2)
    c.restart(2)
    c.job_restart(allow_failed=False)


@cell("replicating", "kill9-wipe", ci=("gs",))
def c_repl_kill_sender_wipe(c):
    """The sender dies wiped mid-push: its step 30 exists nowhere (the
    partial replica must not count)."""
    replicating_setup(c, 2, 1)
    c.kill(2, wipe=True)
    c.net.heal(2)
    c.restart(2)
    copies = c.settle(sorted(c.running))
    if 1 in copies.get((2, 30), ()):
        raise Skip("phase not hit: node 1 received node 2's whole step 30 (the dead "
                   "sender's socket buffer was delivered)")
    c.job_restart(allow_failed=False)


@cell("replicating", "kill-coord")
def c_repl_kill_coord(c):
    """The coordinator (rank 0) dies while it pushes its step 30 to node 1."""
    replicating_setup(c, 0, 1)
    c.kill(0)
    c.net.heal(0)
    c.restart(0)
    c.job_restart(allow_failed=False)


@cell("replicating", "cut-link")
def c_repl_cut(c):
    """The link of the receiver is cut mid-push for 4 s, then healed."""
    replicating_setup(c, 2, 1)
    c.cut_for(1, 4.0)
    c.net.heal(2)
    c.job_restart(allow_failed=False)


@cell("replicating", "ram-full")
def c_repl_ram_full(c):
    """Node 1 receives node 2's replicas. Its RAM tier is made too small for
    node 2's big step 30 (clean remount, ram_size = bytes in use + 1 MiB):
    the replica cannot be stored, replication fails and says so; step 30 is
    still complete (every node holds its own shard) and is restored."""
    c.start()
    c.fresh()
    c.remount(1, str(c.ram_used(1) + MiB))
    c.save(30, ranks=[1, 0], confirm=False)
    pos = c.nodes[2].log_size()
    c.save(30, ranks=[2], size=BIG, confirm=False)
    rx = re.compile(r"replicating job=%s step=30 to rank 1 failed.*" % c.job)
    try:
        m = deadline_wait(lambda: rx.search(c.nodes[2].log_from(pos)), 30,
                          "node 2 reports its replication to node 1 failed")
    except AssertionError:
        raise Skip("phase not hit: node 1 took the replica (or no failure was reported)")
    c.notes.append("node 2: %s" % m.group(0)[:200])
    for r in range(c.n):
        harness.wait_committed(c.nodes[r].ramdir, 30, job=c.job, rank=r)
        c.ledger.saw(r, 30, r)
    c.job_restart(allow_failed=False)


na("replicating", "corrupt", "a corrupt replica is caught when it is read (restore/fetching)")
na("replicating", "bucket-5xx/429/timeout", "no bucket traffic in replication")
na("replicating", "disk-full", "no bucket traffic in replication")


# .. backing up: the backup of step 30 is in flight (gs: uploads slowed by the
# server; file://: a large shard, the fault hits between the data objects and
# the .meta). Every cell then checks two restores: the job restart (cluster
# copies win), and a restart with every node's RAM lost (the bucket: the
# newest backup that is complete and exact - never the interrupted one).

def backing_up_setup(c, victim):
    c.start()
    c.fresh()
    if c.backend == "gs":
        c.bucket.fault([{"match": "upload", "kind": "slow", "delay_ms": 700, "count": 200}])
        c.save(30, confirm=False)
        for r in range(c.n):
            harness.wait_committed(c.nodes[r].ramdir, 30, job=c.job, rank=r)
        rx = re.compile(r"backup job=%s name=(%s) step=30 started" % (c.job, NAME_RE))
        deadline_wait(lambda: rx.search(c.nodes[0].log_text()), 30, "backup of 30 started")
        deadline_wait(lambda: any(f.get("hit", 0) for f in c.bucket.faults()), 30,
                      "an upload of step 30 in flight (slowed by the server)")
        if any(re.search(r"-s30-n%d-w0\.meta$" % victim, k) for k in c.bucket.objects(c.job)):
            raise Skip("phase not hit: node %d's upload of step 30 was done before the kill"
                       % victim)
    else:
        c.save(30, size=24 * MiB, confirm=False)
        pre = c.job + "/"

        def uploading():
            names = [k for k in c.bucket.objects(pre)]
            return any(".data/" in k for k in names if k.split("/")[1] not in c.ledger.backups)
        deadline_wait(uploading, 30, "node uploads of step 30 started (file://)",
                      interval=0.002)
        if any(re.search(r"-s30-n%d-w0\.meta$" % victim, k) for k in c.bucket.objects(c.job)):
            raise Skip("phase not hit: node %d's upload of step 30 was done before the kill"
                       % victim)
    c.notes.append("backup of step 30 in flight when the fault hit")


def backing_up_check(c):
    c.job_restart(allow_failed=False, label="restart")
    if c.backend == "gs":
        c.bucket.clear_faults()
    c.lose_all_ram()
    c.job_restart(allow_failed=False, label="all RAM lost")


@cell("backing-up", "kill9-keep")
def c_bk_kill_keep(c):
    backing_up_setup(c, 1)
    c.kill(1)
    c.restart(1)
    backing_up_check(c)


@cell("backing-up", "kill9-wipe", ci=("file", "gs"))
def c_bk_kill_wipe(c):
    backing_up_setup(c, 1)
    c.kill(1, wipe=True)
    c.restart(1)
    backing_up_check(c)


@cell("backing-up", "kill-coord")
def c_bk_kill_coord(c):
    backing_up_setup(c, 0)
    c.kill(0)
    c.restart(0)
    backing_up_check(c)


@cell("backing-up", "cut-link", backends=("gs",))
def c_bk_cut(c):
    """Node 1's link (to the bucket and everyone) is cut for 5 s mid-upload."""
    backing_up_setup(c, 1)
    c.cut_for(1, 5.0)
    backing_up_check(c)


@cell("backing-up", "bucket-5xx/429/timeout", backends=("gs",), ci=("gs",))
def c_bk_http_faults(c):
    """Uploads of the backup of step 30 meet 503s, a 429 with Retry-After,
    a 500 on a .meta, a reset, and answers slower than the stall timeout:
    retried, the backup completes; with every node's RAM lost the job gets
    step 30 from it."""
    c.start()
    c.fresh()
    c.bucket.fault([       # the first matching fault is taken: specific ones first
        {"match": "upload", "kind": "reset", "after_bytes": 5000, "count": 1, "name": "params"},
        {"match": "upload", "kind": "500", "count": 1},
        {"match": "upload", "kind": "503", "count": 3},
        {"match": "upload", "kind": "429", "count": 1, "retry_after": 1},
        {"match": "upload", "kind": "slow", "delay_ms": 5000, "count": 1},
    ])
    c.save(30)
    check_consumed(c)
    backing_up_check(c)


@cell("backing-up", "disk-full", backends=("file",), ci=("file",))
def c_bk_disk_full(c):
    """The file:// bucket is a small tmpfs, filled up after the backup of
    step 20: the backup of 30 fails with ENOSPC (reported, abandoned); with
    every node's RAM lost the job gets step 20 from the older backup, never
    the partial one."""
    c.start()
    c.fresh()
    c.bucket.fill(leave=100 * KiB)
    c.save(30, confirm=False)
    c.confirm(30, backup=False)
    rx = re.compile(r"backup .*abandoned|backup job=%s name=\S+ step=30 complete" % c.job)
    m = deadline_wait(lambda: rx.search(c.nodes[0].log_text()), 60,
                      "the backup of step 30 abandoned (or complete)")
    if "complete" in m.group(0):
        raise Skip("phase not hit: the backup of step 30 fit in the bucket")
    c.notes.append("coordinator: %s" % m.group(0))
    c.job_restart(allow_failed=False, label="restart")
    c.lose_all_ram()
    c.job_restart(allow_failed=False, label="all RAM lost")
    c.bucket.unfill()


na("backing-up", "corrupt", "bucket corruption is caught when a backup is read "
   "(restore/fetching)")
na("backing-up", "ram-full", "a backup only reads the RAM tier")


# .. restore/planning: the coordinator is collecting catalogs (node 2's yaml
# is held back, so the plan cannot be made) when the fault hits.

def planning_start(c, ranks):
    """Job restart on ranks only, in the background: they send their
    catalogs and wait for the plan. Returns (threads, results, pre) with
    pre the disk truth before it (and log0: node 0's log size then)."""
    live = sorted(c.running)
    pre = {"copies": c.settle(live), "backups": c.scan_bucket(), "live": live,
           "gen": dict(c.gen), "log0": c.nodes[0].log_size()}
    res = {}
    deadline = time.monotonic() + 2 * c.restore_timeout + 30
    ts = [threading.Thread(target=c._node_attempt, args=(r, res, deadline), daemon=True)
          for r in ranks]
    for t in ts:
        t.start()
    for r in ranks:
        deadline_wait(lambda r=r: not os.path.exists(os.path.join(c.mnt(r), "replicator.yaml")),
                      20, "node %d consumed its yaml" % r)
    # the coordinator (node 0) holds every catalog: the plan waits for the rest
    for r in ranks:
        c.cl().wait_coord("catalog", c.job, r, since=pre["log0"], timeout=20)
    return ts, res, pre


def planning_finish(c, ts):
    for t in ts:
        t.join(2 * c.restore_timeout + 40)


def inflight_check(c, res, pre, label="in-flight restore"):
    """The restore that was running when the fault hit: it may fail
    (replicator.failed: the job restarts), but it must not hang (I5), and
    the nodes that published markers agree (I3), got the bytes they wrote
    (I2), and got a step that the surviving copies allow with the live set
    before or after the fault (I1)."""
    c.notes.append("%s: %s" % (label, {r: v[0] if v[0] != "ok" else sorted(v[2])
                                       for r, v in sorted(res.items())}))
    hung = {r: v for r, v in res.items() if v[0] in ("timeout", "error")}
    if hung:
        raise CellFail("I5 no hang: %s: node(s) %s neither published markers nor "
                       "replicator.failed: %s" % (label, sorted(hung), hung))
    done = {r: sorted(v[2]) for r, v in res.items() if v[0] == "ok"}
    survivors = [r for r in done if c.gen.get(r, 0) == pre["gen"].get(r, 0)]
    if any(len(v) != 1 for v in done.values()):
        raise CellFail("I3 %s: markers of several steps: %s" % (label, done))
    steps = {v[0] for v in done.values()}
    if len(steps) > 1:
        raise CellFail("I3 %s: the nodes published different steps: %s" % (label, done))
    if not steps:
        return
    step = steps.pop()
    ok = set()
    for live in (pre["live"], sorted(c.running)):
        ok.add(c.expected(live, pre["copies"], pre["backups"])["step"])
    if step not in ok:
        raise CellFail("I1 %s: nodes %s published step %d; the surviving copies allow %s "
                       "(live nodes before/after the fault %s/%s); exact copies: %s; backups: %s"
                       % (label, sorted(done), step, sorted(ok), pre["live"],
                          sorted(c.running),
                          {"%d@%d" % k: sorted(v) for k, v in sorted(pre["copies"].items())},
                          [(b["name"], b["step"], b["exact"]) for b in pre["backups"]]))
    for r in survivors:
        if step == 0:
            continue
        mnt = c.mnt(r)
        ms = [x for x in os.listdir(mnt) if x.endswith(".restore")]
        if not ms:
            continue
        p = os.path.join(mnt, ms[0])
        have = read_tree(os.path.realpath(p) + "/") if os.path.islink(p) else None
        if have != c.ledger.files.get((r, step)):
            raise CellFail("I2 %s: node %d's published step %d differs from what it wrote"
                           % (label, r, step))


def restore_fault_end(c, res, pre, victim):
    """After a fault in a restore: the restore that was in flight is
    checked, the victim is back, the job restarts once more."""
    inflight_check(c, res, pre)
    if victim not in c.running:
        c.restart(victim)
    c.job_restart(allow_failed=True, label="job restart")


def planning_cell(c, fault):
    c.start()
    c.fresh(steps=(10, 20, 30))
    if fault == "kill-coord":
        victim, waiting = 0, [1, 2]
    else:
        victim, waiting = 1, [0, 1]
    ts, res, pre = planning_start(c, waiting)
    plan = c.nodes[0].log_text().count("plan job=%s" % c.job)
    if fault in ("kill9-keep", "kill9-wipe", "kill-coord"):
        c.kill(victim, wipe=(fault == "kill9-wipe"))
        if c.nodes[0].log_text().count("plan job=%s" % c.job) > plan:
            raise Skip("phase not hit: the coordinator planned before the fault")
        c.restart(victim)
    elif fault == "cut-link":
        # cut for longer than restore_timeout: the coordinator plans without it
        c.cut_for(victim, c.restore_timeout + 2)
    planning_finish(c, ts)
    inflight_check(c, res, pre)
    c.job_restart(allow_failed=True, label="job restart")


fault_cells("restore/planning", planning_cell, {
    "kill9-keep": dict(ci=("file",)), "kill9-wipe": {}, "kill-coord": dict(ci=("gs",)),
    "cut-link": {}})


@cell("restore/planning", "bucket-5xx/429/timeout", backends=("gs",))
def c_plan_http_faults(c):
    """Every node lost its RAM; the coordinator's listing of the bucket
    (planning) meets 503s, a 429 and a slow answer: retried; the job gets
    the newest backup."""
    c.start()
    c.fresh(steps=(10, 20, 30))
    c.lose_all_ram()
    c.job_restart(allow_failed=False, label="all RAM lost", hook=lambda: c.bucket.fault([
        {"match": "download", "kind": "503", "count": 2, "name": ".meta"},
        {"match": "list", "kind": "503", "count": 2},
        {"match": "list", "kind": "429", "count": 1, "retry_after": 1},
        {"match": "list", "kind": "slow", "delay_ms": 5000, "count": 1}]))
    check_consumed(c)


def check_consumed(c):
    """The injected HTTP faults were all met (else the cell tested less)."""
    fs = c.bucket.faults()
    left = [f for f in fs if f["count"] > 0]
    c.notes.append("HTTP faults met: %s" % ", ".join("%s %s x%d" % (f["match"], f["kind"], f["hit"])
                                                     for f in fs if f["hit"]))
    if left:
        raise Skip("phase not hit: injected faults never met: %s" % left)


na("restore/planning", "corrupt", "planning reads catalogs, not data (see restore/fetching)")
na("restore/planning", "ram-full", "planning allocates nothing")
na("restore/planning", "disk-full", "a restore only reads the bucket")


# .. restore/fetching: node 2 was wiped; it fetches its shard of step 30 from
# its replica holder (node 1) over a slowed link; the fault hits while its
# staging directory fills.

def slow_fetch_start(c, node, size=BIG):
    """Steps 10-30 saved; node is wiped and the job restarts with node
    fetching its step 30 back at 24 Mbit/s: returns planning_start's
    (threads, results, pre) once its staging holds 256 KiB."""
    c.fresh(steps=(10, 20))
    c.save(30, size=size)
    c.kill(node, wipe=True)
    c.restart(node)
    c.net.slow(node, 24)
    ts, res, pre = planning_start(c, list(range(c.n)))
    c.wait_stage(node, min_bytes=256 * KiB)
    return ts, res, pre


def fetching_setup(c, size=BIG):
    c.start()
    ts, res, pre = slow_fetch_start(c, 2, size)
    c.notes.append("node 2 was fetching its step 30 when the fault hit")
    return ts, res, pre


def fetching_cell(c, fault):
    ts, res, pre = fetching_setup(c)
    victim = 0 if fault == "kill-coord" else 1
    if fault == "cut-link":
        victim = 2
        c.cut_for(2, 4.0)
    else:
        c.kill(victim, wipe=(fault == "kill9-wipe"))
    planning_finish(c, ts)
    c.net.heal(2)
    restore_fault_end(c, res, pre, victim)


# kill9-keep: node 2's replica holder (node 1) dies mid-fetch, RAMDIR
# kept; kill9-wipe: it comes back empty; cut-link: the fetching node's link
# is cut for 4 s mid-fetch, then healed
fault_cells("restore/fetching", fetching_cell, {
    "kill9-keep": dict(ci=("file",)), "kill9-wipe": {}, "kill-coord": {},
    "cut-link": dict(ci=("file",))})


@cell("restore/fetching", "corrupt", ci=("gs",))
def c_fetch_corrupt_peer(c):
    """Node 1's replica of node 2's step 30 has a flipped byte; node 2 was
    wiped: its only other copy is bad, so 30 is not restorable from the
    cluster (nothing restores a corrupt copy); the expected result follows
    from what survives (older steps dropped by policy, then the bucket)."""
    c.start()
    c.fresh(steps=(10, 20, 30))
    p = os.path.join(c.nodes[1].ramdir, "shards", c.job, "30", "n2-w0", "state/params/0.0")
    with open(p, "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0xFF]))
    c.ledger.corrupted(2, 30, 1)
    c.kill(2, wipe=True)
    c.restart(2)
    c.job_restart(allow_failed=False)


@cell("restore/fetching", "corrupt-bucket")
def c_fetch_corrupt_bucket(c):
    """Every node lost its RAM; a data object of the newest backup (step
    30) has a flipped byte: that backup is excluded, the job gets step 20
    from the older backup."""
    c.start()
    c.fresh(steps=(10, 20, 30))
    newest = max(c.ledger.backups, key=c.backup_order)
    objs = [k for k in c.bucket.objects("%s/%s/" % (c.job, newest)) if "params/0.0" in k]
    c.bucket.corrupt(sorted(objs)[0], offset=100)
    del c.ledger.backups[newest]
    c.lose_all_ram()
    c.job_restart(allow_failed=False, label="all RAM lost")


@cell("restore/fetching", "bucket-5xx/429/timeout", backends=("gs",), ci=("gs",))
def c_fetch_http_faults(c):
    """Every node lost its RAM; the downloads meet 503s, a 429, a reset
    mid-body, a truncated body and a slow answer: retried; the job gets
    step 30 from the newest backup."""
    c.start()
    c.fresh(steps=(10, 20, 30))
    c.lose_all_ram()
    c.job_restart(allow_failed=False, label="all RAM lost", hook=lambda: c.bucket.fault([
        {"match": "download", "kind": "503", "count": 2},
        {"match": "download", "kind": "429", "count": 1, "retry_after": 1},
        {"match": "download", "kind": "reset", "after_bytes": 3000, "count": 1},
        {"match": "download", "kind": "truncate", "after_bytes": 2000, "count": 1},
        {"match": "download", "kind": "slow", "delay_ms": 5000, "count": 1}]))
    check_consumed(c)


@cell("restore/fetching", "bucket-corrupt-transient", backends=("gs",), ci=("gs",))
def c_fetch_transient_corrupt(c):
    """Every node lost its RAM; ONE download of the newest backup's data
    comes back with a flipped byte (the stored object is intact): the
    checksum catches it; the newest backup is still the newest complete one
    that a surviving copy allows (I1), so a retry should get it."""
    c.start()
    c.fresh(steps=(10, 20, 30))
    c.lose_all_ram()
    c.job_restart(allow_failed=False, label="all RAM lost", hook=lambda: c.bucket.fault([
        {"match": "download", "kind": "corrupt", "after_bytes": 700, "count": 1,
         "name": "params"}]))
    check_consumed(c)


@cell("restore/fetching", "kill9-wipe-2", ci=("file",))
def c_fetch_over_own_copy(c):
    """After a restore (every node read step 30 through its marker), nodes 0
    and 1 die wiped. Node 2 still holds its own step 30, but the cluster
    has no complete step: every node restores the backup of 30 - node 2
    replaces its own copy with the bucket's. Read through the marker at
    once (as Orbax does), every byte must be there (I2)."""
    c.start()
    c.fresh(steps=(10, 20, 30))
    c.job_restart(allow_failed=False, label="first restart")
    c.kill(0, wipe=True)
    c.kill(1, wipe=True)
    c.restart(0)
    c.restart(1)
    # node 2's application (or a sidecar) still reads the step it restored
    # when the job restarts; the driver's own scans take longer than the
    # kernel's 1 s entry cache, so this read is what makes the cell
    # deterministic
    c.job_restart(allow_failed=False, label="two nodes wiped",
                  hook=lambda: read_tree(os.path.join(c.mnt(2), "30") + "/"))


na("restore/fetching", "disk-full", "a restore only reads the bucket")
skip("restore/fetching", "ram-full", "a node whose RAM tier cannot hold its own shard "
     "cannot restore any step: no correct outcome to assert (a configuration error)")


# .. restore/barrier: 4 nodes (k=1: 0<->1, 2<->3); node 3 was wiped and
# fetches slowly from node 2; nodes 0 and 1 hold their shards and wait at the
# job-wide barrier when the fault hits node 1.

def barrier_setup(c):
    c.start()
    ts, res, pre = slow_fetch_start(c, 3)
    # nodes 0-2 restore from their own RAM: at the barrier once the
    # coordinator has their "ready"
    for r in range(3):
        c.cl().wait_coord("ready", c.job, r, since=pre["log0"], timeout=20)
    c.notes.append("nodes 0-2 at the barrier, node 3 fetching, when the fault hit")
    return ts, res, pre


def barrier_cell(c, fault):
    ts, res, pre = barrier_setup(c)
    victim = 0 if fault == "kill-coord" else 1
    if fault == "cut-link":
        c.cut_for(victim, 4.0)
    else:
        c.kill(victim, wipe=(fault == "kill9-wipe"))
    c.net.heal(3)
    planning_finish(c, ts)
    restore_fault_end(c, res, pre, victim)


fault_cells("restore/barrier", barrier_cell, {
    "kill9-keep": dict(ci=("gs",)), "kill9-wipe": {}, "kill-coord": dict(ci=("file",)),
    "cut-link": {}})


na("restore/barrier", "corrupt", "no data is read at the barrier")
na("restore/barrier", "ram-full", "the barrier allocates nothing")
na("restore/barrier", "bucket-5xx/429/timeout", "no bucket traffic at the barrier")
na("restore/barrier", "disk-full", "a restore only reads the bucket")


# .. rs (redundancy=rs:2+2 on 4 nodes, one group; protected = every node
# stores all its parity of the step). I1's expectation counts a step
# restorable from the cluster when it was protected everywhere and at most
# M nodes lack their shard or their parity (Ctx.expected).

def rs_lose(c, ranks):
    for r in ranks:
        c.kill(r, wipe=True)
    for r in ranks:
        c.restart(r)


def rs_logged_rebuilt(c, ranks, step, pos):
    for r in ranks:
        txt = c.nodes[r].log_from(pos[r])
        if not re.search(r"restored job=%s step=%d from erasure code rs:2\+2" % (c.job, step),
                         txt):
            raise CellFail("node %d's step %d was not rebuilt from the erasure code: %s" % (
                r, step, [ln for ln in txt.splitlines() if "restored job=" in ln][-3:]))


@cell("protected (rs)", "kill9-wipe-M")
def c_rs_lose_m(c):
    """Every pair of the 4 nodes (M = 2), one after the other, killed -9
    and wiped after a new protected step; the job restarts: every byte
    restored, the lost shards rebuilt from the code."""
    c.start()
    c.fresh()
    step = 20
    for lost in [(a, b) for a in range(4) for b in range(a + 1, 4)]:
        step += 10
        c.save(step)
        rs_lose(c, lost)
        pos = {r: c.nodes[r].log_size() for r in range(c.n)}
        got = c.job_restart(allow_failed=False, label="lost %s" % (lost,))
        if set(got.values()) != {step}:
            raise CellFail("lost %s: restored %s, expected step %d" % (lost, got, step))
        rs_logged_rebuilt(c, lost, step, pos)


def rs_lose_m1(c):
    c.start()
    c.fresh()
    rs_lose(c, [1, 2, 3])
    pos0 = c.nodes[0].log_size()
    got = c.job_restart(allow_failed=False)
    txt = c.nodes[0].log_from(pos0)
    if not re.search(r"node [123]'s shard is held nowhere and the erasure code cannot "
                     r"rebuild it: ", txt):
        raise CellFail("the coordinator's log does not say why the code cannot rebuild "
                       "step 20")
    c.notes.append("restored %s" % sorted(set(got.values())))


@cell("protected (rs)", "kill9-wipe-M+1", ci=("gs",))
def c_rs_lose_m1_bucket(c):
    """3 of the 4 nodes killed -9 and wiped (M + 1): the cluster cannot
    rebuild step 20 and says so; the job restores the newest backup."""
    rs_lose_m1(c)


@cell("protected (rs)", "kill9-wipe-M+1-nobackup", backends=("file",))
def c_rs_lose_m1_nothing(c):
    """As kill9-wipe-M+1 with no backup taken: nothing restored (s0)."""
    rs_lose_m1(c)


@cell("protected (rs)", "corrupt", ci=("file",))
def c_rs_corrupt(c):
    """Every parity fragment of node 1 flipped, node 3 killed -9 and wiped:
    the corrupt fragments are passed over, node 3's shard rebuilt exactly."""
    c.start()
    c.fresh()
    d = c.rs_dir(1, 20)
    frs = [x for x in os.listdir(d) if x.endswith(".frag")]
    if len(frs) != 2:
        raise CellFail("node 1 stores %s of step 20, not M = 2 fragments" % frs)
    for x in frs:
        with open(os.path.join(d, x), "r+b") as f:
            f.seek(400)
            b = f.read(1)
            f.seek(400)
            f.write(bytes([b[0] ^ 0x5A]))
    c.ledger.note("flipped a byte of node 1's parity fragments %s" % frs)
    rs_lose(c, [3])
    pos = {r: c.nodes[r].log_size() for r in range(c.n)}
    got = c.job_restart(allow_failed=False)
    if set(got.values()) != {20}:
        raise CellFail("restored %s, expected step 20" % got)
    rs_logged_rebuilt(c, [3], 20, pos)
    m = re.search(r"from erasure code rs:2\+2: \d+ fragments fetched, (\d+) passed over",
                  c.nodes[3].log_from(pos[3]))
    if not m or int(m.group(1)) < 1:
        raise CellFail("node 3's log does not count a corrupt fragment passed over")


@cell("encoding (rs)", "kill9-wipe")
def c_rs_lost_encoding(c):
    """Node 3 commits step 30 and sends its manifest, then is killed -9
    and wiped before the others commit (its data fragments never go out);
    nodes 0-2 commit 30 and send theirs. 30 is never protected; 20's parity
    is kept and the job restores 20, node 3's shard rebuilt from the code."""
    c.start()
    c.fresh()
    c.save(30, ranks=[3], confirm=False)
    deadline_wait(lambda: all(os.path.exists(os.path.join(c.rs_dir(r, 30), "m3.mf"))
                              for r in range(3)), 30, "node 3's manifest of step 30 everywhere")
    c.kill(3, wipe=True)
    c.save(30, ranks=[0, 1, 2], confirm=False)
    c.confirm(30, ranks=[0, 1, 2])
    deadline_wait(lambda: all(re.search(r"ec: job=%s step=30 sent" % c.job,
                                        c.nodes[r].log_text()) for r in range(3)),
                  60, "nodes 0-2 sent their fragments of step 30")
    for r in range(3):
        if not os.path.isdir(c.rs_dir(r, 20)):
            raise CellFail("node %d dropped step 20's parity while 30 is unprotected" % r)
    c.restart(3)
    pos = {r: c.nodes[r].log_size() for r in range(c.n)}
    got = c.job_restart(allow_failed=False)
    if set(got.values()) != {20}:
        raise CellFail("restored %s, expected step 20" % got)
    rs_logged_rebuilt(c, [3], 20, pos)


# per-cell cluster shapes
SHAPES = {
    "backing-up/disk-full": dict(tmpfs_bucket="4M"),
    "writing/ram-full": dict(size=512 * KiB),
    "restore/barrier/*": dict(n=4, k=1),
    "replicating/*": dict(ram_size="512M"),
    "restore/fetching/*": dict(ram_size="512M"),
    "protected (rs)/*": dict(n=4, redundancy="rs:2+2"),
    "protected (rs)/kill9-wipe-M+1-nobackup": dict(n=4, redundancy="rs:2+2", backups=False),
    "encoding (rs)/*": dict(n=4, redundancy="rs:2+2"),
}
FAULT_COLUMNS = FAULTS[:2] + ["kill9-wipe-2"] + FAULTS[2:] + [
    "corrupt-bucket", "bucket-corrupt-transient", "kill9-wipe-M", "kill9-wipe-M+1",
    "kill9-wipe-M+1-nobackup"]


def shape_of(c):
    kw = {}
    for k, v in SHAPES.items():
        if k.endswith("/*") and c.phase == k[:-2] or k == c.name:
            kw.update(v)
    return kw


# .. after restart (issue 22): node 0 commits step 30 while nodes 1 and 2
# are stopped (SIGSTOP: neither its replica push nor its manifest gets past
# the handshake) and is killed -9 (RAMDIR kept); nodes 1 and 2 commit 30;
# node 0 comes back and the job restores 30 from RAM, node 0's shard of it
# held only by node 0 (replication) / no parity of 30 anywhere (rs). Right
# after that restart one node is killed -9 and wiped: the job must restore
# 30 (if it was protected again in time) or 20, never lose both. No bucket,
# so the cluster's copies are all there is. Self-contained: its phases,
# shapes and columns are added here.

def restart_unprotected(c, rs):
    c.start()
    c.fresh()
    stopped = [1, 2]
    for r in stopped:
        os.kill(c.nodes[r].proc.pid, signal.SIGSTOP)
    try:
        c.save(30, ranks=[0], confirm=False)
        harness.wait_committed(c.nodes[0].ramdir, 30, job=c.job, rank=0, timeout=30)
        c.ledger.saw(0, 30, 0)
        if rs:
            deadline_wait(lambda: os.path.exists(os.path.join(c.rs_dir(0, 30), "m0.mf")),
                          30, "node 0's manifest of step 30 written")
        c.kill(0)
    finally:
        for r in stopped:
            os.kill(c.nodes[r].proc.pid, signal.SIGCONT)
    if rs:
        # as if the kill came before the manifest was written
        shutil.rmtree(c.rs_dir(0, 30), ignore_errors=True)
        c.ledger.note("node 0's parity holding of %s/30 removed (killed before its manifest)" % c.job)
    c.save(30, ranks=[1, 2], confirm=False)
    c.confirm(30, ranks=[1, 2])
    c.restart(0)
    got = c.job_restart(allow_failed=False, label="restart on the unprotected step")
    if set(got.values()) != {30}:
        raise CellFail("restart restored %s, expected step 30 from RAM" % got)


def after_restart_lose(c, victim, rs):
    c.kill(victim, wipe=True)
    # the coordinator (node 0, restarted since 30's commit) logs this only
    # once every node protected 30 again: I1's expectation must know it
    if rs and re.search(r"coord: job %s: step 30 is committed and replicated on all"
                        % c.job, c.nodes[0].log_text()):
        c.rs_protected.add(30)
    c.restart(victim)
    got = c.job_restart(allow_failed=False, label="node %d lost after the restart" % victim)
    if set(got.values()) - {20, 30}:
        raise CellFail("node %d lost right after the restart: restored %s; step 20 must "
                       "stay until 30 is protected again" % (victim, got))
    c.notes.append("restored %s" % sorted(set(got.values())))


@cell("after restart", "kill9-wipe", backends=("file",), ci=("file",))
def c_after_restart_repl(c):
    """Replication: node 0 (whose step 30 no peer holds) is lost right
    after the restart that restored 30."""
    restart_unprotected(c, rs=False)
    after_restart_lose(c, 0, rs=False)


@cell("after restart (rs)", "kill9-wipe", backends=("file",), ci=("file",))
def c_after_restart_rs(c):
    """rs:2+1 on 3 nodes: node 1 is lost right after the restart that
    restored 30, of which no parity existed."""
    restart_unprotected(c, rs=True)
    after_restart_lose(c, 1, rs=True)


PHASES += ["after restart", "after restart (rs)"]
SHAPES["after restart/*"] = dict(backups=False)
SHAPES["after restart (rs)/*"] = dict(n=3, redundancy="rs:2+1", backups=False)




# .. ranks permuted (issue 22), under replication and rs:2+2 (one group of
# the 4 nodes: step 30 protected, the lost shard rebuilt from the code):
# 4 nodes that learn their rank from each
# replicator.yaml (coordinator=, no peers= table), as JobSet reschedules
# hand ranks out; steps 10 and 20 saved; the job restarts with the ranks
# rotated (or the slices swapped: 0<->1, 2<->3) and saves step 30, which
# must be replicated to each rank's peer *now* (k=1: r^1); then one node is
# killed -9 and wiped and the job restarts: step 30 everywhere. With a rank
# -> address table kept from the first replication, step 30's replicas
# went to the machines that held the peer ranks before (or to the pushers
# themselves) and the lost node's shard of 30 existed nowhere else.
# The driver re-indexes its nodes so that index = rank after the
# permutation (the ledger, yaml(), verify() stay by rank); Net's cut/slow
# follow the original index, so these cells cut no link.

PHASES.extend(["ranks permuted", "ranks permuted (rs)"])
FAULT_COLUMNS.extend(["rotated+kill9-wipe", "swapped+kill9-wipe"])
SHAPES["ranks permuted/*"] = dict(n=4, k=1)
SHAPES["ranks permuted (rs)/*"] = dict(n=4, k=1, redundancy="rs:2+2")


def registered(c):
    """Before the start: every node knows only the coordinator's address
    (node 0's), so its rank is the yaml's."""
    table = "peers=" + ",".join(c.addrs)
    for d in c.nodes:
        if table not in d.opts:
            raise CellFail("cannot make node %s a registered node: %s" % (d.name, d.opts))
        d.opts = d.opts.replace(table, "coordinator=" + c.addrs[0])


def permute_ranks(c, new_rank):
    """The node at index i takes rank new_rank[i] at the next job restart:
    the driver's nodes are re-indexed to match, with what it knows of
    them (holders seen, running, kills, wipes)."""
    old = list(c.nodes)
    for i, r in enumerate(new_rank):
        c.nodes[r] = old[i]
    c.running = {new_rank[i] for i in c.running}
    c.gen = {new_rank[i]: g for i, g in c.gen.items()}
    c.wiped_nodes = {new_rank[i] for i in c.wiped_nodes}
    for k, v in c.ledger.sure.items():
        c.ledger.sure[k] = {new_rank[h] for h in v}
    c.ledger.note("ranks permuted: node at index i is now rank %s[i]" % (new_rank,))


def ranks_permuted_cell(c, fault):
    """Replication: step 30 on each rank's new peer, and restored after
    the loss from that peer. rs (c.rs): step 30 protected on every node,
    the lost node's shard rebuilt from the code."""
    perm = [1, 2, 3, 0] if fault.startswith("rotated") else [1, 0, 3, 2]
    registered(c)
    c.start()
    c.fresh()
    permute_ranks(c, perm)
    got = c.job_restart(allow_failed=False, label="restart with ranks %s" % perm)
    if set(got.values()) != {20}:
        raise CellFail("the permuted restart restored %s, expected step 20" % got)
    c.save(30, confirm=False)
    c.confirm(30, backup=False)
    c.wait_backup(30, node=perm[0])   # the coordinator's machine logs it
    for o in range(c.n):
        if c.rs:
            break
        held = {h for h in range(c.n)
                if c.cl().holds(h, c.job).get((o, 30)) in harness.COMMITTED_STATES}
        if held != {o, o ^ 1}:
            raise CellFail("rank %d's step 30 is held on ranks %s, expected %s (its peer "
                           "under the new ranks)" % (o, sorted(held), sorted({o, o ^ 1})))
    # not the coordinator's machine (node 0 before the permutation)
    victim = next(r for r in (2, 3) if r != perm[0])
    c.kill(victim, wipe=True)
    c.restart(victim)
    pos = {r: c.nodes[r].log_size() for r in range(c.n)}
    got = c.job_restart(allow_failed=False, label="restart after node %d was lost" % victim)
    if set(got.values()) != {30}:
        raise CellFail("restored %s after node %d was lost, expected step 30" % (got, victim))
    if c.rs:
        rs_logged_rebuilt(c, [victim], 30, pos)


fault_cells("ranks permuted", ranks_permuted_cell, {
    "rotated+kill9-wipe": {}, "swapped+kill9-wipe": {}})
fault_cells("ranks permuted (rs)", ranks_permuted_cell, {
    "rotated+kill9-wipe": {}, "swapped+kill9-wipe": {}})

# --- the driver ----------------------------------------------------------------------

class Driver:
    def __init__(self, args):
        self.args = args
        self.keep = args.keep
        self.net = Net(use_netns=not args.no_netns)
        self._gcs = None
        self.seq = 0
        self.results = []

    def gcs(self):
        if self._gcs is None:
            self._gcs = GcsServer(host=self.net.host_ip)
        return self._gcs

    def close(self):
        if self._gcs is not None:
            self._gcs.stop()
        self.net.close()

    def run_cell(self, cell, backend):
        rec = {"cell": cell.name, "phase": cell.phase, "fault": cell.fault, "backend": backend}
        if cell.skip:
            rec.update(result="SKIP", reason=cell.skip, secs=0)
            return rec
        self.seq += 1
        t0 = time.monotonic()
        c = None

        def on_alarm(signum, frame):
            raise CellTimeout()
        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(cell.limit)
        try:
            c = Ctx(self, cell.name, backend, **shape_of(cell))
            cell.fn(c)
            rec.update(result="PASS")
        except Skip as e:
            rec.update(result="SKIP", reason=str(e))
        except CellTimeout:
            rec.update(result="FAIL", reason="I5 no hang: the cell did not finish within its "
                       "%d s deadline" % cell.limit)
        except CellFail as e:
            rec.update(result="FAIL", reason=str(e))
        except Exception as e:
            rec.update(result="FAIL", reason="%s: %s" % (type(e).__name__, e),
                       trace=traceback.format_exc()[-3000:])
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        if c is not None:
            try:
                errs = c.close()
            except CellTimeout:
                errs = ["cleanup timed out"]
            except Exception as e:
                errs = ["cleanup: %s" % e]
            sani = [e for e in errs if re.search(r"Sanitizer|runtime error", e)]
            if sani and rec["result"] != "FAIL":
                rec.update(result="FAIL", reason="sanitizer report: %s" % sani[0][:2000])
            elif errs:
                rec.setdefault("cleanup", errs)
            rec["notes"] = c.notes
            rec["checks"] = c.checks
            rec["events"] = c.ledger.events
            if rec["result"] == "FAIL":
                rec["evidence"] = c.evidence()
        rec["secs"] = round(time.monotonic() - t0, 1)
        return rec

    def run_matrix(self, cells, backends):
        for cell in cells:
            if cell.na:
                continue
            for b in backends:
                if b not in cell.backends:
                    continue
                if self.args.ci and isinstance(cell.ci, tuple) and b not in cell.ci:
                    continue
                sys.stdout.write("  %-44s %-5s ... " % (cell.name, b))
                sys.stdout.flush()
                rec = self.run_cell(cell, b)
                self.results.append(rec)
                sys.stdout.write("%s (%.1f s)%s\n" % (
                    rec["result"], rec["secs"],
                    "" if rec["result"] == "PASS" else ": " + rec.get("reason", "")[:300]))
                sys.stdout.flush()


def print_matrix(results, backends, out=sys.stdout):
    by = {(r["cell"], r["backend"]): r for r in results}
    rows = []
    for ph in PHASES:
        for fa in FAULT_COLUMNS:
            cl = [c for c in CELLS if c.phase == ph and c.fault == fa]
            if not cl:
                continue
            c = cl[0]
            vals = []
            for b in backends:
                if c.na:
                    vals.append("n/a")
                elif b not in c.backends:
                    vals.append("-")
                else:
                    r = by.get((c.name, b))
                    vals.append("%s %4.0fs" % (r["result"], r["secs"]) if r else "")
            if any(v and v not in ("-",) for v in vals):
                rows.append((ph, fa, vals))
    w = max(len(p) for p, _, _ in rows) if rows else 10
    wf = max(len(f) for _, f, _ in rows) if rows else 10
    out.write("\n%-*s  %-*s  %s\n" % (w, "phase", wf, "fault",
                                      "  ".join("%-10s" % b for b in backends)))
    for ph, fa, vals in rows:
        out.write("%-*s  %-*s  %s\n" % (w, ph, wf, fa, "  ".join("%-10s" % v for v in vals)))
    n = {k: sum(1 for r in results if r["result"] == k) for k in ("PASS", "FAIL", "SKIP")}
    out.write("\n%d PASS, %d FAIL, %d SKIP\n" % (n["PASS"], n["FAIL"], n["SKIP"]))
    for r in results:
        if r["result"] in ("FAIL", "SKIP"):
            out.write("\n%s %s [%s]: %s\n" % (r["result"], r["cell"], r["backend"],
                                              r.get("reason", "")))
            if r["result"] == "FAIL":
                for note in r.get("notes", []):
                    out.write("   note: %s\n" % note)
                for node, lines in sorted(r.get("evidence", {}).items()):
                    for ln in lines[-12:]:
                        out.write("   %s| %s\n" % (node, ln))
                if r.get("trace"):
                    out.write(r["trace"] + "\n")
    out.flush()


# --- the RAM tier's own account (issue 13), checked by the soak ---------------------

SERVING_LINE = re.compile(r"serving ramdir=\S+ mount=\S+ ram_size=\d+ used=(\d+)")


def catalog_dirs(ramdir):
    """{'JOB/STEP/nR-wW'} of the shards RAMDIR's catalog lists (any state)."""
    if not os.path.isdir(os.path.join(ramdir, "db")):
        return set()     # wiped: no catalog yet
    out = harness.admin("ls", ramdir, "--json")
    return {"%s/%d/n%d-w%d" % (sh["job"], sh["step"], sh["rank"], sh["worker"])
            for sh in json.loads(out).get("shards", [])}


def shard_dirs(ramdir):
    """{'JOB/STEP/NAME'} under RAMDIR/shards, staging names (".*") aside."""
    base, out = os.path.join(ramdir, "shards"), set()
    if not os.path.isdir(base):
        return out
    for dp, dns, _ in os.walk(base):
        rel = os.path.relpath(dp, base)
        if rel.count("/") == 1:
            out.update("%s/%s" % (rel, n) for n in dns if not n.startswith("."))
            dns[:] = []
    return out


def tier_bytes(ramdir, dirs):
    """st_blocks*512 of the regular files of RAMDIR/ns and of RAMDIR/shards/D
    for D in dirs, every inode once: what a start-up recount must find."""
    seen, total = set(), 0
    roots = [os.path.join(ramdir, "ns")] + [os.path.join(ramdir, "shards", d) for d in dirs]
    for root in roots:
        for dp, _, fns in os.walk(root):
            for n in fns:
                try:
                    st = os.lstat(os.path.join(dp, n))
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
    return total


def tier_restart(c, r):
    """Restart node r (dead) and check the RAM tier's account: the start-up
    recount (logged) equals the bytes of the namespace and of the shards
    the catalog names, measured while the daemon was down, and every shard
    directory no record named then (a drop or publish cut short by the
    kill) is gone. Returns a problem string or None."""
    d = c.nodes[r]
    named = catalog_dirs(d.ramdir)
    orphans = shard_dirs(d.ramdir) - named
    stale = c.stage_dirs(r, live_only=False)
    want = tier_bytes(d.ramdir, named)
    pos = d.log_size()
    c.restart(r)
    try:
        m = deadline_wait(lambda: SERVING_LINE.search(d.log_from(pos)), 30,
                          "node %d's start-up line" % r)
    except AssertionError as e:
        return str(e)
    used = int(m.group(1))
    if used != want:
        return ("node %d: ram_used=%d after the restart, but the namespace and the %d "
                "shards in its catalog hold %d bytes" % (r, used, len(named), want))
    gone = [p for p in stale if os.path.isdir(p)]
    if gone:
        return "node %d: staging directories of a shard cut short survived the restart: %s" % (
            r, gone)
    left = {o for o in orphans if os.path.isdir(os.path.join(d.ramdir, "shards", o))}
    if left - catalog_dirs(d.ramdir):
        return "node %d: shard directories no catalog record names survived the restart: %s" % (
            r, sorted(left))
    return None


def verify_clean(c, timeout=30):
    """`mtcfs-admin verify` passes on every running node (a seal that a kill
    interrupted has been resumed; nothing bad). Problem string or None."""
    for r in sorted(c.running):
        last = {}

        def ok():
            p = subprocess.run([harness.MTCFS_ADMIN, "verify", c.nodes[r].ramdir],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=60)
            last["out"] = p.stdout.decode(errors="replace")
            return p.returncode == 0
        try:
            deadline_wait(ok, timeout, "verify clean on node %d" % r, interval=0.5)
        except AssertionError:
            return "node %d: mtcfs-admin verify fails: %s" % (r, last.get("out", "").strip()[-600:])
    return None


# --- soak ------------------------------------------------------------------------------

GC_LINE = re.compile(r"\bdropped (?:replica )?job=")


def soak_gc_kill(c, rnd, victims, wipes, step, size, cyc):
    """The victims die while GC drops the shards the new step makes
    obsolete: either the daemon kills itself right after a drop marked its
    record (MTCFS_TEST_CRASH=drop-marked, set by a clean restart before the
    save), or the driver kills it 0-30 ms after its first `dropped` line.
    Returns the mode used."""
    mode = rnd.choice(["hook", "log"])
    pos = {}
    for v in victims:
        d = c.nodes[v]
        if mode == "hook":
            d.stop()
            d.env["MTCFS_TEST_CRASH"] = "drop-marked"
            d.start()
        pos[v] = d.log_size()
    for r in range(c.n):
        try:
            c.write(r, step, size)
            c.commit(r, step)
        except OSError as e:
            c.notes.append("cycle %d node %d: %s" % (cyc + 1, r, e))
    delay = rnd.uniform(0, 0.03)
    for v in victims:
        d = c.nodes[v]
        try:
            if mode == "hook":
                deadline_wait(lambda: d.proc.poll() is not None, 30,
                              "node %d killing itself at a drop" % v, interval=0.01)
            else:
                deadline_wait(lambda: GC_LINE.search(d.log_from(pos[v])), 30,
                              "node %d's first GC drop" % v, interval=0.002)
                time.sleep(delay)       # the kill's offset after the drop: the fault
        except AssertionError as e:
            c.notes.append("cycle %d: %s: not reached, killed anyway" % (cyc + 1, e))
        d.env.pop("MTCFS_TEST_CRASH", None)
        c.kill(v, wipe=wipes[v])
    return mode


def holder_of(r):
    """The node holding r's replica under Ctx.yaml's peer-ranks (3 nodes)."""
    return 1 if r == 2 else r ^ 1


def soak_restore_kill(c, rnd, step, size, cyc, summary, out):
    """A restore is killed while it fetches: the step is saved and
    confirmed (replicated, backed up); then either one node comes back
    empty (it fetches its shard from its replica holder, over a slowed
    link when namespaces exist) or every node's RAM is lost (each fetches
    from the bucket); the job restarts and, once a fetcher's staging
    directory holds data (or after a random moment when none is seen), the
    fetcher itself or its source node is killed -9 (RAMDIR kept or wiped).
    The in-flight restore is checked (it may fail; what is published must
    be right), the dead come back (ram_used and orphans checked), and the
    caller's job restart checks the next restore. Returns a description."""
    for r in range(c.n):
        c.write(r, step, size)
        c.commit(r, step)
    c.confirm(step)
    src = rnd.choice(["peer", "peer", "bucket"]) if c.backups else "peer"
    if src == "peer":
        f = rnd.randrange(c.n)
        c.kill(f, wipe=True)
        why = tier_restart(c, f)
        if why:
            summary["tier_problems"].append("cycle %d: %s" % (cyc + 1, why))
        target = rnd.choice(["fetcher", "source"])
        victim = f if target == "fetcher" else holder_of(f)
        summary["kills"] += 1
        summary["wipes"] += 1
    else:
        summary["all_ram_lost"] += 1
        c.lose_all_ram()
        f = rnd.randrange(c.n)
        target = rnd.choice(["fetcher", "other fetcher"])
        victim = f if target == "fetcher" else rnd.choice([r for r in range(c.n) if r != f])
    wipe = rnd.random() < 0.5
    min_bytes = rnd.choice([1, 16 * KiB, 256 * KiB])
    slowed = src == "peer" and c.net.mode == "netns"
    if slowed:
        c.net.slow(f, rnd.choice([8, 24]))
    live = sorted(c.running)
    pre = {"copies": c.settle(live), "backups": c.scan_bucket(), "live": live,
           "gen": dict(c.gen)}
    res = {}
    deadline = time.monotonic() + 2 * c.restore_timeout + 30
    ts = [threading.Thread(target=c._node_attempt, args=(r, res, deadline), daemon=True)
          for r in live]
    for t in ts:
        t.start()
    seen = True
    try:
        c.wait_stage(f, timeout=15, min_bytes=min_bytes)
    except AssertionError:
        seen = False
        c.notes.append("cycle %d: node %d's fetch staging never seen (>= %d bytes)" % (
            cyc + 1, f, min_bytes))
        time.sleep(rnd.uniform(0, 0.2))     # a random kill time: the soak's point
    c.kill(victim, wipe=wipe)
    summary["kills"] += 1
    summary["wipes"] += int(wipe)
    summary.setdefault("restore_kills", {"staged": 0, "blind": 0, "cut_mid_shard": 0})
    summary["restore_kills"]["staged" if seen else "blind"] += 1
    # a staging directory the killed fetcher left: the kill cut a shard
    # in half (tier_restart checks that the restart removes it)
    if victim == f and not wipe and c.stage_dirs(f, live_only=False):
        summary["restore_kills"]["cut_mid_shard"] += 1
    planning_finish(c, ts)
    if slowed:
        c.net.heal(f)
    inflight_check(c, res, pre, label="cycle %d in-flight restore" % (cyc + 1))
    inflight = {r: v[0] if v[0] != "ok" else sorted(v[2]) for r, v in sorted(res.items())}
    why = tier_restart(c, victim)
    if why:
        summary["tier_problems"].append("cycle %d: %s" % (cyc + 1, why))
        out.write("  soak cycle %3d: RAM TIER: %s\n" % (cyc + 1, why))
    return "%s fetch of node %d, killed the %s (node %d, %s%s); in flight: %s" % (
        src, f, target, victim, "wiped" if wipe else "kept",
        "" if seen else ", stage not seen", inflight)


SOAK_MOMENTS = ("writing", "commit", "after", "gc", "restore")


def soak(drv, cycles, seed, backend, out=sys.stdout, big=2 * MiB, moments=None):
    """N cycles of: save a step on every node while random kills hit (kill -9
    with the RAMDIR kept or wiped; sometimes every node's RAM) -> restart the
    dead -> job restart (restore) -> verify against the disk truth and the
    ledger. The kills hit while writing, right after the commit rename,
    0-400 ms after every commit, during GC's drops, or during a restore's
    fetch. With `moments` (a list), cycle i kills at moments[i % len]
    instead of a random moment (CI: every new moment in 3 cycles). Returns
    the summary."""
    rnd = random.Random(seed)
    summary = {"cycles": 0, "seed": seed, "backend": backend,
               "restores": {"local": 0, "peer": 0, "bucket": 0, "nothing": 0, "?": 0},
               "restored_steps": [], "bad": [], "kills": 0, "wipes": 0, "all_ram_lost": 0,
               "failed_attempts": 0, "secs": 0, "tier_problems": [], "big": big}
    t0 = time.monotonic()
    ram = "%dM" % max(256, (big * 8) // MiB)

    def new_ctx():
        return Ctx(drv, "soak", backend, n=3, k=1, size=48 * KiB, restore_timeout=6,
                   ram_size=ram)
    c = new_ctx()
    try:
        c.start()
        c.fresh(steps=(10,))
        step = 10
        for cyc in range(cycles):
            step += 10
            victims = rnd.sample(range(c.n), rnd.choice([1, 1, 1, 2]))
            wipes = {v: rnd.random() < 0.5 for v in victims}
            when = rnd.choice(["writing", "commit", "after", "after", "gc", "restore"])
            if moments:
                when = moments[cyc % len(moments)]
            all_ram = rnd.random() < 0.12
            size = rnd.choice([48 * KiB, 48 * KiB, big])
            detail = ""
            if when == "restore":
                # the kills of this cycle hit the restore (see soak_restore_kill)
                victims, wipes, all_ram = [], {}, False
                # at least 24 MiB: a smaller shard arrives whole between two polls
                size = rnd.choice([BIG, max(BIG, big)])
                try:
                    detail = " (%s)" % soak_restore_kill(c, rnd, step, size, cyc, summary, out)
                except (CellFail, AssertionError, OSError) as e:
                    victims = [-1]
                    detail = " (in-flight restore: %s)" % e
                    summary["bad"].append({"cycle": cyc + 1, "step": step, "when": when,
                                           "why": str(e), "evidence": c.evidence(15)})
                    out.write("  soak cycle %3d: BAD RESTORE: %s\n" % (cyc + 1, e))
            elif when == "gc":
                detail = " (%s)" % soak_gc_kill(c, rnd, victims, wipes, step, size, cyc)
            # the job saves the step on every node; the victims die while
            # writing it (files written, no commit), right after their
            # commit rename, or 0-400 ms after every commit (sealing,
            # commit reports, replication and backups in flight)
            for r in range(c.n) if when not in ("gc", "restore") else ():
                try:
                    c.write(r, step, size)
                    if when == "writing" and r in victims:
                        c.kill(r, wipe=wipes[r])
                        continue
                    c.commit(r, step)
                    if when == "commit" and r in victims:
                        c.kill(r, wipe=wipes[r])
                except OSError as e:
                    c.notes.append("cycle %d node %d: %s" % (cyc + 1, r, e))
            if when == "after":
                time.sleep(rnd.uniform(0, 0.4))     # a random kill time: the soak's point
                for v in victims:
                    c.kill(v, wipe=wipes[v])
            if victims == [-1]:
                victims = []
                c.close()
                c = new_ctx()
                c.start()
                c.fresh(steps=(10,))
                step = 10
            summary["kills"] += len(victims)
            summary["wipes"] += sum(wipes.values())
            summary.setdefault("kill_phases", {}).setdefault(when, 0)
            summary["kill_phases"][when] += 1
            for v in victims:
                why = tier_restart(c, v)
                if why:
                    summary["tier_problems"].append("cycle %d: %s" % (cyc + 1, why))
                    out.write("  soak cycle %3d: RAM TIER: %s\n" % (cyc + 1, why))
            if all_ram:
                summary["all_ram_lost"] += 1
                time.sleep(rnd.uniform(0, 1.0))   # let some backup finish
                c.lose_all_ram()
            try:
                got = c.job_restart(allow_failed=True, label="cycle %d" % (cyc + 1))
                chk = c.checks[-1]
                summary["failed_attempts"] += chk["attempts"] - 1
                for r, src in chk["sources"].items():
                    summary["restores"][src if src in summary["restores"] else "?"] += 1
                summary["restored_steps"].append(got[0])
                why = verify_clean(c)
                if why:
                    summary["tier_problems"].append("cycle %d: %s" % (cyc + 1, why))
                    out.write("  soak cycle %3d: VERIFY: %s\n" % (cyc + 1, why))
                out.write("  soak cycle %3d: step %d, killed at %s %s%s%s -> restored %d (%s)\n" % (
                    cyc + 1, step, when, {v: "wiped" if wipes[v] else "kept" for v in victims},
                    detail, ", all RAM lost" if all_ram else "", got[0],
                    ",".join(chk["sources"][str(r)] for r in range(c.n))))
                if when == "restore" or os.environ.get("MTCFS_SOAK_VERBOSE"):
                    out.write("                  expected %s; backups (name, step, exact): %s\n" % (
                        chk.get("expected"), chk.get("backups")))
            except (CellFail, AssertionError, OSError) as e:
                summary["bad"].append({"cycle": cyc + 1, "step": step, "victims": victims,
                                       "when": when,
                                       "wipes": wipes, "all_ram": all_ram, "why": str(e),
                                       "evidence": c.evidence(15)})
                out.write("  soak cycle %3d: BAD RESTORE: %s\n" % (cyc + 1, e))
                # start over from a clean cluster
                c.close()
                c = new_ctx()
                c.start()
                c.fresh(steps=(10,))
                step = 10
            out.flush()
            summary["cycles"] += 1
            # keep the ledger's sure copies honest: the restored step's
            # copies are seen again by the next observe_catalogs()
            c.ledger.sure = {}
            c.observe_catalogs()
    finally:
        errs = c.close()
        sani = [e for e in errs if re.search(r"Sanitizer|runtime error", e)]
        if sani:
            summary["bad"].append({"cycle": None, "why": "sanitizer: %s" % sani[0][:2000]})
    summary["secs"] = round(time.monotonic() - t0, 1)
    return summary


# --- main ----------------------------------------------------------------------------------

def parse_size(txt):
    m = re.fullmatch(r"(\d+)([KMG]?)", txt.strip().upper())
    if not m:
        raise SystemExit("bad size %r (e.g. 2M, 700M, 1G)" % txt)
    return int(m.group(1)) * {"": 1, "K": KiB, "M": MiB, "G": 1024 * MiB}[m.group(2)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", help="regex on 'phase/fault' of the cells to run")
    ap.add_argument("--backends", default="file,gs")
    ap.add_argument("--ci", action="store_true", help="only the cells marked for CI")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--no-matrix", action="store_true", help="soak only")
    ap.add_argument("--soak", action="store_true")
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--soak-backend", default="file")
    ap.add_argument("--soak-moments",
                    help="comma list of kill moments the soak's cycles take in turn "
                         "(%s; default: random)" % ",".join(SOAK_MOMENTS))
    ap.add_argument("--soak-big", default="2M",
                    help="per-node size of the soak's big steps (K/M/G suffix; above 32M a "
                         "step is many 1 MiB files)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--build", help="build directory with mtcfs and mtcfs-admin")
    ap.add_argument("--no-netns", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep temporary directories")
    args = ap.parse_args()

    if args.build:
        os.environ["MTCFS_BIN"] = os.path.join(args.build, "mtcfs")
        os.environ["MTCFS_ADMIN"] = os.path.join(args.build, "mtcfs-admin")
        os.environ["MTCFS_BUILD"] = args.build
    if args.keep:
        os.environ["MTCFS_KEEP_TMP"] = "1"
    global harness, clmod
    import harness as h
    import cluster as cm
    harness, clmod = h, cm
    os.umask(0o022)

    backends = [b for b in args.backends.split(",") if b]
    cells = [c for c in CELLS if (not args.ci or c.ci or c.na)]
    if args.cells:
        rx = re.compile(args.cells)
        cells = [c for c in cells if rx.search(c.name)]
    if args.list:
        for c in CELLS:
            print("%-48s %s%s" % (c.name, "n/a: " + c.na if c.na else
                                  "SKIP: " + c.skip if c.skip else ",".join(c.backends),
                                  " [ci]" if c.ci else ""))
        return 0
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        sys.stdout.write("matrix.py needs root and /dev/fuse\n")
        return 2
    t0 = time.monotonic()
    drv = Driver(args)

    def on_signal(signum, frame):
        # unmount and reap the daemons, remove the namespaces, then leave
        signal.signal(signum, signal.SIG_IGN)
        sys.stderr.write("matrix.py: signal %d: cleaning up\n" % signum)
        try:
            harness._cleanup_all()
        finally:
            drv.close()
            os._exit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    out = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "net": drv.net.mode, "net_note": drv.net.why_not if drv.net.mode != "netns" else "",
           "mtcfs": harness.MTCFS_BIN, "cells": [], "soak": None}
    sys.stdout.write("mtcfs fault matrix: %s, network: %s%s\n" % (
        harness.MTCFS_BIN, drv.net.mode,
        "" if drv.net.mode == "netns" else " (%s; cut-link cells skip)" % drv.net.why_not))
    rc = 0
    try:
        if not args.no_matrix:
            drv.run_matrix(cells, backends)
            out["cells"] = drv.results
            print_matrix(drv.results, backends)
            if any(r["result"] == "FAIL" for r in drv.results):
                rc = 1
        if args.soak:
            seed = args.seed if args.seed is not None else random.randrange(1 << 30)
            sys.stdout.write("\nsoak: %d cycles, seed %d, %s bucket\n" % (
                args.cycles, seed, args.soak_backend))
            moments = [m for m in (args.soak_moments or "").split(",") if m]
            if any(m not in SOAK_MOMENTS for m in moments):
                raise SystemExit("--soak-moments: one of %s" % ",".join(SOAK_MOMENTS))
            s = soak(drv, args.cycles, seed, args.soak_backend, big=parse_size(args.soak_big),
                     moments=moments)
            out["soak"] = s
            sys.stdout.write("soak summary: %d cycles in %.0f s; restores by source "
                             "(node-restores): %s; %d kills (%d wiped), %d with all RAM lost, "
                             "%d failed restore attempts retried; bad restores: %d\n" % (
                                 s["cycles"], s["secs"], s["restores"], s["kills"], s["wipes"],
                                 s["all_ram_lost"], s["failed_attempts"], len(s["bad"])))
            sys.stdout.write("  kill moments (cycles): %s; restore kills: %s\n" % (
                s.get("kill_phases", {}), s.get("restore_kills", {})))
            for b in s["bad"]:
                sys.stdout.write("  BAD cycle %s: %s\n" % (b.get("cycle"), b["why"]))
            for t in s["tier_problems"]:
                sys.stdout.write("  RAM TIER %s\n" % t)
            if s["bad"] or s["tier_problems"]:
                rc = 1
    finally:
        drv.close()
        out["secs"] = round(time.monotonic() - t0, 1)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
    sys.stdout.write("total %.0f s\n" % (time.monotonic() - t0))
    return rc


if __name__ == "__main__":
    sys.exit(main())
