"""Launching the real clients from the integration tests (standard library
only: the tests run under /usr/bin/python3, the clients under the venv
python that tests/run builds from tests/requirements.txt).

MTCFS_TEST_PY    the venv's python (tests/run exports it); else
                 /var/cache/mtcfs-test-venv/bin/python when it exists.
                 Missing: the tests skip, but FAIL when CI=true.
MTCFS_REAL_CLIENTS=1  run them in every build; by default they skip in a
                 sanitizer build (MTCFS_BUILD containing "asan" or "tsan"),
                 where each would take several minutes of the CI budget and
                 the release build already runs them.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_VENV_PY = "/var/cache/mtcfs-test-venv/bin/python"


def venv_python():
    p = os.environ.get("MTCFS_TEST_PY")
    if p:
        return p
    if os.access(DEFAULT_VENV_PY, os.X_OK):
        return DEFAULT_VENV_PY
    return None


def check_runnable(tc):
    """Call from setUp: skip (or fail in CI) when the clients cannot run.
    Returns the venv python."""
    build = os.environ.get("MTCFS_BUILD", "")
    if os.environ.get("MTCFS_REAL_CLIENTS") != "1" and (
            "asan" in build or "tsan" in build):
        tc.skipTest("real-client tests run in the release build only "
                    "(MTCFS_REAL_CLIENTS=1 runs them here)")
    py = venv_python()
    if py is None or not os.access(py, os.X_OK):
        msg = ("no venv python for the real clients (MTCFS_TEST_PY=%r, %s "
               "missing): tests/run builds it from tests/requirements.txt"
               % (os.environ.get("MTCFS_TEST_PY"), DEFAULT_VENV_PY))
        if os.environ.get("CI") == "true":
            tc.fail(msg)
        tc.skipTest(msg)
    return py


class Ranks:
    """N client processes (one per node), each in its own session, its
    output in a log file; always reaped (kill of its process group at the
    deadline or at cleanup)."""

    def __init__(self, tc, py, script, argvs, envs, name):
        self.tc = tc
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="mtcfs-client-%s-" % name)
        self.logs = []
        self.procs = []
        if os.environ.get("MTCFS_KEEP_TMP") != "1":
            tc.addCleanup(shutil.rmtree, self.dir, True)
        for i, (argv, env) in enumerate(zip(argvs, envs)):
            lp = os.path.join(self.dir, "rank%d.log" % i)
            self.logs.append(lp)
            full_env = dict(os.environ)
            full_env.update(env)
            full_env.setdefault("PYTHONUNBUFFERED", "1")
            # a crash in a framework's native code prints the Python stack
            full_env.setdefault("PYTHONFAULTHANDLER", "1")
            with open(lp, "wb") as log:
                self.procs.append(subprocess.Popen(
                    [py, os.path.join(HERE, script)] + argv,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    env=full_env, cwd=self.dir, start_new_session=True))
        tc.addCleanup(self.kill)

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def log_tail(self, i, n=60):
        try:
            with open(self.logs[i], "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def wait(self, timeout, check=None):
        """Wait for every rank to exit 0; fail with their logs otherwise.
        check() runs while waiting (e.g. "daemons alive")."""
        deadline = time.monotonic() + timeout
        timed_out = False
        while any(p.poll() is None for p in self.procs):
            if any(p.poll() is not None and p.returncode != 0
                   for p in self.procs):
                break             # one failed: the others would only hang
            if time.monotonic() > deadline:
                timed_out = True
                break
            if check is not None:
                check()
            time.sleep(0.1)
        self.kill()
        rcs = [p.returncode for p in self.procs]
        if timed_out or any(rc != 0 for rc in rcs):
            msg = ["%s: client ranks %s (exit codes %s)" % (
                self.name, "timed out after %.0f s" % timeout if timed_out
                else "failed", rcs)]
            for i in range(len(self.procs)):
                msg.append("--- %s rank %d log (%s) ---\n%s"
                           % (self.name, i, self.logs[i], self.log_tail(i)))
            self.tc.fail("\n".join(msg))
        sys.stdout.flush()
