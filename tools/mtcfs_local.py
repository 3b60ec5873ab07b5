"""mtcfs nodes on this machine: start, stop, kill -9 and wipe mtcfs daemons,
clusters of them on loopback, and the job's side of replicator.yaml.

A Daemon runs `mtcfs -f -o OPTS RAMDIR MNT` (by default RAMDIR under
/dev/shm, MNT under /tmp), waits until the kernel shows the mount (never a
fixed sleep), and is always unmounted and reaped: by close(), the context
manager, or an atexit hook (also reached on SIGTERM/SIGHUP). A daemon log
showing "ERROR", a sanitizer report or a non-zero exit after a clean
unmount is reported (DaemonError) unless declared expected
(Daemon.expect_log). A Cluster is N of them with a static peers= table and
a shared secret; job_start() writes every node's replicator.yaml the way
Orbax does and waits for its .restore markers.

tools/demo.py drives it; the integration tests (tests/integration/harness.py
and cluster.py) build on it and re-export its names. tools/ never imports
from tests/ (tools/check-layers fails if it does).

Environment: MTCFS_BIN, MTCFS_ADMIN, MTCFS_BUILD (defaults: <repo>/build);
MTCFS_KEEP_TMP=1 keeps the temp directories; MTCFS_TEST_VERBOSE=1 prints
each daemon's log when it stops.

Standard library only: run with /usr/bin/python3.
"""

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BUILD = os.environ.get("MTCFS_BUILD") or os.path.join(REPO, "build")
MTCFS_BIN = os.environ.get("MTCFS_BIN") or os.path.join(BUILD, "mtcfs")
MTCFS_ADMIN = os.environ.get("MTCFS_ADMIN") or os.path.join(BUILD,
                                                            "mtcfs-admin")
KEEP_TMP = os.environ.get("MTCFS_KEEP_TMP") == "1"
VERBOSE = os.environ.get("MTCFS_TEST_VERBOSE") == "1"

DEFAULT_OPTS = "ram_size=1G"
READY_TIMEOUT = 30.0          # sanitizer builds start slowly
EXIT_TIMEOUT = 30.0           # LeakSanitizer runs at exit
COMMIT_TIMEOUT = 60.0
UNMOUNT_RETRY = 5.0           # seconds to retry an EBUSY unmount
COMMITTED_STATES = ("committed", "replicated", "backed-up")

# A log line with one of these fails the test (libfuse's test runner habit).
BAD_LOG = re.compile(r"ERROR|AddressSanitizer|runtime error:|LeakSanitizer|"
                     r"ThreadSanitizer")


# --- polling ----------------------------------------------------------------

def wait_until(cond, timeout, msg, interval=0.005, check=None, max_interval=0.1,
               error=AssertionError):
    """Poll cond() until it returns a truthy value, which is returned.

    Raises error (AssertionError) naming msg after timeout seconds.
    check(), if given, runs on every round (e.g. "daemon still alive") and
    may raise. The poll interval grows from 5 ms to max_interval (100 ms).
    """
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise error("timed out after %.1fs waiting for %s" % (timeout, msg))
        time.sleep(interval)
        interval = min(interval * 2, max_interval)


def _unescape_mount_field(s):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mount_fstype(path):
    """fstype of the mount at exactly path per /proc/mounts, else None."""
    path = os.path.realpath(path)
    found = None
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3 and _unescape_mount_field(fields[1]) == path:
                found = fields[2]          # the last (top) mount wins
    return found


def mount_options(path):
    """The mount options of the mount at exactly path per /proc/mounts (the
    top one), as a set, else None."""
    path = os.path.realpath(path)
    found = None
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 4 and _unescape_mount_field(fields[1]) == path:
                found = set(fields[3].split(","))
    return found


def _run_quiet(argv, timeout=30):
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, -1, str(e).encode())


_PORTS_GIVEN = set()


def free_ports(n):
    """n distinct TCP ports on 127.0.0.1 that are free now, for a server
    started later (a daemon's listen=, JAX's coordinator).

    They are taken below the kernel's ephemeral range
    (net.ipv4.ip_local_port_range): a port the kernel handed out as
    bind(0) is an ephemeral one, which any outgoing connection of any
    process may take before the server binds it (JAX's coordinator once
    failed so). A port is never given twice in one test process.
    """
    import random
    import socket
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            eph_lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        eph_lo = 32768
    lo, hi = (10000, eph_lo) if eph_lo > 11000 else (eph_lo // 2, eph_lo)
    rnd = random.Random()
    ports = []
    for _ in range(20000):
        if len(ports) == n:
            return ports
        p = rnd.randrange(lo, hi)
        if p in _PORTS_GIVEN:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            s.close()
        _PORTS_GIVEN.add(p)
        ports.append(p)
    raise RuntimeError("no %d free ports below %d" % (n, hi))


def thread_stacks(pid, timeout=60):
    """Every thread's backtrace of a live process, for a hang report.

    gdb attaches, prints and detaches; without gdb (or if it fails) the
    kernel's view of each thread (/proc/PID/task/*/stack, wchan) is what
    there is.
    """
    if shutil.which("gdb"):
        try:
            r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx",
                                "-ex", "set pagination off",
                                "-ex", "thread apply all bt"],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=timeout)
            out = r.stdout.decode(errors="replace")
            if "Thread " in out:
                return "\n".join(l for l in out.splitlines()
                                 if l.startswith(("Thread ", "#")))
        except (OSError, subprocess.TimeoutExpired):
            pass
    lines = []
    for tid in sorted(os.listdir("/proc/%d/task" % pid)):
        try:
            with open("/proc/%d/task/%s/wchan" % (pid, tid)) as f:
                lines.append("thread %s: %s" % (tid, f.read()))
        except OSError:
            pass
    return "\n".join(lines)


def force_unmount(mnt):
    """Unmount mnt however possible (used after kill -9 and at exit)."""
    for argv in (["fusermount3", "-u", mnt], ["fusermount3", "-u", "-z", mnt],
                 ["umount", "-l", mnt]):
        if mount_fstype(mnt) is None:
            return
        _run_quiet(argv)


# --- the daemon ---------------------------------------------------------------

_LIVE = set()                 # daemons that may still be running or mounted
_MAIN_PID = os.getpid()       # forked test children must not reap them


class DaemonError(AssertionError):
    pass


class Daemon:
    """One mtcfs process on (ramdir, mnt); restartable on the same RAMDIR.

    d = Daemon(); d.start()  ... d.stop()   or   with Daemon() as d: ...
    d.ramdir, d.mnt, d.log_path; d.log_text() for everything logged so far.
    A caller that gives mnt and log_path (the demo, the bench) gets no
    temp directory of the harness; binary: another mtcfs than MTCFS_BIN.
    """

    def __init__(self, ramdir=None, mnt=None, opts=DEFAULT_OPTS,
                 extra_args=(), env=None, name="mtcfs", binary=None, log_path=None):
        self._own_dirs = []
        if ramdir is None:
            ramdir = tempfile.mkdtemp(prefix="mtcfs-ram-", dir="/dev/shm")
            self._own_dirs.append(ramdir)
        self.workdir = None
        if mnt is None or log_path is None:
            self.workdir = tempfile.mkdtemp(prefix="mtcfs-test-", dir="/tmp")
            self._own_dirs.append(self.workdir)
        if mnt is None:
            mnt = os.path.join(self.workdir, "mnt")
            os.mkdir(mnt)
        self.binary = binary or MTCFS_BIN
        self.ramdir = ramdir
        self.mnt = mnt
        self.opts = opts
        self.extra_args = list(extra_args)
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
        self.name = name
        self.log_path = log_path or os.path.join(self.workdir, "daemon.log")
        self.proc = None
        self.expected_log = []         # regexes of tolerated bad lines
        self.expect_nonzero_exit = False
        self._log_pos = 0              # start of the current run in the log
        self.problems = []             # findings of the log/exit checks
        self.final_log = None          # the log, kept after cleanup
        self.closed = False
        _LIVE.add(self)

    # -- lifecycle --

    def argv(self):
        a = [self.binary, "-f"]
        if self.opts:
            a += ["-o", self.opts]
        return a + self.extra_args + [self.ramdir, self.mnt]

    def spawn(self):
        """Start the process, its output appended to the log; no wait (a
        test of the start itself waits its own way). Returns the Popen."""
        if not os.access(self.binary, os.X_OK):
            raise DaemonError("mtcfs binary not found or not executable: %s "
                              "(set MTCFS_BIN or build into %s)"
                              % (self.binary, BUILD))
        assert self.proc is None, "already running"
        with open(self.log_path, "ab") as log:
            self._log_pos = log.tell()
            log.write(("=== %s start: %s\n" % (self.name, " ".join(
                self.argv()))).encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=self.env,
                                         start_new_session=True)
        return self.proc

    def start(self, timeout=READY_TIMEOUT):
        assert mount_fstype(self.mnt) is None, "%s already mounted" % self.mnt
        self.spawn()
        wait_until(lambda: mount_fstype(self.mnt) == "fuse.mtcfs",
                   timeout, "%s mounted on %s (fuse.mtcfs in /proc/mounts)"
                   % (self.name, self.mnt), check=self.check_alive)
        return self

    def check_alive(self):
        if self.proc is not None and self.proc.poll() is not None:
            rc = self.proc.returncode
            self.proc = None
            raise DaemonError("%s exited unexpectedly (rc=%s); log:\n%s"
                              % (self.name, rc, self.log_tail()))

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=EXIT_TIMEOUT):
        """Unmount, wait for exit (kill -9 at the deadline), check the log.

        Problems found (bad log lines, non-zero exit, no exit) are recorded
        in self.problems and raised as DaemonError.
        """
        if self.proc is None:
            force_unmount(self.mnt)
            return
        clean = False
        if mount_fstype(self.mnt) is not None:
            # EBUSY can be transient (a process of ours still exiting), so
            # retry briefly; a test that leaks an fd still fails below.
            r = None
            deadline = time.monotonic() + UNMOUNT_RETRY
            while True:
                r = _run_quiet(["fusermount3", "-u", self.mnt])
                if (r.returncode == 0 or mount_fstype(self.mnt) is None
                        or time.monotonic() >= deadline
                        or not self.running()):
                    break
                time.sleep(0.1)
            if r.returncode == 0:
                clean = True
            else:
                self.problems.append("fusermount3 -u failed (%s); lazy unmount"
                                     % r.stdout.decode(errors="replace")
                                     .strip())
                force_unmount(self.mnt)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stacks = thread_stacks(self.proc.pid)
            self.proc.kill()
            rc = self.proc.wait()
            if clean:
                self.problems.append("daemon did not exit within %.0fs of "
                                     "the unmount; killed; its threads:\n%s"
                                     % (timeout, stacks))
        self.proc = None
        force_unmount(self.mnt)
        if clean and rc != 0 and not self.expect_nonzero_exit:
            self.problems.append("daemon exited with status %s after a clean "
                                 "unmount" % rc)
        self._check_log()
        self._raise_problems()

    def kill9(self):
        """kill -9 the daemon (no unmount by it), then clear the dead mount."""
        assert self.proc is not None, "not running"
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None
        force_unmount(self.mnt)
        wait_until(lambda: mount_fstype(self.mnt) is None, 10,
                   "dead mount %s gone" % self.mnt)
        self._check_log()
        self._raise_problems()

    def restart(self, kill=False):
        """Stop (or kill -9) and start again on the same RAMDIR and MNT."""
        if kill:
            self.kill9()
        else:
            self.stop()
        return self.start()

    def wipe_ramdir(self):
        """Empty RAMDIR (a node that comes back with nothing); stopped only."""
        assert self.proc is None, "stop or kill9 the daemon first"
        for n in os.listdir(self.ramdir):
            p = os.path.join(self.ramdir, n)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)

    def close(self):
        """Always safe: stop if running, keep the log, remove temp dirs."""
        if self.closed:
            return
        try:
            if self.proc is not None:
                self.stop()
            else:
                force_unmount(self.mnt)
        finally:
            self.closed = True
            _LIVE.discard(self)
            try:
                self.final_log = self.log_text()
            except OSError:
                self.final_log = ""
            if VERBOSE:
                sys.stderr.write("--- %s log (%s) ---\n%s\n" % (
                    self.name, self.log_path, self.final_log))
            if not KEEP_TMP and mount_fstype(self.mnt) is None:
                for d in self._own_dirs:
                    shutil.rmtree(d, ignore_errors=True)

    def __enter__(self):
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- log --

    def expect_log(self, regex):
        """Tolerate bad log lines matching regex (an expected error)."""
        self.expected_log.append(re.compile(regex))

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def log_size(self):
        """The log's length now: a mark for log_from() and wait_log()."""
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def log_from(self, pos):
        """What was logged from byte pos on."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(pos)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def wait_log(self, regex, timeout=COMMIT_TIMEOUT, what=None, since=None):
        """Poll the log (from byte since; default: this run's start) until
        a line matches regex; returns the match. The daemon must stay up."""
        rx = re.compile(regex, re.M)
        pos = self._log_pos if since is None else since
        return wait_until(lambda: rx.search(self.log_from(pos)), timeout,
                          what or "%s to log /%s/" % (self.name, regex),
                          check=self.check_alive)

    def log_tail(self, n=60):
        try:
            lines = self.log_text().splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def _check_log(self):
        with open(self.log_path, "rb") as f:
            f.seek(self._log_pos)
            text = f.read().decode(errors="replace")
        bad = [ln for ln in text.splitlines()
               if BAD_LOG.search(ln)
               and not any(r.search(ln) for r in self.expected_log)]
        if bad:
            self.problems.append("daemon log has unexpected error lines:\n  "
                                 + "\n  ".join(bad[:40]))

    def _raise_problems(self):
        if self.problems:
            p, self.problems = self.problems, []
            raise DaemonError("%s (%s): %s\n--- log tail ---\n%s" % (
                self.name, self.log_path, "\n".join(p), self.log_tail()))


def _cleanup_all():
    if os.getpid() != _MAIN_PID:        # a forked child: not its daemons
        return
    for d in list(_LIVE):
        try:
            d.close()
        except Exception as e:          # at exit: report, go on reaping
            sys.stderr.write("harness cleanup: %s\n" % e)


atexit.register(_cleanup_all)


def _on_signal(signum, frame):
    # unittest would catch a SystemExit raised inside a test and go on, so
    # unmount and reap right here, then leave. Forked children just leave.
    if os.getpid() == _MAIN_PID:
        signal.signal(signum, signal.SIG_IGN)
        sys.stderr.write("harness: signal %d: unmounting and exiting\n"
                         % signum)
        _cleanup_all()
    os._exit(128 + signum)


signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGHUP, _on_signal)


# --- mtcfs-admin --------------------------------------------------------------

def admin(*args, timeout=60):
    """Run mtcfs-admin ARGS; returns stdout text; raises on failure."""
    argv = [MTCFS_ADMIN] + [str(a) for a in args]
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError("%s failed (rc=%d): %s" % (
            " ".join(argv), r.returncode,
            r.stderr.decode(errors="replace").strip()))
    return r.stdout.decode()


def admin_ls(ramdir):
    """mtcfs-admin ls RAMDIR --json, parsed."""
    out = admin("ls", ramdir, "--json")
    try:
        return json.loads(out)
    except ValueError as e:
        raise AssertionError("mtcfs-admin ls --json printed invalid JSON "
                             "(%s): %r" % (e, out[:2000]))


# --- clusters ------------------------------------------------------------------

class Cluster:
    """n nodes, node i listening on hosts[i] (default 127.0.0.1), each with
    its own RAMDIR, mount and log. ram_sizes: {rank: size} overrides
    ram_size. make_node(rank, opts=, name=) builds a node (a Daemon
    or a subclass: a RAMDIR on a given tmpfs, a network namespace ...)."""

    def __init__(self, n, ram_size="1G", secret=True, restore_timeout=15, extra="", k=1,
                 hosts=None, ram_sizes=None, make_node=None):
        self.n = n
        self.k = k
        self.interval = "backup-interval-minutes: 30"
        self.ports = free_ports(n)
        self.addrs = ["%s:%d" % (hosts[i] if hosts else "127.0.0.1", p)
                      for i, p in enumerate(self.ports)]
        self.dir = tempfile.mkdtemp(prefix="mtcfs-cluster-")
        self.secret = None
        if secret:
            self.secret = os.path.join(self.dir, "secret")
            with open(self.secret, "w") as f:
                f.write(os.urandom(24).hex() + "\n")
        self.nodes = []
        self.started = {}       # rank -> (step, marker names, secs) of its last job start
        for i in range(n):
            opts = "ram_size=%s,listen=%s,peers=%s,restore_timeout=%d" % (
                (ram_sizes or {}).get(i, ram_size), self.addrs[i], ",".join(self.addrs),
                restore_timeout)
            if self.secret:
                opts += ",secret_file=" + self.secret
            if extra:
                opts += "," + extra
            name = "node%d" % i
            self.nodes.append(make_node(i, opts=opts, name=name) if make_node
                              else Daemon(opts=opts, name=name))

    # -- lifecycle --
    def start(self):
        for d in self.nodes:
            d.start()
        return self

    def close(self):
        errs = []
        for d in self.nodes:
            try:
                d.close()
            except Exception as e:  # keep closing the others
                errs.append(e)
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)
        if errs:
            raise errs[0]

    def __enter__(self):
        return self.start()

    def __exit__(self, *a):
        self.close()

    def lose_all_ram(self):
        """Every node is killed (-9) and comes back with an empty RAMDIR
        (the job rescheduled on new machines): only the bucket is left."""
        for d in self.nodes:
            d.kill9()
        for d in self.nodes:
            d.wipe_ramdir()
        for d in self.nodes:
            d.start()

    def resize(self, n):
        """The job rescheduled on nodes 0..n-1 (n at most the nodes built):
        every daemon stops; the first n come back on their RAMDIRs with a
        peers= table of only those n (what the node driver gives an n-node
        job: a yaml's nodes must equal its entries); the others stay down,
        their RAMDIRs kept for a later resize."""
        for d in self.nodes:
            d.stop()
        full = "peers=" + ",".join(self.addrs)
        for d in self.nodes[:n]:
            if not hasattr(d, "full_opts"):
                d.full_opts = d.opts
            d.opts = d.full_opts.replace(full, "peers=" + ",".join(self.addrs[:n]))
            d.start()
        self.n = n

    # -- the job, as Orbax plays it on every node --
    def yaml(self, job, rank, extra=""):
        return ("job-name: %s\nframework: orbax\nnode-rank: %d\nnodes: %d\n"
                "peers-per-node: %d\n%s\n%s" % (
                    job, rank, self.n, self.k, self.interval, extra))

    def job_start(self, job, ranks=None, extra="", timeout=60):
        """Every node (in parallel) writes replicator.yaml and waits for its
        markers. Returns {rank: restored step (0 = nothing)}."""
        ranks = list(range(self.n)) if ranks is None else ranks
        out, errs = {}, []

        def one(r):
            try:
                out[r] = self.node_start(r, job, extra, timeout)
            except Exception as e:
                errs.append((r, e))
        ts = [threading.Thread(target=one, args=(r,)) for r in ranks]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errs:
            raise AssertionError("job start failed on %s" % errs)
        return out

    def node_start(self, r, job, extra="", timeout=60):
        mnt = self.nodes[r].mnt
        yaml = os.path.join(mnt, "replicator.yaml")
        wait_until(lambda: not os.path.exists(yaml), timeout, "yaml absent on node %d" % r)
        with open(yaml + ".tmp", "w") as f:
            f.write(self.yaml(job, r, extra))
        os.rename(yaml + ".tmp", yaml)
        t0 = time.monotonic()
        wait_until(lambda: not os.path.exists(yaml), timeout, "yaml consumed on node %d" % r)
        failed = os.path.join(mnt, "replicator.failed")

        def markers():
            if os.path.exists(failed):
                raise AssertionError("node %d: replicator.failed: %s" % (r, open(failed).read()))
            m = [x for x in os.listdir(mnt) if x.endswith(".restore")]
            return m or None
        ms = wait_until(markers, timeout, "markers on node %d" % r)
        steps = {int(re.match(r".*-s(\d+)-n\d+-w\d+\.restore$", x).group(1)) for x in ms}
        assert len(steps) == 1, ms
        step = steps.pop()
        self.started[r] = (step, sorted(ms), time.monotonic() - t0)
        return step

    def holds(self, r, job):
        """{(owner, step): state} of node r's catalog for job."""
        return {(s["rank"], s["step"]): s["state"]
                for s in admin_ls(self.nodes[r].ramdir)["shards"] if s["job"] == job}

    def wait_replicated(self, job, step, timeout=60):
        """Every node's shard of step is committed locally and held by at
        least one other node."""
        def ok():
            have = {}
            for r in range(self.n):
                for (owner, st), state in self.holds(r, job).items():
                    if st == step and state in COMMITTED_STATES:
                        have.setdefault(owner, set()).add(r)
            return all(len(have.get(o, ())) >= min(2, self.n) for o in range(self.n))
        wait_until(ok, timeout, "step %d replicated on all nodes" % step)
