"""Integration-test harness: real mtcfs mounts in private directories.

A test starts `mtcfs -f -o OPTS RAMDIR MNT` (RAMDIR under /dev/shm, MNT under
/tmp), waits until the kernel shows the mount (never a fixed sleep), runs
its operations, and the harness always unmounts and reaps the daemon: via
the test's addCleanup, the Daemon context manager and an atexit hook (also
reached on SIGTERM/SIGINT). A daemon log showing "ERROR", a sanitizer report
or a non-zero exit after a clean unmount fails the test unless the test
declared it expected (Daemon.expect_log).

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
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from crc32c import crc32c  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
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


def find_shard(ls, step, job="default", rank=0, worker=0):
    for s in ls.get("shards", []):
        if (s.get("job") == job and s.get("step") == step
                and s.get("rank") == rank and s.get("worker") == worker):
            return s
    return None


def shard_steps(ramdir, job="default"):
    """Sorted steps that mtcfs-admin ls lists for job (any state)."""
    return sorted(s["step"] for s in admin_ls(ramdir).get("shards", [])
                  if s.get("job") == job)


def wait_committed(ramdir, step, job="default", rank=0, worker=0,
                   timeout=COMMIT_TIMEOUT, daemon=None):
    """Poll mtcfs-admin ls until the shard is committed; returns its dict."""
    last = {}

    def cond():
        s = find_shard(admin_ls(ramdir), step, job, rank, worker)
        last["s"] = s
        return s if s is not None and s.get("state") in COMMITTED_STATES \
            else None
    try:
        return wait_until(cond, timeout, "shard %s step %d n%d-w%d committed"
                          % (job, step, rank, worker),
                          check=daemon.check_alive if daemon else None)
    except AssertionError as e:
        raise AssertionError("%s; last seen: %s" % (
            e, json.dumps(last.get("s"))[:2000])) from None


def shard_dir(ramdir, step, job="default", rank=0, worker=0):
    return os.path.join(ramdir, "shards", job, str(step),
                        "n%d-w%d" % (rank, worker))


# --- manifest checks ------------------------------------------------------------

def _ancestors(path):
    parts = path.split("/")[:-1]
    return {"/".join(parts[:i + 1]) for i in range(len(parts))}


def expected_entry(content):
    """(size, crc) of content: bytes-like, or an already known (size, crc)."""
    if isinstance(content, tuple):
        return content
    return len(content), crc32c(content)


def assert_manifest(tc, shard, files, dirs=(), modes=None, check_dirs=True):
    """Assert shard's manifest describes exactly files.

    files: {relpath: bytes or (size, crc32c int)} — the regular files.
    dirs: extra (e.g. empty) directories; the ancestors of every file are
    always expected. modes: optional {relpath: permission bits}.
    """
    exp_files = {p: expected_entry(c) for p, c in files.items()}
    exp_dirs = set(dirs)
    for p in exp_files:
        exp_dirs |= _ancestors(p)
    got_files, got_dirs, other = {}, set(), []
    for e in shard.get("files", []):
        t = e.get("type")
        if t == "file":
            tc.assertNotIn(e["path"], got_files, "duplicate manifest entry")
            got_files[e["path"]] = e
        elif t == "dir":
            got_dirs.add(e["path"])
        else:
            other.append(e)
    tc.assertEqual(sorted(got_files), sorted(exp_files),
                   "manifest file paths of step %s" % shard.get("step"))
    if check_dirs:
        tc.assertEqual(sorted(got_dirs), sorted(exp_dirs),
                       "manifest directories of step %s" % shard.get("step"))
    tc.assertEqual(other, [], "unexpected manifest entry types")
    for p, (size, crc) in exp_files.items():
        e = got_files[p]
        tc.assertEqual(e.get("size"), size, "size of %s" % p)
        tc.assertRegex(e.get("crc32c", ""), r"^[0-9a-f]{8}$",
                       "crc32c format of %s" % p)
        tc.assertEqual(e["crc32c"], "%08x" % crc, "crc32c of %s" % p)
        if modes and p in modes:
            tc.assertEqual(e.get("mode"), modes[p], "mode of %s" % p)
    tc.assertEqual(shard.get("bytes"), sum(s for s, _ in exp_files.values()),
                   "shard total bytes")
    tc.assertRegex(shard.get("hash", ""), r"^[0-9a-f]{64}$", "shard hash")


def assert_shard_on_disk(tc, ramdir, step, files, job="default", rank=0,
                         worker=0):
    """RAMDIR/shards/<job>/<step>/n<r>-w<w>/<path> holds each file's bytes."""
    base = shard_dir(ramdir, step, job, rank, worker)
    for p, content in files.items():
        fp = os.path.join(base, p)
        tc.assertTrue(os.path.isfile(fp), "shard file %s missing" % fp)
        if isinstance(content, tuple):
            from crc32c import crc32c_file
            tc.assertEqual((os.path.getsize(fp), crc32c_file(fp)), content,
                           "shard file %s" % fp)
        else:
            with open(fp, "rb") as f:
                tc.assertEqual(f.read(), bytes(content),
                               "bytes of shard file %s" % fp)


def read_tree(root):
    """{relpath: bytes} of the regular files under root (no symlink follow)."""
    out = {}
    for dp, dns, fns in os.walk(root):
        for fn in fns:
            fp = os.path.join(dp, fn)
            if os.path.isfile(fp) and not os.path.islink(fp):
                with open(fp, "rb") as f:
                    out[os.path.relpath(fp, root)] = f.read()
    return out


def write_file(path, data, mode=0o644, fsync=False):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        mv = memoryview(data)
        while mv:
            n = os.write(fd, mv)
            mv = mv[n:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


# --- unittest glue --------------------------------------------------------------

class MountTestCase(unittest.TestCase):
    """Each test gets a fresh daemon: self.fs (Daemon), self.mnt, self.ramdir.

    Override OPTS for other mount options; set START = False to start the
    daemon yourself (self.fs is created but not started).
    """
    OPTS = DEFAULT_OPTS
    START = True

    def setUp(self):
        self.fs = self.new_daemon(opts=self.OPTS)
        if self.START:
            self.fs.start()
        self.mnt = self.fs.mnt
        self.ramdir = self.fs.ramdir

    def new_daemon(self, **kw):
        d = Daemon(**kw)
        self.__dict__.setdefault("daemons", []).append(d)
        self.addCleanup(d.close)
        return d

    def wait_committed(self, step, **kw):
        kw.setdefault("daemon", self.fs)
        return wait_committed(self.ramdir, step, **kw)

    def assertErrno(self, err, fn, *args, **kw):
        """fn(*args) must raise OSError with errno err; returns it."""
        with self.assertRaises(OSError, msg="%s%r should fail with %s" % (
                getattr(fn, "__name__", fn), args, os.strerror(err))) as cm:
            r = fn(*args, **kw)
            if fn is os.open:           # it succeeded: don't leak the fd
                os.close(r)
        self.assertEqual(cm.exception.errno, err,
                         "%s%r: got %s, want %s" % (
                             getattr(fn, "__name__", fn), args,
                             cm.exception, os.strerror(err)))
        return cm.exception


class _Result(unittest.TextTestResult):
    """Prints the daemon log tail of a failing test."""

    def _dump(self, test):
        for d in getattr(test, "daemons", []):
            text = d.final_log if d.final_log is not None else d.log_tail(200)
            lines = (text or "").splitlines()[-60:]
            self.stream.write("\n--- %s log of %s (%s), last %d lines ---\n%s\n"
                              % (d.name, test.id(), d.log_path, len(lines),
                                 "\n".join(lines)))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._dump(test)

    def addError(self, test, err):
        super().addError(test, err)
        self._dump(test)


def main():
    """unittest.main() plus the plain 'N passed, M failed' closing line."""
    os.umask(0o022)
    runner = unittest.TextTestRunner(resultclass=_Result, verbosity=2,
                                     stream=sys.stdout)
    prog = unittest.main(testRunner=runner, exit=False)
    r = prog.result
    _cleanup_all()
    # a test can fail twice (its body, then its daemon check): count tests
    failed_ids = {t.id() for t, _ in r.failures + r.errors}
    failed_ids |= {t.id() for t in r.unexpectedSuccesses}
    skipped_ids = {t.id() for t, _ in r.skipped} - failed_ids
    failed = len(failed_ids)
    passed = max(0, r.testsRun - failed - len(skipped_ids))
    sys.stdout.write("%d passed, %d failed, %d skipped\n"
                     % (passed, failed, len(skipped_ids)))
    sys.stdout.flush()
    sys.exit(0 if failed == 0 and r.testsRun > 0 else 1)
