"""Integration-test harness: real mtcfs mounts in private directories.

A test starts `mtcfs -f -o OPTS RAMDIR MNT` (RAMDIR under /dev/shm, MNT under
/tmp), waits until the kernel shows the mount (never a fixed sleep), runs
its operations, and the harness always unmounts and reaps the daemon: via
the test's addCleanup, the Daemon context manager and an atexit hook (also
reached on SIGTERM/SIGINT). A daemon log showing "ERROR", a sanitizer report
or a non-zero exit after a clean unmount fails the test unless the test
declared it expected (Daemon.expect_log).

The daemons themselves (Daemon, the polls, mtcfs-admin, the atexit and
signal hooks) are tools/mtcfs_local.py, which the demo uses too; this
module re-exports them (harness.Daemon, harness.wait_until, ...) and adds
what only tests need: shard and manifest checks, MountTestCase, main().

Environment: MTCFS_BIN, MTCFS_ADMIN, MTCFS_BUILD (defaults: <repo>/build);
MTCFS_KEEP_TMP=1 keeps the temp directories; MTCFS_TEST_VERBOSE=1 prints
each daemon's log when it stops.

Standard library only: run with /usr/bin/python3.
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))
from crc32c import crc32c  # noqa: E402
from mtcfs_local import (  # noqa: E402,F401 (re-exported: the tests use harness.X)
    REPO, BUILD, MTCFS_BIN, MTCFS_ADMIN, KEEP_TMP, VERBOSE, DEFAULT_OPTS, READY_TIMEOUT,
    EXIT_TIMEOUT, COMMIT_TIMEOUT, UNMOUNT_RETRY, COMMITTED_STATES, BAD_LOG, wait_until,
    _unescape_mount_field, mount_fstype, mount_options, _run_quiet, _PORTS_GIVEN,
    free_ports, thread_stacks, force_unmount, _LIVE, _MAIN_PID, DaemonError, Daemon,
    _cleanup_all, _on_signal, admin, admin_ls)


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


def parity_dir(ramdir, job, step):
    """A step's erasure-code holding (rs:K+M): its parity fragments and
    group manifests, a record of the RAM tier beside the step's shards."""
    return os.path.join(ramdir, "shards", job, str(step), "parity")


def parity_steps(ramdir, job):
    """Sorted names of the steps of job with a parity holding here."""
    d = os.path.join(ramdir, "shards", job)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return sorted(s for s in names if os.path.isdir(os.path.join(d, s, "parity")))


def parity_files(ramdir, job, step=None):
    """Sorted files of a step's parity holding; without step, the steps
    with one (as the old RAMDIR/frags/JOB listing gave)."""
    if step is None:
        return parity_steps(ramdir, job)
    try:
        return sorted(os.listdir(parity_dir(ramdir, job, step)))
    except FileNotFoundError:
        return []


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
