"""What tests/bench/run and tests/bench/peerbench.py share: the cleanup
stack run on every way out, polling with a deadline, /proc readers, the
daemon log tail, and the mtcfs daemon, which is the integration tests'
harness.Daemon (tests/integration/harness.py) with the bench's ways.

Each script calls benchlib.setup(name) first: log lines are prefixed with
name and SIGINT/SIGTERM/SIGHUP end in the cleanup stack.

Standard library only: run with /usr/bin/python3.
"""

import atexit
import calendar
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
import harness  # noqa: E402
from cluster import free_ports  # noqa: E402,F401

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10

mount_fstype = harness.mount_fstype
_NAME = ["bench"]


def log(msg):
    sys.stderr.write("[%s %s] %s\n" % (_NAME[0], time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


class BenchError(Exception):
    pass


# --- cleanup: one LIFO stack, run once, on every way out ----------------------

_CLEANUP = []


def on_cleanup(fn, *args):
    """Register fn(*args) to run at cleanup (last registered runs first).
    Returns a token for forget()."""
    item = [fn, args]
    _CLEANUP.append(item)
    return item


def forget(token):
    if token in _CLEANUP:
        _CLEANUP.remove(token)


def run_cleanup():
    # No signal may interrupt the unmounts.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(s, signal.SIG_IGN)
        except (OSError, ValueError):
            pass
    while _CLEANUP:
        fn, args = _CLEANUP.pop()
        try:
            fn(*args)
        except Exception as e:           # keep going: reap everything
            log("cleanup: %s" % e)


def forget_calls(fn, *args):
    """Drop every registration of fn(*args): it has been done already."""
    for item in list(_CLEANUP):
        if item[0] == fn and tuple(item[1]) == args:
            forget(item)


def mounts_below(d):
    """The /proc/mounts lines of the mounts under directory d."""
    with open("/proc/mounts") as f:
        return [ln for ln in f
                if harness._unescape_mount_field(ln.split()[1]).startswith(d + "/")]


def _on_signal(signum, frame):
    log("signal %d: unmounting and stopping what was started" % signum)
    raise SystemExit(128 + signum)       # -> finally / atexit -> run_cleanup


def setup(name):
    """The script's log prefix; the cleanup stack on exit and on signals
    (replacing the harness's handlers: the bench unwinds through finally)."""
    _NAME[0] = name
    atexit.register(run_cleanup)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)


# --- small helpers ---------------------------------------------------------------

def wait_until(cond, timeout, what, interval=0.002, check=None, max_interval=0.05):
    """harness.wait_until, polling from 2 ms to 50 ms; a BenchError at the
    deadline."""
    return harness.wait_until(cond, timeout, what, interval=interval, check=check,
                              max_interval=max_interval, error=BenchError)


def quiet(argv, timeout=60):
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, -1, str(e).encode())


def read_sysctl(path):
    with open(path) as f:
        return f.read().strip()


def write_sysctl(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def cpu_busy_s():
    """Busy CPU seconds of the whole machine so far (all CPUs)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_s():
    """CPU seconds of this process and its reaped children (mtcfs,
    mtcfs-fsbench, mtcfs-admin)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def proc_cpu_s(pid):
    """utime + stime of all threads of a live process (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s():
    """CPU seconds of this process's reaped children (and theirs) so far."""
    t = os.times()
    return t.children_user + t.children_system


def proc_status_kib(pid, key):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def stats(samples):
    return {"samples": [round(x, 6) for x in samples],
            "min": min(samples), "median": statistics.median(samples),
            "max": max(samples)}


def human_size(n):
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= div and n % div == 0:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


LOG_TS = re.compile(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z ")


def log_epoch(line):
    """Wall-clock time (s since the epoch) of a daemon log line."""
    m = LOG_TS.match(line)
    if not m:
        return None
    y, mo, d, h, mi, sec, ms = (int(x) for x in m.groups())
    return calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0)) + ms / 1000.0


class LogTail:
    """Incremental reader of a daemon log (mtcfs -d) from an offset."""

    def __init__(self, path, since):
        self.path = path
        self.pos = since
        self.part = b""
        self.lines = []

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return
        if not data:
            return
        self.pos += len(data)
        data = self.part + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self.part = data
            return
        self.part = data[cut + 1:]
        self.lines.extend(data[:cut].decode(errors="replace").split("\n"))

    def find(self, regex):
        rx = re.compile(regex)
        self.poll()
        for ln in self.lines:
            m = rx.search(ln)
            if m:
                return m, ln
        return None

    def wait(self, regex, timeout, what, check=None, interval=0.001, fail=None):
        """Poll every `interval` s until a line matches; returns (match, line).
        A line matching `fail` raises BenchError."""
        rx = re.compile(regex)
        frx = re.compile(fail) if fail else None
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            self.poll()
            for ln in self.lines[seen:]:
                m = rx.search(ln)
                if m:
                    return m, ln
                if frx and frx.search(ln):
                    raise BenchError("%s: %s" % (what, ln))
            seen = len(self.lines)
            if check is not None:
                check()
            if time.monotonic() >= deadline:
                raise BenchError("timed out after %.0fs waiting for %s" % (timeout, what))
            time.sleep(interval)


# --- the daemon --------------------------------------------------------------------

class Daemon(harness.Daemon):
    """mtcfs -f [-d] -o OPTS RAMDIR MNT: the tests' harness.Daemon, with its
    log (appended across restarts) at log_path, stopped by the cleanup
    stack, and the bench's ways: a failure is a BenchError (the section
    fails, the others run), problems at stop are logged, not raised, and
    bad log lines are reported by bad_log_lines(), not at stop."""

    def __init__(self, bench, ramdir, mnt, opts, name, log_path, debug=True, env=None):
        super().__init__(ramdir, mnt, opts=opts, extra_args=["-d"] if debug else [],
                         env=env, name=name, binary=bench.mtcfs, log_path=log_path)
        self.bench = bench
        self.debug = debug
        self.token = None
        self.expect_log(".")

    def start(self):
        # (re-)registered on every start: after a restart on a fresh RAMDIR
        # tmpfs the daemon must stop before that tmpfs is unmounted
        forget(self.token)
        self.token = on_cleanup(self.stop)
        try:
            return super().start()
        except AssertionError as e:
            raise BenchError(str(e)) from None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def check_alive(self):
        try:
            super().check_alive()
        except harness.DaemonError:
            raise BenchError("mtcfs %s exited; see %s" % (self.name, self.log_path)) from None

    def kill9(self):
        """kill -9 (the daemon does not unmount), then clear the dead mount."""
        if self.proc is None:
            harness.force_unmount(self.mnt)
            return
        try:
            super().kill9()
        except AssertionError as e:
            raise BenchError(str(e)) from None

    def stop(self):
        forget(self.token)
        self.token = None
        try:
            super().stop()
        except harness.DaemonError as e:
            log("%s: %s" % (self.name, str(e).splitlines()[0]))

    def tail(self, since=None):
        return LogTail(self.log_path, self.log_size() if since is None else since)

    def write_yaml(self, text):
        """The application's replicator.yaml (written as .tmp + rename)."""
        y = os.path.join(self.mnt, "replicator.yaml")
        wait_until(lambda: not os.path.exists(y), 60, "replicator.yaml absent on %s" % self.name,
                   check=self.check_alive)
        with open(y + ".tmp", "w") as f:
            f.write(text)
        os.rename(y + ".tmp", y)

    def bad_log_lines(self):
        try:
            text = self.log_text()
        except OSError:
            return []
        return [ln for ln in text.splitlines()
                if re.search(r" ERROR |AddressSanitizer|runtime error:", ln)]
