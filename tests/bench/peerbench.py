#!/usr/bin/python3
"""tests/bench/peerbench.py: the peer-tier benchmarks of issue 4, one command.

Every number is measured side by side with its baseline in the same run,
over several repetitions; rows give min/median/max and the ratio of the
medians, next to the goal (the row format of tests/bench/run).

  1. Time to redundancy. A 2-node cluster of real mtcfs processes on
     loopback (static peers= table, shared secret, each RAMDIR a private
     tmpfs). Node 1 (the writer) writes a shard of 4 files through its mount
     into <S>.orbax-checkpoint-tmp-1 and renames it to <S>; the clock runs
     from that rename until node 0's daemon logs "replica job=.. step=S
     node=1 .. bytes=.." (written once every CRC32C matched and the replica
     is published; the log is polled every millisecond), and node 0's
     catalog is then checked to show it. Baseline: mtcfs-tcpbase copying
     the same number of bytes (the same 4-file layout) over one loopback
     TCP connection from a tmpfs file into a tmpfs file (sendfile -> recv +
     write, and sendfile -> splice; the faster of the two by median is the
     baseline). Goal >= 0.75x. Also the CPU seconds per GiB of both
     daemons (utime+stime from /proc, the seal worker's thread excluded)
     against mtcfs-tcpbase's own.
  1b. Time to redundancy over mutual TLS (--only redundancy-tls). The
     measurement of 1 on a second 2-node cluster whose daemons also have
     tls_cert=, tls_key=, tls_ca= (TLS 1.3, each side presents its
     certificate; the shared secret is still proven, inside TLS; file bytes
     are encrypted in user space, no sendfile). The certificates are made
     in the run's temp dir with the openssl CLI: an EC P-256 CA
     (basicConstraints CA:true), one leaf per node signed by it
     (extendedKeyUsage serverAuth, clientAuth); both daemons must log "peer
     traffic runs over mutual TLS". In each repetition its round takes the
     next place among 1's and the raw-TCP round (6 repetitions go through
     all 6 orders); its ratio is against the same raw-TCP samples as 1, and
     the note gives the TLS / plain time. No goal (report only). CPU
     seconds per GiB as in 1. The TLS cluster is stopped before 2.
  2. Restore from a peer into an empty RAMDIR. kill -9 node 1, a fresh
     empty tmpfs as its RAMDIR, restart; node 0 writes replicator.yaml,
     then (clock starts) node 1 writes it; the clock stops when node 1's
     daemon logs "restore job=.. source=peer" (its .restore markers are
     published). Reading the data back is not included. Same baseline.
     Goal >= 0.75x. CPU seconds per GiB as in 1.
  3. The application's write throughput into the mount while its previous
     step replicates to the peer (node 1 writes step A, renames it, and at
     once writes step B: B's write is timed) against the same write on a
     single node without peers (replication off). Ratio only.
  4. Coordinator scale. One real mtcfs rank-0 daemon (listen= and
     coordinator= its own address, rank=0) plus mtcfs-coordload playing
     ranks 1..N-1 over the real protocol (one authenticated control
     connection each, one epoll loop): register, then per round a catalog
     each (steps 100 and 200 of itself and of its XOR-1 neighbour, step 200
     of rank N-1 held nowhere) while rank 0's application writes
     replicator.yaml (nodes: N); time from the last catalog written to the
     last plan entry received (all N-1), then from the last "ready" to the
     last "go" (the barrier); the daemon's peak RSS (VmHWM). N = 256, 1024, 4096,
     16384 (quick: 256, 1024). Targets: plan <= 2 s at 4096 and 16384, barrier <= 1 s at 16384.

  tests/bench/peerbench.py            quick mode (about 2 minutes on 2 cores)
  tests/bench/peerbench.py --full     1 GiB shards, N up to 16384, more repetitions
  tests/bench/peerbench.py --only redundancy,redundancy-tls,restore,write,coord
  tests/bench/peerbench.py --build-dir DIR | --no-build [--mtcfs X --admin Y]
  tests/bench/peerbench.py --shard-mib 4096 --warmup 0 --reps 1 --only redundancy,restore
                                      one large shard (each node then holds one step)
  tests/bench/peerbench.py --prefault touch a shard's worth of memory before every timed
                                      round (VMs whose host maps guest memory lazily)
  tests/bench/peerbench.py --check    exit 1 when a goal is missed

tests/bench/run calls this script for its "peer" and "coord" sections and
for the shard-size sweep, and merges peer.json into its own table.

Writes OUT/peer.json and OUT/peer.md (OUT: tests/bench/out by default) and
the daemon logs OUT/peer-*.log; prints the Markdown table. Exit status 0,
1 (--check and a goal missed) or 2 (the benchmark itself failed).

Needs root (mount, /proc/sys), /dev/fuse, fusermount3; the openssl CLI for
redundancy-tls. Standard library only.
Loopback only. Whatever it mounts or starts is unmounted and reaped on every
way out (finally, atexit, SIGINT/SIGTERM/SIGHUP); fs.pipe-max-size is set to
4 MiB for the run and restored; the secret and the certificates live in the
run's temp dir, removed with it.
"""

import argparse
import datetime
import json
import os
import platform
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402  (what run and peerbench.py share)
from benchlib import (  # noqa: E402,F401
    GiB, MiB, KiB, BenchError, LogTail, children_cpu_s, cpu_busy_s, forget, forget_calls,
    free_ports, human_size, log, log_epoch, mem_available, mount_fstype, mounts_below,
    on_cleanup, own_cpu_s,
    proc_cpu_s, proc_status_kib, quiet, read_sysctl, run_cleanup, stats, wait_until,
    write_sysctl)
PIPE_MAX = "/proc/sys/fs/pipe-max-size"
PIPE_WANT = 4 * 1024 * 1024
COMMITTED_STATES = ("committed", "replicated", "backed-up")
PARTS = ("redundancy", "redundancy-tls", "restore", "write", "coord")
JOB = "peerbench"

benchlib.setup("peerbench")


# --- small helpers -----------------------------------------------------------------

def fmt_num(v, unit):
    if v is None:
        return "–"
    if unit in ("files/s",):
        return "{:,.0f}".format(v)
    if unit in ("ms", "s"):
        return "%.3f" % v if v < 10 else "%.1f" % v
    if unit == "MiB":
        return "%.0f" % v if v >= 100 else "%.1f" % v
    return "%.2f" % v


def thread_cpu_s(pid, comm):
    """utime + stime of the live threads of pid named comm (e.g. the
    daemon's seal worker "mtcfs-seal"), in seconds."""
    tot = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        if head.split("(", 1)[1] == comm:
            v = tail.split()
            tot += int(v[11]) + int(v[12])
    return tot / os.sysconf("SC_CLK_TCK")


# --- the daemon --------------------------------------------------------------------

class Daemon(benchlib.Daemon):
    """benchlib's daemon (the tests' harness.Daemon), -d by default, its
    log OUT/peer-NAME-MODE.log."""

    def __init__(self, bench, ramdir, mnt, opts, name, debug=True):
        super().__init__(bench, ramdir, mnt, opts, name, os.path.join(
            bench.out_dir, "peer-%s-%s.log" % (name, bench.mode)), debug=debug)

    def wait_yaml_consumed(self, timeout=60):
        y = os.path.join(self.mnt, "replicator.yaml")
        failed = os.path.join(self.mnt, "replicator.failed")

        def gone():
            if os.path.exists(failed):
                with open(failed) as f:
                    raise BenchError("%s: replicator.failed: %s" % (self.name, f.read().strip()))
            return not os.path.exists(y)
        wait_until(gone, timeout, "replicator.yaml consumed on %s" % self.name,
                   interval=0.001, check=self.check_alive)


class LineReader:
    """Lines from a child's stdout with a timeout (no buffered reads)."""

    def __init__(self, proc):
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.buf = b""

    def readline(self, timeout, what):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError("timed out after %.0fs waiting for %s" % (timeout, what))
            r, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    raise BenchError("%s: the process exited (rc=%s)" % (what, self.proc.wait()))
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


# --- the benchmark context ---------------------------------------------------------

class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = not args.full
        self.mode = "full" if args.full else "quick"
        self.out_dir = os.path.abspath(args.out)
        os.makedirs(self.out_dir, exist_ok=True)
        self.build_dir = os.path.abspath(args.build_dir)
        self.mtcfs = args.mtcfs or os.path.join(self.build_dir, "mtcfs")
        self.admin = args.admin or os.path.join(self.build_dir, "mtcfs-admin")
        self.coordload = os.path.join(self.build_dir, "mtcfs-coordload")
        self.tcpbase = os.path.join(self.build_dir, "mtcfs-tcpbase")
        self.workdir = None
        self.rows = []
        self.notes = []
        self.daemons = []
        self._n = 0
        self.secret = None
        self.tls = None                   # [(cert, key, ca)] per node, by make_pki()
        self.max_leak = (None, 0, 0, 0)   # (tmpfs, bytes, used, held by the catalog)
        self.max_settle = 0.0             # longest wait for a dropped shard's pages

    def build(self):
        bins = [self.coordload, self.tcpbase, self.mtcfs, self.admin]
        if self.args.no_build:
            for b in bins:
                if not os.access(b, os.X_OK):
                    raise BenchError("%s missing (drop --no-build to build it)" % b)
            return
        if not os.path.exists(os.path.join(self.build_dir, "CMakeCache.txt")):
            log("configuring a Release build in %s" % self.build_dir)
            self._sh(["cmake", "-S", REPO, "-B", self.build_dir, "-DCMAKE_BUILD_TYPE=Release"])
        else:
            bt = ""
            with open(os.path.join(self.build_dir, "CMakeCache.txt")) as f:
                for line in f:
                    if line.startswith("CMAKE_BUILD_TYPE:"):
                        bt = line.split("=", 1)[1].strip()
            if bt != "Release":
                self.notes.append("build dir %s is CMAKE_BUILD_TYPE=%s, not Release: numbers "
                                  "are not comparable" % (self.build_dir, bt or "(none)"))
                log("WARNING: " + self.notes[-1])
        targets = ["mtcfs-coordload", "mtcfs-tcpbase"]
        if not self.args.mtcfs:
            targets.append("mtcfs")
        if not self.args.admin:
            targets.append("mtcfs-admin")
        log("building %s in %s" % (" ".join(targets), self.build_dir))
        self._sh(["cmake", "--build", self.build_dir, "-j2", "--target"] + targets)

    def _sh(self, argv):
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise BenchError("%s failed:\n%s" % (" ".join(argv),
                                                 r.stdout.decode(errors="replace")[-4000:]))

    def setup(self):
        if os.geteuid() != 0:
            raise BenchError("needs root (tmpfs mounts, /proc/sys)")
        self.workdir = tempfile.mkdtemp(prefix="mtcfs-peerbench-", dir="/tmp")
        on_cleanup(self._rm_workdir)
        old = int(read_sysctl(PIPE_MAX))
        if old != PIPE_WANT:
            write_sysctl(PIPE_MAX, PIPE_WANT)
            on_cleanup(write_sysctl, PIPE_MAX, old)
            log("fs.pipe-max-size %d -> %d (restored at the end)" % (old, PIPE_WANT))
        self.secret = os.path.join(self.workdir, "secret")
        fd = os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, (os.urandom(24).hex() + "\n").encode())
        os.close(fd)

    def make_pki(self, nnodes=2):
        """Certificates for mutual TLS in the run's temp dir (removed with it),
        with the openssl CLI: an EC P-256 CA (basicConstraints CA:true), one
        leaf per node signed by it (serverAuth + clientAuth). Sets self.tls to
        [(cert, key, ca)] per node."""
        openssl = shutil.which("openssl")
        if not openssl:
            raise BenchError("redundancy-tls needs the openssl CLI (apt-get install openssl)")
        d = os.path.join(self.workdir, "pki")
        os.mkdir(d, 0o700)

        def ossl(*argv):
            r = subprocess.run([openssl] + list(argv), cwd=d, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
            if r.returncode != 0:
                raise BenchError("openssl %s: %s" % (argv[0], r.stdout.decode(
                    errors="replace").strip()[-500:]))
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        ca, ca_key = os.path.join(d, "ca.pem"), os.path.join(d, "ca.key")
        ossl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2",
             "-subj", "/CN=mtcfs-peerbench-ca",
             "-addext", "basicConstraints=critical,CA:true",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        ext = os.path.join(d, "leaf.ext")
        with open(ext, "w") as f:
            f.write("basicConstraints=critical,CA:false\n"
                    "keyUsage=critical,digitalSignature\n"
                    "extendedKeyUsage=serverAuth,clientAuth\n"
                    "subjectAltName=IP:127.0.0.1\n")
        self.tls = []
        for i in range(nnodes):
            key, csr, cert = (os.path.join(d, "node%d.%s" % (i, x)) for x in ("key", "csr", "pem"))
            ossl("req", "-new", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=node%d" % i)
            ossl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key,
                 "-set_serial", str(100 + i), "-days", "2", "-sha256", "-extfile", ext,
                 "-out", cert)
            self.tls.append((cert, key, ca))
        log("mutual TLS: EC P-256 CA and %d node certificates in %s" % (nnodes, d))

    def _rm_workdir(self):
        busy = mounts_below(self.workdir)
        if busy:
            log("not removing %s: still mounted: %s" % (self.workdir, busy))
            return
        shutil.rmtree(self.workdir, ignore_errors=True)

    def path(self, name):
        self._n += 1
        p = os.path.join(self.workdir, "%02d-%s" % (self._n, name))
        os.mkdir(p)
        return p

    def tmpfs(self, name, size, path=None):
        """A fresh private tmpfs (4K pages), unmounted at cleanup."""
        p = path or self.path(name)
        opts = "size=%d,mode=0755" % size
        r = quiet(["mount", "-t", "tmpfs", "-o", opts, "peerbench-" + name, p])
        if r.returncode != 0:
            raise BenchError("mount tmpfs %s (%s): %s" % (p, opts,
                                                          r.stdout.decode(errors="replace").strip()))
        on_cleanup(self._umount, p)
        return p

    def _umount(self, p):
        if mount_fstype(p) is None:
            return
        if quiet(["umount", p]).returncode != 0:
            quiet(["umount", "-l", p])

    def umount_tmpfs(self, p):
        forget_calls(self._umount, p)
        self._umount(p)

    def fresh_tmpfs(self, p, name, size):
        """Replace the tmpfs at p by an empty one (a wiped RAMDIR)."""
        self.umount_tmpfs(p)
        if mount_fstype(p) is not None:
            raise BenchError("cannot unmount %s" % p)
        return self.tmpfs(name, size, path=p)

    def daemon(self, ramdir, opts, name, debug=True):
        mnt = self.path(name + "-mnt")
        d = Daemon(self, ramdir, mnt, opts, name, debug=debug)
        if os.path.exists(d.log_path):
            os.unlink(d.log_path)
        d.start()
        self.daemons.append(d)
        return d

    def release_dropped(self, ramdirs):
        """After GC: wait (outside every timing) until each RAMDIR's tmpfs
        holds no more than the catalog says. The daemon frees a dropped
        shard's pages once the kernel forgets its FUSE inodes (it keeps an
        O_PATH descriptor per inode until FORGET), which follows the
        daemon's asynchronous invalidation within milliseconds (measured:
        5-80 ms). What is still unaccounted after 5 s is a leak and is
        reported."""
        for tmpfs_path, ramdir in ramdirs:
            t0 = time.monotonic()
            while True:
                st = os.statvfs(tmpfs_path)
                used = (st.f_blocks - st.f_bfree) * st.f_frsize
                held = sum(x.get("bytes") or 0 for x in self.admin_ls(ramdir))
                leak = used - held
                if leak <= 16 * MiB or time.monotonic() - t0 > 5:
                    break
                time.sleep(0.01)
            self.max_settle = max(self.max_settle, time.monotonic() - t0)
            if leak > self.max_leak[1]:
                self.max_leak = (tmpfs_path, leak, used, held)

    def admin_ls(self, ramdir, job=None):
        argv = [self.admin, "ls", ramdir, "--json"] + (["--job", job] if job else [])
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60)
        if r.returncode != 0:
            raise BenchError("mtcfs-admin ls %s: %s" % (ramdir,
                                                       r.stderr.decode(errors="replace").strip()))
        return json.loads(r.stdout.decode()).get("shards", [])

    def run_json(self, argv, timeout=600):
        r = subprocess.run([str(a) for a in argv], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        if r.returncode != 0:
            raise BenchError("%s: %s" % (" ".join(str(a) for a in argv),
                                         r.stderr.decode(errors="replace").strip()))
        return json.loads(r.stdout.decode())

    # -- rows (the format of tests/bench/run) --

    def ratio_row(self, rid, what, unit, base, subj, goal=None, higher_is_better=True,
                  config="", baseline_name="tmpfs", subject_name="mtcfs", note="",
                  goal_text=None):
        """goal: None or (kind, value), checked; goal_text without a goal: what
        the goal column says (nothing is checked)."""
        b, s = stats(base), stats(subj)
        ratio = s["median"] / b["median"] if higher_is_better else b["median"] / s["median"]
        met, gtext, gj = None, goal_text or "–", None
        if goal is not None:
            kind, val = goal
            if kind == "ratio>=":
                met = ratio >= val
                gtext = "≥ %.2f× %s" % (val, baseline_name)
            elif kind == "median<=":
                met = s["median"] <= val
                gtext = "< %s %s (median)" % (fmt_num(val, unit), unit)
            else:
                raise ValueError(kind)
            gj = {"kind": kind, "value": val, "text": gtext}
        row = {"section": "peer", "id": rid, "what": what, "config": config, "unit": unit,
               "higher_is_better": higher_is_better,
               "baseline": dict(b, name=baseline_name), "subject": dict(s, name=subject_name),
               "ratio": ratio, "goal": gj, "goal_text": gtext, "met": met, "note": note}
        self.rows.append(row)
        log("%-36s %s %s | %s %s | ratio %.3f%s" % (
            rid, baseline_name, fmt_num(b["median"], unit), subject_name,
            fmt_num(s["median"], unit), ratio,
            "" if met is None else (" OK" if met else " MISSED")))
        return row

    def value_row(self, rid, what, unit, subj, config="", note="", goal_max=None,
                  goal_text=None, subject_name="mtcfs", higher_is_better=False):
        """A row without baseline; goal_max: the median must be <= it."""
        s = stats(subj)
        met, gj, gtext = None, None, "–"
        if goal_max is not None:
            met = s["median"] <= goal_max
            gtext = goal_text or "≤ %s %s (median)" % (fmt_num(goal_max, unit), unit)
            gj = {"kind": "median<=", "value": goal_max, "text": gtext}
        row = {"section": "peer", "id": rid, "what": what, "config": config, "unit": unit,
               "higher_is_better": higher_is_better, "baseline": None,
               "subject": dict(s, name=subject_name), "ratio": None, "goal": gj,
               "goal_text": gtext, "met": met, "note": note}
        self.rows.append(row)
        log("%-36s %s %s %s%s" % (rid, subject_name, fmt_num(s["median"], unit), unit,
                                  "" if met is None else (" OK" if met else " MISSED")))
        return row


# --- shards as the application writes them -----------------------------------------

class Writer:
    """Writes a step's files through a mount like a checkpointing app: one
    file-sized buffer, 1 MiB write() calls. Every 1 MiB block starts with a
    stamp (step, file, block), so no two steps have the same content (the
    peer tier links identical content instead of sending it)."""

    def __init__(self, nfiles, fsize, block=MiB):
        self.nfiles = nfiles
        self.fsize = fsize
        self.block = block
        self.buf = bytearray(os.urandom(1 << 16)) * (fsize // (1 << 16))
        assert len(self.buf) == fsize
        self.mv = memoryview(self.buf)

    @property
    def total(self):
        return self.nfiles * self.fsize

    def write_dir(self, d, step):
        """Write the files into d (created); returns (secs, t_start_wall,
        t_end_wall)."""
        os.mkdir(d)
        w0 = time.time()
        t0 = time.monotonic()
        for i in range(self.nfiles):
            for off in range(0, self.fsize, self.block):
                self.buf[off:off + 32] = b"%016x%08x%08x" % (step, i, off // self.block)
            fd = os.open(os.path.join(d, "shard-%02d.bin" % i),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                off = 0
                while off < self.fsize:
                    off += os.write(fd, self.mv[off:off + self.block])
            finally:
                os.close(fd)
        secs = time.monotonic() - t0
        return secs, w0, time.time()


def tiny_step(mnt, step, rank):
    """A small committed step (node 0's part of a job step)."""
    tmp = os.path.join(mnt, "%d.orbax-checkpoint-tmp-%d" % (step, rank))
    os.mkdir(tmp)
    with open(os.path.join(tmp, "meta.json"), "wb") as f:
        f.write(b'{"step": %d, "rank": %d}' % (step, rank) + b" " * 4000)
    os.rename(tmp, os.path.join(mnt, str(step)))


def yaml_text(rank, nodes, peers_per_node, job=JOB):
    return ("job-name: %s\nframework: orbax\nnode-rank: %d\nnodes: %d\n"
            "peers-per-node: %d\nbackup-interval-minutes: 30\n"
            % (job, rank, nodes, peers_per_node))


def shard_of(shards, rank, step):
    for s in shards:
        if s.get("rank") == rank and s.get("step") == step and s.get("worker", 0) == 0:
            return s
    return None


# --- the 2-node cluster: benchmarks 1, 1b, 2, 3 ---------------------------------------

class Cluster:
    """2 nodes on loopback with the shared secret; tls: [(cert, key, ca)] per
    node adds mutual TLS (benchmark 1b; its daemons are named tls-node0/1)."""

    def __init__(self, bench, shard_bytes, tls=None):
        self.bench = bench
        self.tls = tls
        self.prefix = "tls-node" if tls else "node"
        self.ports = free_ports(2)
        self.addrs = ["127.0.0.1:%d" % p for p in self.ports]
        # RAMDIR room: up to 3 steps of the writer plus slack
        self.size = 4 * shard_bytes + 512 * MiB
        self.ram = [bench.tmpfs("%s%d-ram" % (self.prefix, i), self.size) for i in range(2)]
        self.nodes = [None, None]

    def opts(self, i):
        o = ("ram_size=%d,listen=%s,peers=%s,restore_timeout=30,secret_file=%s"
             % (self.size - 256 * MiB, self.addrs[i], ",".join(self.addrs),
                self.bench.secret))
        if self.tls:
            o += ",tls_cert=%s,tls_key=%s,tls_ca=%s" % self.tls[i]
        return o

    def start(self):
        for i in range(2):
            self.nodes[i] = self.bench.daemon(self.ram[i], self.opts(i),
                                              "%s%d" % (self.prefix, i))
        if self.tls:
            # net/server.c says so once its listener is up
            for d in self.nodes:
                d.tail(0).wait(r"peer traffic runs over mutual TLS and proves the shared "
                               r"secret", 30, "%s: the log line \"peer traffic runs over "
                               "mutual TLS and proves the shared secret\"" % d.name,
                               check=d.check_alive)
        return self

    def check(self):
        for d in self.nodes:
            d.check_alive()

    def job_start(self, first=0, timed_rank=None):
        """Both nodes write replicator.yaml (node `first` first) and wait for
        their markers. Returns {rank: (restored step, source, ready_ms,
        secs from the second yaml write to that rank's markers)}."""
        order = [first, 1 - first]
        tails = [d.tail() for d in self.nodes]
        d0 = self.nodes[order[0]]
        d0.write_yaml(yaml_text(order[0], 2, 1))
        d0.wait_yaml_consumed()
        t0 = time.monotonic()
        self.nodes[order[1]].write_yaml(yaml_text(order[1], 2, 1))
        out = {}
        rx = r"restore job=%s step=(\d+) source=(\w+) ready_ms=([\d.]+)" % JOB
        for r in (order[1], order[0]):
            m, _ = tails[r].wait(rx, 180, "node %d restore" % r, check=self.check,
                                 fail=r"replicator.failed|restore failed")
            out[r] = (int(m.group(1)), m.group(2), float(m.group(3)), time.monotonic() - t0)
        for r in range(2):
            step = out[r][0]
            names = [x for x in os.listdir(self.nodes[r].mnt) if x.endswith(".restore")]
            if not any("-s%d-n%d-" % (step, r) in x for x in names):
                raise BenchError("node %d: no marker for step %d: %s" % (r, step, names))
        return out

    def wait_gc(self, keep_from, timeout=60):
        """Steps older than keep_from are gone on both nodes (LKG moved)."""
        def done():
            for r in range(2):
                for s in self.bench.admin_ls(self.nodes[r].ramdir, JOB):
                    if s["step"] < keep_from and s.get("state") != "writing":
                        return False
            return True
        wait_until(done, timeout, "old steps dropped on both nodes (GC)", interval=0.02,
                   check=self.check)
        self.bench.release_dropped([(self.ram[r], self.nodes[r].ramdir) for r in range(2)])

    def stop(self, unmount_ram=False):
        for d in self.nodes:
            if d is not None:
                d.stop()
        if unmount_ram:
            for p in self.ram:
                self.bench.umount_tmpfs(p)


def prefault(bench, d, nbytes):
    """With --prefault: write nbytes of zeros into a file in d (a tmpfs with
    room) and delete it, right before a timed round. In a VM whose guest
    memory the host maps lazily and takes back when it is free (Firecracker,
    free page reporting) the first touch of such memory costs a host page
    fault per page (measured here: ~0.3 GiB/s instead of ~1.8 when stores
    go to memory that was used seconds before); this makes the round that
    comes next, mtcfs or baseline, find warm pages, like a machine whose
    RAM is its own."""
    if not bench.args.prefault:
        return
    p = os.path.join(d, ".prefault")
    chunk = bytes(64 * MiB)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, chunk[:min(left, len(chunk))])
    finally:
        os.close(fd)
        os.unlink(p)


def tcpbase_round(bench, src_files, dst, modes, cpu=None):
    """One copy of src_files into dst per mode; returns {mode: GiB/s}.
    cpu: a dict {mode: [...]} that gets the copy's CPU seconds per GiB
    (mtcfs-tcpbase's utime+stime: sender and receiver thread)."""
    out = {}
    for mode in modes:
        prefault(bench, dst, sum(os.path.getsize(f) for f in src_files))
        c0 = children_cpu_s()
        r = bench.run_json([bench.tcpbase, "--mode", mode, dst] + src_files)
        if cpu is not None:
            cpu.setdefault(mode, []).append((children_cpu_s() - c0) / (r["bytes"] / GiB))
        out[mode] = r["gib_per_s"]
        for n in os.listdir(dst):
            os.unlink(os.path.join(dst, n))
    return out


def baseline_samples(res):
    """The faster raw-TCP mode by median: (name, samples)."""
    best = max(res, key=lambda m: statistics.median(res[m]))
    name = {"copy": "raw TCP recv+write", "splice": "raw TCP splice"}[best]
    return name, res[best]


def section_cluster(bench, p, parts):
    nfiles, fsize = p["nfiles"], p["fsize"]
    shard = nfiles * fsize
    reps = p["reps"]
    w = Writer(nfiles, fsize)
    log("2-node cluster: shard %s (%d × %s), %d repetitions"
        % (human_size(shard), nfiles, human_size(fsize), reps))

    # the plain cluster serves 1, 2, 3; with only 1b asked for it is not started
    cl = Cluster(bench, shard).start() \
        if any(x in parts for x in ("redundancy", "restore", "write")) else None
    tcl = None                 # the mutual-TLS cluster of 1b
    base_src = base_dst = None
    single = single_ram = None
    step = [100]

    def next_step():
        step[0] += 1
        return step[0]

    try:
        if cl is not None:
            got = cl.job_start(first=0)
            log("job started on both nodes: %s" % got)
            w1 = cl.nodes[1]
            w0 = cl.nodes[0]
        if "redundancy-tls" in parts:
            bench.make_pki()
            tcl = Cluster(bench, shard, tls=bench.tls).start()
            got = tcl.job_start(first=0)
            log("job started on both nodes of the mutual-TLS cluster: %s" % got)
        if "redundancy" in parts or "restore" in parts or "redundancy-tls" in parts:
            base_src = bench.tmpfs("tcp-src", shard + 64 * MiB)
            base_dst = bench.tmpfs("tcp-dst", shard + 64 * MiB)
            src_files = []
            for i in range(nfiles):
                fn = os.path.join(base_src, "shard-%02d.bin" % i)
                with open(fn, "wb") as f:
                    f.write(w.buf)
                src_files.append(fn)
            # discarded rounds: first touch of memory is slower in a VM
            tcpbase_round(bench, src_files, base_dst, ("copy", "splice"))
        modes = ("copy", "splice")

        # -- 1 and 1b: time to redundancy (plain and over mutual TLS) --------------------
        def red_acc():
            return {"e2e": [], "push": [], "seal": [], "write_idle": [], "bytes": [],
                    "cpu": [], "cpu_seal": []}

        def red_round(c, s, acc):
            """Node 1 of cluster c writes step s through its mount and renames
            it; the clock runs from the rename to node 0's replica log line.
            acc (a red_acc()) gets the samples, None for a warm-up."""
            n0, n1 = c.nodes
            tmp = os.path.join(n1.mnt, "%d.orbax-checkpoint-tmp-1" % s)
            wsecs, _, _ = w.write_dir(tmp, s)
            prefault(bench, base_dst, shard)      # the replica's pages
            t0n, t1n = n0.tail(), n1.tail()
            c0 = proc_cpu_s(n0.pid) + proc_cpu_s(n1.pid)
            cs0 = thread_cpu_s(n1.pid, "mtcfs-seal")
            t0 = time.monotonic()
            os.rename(tmp, os.path.join(n1.mnt, str(s)))
            m, _ = t0n.wait(r"replica job=%s step=%d node=1 from rank 1 bytes=(\d+)"
                            % (JOB, s), 300, "replica of step %d on %s" % (s, n0.name),
                            check=c.check,
                            fail=r"replica job=%s step=%d node=1 (linked|from rank 1 "
                                 r"rejected)" % (JOB, s))
            e2e = time.monotonic() - t0
            nbytes = int(m.group(1))
            mr, _ = t1n.wait(r"replicated job=%s step=%d to rank 0 bytes=\d+ secs=([\d.]+)"
                             % (JOB, s), 60, "%s's push log of step %d" % (n1.name, s),
                             check=c.check)
            ms, _ = t1n.wait(r"committed job=%s step=%d .*seal_ms=([\d.]+)" % (JOB, s), 10,
                             "%s's commit log of step %d" % (n1.name, s))
            cseal = thread_cpu_s(n1.pid, "mtcfs-seal") - cs0
            cpu = proc_cpu_s(n0.pid) + proc_cpu_s(n1.pid) - c0 - cseal
            sh = shard_of(bench.admin_ls(n0.ramdir, JOB), 1, s)
            if not sh or sh.get("state") not in COMMITTED_STATES or sh.get("bytes") != shard:
                raise BenchError("%s's catalog does not show node 1's step %d: %s"
                                 % (n0.name, s, sh))
            if acc is not None:
                acc["cpu"].append(cpu / (nbytes / GiB))
                acc["cpu_seal"].append(cseal / (nbytes / GiB))
                acc["e2e"].append(e2e)
                acc["push"].append(float(mr.group(1)))
                acc["seal"].append(float(ms.group(1)))
                acc["write_idle"].append(shard / GiB / wsecs)
                acc["bytes"].append(nbytes)
            # node 0's part of the step: the LKG moves, older steps go
            tiny_step(n0.mnt, s, 0)
            c.wait_gc(s)

        # The last step written on the plain cluster is what benchmark 2
        # restores, so its rounds run whenever either is asked for.
        red, red_tls = red_acc(), red_acc()
        tcp1 = {m: [] for m in modes}
        tcp1cpu = {m: [] for m in modes}
        need_red = "redundancy" in parts or "restore" in parts
        tcp_red = "redundancy" in parts or "redundancy-tls" in parts
        # rounds before `warm` are warm-ups (discarded); with --warmup 0 and
        # only "restore" asked for, one round still writes the step to restore
        warm = p["warmup"]
        nplain = (reps + warm if "redundancy" in parts else max(1, warm)) if need_red else 0
        ntls = reps + warm if "redundancy-tls" in parts else 0
        last_step = None
        for rep in range(max(nplain, ntls)):
            # mtcfs and raw TCP alternate as they always did; the TLS round
            # moves through the places (0, 1, 2, 0, ..), so that 6 repetitions
            # go through all 6 orders and no side always follows the same one
            order = ["mtcfs", "tcp"] if rep < nplain else ["tcp"]
            if rep % 2:
                order.reverse()
            if rep < ntls:
                order.insert(rep % (len(order) + 1), "tls")
            for what in order:
                if what == "tcp":
                    if rep >= warm and tcp_red:
                        for m, v in tcpbase_round(bench, src_files, base_dst, modes,
                                                  tcp1cpu).items():
                            tcp1[m].append(v)
                elif what == "tls":
                    red_round(tcl, next_step(), red_tls if rep >= warm else None)
                else:
                    last_step = next_step()
                    red_round(cl, last_step, red if rep >= warm else None)
            if rep >= warm:
                msg = []
                if rep < nplain:
                    msg.append("%.3f s rename -> replica (%.2f GiB/s; daemon push %.3f s, "
                               "seal %.0f ms)" % (red["e2e"][-1], shard / GiB / red["e2e"][-1],
                                                  red["push"][-1], red["seal"][-1]))
                if rep < ntls:
                    msg.append("mutual TLS %.3f s (%.2f GiB/s; push %.3f s)" % (
                        red_tls["e2e"][-1], shard / GiB / red_tls["e2e"][-1],
                        red_tls["push"][-1]))
                if tcp1["copy"]:
                    msg.append("tcp copy %.2f splice %.2f GiB/s" % (tcp1["copy"][-1],
                                                                   tcp1["splice"][-1]))
                log("redundancy rep %d/%d: %s" % (rep - warm + 1, max(nplain, ntls) - warm,
                                                  "; ".join(msg)))
        if tcl is not None:             # done with it: its memory and CPUs go back
            tcl.stop(unmount_ram=True)
            tcl = None
        if "redundancy" in parts:
            bname, bs = baseline_samples(tcp1)
            cfg = "2 nodes on loopback, tmpfs 4K pages, secret_file, peers-per-node 1"
            bench.ratio_row(
                "peer.redundancy", "time to redundancy: rename of a %s step (%d files) → "
                "verified replica on the peer, as throughput" % (human_size(shard), nfiles),
                "GiB/s", bs, [shard / GiB / t for t in red["e2e"]], ("ratio>=", 0.75),
                config=cfg, baseline_name=bname,
                note="median %.3f s end to end; the daemon's own push time: median %.3f s"
                     % (statistics.median(red["e2e"]), statistics.median(red["push"])))
            bench.value_row("peer.redundancy.push", "  of which the push (node 1's log: "
                            "connect, manifest, sendfile, peer's CRC check, publish)", "GiB/s",
                            [shard / GiB / t for t in red["push"]], config=cfg,
                            higher_is_better=True)
            bench.value_row("peer.redundancy.seal", "  of which the seal (rename → "
                            "committed: manifest built)", "ms", red["seal"], config=cfg)
            other = [m for m in modes if m != ("copy" if "recv" in bname else "splice")][0]
            bench.value_row("peer.tcp.%s" % other, "raw TCP, the other receiver (%s)"
                            % ("sendfile → splice" if other == "splice"
                               else "sendfile → recv+write"), "GiB/s", tcp1[other],
                            subject_name="mtcfs-tcpbase", higher_is_better=True)
            bench.value_row("peer.write.idle", "app write into the mount, cluster idle "
                            "(%s, 1 MiB writes)" % human_size(shard), "GiB/s",
                            red["write_idle"], higher_is_better=True, config=cfg)
            bmode = "copy" if "recv" in bname else "splice"
            bench.ratio_row(
                "peer.cpu.replication", "CPU seconds per GiB: replication (%s step, both "
                "daemons' utime+stime from rename to published replica, seal excluded)"
                % human_size(shard), "CPU s/GiB", tcp1cpu[bmode], red["cpu"], None,
                higher_is_better=False, config=cfg,
                baseline_name=bname + " (mtcfs-tcpbase)",
                note="the seal (CRC32C of every file, manifest) took another %.3f CPU s/GiB "
                     "(median, the mtcfs-seal thread)" % statistics.median(red["cpu_seal"]))
        if "redundancy-tls" in parts:
            bname, bs = baseline_samples(tcp1)
            bmode = "copy" if "recv" in bname else "splice"
            cfg = ("2 nodes on loopback, tmpfs 4K pages, secret_file + mutual TLS 1.3 (EC P-256 "
                   "certificates), peers-per-node 1")
            e2e, push = statistics.median(red_tls["e2e"]), statistics.median(red_tls["push"])
            vs = ""
            if "redundancy" in parts:
                vs = "; without TLS in the same run: median %.3f s (TLS / plain time %.2f×)" % (
                    statistics.median(red["e2e"]), e2e / statistics.median(red["e2e"]))
            bench.ratio_row(
                "peer.redundancy.tls", "time to redundancy over mutual TLS: rename of a %s "
                "step (%d files) → verified replica on the peer, as throughput"
                % (human_size(shard), nfiles), "GiB/s", bs,
                [shard / GiB / t for t in red_tls["e2e"]], None, goal_text="report (no goal)",
                config=cfg, baseline_name=bname,
                note="median %.3f s end to end%s; the daemon's own push time (TLS handshake, "
                     "file bytes encrypted in user space, no sendfile): median %.3f s"
                     % (e2e, vs, push))
            cnote = []
            if "redundancy" in parts:
                cnote.append("without TLS in the same run: %.3f CPU s/GiB (TLS / plain %.2f×)"
                             % (statistics.median(red["cpu"]), statistics.median(red_tls["cpu"])
                                / statistics.median(red["cpu"])))
            cnote.append("the seal took another %.3f CPU s/GiB (median, the mtcfs-seal thread)"
                         % statistics.median(red_tls["cpu_seal"]))
            bench.ratio_row(
                "peer.cpu.replication.tls", "CPU seconds per GiB: replication over mutual TLS "
                "(%s step, both daemons' utime+stime from rename to published replica, seal "
                "excluded)" % human_size(shard), "CPU s/GiB", tcp1cpu[bmode], red_tls["cpu"],
                None, higher_is_better=False, config=cfg,
                baseline_name=bname + " (mtcfs-tcpbase)",
                note="; ".join(cnote))

        # -- 2: restore from a peer into an empty RAMDIR ------------------------------
        if "restore" in parts:
            rst = {"e2e": [], "ready_ms": [], "cpu": []}
            tcp2 = {m: [] for m in modes}
            tcp2cpu = {m: [] for m in modes}
            for rep in range(reps):
                order = ("mtcfs", "tcp") if rep % 2 == 0 else ("tcp", "mtcfs")
                for what in order:
                    if what == "tcp":
                        for m, v in tcpbase_round(bench, src_files, base_dst, modes,
                                                  tcp2cpu).items():
                            tcp2[m].append(v)
                        continue
                    w1.kill9()
                    cl.ram[1] = bench.fresh_tmpfs(cl.ram[1], "node1-ram", cl.size)
                    if os.listdir(cl.ram[1]):
                        raise BenchError("fresh RAMDIR not empty")
                    w1.start()
                    prefault(bench, base_dst, shard)  # the restored shard's pages
                    t1n = w1.tail()
                    c0 = proc_cpu_s(w0.pid) + proc_cpu_s(w1.pid)
                    got = cl.job_start(first=0)
                    cpu = proc_cpu_s(w0.pid) + proc_cpu_s(w1.pid) - c0
                    st, src, ready_ms, secs = got[1]
                    if st != last_step or src != "peer" or got[0][0] != last_step:
                        raise BenchError("restore: expected step %d from a peer on node 1, got "
                                         "%s" % (last_step, got))
                    m, _ = t1n.wait(r"restored job=%s step=%d from rank 0 bytes=(\d+)"
                                    % (JOB, st), 10, "node 1's restored log")
                    if int(m.group(1)) != shard:
                        raise BenchError("restored %s bytes, expected %d" % (m.group(1), shard))
                    rst["e2e"].append(secs)
                    rst["ready_ms"].append(ready_ms)
                    rst["cpu"].append(cpu / (shard / GiB))
                log("restore rep %d/%d: %.3f s yaml -> markers (%.2f GiB/s; daemon ready_ms "
                    "%.0f); tcp copy %.2f splice %.2f GiB/s" % (
                        rep + 1, reps, rst["e2e"][-1], shard / GiB / rst["e2e"][-1],
                        rst["ready_ms"][-1], tcp2["copy"][-1], tcp2["splice"][-1]))
            bname, bs = baseline_samples(tcp2)
            bench.ratio_row(
                "peer.restore", "restore from the peer into an empty RAMDIR: node 1's "
                "replicator.yaml → its .restore markers (%s fetched, CRC-checked)"
                % human_size(shard), "GiB/s", bs, [shard / GiB / t for t in rst["e2e"]],
                ("ratio>=", 0.75), config="2 nodes, node 1 killed -9 and wiped",
                baseline_name=bname,
                note="median %.3f s; node 0 wrote its yaml first; daemon ready_ms median %.0f"
                     % (statistics.median(rst["e2e"]), statistics.median(rst["ready_ms"])))
            bench.ratio_row(
                "peer.cpu.restore", "CPU seconds per GiB: restore from the peer (%s, both "
                "daemons' utime+stime from the yamls to the markers)" % human_size(shard),
                "CPU s/GiB", tcp2cpu["copy" if "recv" in bname else "splice"], rst["cpu"],
                None, higher_is_better=False, config="2 nodes, node 1 killed -9 and wiped",
                baseline_name=bname + " (mtcfs-tcpbase)")
        if base_src:
            bench.umount_tmpfs(base_dst)
            bench.umount_tmpfs(base_src)

        # -- 3: app write while replicating vs replication off -------------------------
        if "write" in parts:
            single_ram = bench.tmpfs("single-ram", 3 * shard + 512 * MiB)
            single = bench.daemon(single_ram, "ram_size=%d" % (3 * shard + 256 * MiB),
                                  "single")
            single.write_yaml(yaml_text(0, 1, 0))
            single.wait_yaml_consumed()
            wait_until(lambda: any(x.endswith(".restore") for x in os.listdir(single.mnt)),
                       60, "single node ready", check=single.check_alive)
            wr = {"during": [], "single": [], "overlap": []}
            for rep in range(reps + 1):   # rep 0: warm-up, discarded
                order = ("cluster", "single") if rep % 2 == 0 else ("single", "cluster")
                for what in order:
                    if what == "single":
                        s = next_step()
                        tmp = os.path.join(single.mnt, "%d.orbax-checkpoint-tmp-0" % s)
                        secs, _, _ = w.write_dir(tmp, s)
                        os.rename(tmp, os.path.join(single.mnt, str(s)))
                        wait_until(lambda: (shard_of(bench.admin_ls(single_ram, JOB), 0, s)
                                            or {}).get("state") in COMMITTED_STATES, 120,
                                   "single node: step %d committed" % s,
                                   check=single.check_alive)
                        wait_until(lambda: all(x["step"] >= s for x in
                                               bench.admin_ls(single_ram, JOB)), 60,
                                   "single node: older steps dropped", check=single.check_alive)
                        bench.release_dropped([(single_ram, single_ram)])
                        if rep > 0:
                            wr["single"].append(shard / GiB / secs)
                        continue
                    a, b = next_step(), next_step()
                    t1n, t0n = w1.tail(), w0.tail()
                    tmp = os.path.join(w1.mnt, "%d.orbax-checkpoint-tmp-1" % a)
                    w.write_dir(tmp, a)
                    os.rename(tmp, os.path.join(w1.mnt, str(a)))
                    tmp = os.path.join(w1.mnt, "%d.orbax-checkpoint-tmp-1" % b)
                    secs, ws, we = w.write_dir(tmp, b)
                    os.rename(tmp, os.path.join(w1.mnt, str(b)))
                    _, la = t1n.wait(r"committed job=%s step=%d " % (JOB, a), 60,
                                     "commit of step %d" % a, check=cl.check)
                    _, lr = t1n.wait(r"replicated job=%s step=%d to rank 0" % (JOB, a), 300,
                                     "push of step %d" % a, check=cl.check)
                    for st in (a, b):
                        t0n.wait(r"replica job=%s step=%d node=1 from rank 1 bytes=" % (JOB, st),
                                 300, "replica of step %d" % st, check=cl.check,
                                 fail=r"replica job=%s step=%d node=1 (linked|from rank 1 "
                                      r"rejected)" % (JOB, st))
                    rs, re_ = log_epoch(la), log_epoch(lr)
                    ov = max(0.0, min(re_, we) - max(rs, ws)) / max(we - ws, 1e-9)
                    tiny_step(w0.mnt, b, 0)
                    cl.wait_gc(b)
                    if rep > 0:
                        wr["during"].append(shard / GiB / secs)
                        wr["overlap"].append(ov)
                if rep > 0:
                    log("write rep %d/%d: during replication %.2f GiB/s (overlap %.0f%%), "
                        "single node %.2f GiB/s" % (rep, reps, wr["during"][-1],
                                                    100 * wr["overlap"][-1], wr["single"][-1]))
            bench.ratio_row(
                "peer.write.during", "app write into the mount while the previous step "
                "replicates to the peer (%s, 1 MiB writes)" % human_size(shard), "GiB/s",
                wr["single"], wr["during"], None, config="node 1 of 2 vs a single node",
                baseline_name="single node, no peers",
                note="the replication ran during %.0f%% of the timed write (median); sender "
                     "and receiver share the same 2 CPUs here"
                     % (100 * statistics.median(wr["overlap"])))
    finally:
        if single is not None:
            single.stop()
        if tcl is not None:
            tcl.stop()
        if cl is not None:
            cl.stop()


# --- 4: coordinator scale ------------------------------------------------------------

def coord_one(bench, n, rounds):
    job = "coord%d" % n
    port = free_ports(1)[0]
    addr = "127.0.0.1:%d" % port
    ram = bench.tmpfs("coord%d-ram" % n, 512 * MiB)
    # INFO: the restore lines are all this needs; with -d the coordinator
    # would log a line per message of the N nodes inside the timed windows
    d = bench.daemon(ram, "ram_size=%d,listen=%s,coordinator=%s,rank=0,restore_timeout=120,"
                          "secret_file=%s" % (384 * MiB, addr, addr, bench.secret),
                     "coord%d" % n, debug=False)
    rss_idle = proc_status_kib(d.pid, "VmRSS")
    errlog = open(os.path.join(bench.out_dir, "peer-coordload%d-%s.log" % (n, bench.mode)), "wb")
    proc = subprocess.Popen([bench.coordload, "--coord", addr, "--nodes", str(n), "--job", job,
                             "--secret", bench.secret, "--timeout", "300"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog,
                            start_new_session=True)

    def reap():
        # a normal end has sent "quit" and reaped it already
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdin, proc.stdout, errlog):
            try:
                f.close()
            except OSError:
                pass
    token = on_cleanup(reap)
    rd = LineReader(proc)

    def cmd(line, what, timeout=300):
        proc.stdin.write((line + "\n").encode())
        proc.stdin.flush()
        r = json.loads(rd.readline(timeout, what))
        if r.get("event") != "round":
            raise BenchError("coordload: %s" % r)
        return r

    res = {"plan": [], "plan_total": [], "barrier": [], "barrier_total": [], "plan_ms": []}
    try:
        conn = json.loads(rd.readline(600, "coordload: %d connections" % (n - 1)))
        d.check_alive()
        hwm_connect = proc_status_kib(d.pid, "VmHWM")
        log("N=%d: %d control connections in %.2f s, register in %.2f s (%.1f MiB of address "
            "tables); daemon RSS %.1f MiB idle, peak %.1f MiB" % (
                n, conn["conns"], conn["connect_s"], conn["register_s"],
                conn["register_bytes"] / MiB, rss_idle / 1024, hwm_connect / 1024))
        # round 0: nobody holds anything; then rank 0 commits steps 100, 200
        tl = d.tail()
        d.write_yaml(yaml_text(0, n, 0, job))
        d.wait_yaml_consumed()
        r0 = cmd("round0", "round 0")
        tl.wait(r"restore job=%s step=0 source=" % job, 120, "rank 0 ready (round 0)",
                check=d.check_alive)
        if r0["bad_plans"] or r0["not_go"] or r0["errors"]:
            raise BenchError("coordload round 0: %s" % r0)
        for s in (100, 200):
            tiny_step(d.mnt, s, 0)
        hashes = {}

        def committed():
            for s in bench.admin_ls(ram, job):
                if s["rank"] == 0 and s["state"] in COMMITTED_STATES and s.get("hash"):
                    hashes[s["step"]] = s["hash"]
            return 100 in hashes and 200 in hashes
        wait_until(committed, 60, "rank 0's steps 100 and 200 committed", check=d.check_alive)
        with open("/proc/%d/clear_refs" % d.pid, "w") as f:
            f.write("5")                      # VmHWM := VmRSS: the rounds' peak from here
        for i in range(rounds):
            tl = d.tail()
            d.write_yaml(yaml_text(0, n, 0, job))
            d.wait_yaml_consumed()
            r = cmd("round %s %s" % (hashes[100], hashes[200]), "round %d" % (i + 1))
            tl.wait(r"restore job=%s step=100 source=local" % job, 120,
                    "rank 0 restores step 100", check=d.check_alive,
                    fail=r"restore job=%s step=(?!100 )" % job)
            if r["bad_plans"] or r["not_go"] or r["errors"] or not r["found"] or \
                    r["step"] != 100:
                raise BenchError("coordload round %d: unexpected answers: %s" % (i + 1, r))
            mp = tl.find(r"coord: plan job=%s plan=\d+ found=1 .*plan_ms=([\d.]+)" % job)
            res["plan"].append(r["plan_s"])
            res["plan_total"].append(r["plan_total_s"])
            res["barrier"].append(r["barrier_s"])
            res["barrier_total"].append(r["barrier_total_s"])
            if mp:
                res["plan_ms"].append(float(mp[0].group(1)))
            log("N=%d round %d/%d: last catalog → last plan %.3f s (first catalog → last plan "
                "%.3f s), last ready → last go %.3f s" % (
                    n, i + 1, rounds, r["plan_s"], r["plan_total_s"], r["barrier_s"]))
        hwm_rounds = proc_status_kib(d.pid, "VmHWM")
        proc.stdin.write(b"quit\n")
        proc.stdin.flush()
        proc.wait(60)
    finally:
        reap()
        forget(token)
        d.stop()
        bench.umount_tmpfs(ram)
    res.update(conn=conn, rss_idle=rss_idle, hwm_connect=hwm_connect, hwm_rounds=hwm_rounds)
    return res


def unit_nofile():
    """The open-file limit of packaging/systemd/mtcfs-ckpt.service
    (LimitNOFILE=), given to this process and so to the daemons and the
    load generator it starts: the coordinator is measured on the limits our
    own unit sets, not on whatever the shell had. Root may raise its hard
    limit up to fs.nr_open."""
    import resource
    want = 1048576
    try:
        with open(os.path.join(REPO, "packaging", "systemd", "mtcfs-ckpt.service")) as f:
            for ln in f:
                if ln.startswith("LimitNOFILE="):
                    want = int(ln.split("=", 1)[1])
        with open("/proc/sys/fs/nr_open") as f:
            want = min(want, int(f.read()))
    except (OSError, ValueError):
        pass
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
        except (OSError, ValueError) as e:
            log("cannot raise RLIMIT_NOFILE to the unit's %d: %s (hard %d stays)" % (want, e, hard))
            return hard
    elif soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def section_coord(bench, p):
    out = {}
    nofile = unit_nofile()
    log("coord: RLIMIT_NOFILE %d" % nofile)
    for n in p["coord_nodes"]:
        out[n] = coord_one(bench, n, p["coord_rounds"])
    for n, r in out.items():
        cfg = "1 mtcfs rank-0 daemon + mtcfs-coordload (%d control connections)" % (n - 1)
        bench.value_row("peer.coord.%d.plan" % n,
                        "coordinator, N=%d: last catalog sent → last plan entry received "
                        "(all %d)" % (n, n - 1), "s", r["plan"], config=cfg, goal_max=2.0,
                        goal_text="≤ 2 s (target at 4096 and 16384)",
                        note="first catalog → last plan: median %.3f s%s" % (
                            statistics.median(r["plan_total"]),
                            "; lkg_plan %.2f ms" % statistics.median(r["plan_ms"])
                            if r["plan_ms"] else ""))
        bench.value_row("peer.coord.%d.barrier" % n,
                        "coordinator, N=%d: last ready sent → last go received" % n, "s",
                        r["barrier"], config=cfg, goal_max=1.0 if n >= 16384 else 2.0,
                        goal_text="≤ 1 s (target at 16384)" if n >= 16384
                        else "≤ 2 s (target at 4096)",
                        note="first ready → last go: median %.3f s"
                             % statistics.median(r["barrier_total"]))
        bench.value_row("peer.coord.%d.rss" % n,
                        "coordinator daemon, N=%d: peak RSS (VmHWM) during the rounds" % n,
                        "MiB", [r["hwm_rounds"] / 1024.0], config=cfg,
                        note="idle %.1f MiB; peak while %d ranks connected and registered "
                             "%.1f MiB" % (r["rss_idle"] / 1024.0, n - 1,
                                           r["hwm_connect"] / 1024.0))
        bench.value_row("peer.coord.%d.register" % n,
                        "coordinator, N=%d: %d ranks register (each answer carries the "
                        "address table)" % (n, n - 1), "s", [r["conn"]["register_s"]],
                        config=cfg,
                        note="%.1f MiB of answers; %d authenticated connects took %.2f s "
                             "(4 threads)" % (r["conn"]["register_bytes"] / MiB, n - 1,
                                              r["conn"]["connect_s"]))


# --- report ---------------------------------------------------------------------------

def env_info(bench):
    def first_line(argv):
        r = quiet(argv, timeout=10)
        return r.stdout.decode(errors="replace").strip().splitlines()[0] \
            if r.returncode == 0 and r.stdout.strip() else None
    mem = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            mem[k] = v.strip()
    model = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "mem_total": mem.get("MemTotal"),
        "libfuse": first_line(["pkg-config", "--modversion", "fuse3"]),
        "mtcfs": first_line([bench.mtcfs, "-V"]),
        "git_head": os.environ.get("MTCFS_BENCH_GIT") or first_line(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"]),
        "pipe_max_size": int(read_sysctl(PIPE_MAX)),
        "build_dir": bench.build_dir,
    }


def markdown(bench, env, started, duration):
    out = ["# mtcfs peer-tier benchmark (%s mode)" % bench.mode, ""]
    out.append("%s, %.0f s; kernel %s, %s CPUs (%s), %s RAM, libfuse %s, git %s (working "
               "tree as built); load average at start %s; CPU used by other processes "
               "during the run: %.0f%%." % (
                   started, duration, env["kernel"], env["cpus"], env["cpu_model"],
                   env["mem_total"], env["libfuse"], env["git_head"],
                   env.get("loadavg_start", "?").split()[0],
                   100 * env.get("other_cpu_share", 0)))
    out.append("")
    out.append("| what | baseline (same run), median | mtcfs min / median / max | ratio | "
               "goal | met |")
    out.append("|---|---|---|---|---|---|")
    for r in bench.rows:
        u = r["unit"]
        s = r["subject"]
        b = r["baseline"]
        btxt = "–" if b is None else "%s: %s %s" % (b["name"], fmt_num(b["median"], u), u)
        stxt = "%s / **%s** / %s %s" % (fmt_num(s["min"], u), fmt_num(s["median"], u),
                                        fmt_num(s["max"], u), u)
        if s.get("name") not in (None, "mtcfs"):
            stxt = "%s: %s" % (s["name"], stxt)
        rtxt = "–" if r["ratio"] is None else "%.2f" % r["ratio"]
        met = "–" if r["met"] is None else ("yes" if r["met"] else "**no**")
        what = r["what"]
        if r.get("note"):
            what += " (%s)" % r["note"]
        out.append("| %s | %s | %s | %s | %s | %s |" % (what, btxt, stxt, rtxt, r["goal_text"],
                                                        met))
    out.append("")
    n = sorted({len(r["subject"]["samples"]) for r in bench.rows})
    out.append("Ratio: mtcfs speed / baseline speed from the medians (for times: baseline "
               "time / mtcfs time). Samples per row: %s." % ", ".join(str(x) for x in n))
    for note in bench.notes:
        out.append("")
        out.append("- " + note)
    out.append("")
    return "\n".join(out)


def params(bench):
    quick = bench.quick
    p = {"reps": 5 if quick else 7,
         "nfiles": 4, "fsize": (64 if quick else 256) * MiB,
         "coord_nodes": [256, 1024] if quick else [256, 1024, 4096, 16384],
         "coord_rounds": 3 if quick else 5, "warmup": 1}
    if bench.args.reps:
        p["reps"] = p["coord_rounds"] = bench.args.reps
    if bench.args.coord_nodes:
        p["coord_nodes"] = [int(x) for x in bench.args.coord_nodes.split(",")]
    if bench.args.shard_mib:
        p["fsize"] = bench.args.shard_mib * MiB // p["nfiles"]
    if bench.args.warmup is not None:
        p["warmup"] = bench.args.warmup
    return p


def mem_needed(p, parts):
    """Peak memory of the cluster parts, roughly: the raw-TCP source and
    destination tmpfs, each node holding its previous step while the next
    one arrives (one step if only one is written), the writer's buffer, and
    the same per node of the mutual-TLS cluster, which runs alongside; the
    "write" part (after the TLS cluster is gone) holds up to three steps per
    node and a single node."""
    shard = p["nfiles"] * p["fsize"]

    def held(writes):
        return 2 if writes >= 2 else 1
    nodes = 0
    if "redundancy" in parts or "restore" in parts:
        nodes += 2 * held((p["reps"] if "redundancy" in parts else 0) + p["warmup"])
    if "redundancy-tls" in parts:
        nodes += 2 * held(p["reps"] + p["warmup"])
    red = (2 + nodes) * shard + p["fsize"] + GiB if nodes else GiB
    return max(red, 8 * shard + GiB) if "write" in parts else red


def main():
    ap = argparse.ArgumentParser(description="mtcfs peer-tier benchmarks (issue 4): ratios "
                                             "against a side-by-side baseline")
    m = ap.add_mutually_exclusive_group()
    m.add_argument("--quick", action="store_true",
                   help="quick mode (default): 256 MiB shards, N up to 1024, 5 repetitions")
    m.add_argument("--full", action="store_true",
                   help="full mode: 1 GiB shards, N up to 16384, 7 repetitions")
    ap.add_argument("--only", help="comma-separated subset of %s" % ",".join(PARTS))
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build-bench"),
                    help="build dir (configured as Release if new; default: %(default)s)")
    ap.add_argument("--no-build", action="store_true",
                    help="use the binaries in --build-dir as they are")
    ap.add_argument("--mtcfs", help="mtcfs binary (default: BUILD/mtcfs)")
    ap.add_argument("--admin", help="mtcfs-admin binary")
    ap.add_argument("--out", default=os.path.join(HERE, "out"),
                    help="output dir (default: %(default)s)")
    ap.add_argument("--reps", type=int, help="repetitions (override)")
    ap.add_argument("--coord-nodes", help="node counts for the coordinator rows, e.g. 256,4096")
    ap.add_argument("--shard-mib", type=int, help="shard size in MiB (override; 4 files)")
    ap.add_argument("--warmup", type=int,
                    help="discarded warm-up rounds before the redundancy rounds (default 1; "
                         "0 lets a large shard fit: each node then holds one step)")
    ap.add_argument("--prefault", action="store_true",
                    help="before every timed redundancy, restore and raw-TCP round, write "
                         "and delete a shard's worth of zeros on a tmpfs, so that the round "
                         "finds warm memory (for VMs whose host maps guest memory lazily)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    parts = PARTS if not args.only else tuple(x.strip() for x in args.only.split(","))
    for x in parts:
        if x not in PARTS:
            ap.error("unknown part %r (choose from %s)" % (x, ", ".join(PARTS)))
    if args.reps is not None and args.reps < 1:
        ap.error("--reps must be at least 1")
    if args.warmup is not None and args.warmup < 0:
        ap.error("--warmup must be at least 0")

    bench = Bench(args)
    p = params(bench)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    load0 = read_sysctl("/proc/loadavg")
    t0 = time.monotonic()
    env = {}
    try:
        bench.build()
        bench.setup()
        env = env_info(bench)
        need = mem_needed(p, [x for x in parts if x != "coord"])
        if mem_available() < need:
            raise BenchError("needs about %.1f GiB of free memory (MemAvailable: %.1f GiB)"
                             % (need / GiB, mem_available() / GiB))
        busy0, own0, tb = cpu_busy_s(), own_cpu_s(), time.monotonic()
        cparts = [x for x in parts if x != "coord"]
        if cparts:
            section_cluster(bench, p, cparts)
        if "coord" in parts:
            section_coord(bench, p)
    except BenchError as e:
        log("FAILED: %s" % e)
        return 2
    finally:
        run_cleanup()
    duration = time.monotonic() - t0
    others = max(0.0, (cpu_busy_s() - busy0) - (own_cpu_s() - own0))
    share = others / ((time.monotonic() - tb) * (os.cpu_count() or 1))
    env["loadavg_start"] = load0
    env["loadavg_end"] = read_sysctl("/proc/loadavg")
    env["other_cpu_share"] = round(share, 4)
    bench.notes.append(
        "peer: every mtcfs runs with -d (info log lines, used for the timings), a shared "
        "secret (HMAC handshake), RAMDIRs on private tmpfs mounts (4K pages). The writer "
        "is this Python process: 4 files per shard, 1 MiB os.write() calls from one "
        "file-sized buffer, each 1 MiB block stamped (step, file, block) so that steps "
        "never share content (identical content is linked, not sent).")
    bench.notes.append(
        "peer: the raw TCP baseline (mtcfs-tcpbase) copies the same bytes in the same "
        "4-file layout over one loopback connection with the socket tuning mtcfs's data "
        "connections use (TCP_NODELAY, 4 MiB buffers), no CRC; of its two receivers "
        "(recv+write 1 MiB, splice through a 1 MiB pipe) the faster by median is the "
        "baseline. Sender, receiver and (for mtcfs) both daemons share the same 2 CPUs.")
    if "redundancy-tls" in parts and bench.tls:
        aes = False
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    aes = " aes " in line + " "
                    break
        bench.notes.append(
            "peer: time to redundancy over mutual TLS ran on a second 2-node cluster "
            "(daemons tls-node0/1: the same options plus tls_cert=, tls_key=, tls_ca=; the "
            "shared secret is proven inside TLS). Certificates made for the run with the "
            "openssl CLI: an EC P-256 CA (CA:true), one leaf per node signed by it "
            "(serverAuth, clientAuth). Its rounds were interleaved with the plain cluster's "
            "and the raw-TCP rounds, each taking every place in turn, and its ratio is against "
            "the same raw-TCP samples. With "
            "TLS the daemon encrypts the file bytes in user space instead of sendfile; "
            "TLS 1.3 cipher suites as net/tls.c orders them (AES-128-GCM first); this "
            "CPU %s AES-NI." % ("has" if aes else "does not have"))
    if args.prefault:
        bench.notes.append(
            "peer: --prefault: right before every timed round (mtcfs and raw TCP alike) a "
            "shard's worth of zeros was written to a tmpfs and deleted, so the round found "
            "warm memory: in this VM class the first touch of guest memory that was not "
            "used for a few seconds costs a host page fault per page (~0.3 GiB/s), which "
            "otherwise falls on whichever side happens to run first.")
    if bench.max_leak[1] > 16 * MiB:
        tp, leak, used, held = bench.max_leak
        bench.notes.append(
            "mtcfs bug seen in this run: 5 s after GC dropped shards, tmpfs %s still had "
            "%.0f MiB in use while the catalog held %.0f MiB (%.0f MiB unaccounted): the "
            "pages of dropped shards were not freed."
            % (tp, used / MiB, held / MiB, leak / MiB))
        log("WARNING: " + bench.notes[-1])
    if share > 0.05:
        bench.notes.append(
            "other processes used %.0f%% of the machine's CPU time during the run (load "
            "average at start: %s): the numbers are noisier than on an idle machine; "
            "baseline and mtcfs alternated, so the ratios are less affected than the "
            "absolute values" % (100 * share, load0.split()[0]))
        log("WARNING: " + bench.notes[-1])
    for dmn in bench.daemons:
        bad = dmn.bad_log_lines()
        if bad:
            bench.notes.append("daemon log %s has error lines: %s"
                               % (dmn.log_path, "; ".join(bad[:5])))
            log("WARNING: " + bench.notes[-1])
    md = markdown(bench, env, started, duration)
    result = {"mode": bench.mode, "started": started, "duration_s": round(duration, 1),
              "env": env, "sections": ["peer"], "parts": list(parts), "params": p,
              "rows": bench.rows, "notes": bench.notes}
    with open(os.path.join(bench.out_dir, "peer.json"), "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(bench.out_dir, "peer.md"), "w") as f:
        f.write(md)
    sys.stdout.write(md)
    log("wrote %s/peer.json and peer.md" % bench.out_dir)
    missed = [r["id"] for r in bench.rows if r["met"] is False]
    if missed:
        log("goals missed: %s" % ", ".join(missed))
    return 1 if (missed and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
