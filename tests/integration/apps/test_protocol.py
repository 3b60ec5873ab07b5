"""The application protocol of DESIGN §3 (issue 3), on one node.

replicator.yaml validation (one test per rule, exact message substrings
from fs/rcfg.c), $VAR expansion, the empty file, jax-init-info.txt, the
namespace clean-up, replicator.prerestore and the .restore markers, local
GC, and replays of the exact start-up/save/restore sequences of Orbax
(ReplicatorCheckpointManager / initialize_multi_tier_checkpointing) and of
the PyTorch reference (resiliency high-scale-ckpt utils) over several job
incarnations and an mtcfs restart.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/apps/test_protocol.py [-k NAME]
"""

import errno
import fcntl
import json
import os
import random
import struct
import subprocess
import sys
import threading
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
import crc32c as crcmod  # noqa: E402
from harness import (assert_manifest, read_file, read_tree,  # noqa: E402
                     wait_until, write_file)

MiB = 1 << 20
YAML = "replicator.yaml"
YAML_TMP = "replicator.yaml.tmp"
ERRORS = "replicator.errors"
FAILED = "replicator.failed"
PRERESTORE = "replicator.prerestore"
JAXINFO = "jax-init-info.txt"
PROTO_TIMEOUT = 30.0

# The messages of the rejected-config log line (log_err): expected in tests
# that feed invalid configs or corrupt shards on purpose.
REJECTED_LOG = r"replicator\.yaml rejected"
VERIFY_LOG = r"fails verification"


def pattern(seed, n):
    return random.Random(seed).randbytes(n)


# --- the exact texts the applications write ----------------------------------

def orbax_yaml(job, rank=0, nodes=1, dp=1, peer_ranks=(), minutes=30):
    """Orbax's _create_replicator_file: stripped lines, no final newline."""
    return "\n".join([
        "job-name: %s" % job,
        "framework: orbax",
        "assume-data-parallelism: %d" % dp,
        "node-rank: %d" % rank,
        "nodes: %d" % nodes,
        "peer-ranks: %s" % list(peer_ranks),
        "backup-interval-minutes: %d" % minutes,
    ])


def pytorch_yaml(job, rank=0, nodes=1, peers_per_node=1, minutes=30):
    """The PyTorch reference's yaml.dump(config, default_flow_style=False,
    sort_keys=False) of init_high_scale_ckpt's dict."""
    return ("job-name: %s\nframework: pytorch.distributed\nnode-rank: %d\n"
            "nodes: %d\npeers-per-node: %d\nbackup-interval-minutes: %d\n"
            % (job, rank, nodes, peers_per_node, minutes))


def simple_yaml(job, extra=""):
    return "job-name: %s\nnode-rank: 0\nnodes: 1\n%s" % (job, extra)


def flock_struct(l_type):
    return struct.pack("hhqqi4x", l_type, os.SEEK_SET, 0, 0, 0)


def write_all(fd, data):
    mv = memoryview(data)
    while mv:
        mv = mv[os.write(fd, mv):]


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- kill -9 with a watchdog --------------------------------------------------
#
# A daemon thread blocked in a request to its OWN mount (e.g. a stat() of the
# mount point) is never woken once the daemon's FUSE threads are killed: the
# process stays a zombie holding /dev/fuse and harness.Daemon.kill9() would
# wait forever. The watchdog reports the stuck threads and aborts the FUSE
# connection (fusectl), so the test fails with a diagnosis instead of hanging.

FUSECTL = "/sys/fs/fuse/connections"
KILL_TIMEOUT = 15.0


def mount_dev(mnt):
    """'major:minor' of the mount at exactly mnt, from /proc/self/mountinfo
    (no syscall into the mount itself)."""
    # never stat the mount itself: it may be the dead one
    mnt = os.path.abspath(mnt)
    real = os.path.join(os.path.realpath(os.path.dirname(mnt)),
                        os.path.basename(mnt))
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            p = line.split()
            if len(p) > 4 and harness._unescape_mount_field(p[4]) == real:
                found = p[2]
    return found


def thread_report(pid):
    out = []
    try:
        tids = sorted(os.listdir("/proc/%d/task" % pid), key=int)
    except OSError as e:
        return "(no /proc/%d/task: %s)" % (pid, e)
    for t in tids:
        base = "/proc/%d/task/%s/" % (pid, t)
        info = {}
        for k in ("comm", "stat", "stack", "wchan"):
            try:
                with open(base + k) as f:
                    info[k] = f.read().strip()
            except OSError as e:
                info[k] = "(%s)" % e.strerror
        state = info["stat"].rsplit(")", 1)[-1].split()[:1]
        out.append("  thread %s %s state %s wchan %s\n    %s" % (
            t, info["comm"], state, info["wchan"],
            info["stack"].replace("\n", "\n    ")))
    return "\n".join(out)


def abort_fuse_connection(mnt):
    dev = mount_dev(mnt)
    if dev is None:
        return "mount %s not found in mountinfo" % mnt
    major, minor = (int(x) for x in dev.split(":"))
    num = (major << 20) | minor
    if not os.path.isdir(os.path.join(FUSECTL, str(num))):
        subprocess.run(["mount", "-t", "fusectl", "none", FUSECTL],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    try:
        with open(os.path.join(FUSECTL, str(num), "abort"), "w") as f:
            f.write("1")
        return "aborted FUSE connection %d (%s)" % (num, dev)
    except OSError as e:
        return "could not abort FUSE connection %d: %s" % (num, e)


def safe_kill9(tc, d, timeout=KILL_TIMEOUT):
    """d.kill9(), but a daemon that does not die within timeout seconds of
    SIGKILL fails the test (with its threads' kernel stacks) instead of
    hanging it."""
    pid = d.proc.pid
    done = threading.Event()
    report = {}

    def watchdog():
        if done.wait(timeout):
            return
        report["threads"] = thread_report(pid)
        report["abort"] = abort_fuse_connection(d.mnt)

    t = threading.Thread(target=watchdog, daemon=True)
    t.start()
    try:
        d.kill9()
    finally:
        done.set()
        t.join()
    if report:
        tc.fail("mtcfs (pid %d) did not exit within %.0f s of SIGKILL: a "
                "thread is stuck in a FUSE request that nobody will answer "
                "(a request to its own mount?); %s to recover.\n%s"
                % (pid, timeout, report["abort"], report["threads"]))


def marker_step(name):
    """Orbax's _extract_step: '{job}-s{step}-n{rank}-w{w}.restore'."""
    return name.rsplit("-", 3)[1][1:]


class ProtoCase(harness.MountTestCase):
    """Helpers for the application side of the protocol."""

    OPTS = "ram_size=2G,jax_init_info"

    def m(self, *parts):
        return os.path.join(self.mnt, *parts)

    def top(self):
        return sorted(os.listdir(self.mnt))

    def markers(self):
        return sorted(n for n in os.listdir(self.mnt) if n.endswith(".restore"))

    def restart_kill9(self):
        safe_kill9(self, self.fs)
        self.fs.start()

    def alive(self):
        self.fs.check_alive()

    def wait(self, cond, msg, timeout=PROTO_TIMEOUT):
        return wait_until(cond, timeout, msg, check=self.alive)

    # -- writing replicator.yaml --

    def wait_yaml_gone(self, timeout=PROTO_TIMEOUT):
        self.wait(lambda: not os.path.lexists(self.m(YAML)),
                  "replicator.yaml to disappear", timeout)

    def put_yaml(self, text, via_tmp=False):
        """Write replicator.yaml as the apps do (waits until it is absent
        first). Returns the monotonic time of the write's completion."""
        self.wait_yaml_gone()
        data = text.encode() if isinstance(text, str) else text
        if via_tmp:                                 # Orbax
            with open(self.m(YAML_TMP), "wb") as f:
                f.write(data)
            os.replace(self.m(YAML_TMP), self.m(YAML))
        else:                                       # PyTorch reference
            with open(self.m(YAML), "wb") as f:
                f.write(data)
        return time.monotonic()

    def configure(self, text, via_tmp=False, workers=1):
        """Write the yaml, wait until accepted and until the markers are all
        there; asserts no .failed/.errors. Returns the sorted markers."""
        self.put_yaml(text, via_tmp)
        self.wait_yaml_gone()
        self.assertNoProblemFiles()
        ms = self.wait_markers(workers)
        self.assertNoProblemFiles()
        return ms

    def wait_markers(self, n=1):
        return self.wait(lambda: (lambda ms: ms if len(ms) >= n else None)(
            self.markers()), "%d .restore marker(s)" % n)

    def configure_warned(self, text, warnings, via_tmp=False):
        """Like configure(), for a yaml GKE runs and mtcfs accepts with
        warnings: replicator.errors holds exactly those lines (the app reads
        and deletes it) and there is no replicator.failed."""
        self.put_yaml(text, via_tmp)
        self.wait_yaml_gone()
        self.assertFalse(os.path.lexists(self.m(FAILED)),
                         os.path.lexists(self.m(FAILED)) and
                         read_file(self.m(FAILED)))
        got = read_file(self.m(ERRORS)).decode() if warnings else ""
        self.assertEqual(got, "".join(w + "\n" for w in warnings))
        if warnings:
            os.unlink(self.m(ERRORS))
        ms = self.wait_markers(1)
        self.assertNoProblemFiles()
        return ms

    def assertNoProblemFiles(self):
        for n in (FAILED, ERRORS):
            if os.path.lexists(self.m(n)):
                self.fail("%s exists: %r" % (n, read_file(self.m(n))))

    def prerestore(self):
        self.wait(lambda: os.path.exists(self.m(PRERESTORE)),
                  "replicator.prerestore")
        return read_file(self.m(PRERESTORE)).decode()

    def assert_nothing_restored(self, job, rank=0, workers=1):
        self.assertEqual(self.prerestore(), "{}\n")
        want = ["%s-s0-n%d-w%d.restore" % (job, rank, w)
                for w in range(workers)]
        self.assertEqual(self.markers(), want)
        for n in want:
            st = os.lstat(self.m(n))
            self.assertTrue(os.path.isfile(self.m(n))
                            and not os.path.islink(self.m(n)), n)
            self.assertEqual(st.st_size, 0, n)

    def assert_restore_markers(self, job, step, files, rank=0, workers=1):
        """prerestore names step; one relative symlink per worker that
        resolves inside the mount to exactly files."""
        self.assertEqual(self.prerestore(), "restore-step: %d\n" % step)
        want = ["%s-s%d-n%d-w%d.restore" % (job, step, rank, w)
                for w in range(workers)]
        self.assertEqual(self.markers(), want)
        mnt_real = os.path.realpath(self.mnt)
        for n in want:
            p = self.m(n)
            self.assertTrue(os.path.islink(p), "%s is not a symlink" % n)
            target = os.readlink(p)
            self.assertFalse(target.startswith("/"),
                             "%s -> %s is not relative" % (n, target))
            real = os.path.realpath(p)
            self.assertTrue(real.startswith(mnt_real + os.sep),
                            "%s resolves outside the mount: %s" % (n, real))
            self.assertTrue(os.path.isdir(p), "%s -> %s" % (n, target))
            self.assertEqual(read_tree(p), files, "files behind %s" % n)

    # -- the Orbax application --

    def ts_write(self, dirpath, key, value):
        """TensorStore file kvstore write (K.__lock + OFD lock + ftruncate +
        write + fsync + rename over K + fsync of the directory)."""
        full = os.path.join(dirpath, key)
        d = os.path.dirname(full)
        os.makedirs(d, exist_ok=True)
        lock_path = full + ".__lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, flock_struct(fcntl.F_WRLCK))
            os.ftruncate(fd, 0)
            write_all(fd, value)
            os.fsync(fd)
            os.rename(lock_path, full)
            fsync_dir(d)
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, flock_struct(fcntl.F_UNLCK))
        finally:
            os.close(fd)

    def orbax_save(self, step, seed, big=0):
        """Save a step as Orbax does; returns {relpath: bytes}."""
        tmp = self.m("%d.orbax-checkpoint-tmp-%d" % (step, 1000 + step))
        os.mkdir(tmp)
        files = {}
        for item, n in (("state", 4), ("metrics", 1)):
            itmp = os.path.join(tmp, "%s.orbax-checkpoint-tmp-%d"
                                % (item, 2000 + step))
            os.mkdir(itmp)
            for i in range(n):
                key = "params.layer%d/0.0" % i
                val = pattern(seed * 100 + i, 50000 + 1000 * i + seed)
                self.ts_write(itmp, key, val)
                files["%s/%s" % (item, key)] = val
                zarray = json.dumps({"shape": [i + 1], "seed": seed}).encode()
                self.ts_write(itmp, "params.layer%d/.zarray" % i, zarray)
                files["%s/params.layer%d/.zarray" % (item, i)] = zarray
            meta = json.dumps({"tree_metadata": {"step": step}}).encode()
            write_file(os.path.join(itmp, "_METADATA"), meta)
            files["%s/_METADATA" % item] = meta
            os.rename(itmp, os.path.join(tmp, item))
            fsync_dir(tmp)
        if big:
            blob = pattern(seed, big)
            write_file(os.path.join(tmp, "state", "big.bin"), blob)
            files["state/big.bin"] = blob
        cmeta = json.dumps({"item_handlers": {"state": "PyTreeHandler"},
                            "commit_timestamp_nsecs": step}).encode()
        write_file(os.path.join(tmp, "_CHECKPOINT_METADATA"), cmeta)
        files["_CHECKPOINT_METADATA"] = cmeta
        ok = ("Checkpoint commit was successful to %s"
              % self.m(str(step))).encode()
        write_file(os.path.join(tmp, "commit_success.txt"), ok)
        files["commit_success.txt"] = ok
        os.rename(tmp, self.m(str(step)))
        return files

    def orbax_startup(self, job):
        """initialize_multi_tier_checkpointing's file protocol; returns
        (restored step or 0, path of MNT/<step> or None)."""
        info = read_file(self.m(JAXINFO)).decode().split("\n")
        self.assertGreaterEqual(len(info), 2, info)
        self.assertTrue(info[0] and info[1], info)
        self.wait_yaml_gone()
        self.put_yaml(orbax_yaml(job), via_tmp=True)
        self.wait_yaml_gone()
        self.assertNoProblemFiles()
        # _block_and_process_restore_dir
        files = self.wait_markers()
        self.assertNoProblemFiles()
        self.orbax_markers = files
        f = files[0]
        step = marker_step(f)
        if step != "0":
            os.rename(self.m(f), self.m(step))
            return int(step), self.m(step)
        return 0, None

    # -- the PyTorch reference --

    def pytorch_startup(self, job):
        """block_and_proces_restore_dir; returns (step, MNT/step=N or None)."""
        self.put_yaml(pytorch_yaml(job))
        self.wait_yaml_gone()
        # handle_replicator_fail_situation
        self.assertNoProblemFiles()
        # process_replicator_prerestore: a YAML mapping or {}
        text = self.prerestore()
        if text.strip() == "{}":
            step = 0
        else:
            kv = dict(ln.split(": ", 1) for ln in text.splitlines())
            step = int(kv.get("restore-step", 0))
        f = self.wait_markers()[0]
        self.assertNoProblemFiles()
        mstep = int(f.rsplit("-", 3)[1][1:])
        self.assertEqual(mstep, step, "marker %s vs prerestore %r"
                         % (f, text))
        if mstep == 0:
            return 0, None
        target = self.m("step=%d" % mstep)
        os.rename(self.m(f), target)
        return mstep, target

    def pytorch_save(self, step, seed):
        os.close(os.open(self.m("step=%d-unfinished" % step),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        os.makedirs(self.m("step=%d" % step, "0"))
        files = {"0/__0_0.distcp": pattern(seed, 2 * MiB + seed),
                 "0/__0_1.distcp": pattern(seed + 1, 300000),
                 "0/.metadata": pattern(seed + 2, 4000)}
        for rel, data in files.items():
            with open(self.m("step=%d" % step, rel), "wb") as f:
                for off in range(0, len(data), 256 * 1024):
                    f.write(data[off:off + 256 * 1024])
                f.flush()
                os.fsync(f.fileno())
        os.unlink(self.m("step=%d-unfinished" % step))
        os.rename(self.m("step=%d" % step), self.m(str(step)))
        return files

    # -- checks --

    def wait_steps(self, job, steps, timeout=harness.COMMIT_TIMEOUT):
        """Wait until mtcfs-admin ls lists exactly steps (all committed)."""
        last = {}

        def cond():
            got = [s for s in harness.admin_ls(self.ramdir).get("shards", [])
                   if s.get("job") == job]
            last["v"] = [(s["step"], s.get("state")) for s in got]
            return (sorted(s["step"] for s in got) == sorted(steps)
                    and all(s.get("state") in harness.COMMITTED_STATES
                            for s in got))
        try:
            self.wait(cond, "steps %s of job %s" % (steps, job), timeout)
        except AssertionError as e:
            raise AssertionError("%s; last seen %s" % (e, last.get("v")))

    def assert_read_only(self, root):
        for dp, dns, fns in os.walk(root):
            for fn in fns:
                p = os.path.join(dp, fn)
                self.assertErrno(errno.EROFS, os.open, p, os.O_WRONLY)
            self.assertErrno(errno.EROFS, os.open, os.path.join(dp, "new"),
                             os.O_WRONLY | os.O_CREAT, 0o644)
            break

    def flip_byte(self, job, step, rel, off=100):
        p = os.path.join(harness.shard_dir(self.ramdir, step, job), rel)
        with open(p, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x5A]))


# =============================================================================
# (a) validation: one test per rule
# =============================================================================

VALID_TAIL = "framework: orbax\n"


class Validation(ProtoCase):

    def rejected(self, text, *substrings, via_tmp=False):
        """text is rejected with a one-line replicator.failed containing each
        substring; replicator.yaml is deleted; the daemon keeps serving and a
        later valid replicator.yaml works (and cleans the .failed away)."""
        self.fs.expect_log(REJECTED_LOG)
        before = self.top()
        self.put_yaml(text, via_tmp)
        self.wait_yaml_gone()
        self.assertTrue(os.path.exists(self.m(FAILED)),
                        "no replicator.failed; top: %s" % self.top())
        msg = read_file(self.m(FAILED)).decode()
        self.assertTrue(msg.endswith("\n"), repr(msg))
        self.assertEqual(len(msg.splitlines()), 1, repr(msg))
        for s in substrings:
            self.assertIn(s, msg)
        # nothing else happened: no clean-up, no markers, no prerestore
        self.assertEqual(self.top(), sorted(before + [FAILED]))
        self.assertFalse(os.path.lexists(self.m(ERRORS)))
        # still serving
        self.alive()
        write_file(self.m("probe"), b"still serving")
        self.assertEqual(read_file(self.m("probe")), b"still serving")
        os.unlink(self.m("probe"))
        # a later valid yaml works
        self.configure(simple_yaml("after-failure"))
        self.assert_nothing_restored("after-failure")
        self.assertEqual(self.top(), sorted([JAXINFO, PRERESTORE,
                                      "after-failure-s0-n0-w0.restore"]))
        return msg

    def test_not_yaml(self):
        msg = self.rejected("job-name: [unclosed\n", "invalid YAML at line ")
        sys.stderr.write("[%s] " % msg.strip())

    def test_not_yaml_via_tmp_rename(self):
        self.rejected("job-name: run\nnodes: 1\n  node-rank: 0\n",
                      "invalid YAML at line 3", via_tmp=True)

    def test_not_a_mapping(self):
        self.rejected("- a\n- b\n", "line 1: the top level must be a mapping "
                      "of keys (job-name: ..., nodes: ...), got a list")

    def test_scalar_document(self):
        self.rejected("just a string\n", "the top level must be a mapping",
                      "got a scalar")

    def test_wrong_type_list_for_int(self):
        self.rejected("job-name: j\nnode-rank: [1]\nnodes: 1\n",
                      "line 2: 'node-rank' expects an integer, got a list")

    def test_wrong_type_string_for_int(self):
        self.rejected("job-name: j\nnode-rank: 0\nnodes: two\n",
                      "line 3: 'nodes' expects a non-negative integer, "
                      'got "two"')

    def test_wrong_type_mapping_for_string(self):
        self.rejected("job-name: {a: 1}\nnode-rank: 0\nnodes: 1\n",
                      "line 1: 'job-name' expects a string, got a mapping")

    def test_wrong_type_scalar_for_list(self):
        self.rejected(simple_yaml("j", "peer-ranks: 1\n"),
                      "line 4: 'peer-ranks' expects a list of integers such "
                      'as [1, 2], got "1"')

    def test_bad_framework(self):
        self.rejected(simple_yaml("j", "framework: tensorflow\n"),
                      "line 4: 'framework' \"tensorflow\" is not one of "
                      "orbax, pytorch.distributed, pytorch")

    def test_missing_job_name(self):
        self.rejected("node-rank: 0\nnodes: 1\n",
                      "missing required key: job-name")

    def test_missing_node_rank(self):
        self.rejected("job-name: j\nnodes: 1\n",
                      "missing required key: node-rank")

    def test_missing_nodes(self):
        self.rejected("job-name: j\nnode-rank: 0\n",
                      "missing required key: nodes")

    def test_missing_all(self):
        self.rejected("framework: orbax\n",
                      "missing required keys: job-name, node-rank, nodes")

    def test_node_rank_not_below_nodes(self):
        self.rejected("job-name: j\nnode-rank: 1\nnodes: 1\n",
                      "line 2: 'node-rank' 1 must be less than 'nodes' 1 "
                      "(ranks are 0..0)")

    def test_negative_node_rank(self):
        self.rejected("job-name: j\nnode-rank: -1\nnodes: 1\n",
                      "line 2: 'node-rank' must not be negative, got -1")

    def test_negative_nodes(self):
        self.rejected("job-name: j\nnode-rank: 0\nnodes: -3\n",
                      "line 3: 'nodes' must not be negative, got -3")

    def test_zero_nodes(self):
        self.rejected("job-name: j\nnode-rank: 0\nnodes: 0\n",
                      "line 3: 'nodes' must be at least 1, got 0")

    def test_negative_interval(self):
        self.rejected(simple_yaml("j", "backup-interval-minutes: -5\n"),
                      "line 4: 'backup-interval-minutes' must not be "
                      "negative, got -5")

    def test_negative_peer_rank(self):
        self.rejected(simple_yaml("j", "peer-ranks: [-1]\n"),
                      "line 4: 'peer-ranks' entry must not be negative, "
                      "got -1")

    def test_peer_rank_out_of_range(self):
        self.rejected(simple_yaml("j", "peer-ranks: [1]\n"),
                      "line 4: 'peer-ranks' entry 1 is out of range: with "
                      "'nodes' 1 ranks are 0..0")

    def test_job_name_with_slash(self):
        self.rejected(simple_yaml("a/b"),
                      "line 1: 'job-name' \"a/b\" cannot be used as a file "
                      "name: it may contain only letters, digits, '.', '_' "
                      "and '-' (found '/')")

    def test_job_name_dot(self):
        self.rejected(simple_yaml(".hidden"),
                      "line 1: 'job-name' \".hidden\" cannot be used as a "
                      "file name: it must not start with '.' or '-'")

    def test_job_name_dotdot(self):
        self.rejected(simple_yaml(".."), "'job-name' \"..\" cannot be used",
                      "must not start with '.'")

    def test_job_name_empty(self):
        self.rejected('job-name: ""\nnode-rank: 0\nnodes: 1\n',
                      "'job-name' \"\" cannot be used as a file name: it is "
                      "empty")

    def test_more_than_one_node_needs_peer_tier(self):
        self.rejected(orbax_yaml("j", rank=0, nodes=2, dp=1, peer_ranks=[1]),
                      "nodes: 2 needs the peer tier")

    def test_yaml_directory_is_not_config(self):
        self.fs.expect_log(REJECTED_LOG)
        os.mkdir(self.m(YAML))
        # a mkdir does not wake the control thread; a later valid file
        # does. A rename of a directory onto the name does. (Its start-up
        # check may still be running on a slow build and take this one.)
        try:
            os.rmdir(self.m(YAML))
        except FileNotFoundError:
            pass
        os.mkdir(self.m("d.tmp"))
        os.rename(self.m("d.tmp"), self.m(YAML))
        self.wait_yaml_gone()
        self.assertEqual(read_file(self.m(FAILED)).decode(),
                         "replicator.yaml is not a regular file\n")
        self.configure(simple_yaml("j"))
        self.assert_nothing_restored("j")

    def test_failed_then_valid_restores(self):
        # a failure in the middle of a job's life does not lose its steps
        self.configure(simple_yaml("run"))
        files = self.orbax_save(3, seed=3)
        self.wait_committed(3, job="run")
        self.fs.expect_log(REJECTED_LOG)
        self.put_yaml(simple_yaml("run", "workers-per-node: two\n"))
        self.wait_yaml_gone()
        self.assertIn("'workers-per-node' expects", read_file(self.m(FAILED))
                      .decode())
        self.assertEqual(sorted(os.listdir(self.m("3"))),
                         sorted({p.split("/")[0] for p in files}))
        self.configure(simple_yaml("run"))
        self.assert_restore_markers("run", 3, files)


class GkeAccepts(ProtoCase):
    """What GKE's replicator runs is configured, not failed (issue 12);
    where mtcfs reads it differently, one WARNING line each in
    replicator.errors. Each "GKE:" fact was checked by running GKE's
    util.read_config / coordinator code on the same text."""

    W = "WARNING: replicator.yaml: "

    def test_nemo_reference_single_node(self):
        # GKE: master-port defaults to 4242, master is read only by its
        # VM_TEST platform; both peer keys: peer-ranks wins (restore.py
        # sends it, the coordinator ignores peers-per-node)
        self.configure_warned(
            "job-name: nemo\nframework: pytorch.distributed\nnode-rank: 0\n"
            "nodes: 1\npeer-ranks: []\npeers-per-node: 1\n"
            "backup-interval-minutes: 30\nmaster: tcp://nemo-0.nemo:4242\n"
            "master-port: 4242\n", [])
        self.assert_nothing_restored("nemo")

    def test_unknown_key(self):
        # GKE: ignored
        self.configure_warned(simple_yaml("j", "colour: red\nx: {a: [1]}\n"), [
            self.W + 'line 4: unknown key "colour" ignored',
            self.W + 'line 5: unknown key "x" ignored'])
        self.assert_nothing_restored("j")

    def test_duplicate_key(self):
        # GKE (PyYAML): the last one counts
        self.configure_warned("job-name: a\nnode-rank: 0\nnodes: 1\n"
                              "job-name: b\n", [
            self.W + "line 4: duplicate key 'job-name' (first given at line "
            "1): the last one counts, as in GKE"])
        self.assert_nothing_restored("b")

    def test_fractional_interval(self):
        # GKE: 0.5 is a float, backups every 30 s; names are per minute
        self.configure_warned(simple_yaml("j", "backup-interval-minutes: 0.5\n"),
                              [self.W + "line 4: 'backup-interval-minutes' 0.5 "
                               "is rounded up to 1: mtcfs backs up at most "
                               "once a minute"])
        self.assert_nothing_restored("j")

    def test_peer_rank_self_on_one_node(self):
        self.configure_warned(simple_yaml("j", "peer-ranks: [0]\n"), [
            self.W + "line 4: 'peer-ranks' entry 0 is this node's own "
            "'node-rank': ignored"])
        self.assert_nothing_restored("j")

    def test_both_interval_keys(self):
        # GKE's coordinator reads only backup-interval-minutes
        self.configure_warned(simple_yaml("j", "backup-interval-minutes: 30\n"
                                          "backup-interval-steps: 100\n"), [
            self.W + "'backup-interval-minutes' (line 4) and "
            "'backup-interval-steps' (line 5) are both given: the minutes "
            "are used, as in GKE"])

    def test_dp_not_dividing_nodes(self):
        # GKE logs an error in infer_missing_meta and infers nothing
        self.configure_warned(simple_yaml("j", "assume-data-parallelism: 2\n"),
                              [self.W + "line 4: 'nodes' 1 is not divisible by "
                               "'assume-data-parallelism' 2: data parallelism "
                               "is not assumed"])

    def test_octal_and_quoted_ints(self):
        # GKE: plain 010 is YAML 1.1 octal 8, "01" is int("01") = 1
        self.configure_warned("job-name: j\nnode-rank: 00\nnodes: \"01\"\n"
                              "workers-per-node: 010\n", [])
        self.wait_markers(8)
        self.assertEqual(self.markers(), sorted("j-s0-n0-w%d.restore" % w
                                                for w in range(8)))


# =============================================================================
# (b) $VAR / ${VAR}, (c) empty file, jax-init-info.txt
# =============================================================================

class EnvExpansion(ProtoCase):
    """$VARs read only allow-listed names (rcfg_env_allowed: the JobSet /
    torchrun pod variables and MTCFS_YAML_*); GKE expands any variable of
    its own environment, but mtcfs's may hold credentials that any mount
    user could then read back through file names or messages."""
    START = False
    SECRET = "tok-9f8e7d6c5b4a"

    def setUp(self):
        super().setUp()
        self.fs.env.update({"MTCFS_YAML_T_JOB": "envjob", "NODE_RANK": "0",
                            "NNODES": "1", "MTCFS_YAML_T_WORKERS": "2",
                            "MTCFS_YAML_T_BAD": "abc",
                            "SECRET_TOKEN": self.SECRET})
        self.fs.env.pop("MTCFS_YAML_T_UNSET", None)
        self.fs.start()

    def test_dollar_and_braces(self):
        self.configure("job-name: ${MTCFS_YAML_T_JOB}-x.$MTCFS_YAML_T_JOB\n"
                       "node-rank: $NODE_RANK\n"
                       "nodes: ${NNODES}\n"
                       "workers-per-node: $MTCFS_YAML_T_WORKERS\n"
                       "peer-ranks: []\n", workers=2)
        self.assert_nothing_restored("envjob-x.envjob", workers=2)

    def test_expansion_in_orbax_format(self):
        self.configure(orbax_yaml("$MTCFS_YAML_T_JOB").replace(
            "node-rank: 0", "node-rank: ${NODE_RANK}"), via_tmp=True)
        self.assert_nothing_restored("envjob")

    def test_unset_variable(self):
        # GKE (os.path.expandvars): an unset variable stays as written
        self.rejected_env("job-name: ${MTCFS_YAML_T_UNSET}\nnode-rank: 0\n"
                          "nodes: 1\n", "line 1: 'job-name' "
                          "\"${MTCFS_YAML_T_UNSET}\" cannot be used as a file "
                          "name", "($MTCFS_YAML_T_UNSET is not set)")

    def test_expanded_value_invalid(self):
        self.rejected_env("job-name: j\nnode-rank: $MTCFS_YAML_T_BAD\nnodes: 1\n",
                          "line 2: 'node-rank' expects a non-negative "
                          'integer, got "$MTCFS_YAML_T_BAD" (after $VAR '
                          "expansion)")

    def test_invalid_reference_is_literal(self):
        # GKE: "${1x}" names a variable "1x"; unset, it stays as written
        self.rejected_env("job-name: ${1x}\nnode-rank: 0\nnodes: 1\n",
                          "'job-name' \"${1x}\" cannot be used as a file name")

    def test_secret_never_echoed(self):
        # rejected: the message quotes the reference, not the value
        msg = self.rejected_env("job-name: $SECRET_TOKEN\nnode-rank: 0\n"
                                "nodes: 1\n", "'job-name' \"$SECRET_TOKEN\"",
                                "$SECRET_TOKEN is not expanded")
        self.assertNotIn(self.SECRET, msg)
        # accepted (master is not used): the warning names only the variable
        self.configure_warned(simple_yaml("j", "master: ${SECRET_TOKEN}\n"), [
            "WARNING: replicator.yaml: line 4: 'master': $SECRET_TOKEN is not "
            "a variable mtcfs expands (see README); kept as written"])
        for name in os.listdir(self.mnt):
            self.assertNotIn(self.SECRET, name)
        self.assertNotIn(self.SECRET, self.fs.log_text())

    rejected_env = Validation.rejected
    configure_warned = ProtoCase.configure_warned


class EmptyYaml(ProtoCase):

    def test_empty_file_is_deleted_and_ignored(self):
        write_file(self.m("junk.tmp"), b"stays")
        os.mkdir(self.m("7.orbax-checkpoint-tmp-1"))
        before = self.top()
        # created empty (open O_CREAT + close)
        self.put_yaml(b"")
        self.wait_yaml_gone()
        # whitespace only, via tmp + rename
        self.put_yaml(b"  \n\n\t\n", via_tmp=True)
        self.wait_yaml_gone()
        self.assertEqual(self.top(), before)
        for n in (FAILED, ERRORS, PRERESTORE):
            self.assertFalse(os.path.lexists(self.m(n)), n)
        self.assertEqual(self.markers(), [])
        # still serves, and a later valid file configures
        self.configure(simple_yaml("j"))
        self.assert_nothing_restored("j")
        self.assertFalse(os.path.lexists(self.m("junk.tmp")))


class JaxInitInfo(ProtoCase):
    """jax-init-info.txt is written by default (GKE's driver always writes
    it; Orbax's and MaxText's _retrieve_jax_init_info wait 900 s for it and
    read its first two lines: process id, coordinator address)."""
    START = False

    def test_default(self):
        self.fs.opts = "ram_size=2G"
        self.fs.start()
        self.assertEqual(self.top(), sorted([JAXINFO]))
        self.assertEqual(read_file(self.m(JAXINFO)), b"0\n127.0.0.1:8476\n")

    def test_rank_and_port(self):
        self.fs.opts = "ram_size=2G,jax_init_info,rank=3,jax_port=9123"
        self.fs.start()
        self.assertEqual(read_file(self.m(JAXINFO)), b"3\n127.0.0.1:9123\n")
        # survives the clean-up of a valid yaml
        self.configure(simple_yaml("j"))
        self.assertEqual(read_file(self.m(JAXINFO)), b"0\n127.0.0.1:9123\n")

    def test_turned_off(self):
        for opt in ("no_jax_init_info", "jax_init_info=0"):
            self.fs.opts = "ram_size=2G," + opt
            self.fs.start()
            self.assertNotIn(JAXINFO, self.top())
            self.configure(simple_yaml("j"))
            self.assertEqual(self.top(), sorted([PRERESTORE,
                                                 "j-s0-n0-w0.restore"]))
            self.fs.stop()


def nemo_yaml(job, rank, nodes):
    """A NeMo-reference-style yaml: both peer keys (the reference writes
    peers-per-node and, given peer ranks, peer-ranks too) and GKE's own
    master / master-port."""
    return ("job-name: %s\nframework: pytorch.distributed\nnode-rank: %d\n"
            "nodes: %d\npeer-ranks: [%d]\npeers-per-node: 1\n"
            "backup-interval-minutes: 30\nmaster: tcp://%s-0:4242\n"
            "master-port: 4242\n" % (job, rank, nodes, (rank + 1) % nodes, job))


def start_ranks(c, job, ranks, text=nemo_yaml, timeout=60):
    """Node i writes text(job, ranks[i], n) (in parallel, as the pods do)
    and waits for its markers; replicator.failed or .errors fails."""
    errs = []

    def one(i):
        try:
            mnt = c.nodes[i].mnt
            y = os.path.join(mnt, YAML)
            wait_until(lambda: not os.path.exists(y), timeout, "yaml absent")
            with open(y + ".tmp", "w") as f:
                f.write(text(job, ranks[i], c.n))
            os.rename(y + ".tmp", y)

            def ready():
                for bad in (FAILED, ERRORS):
                    if os.path.exists(os.path.join(mnt, bad)):
                        raise AssertionError("node %d: %s: %s" % (
                            i, bad, read_file(os.path.join(mnt, bad))))
                # this job's markers: the last job's stay until the yaml
                # is taken
                return [x for x in os.listdir(mnt) if x.endswith(".restore")
                        and x.startswith(job + "-s")] or None
            wait_until(ready, timeout, "markers on node %d" % i)
        except Exception as e:
            errs.append((i, e))
    ts = [threading.Thread(target=one, args=(i,)) for i in range(c.n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise AssertionError("job start failed: %s" % errs)


class ClusterProtocol(unittest.TestCase):
    """jax-init-info.txt and the NeMo-style yaml on real 2- and 3-node
    clusters (cluster.py: separate daemons on loopback)."""

    def jaxinfo(self, d):
        p = os.path.join(d.mnt, JAXINFO)
        return read_file(p) if os.path.exists(p) else None

    def test_two_nodes_jax_info_and_nemo_yaml(self):
        from cluster import Cluster
        c = Cluster(2, ram_size="256M")
        self.addCleanup(c.close)
        # rank 0 on its own loopback address: the host in the file must be
        # rank 0's (peers= entry 0), not this node's
        old, new = c.addrs[0], c.addrs[0].replace("127.0.0.1", "127.0.0.2")
        for d in c.nodes:
            d.opts = d.opts.replace(old, new)
        c.addrs[0] = new
        c.start()
        # before any replicator.yaml: what Orbax reads first
        self.assertEqual(self.jaxinfo(c.nodes[0]), b"0\n127.0.0.2:8476\n")
        self.assertEqual(self.jaxinfo(c.nodes[1]), b"1\n127.0.0.2:8476\n")
        start_ranks(c, "nemo", [0, 1])
        for r in (0, 1):
            self.assertEqual(self.jaxinfo(c.nodes[r]),
                             ("%d\n127.0.0.2:8476\n" % r).encode())
            self.assertEqual(sorted(x for x in os.listdir(c.nodes[r].mnt)
                                    if x.endswith(".restore")),
                             ["nemo-s0-n%d-w0.restore" % r])

    def test_rank_change_rewrites_jax_info(self):
        from cluster import Cluster
        c = Cluster(3, ram_size="256M")
        self.addCleanup(c.close)
        coord = c.addrs[0]
        for i, d in enumerate(c.nodes):
            d.opts = ("ram_size=256M,listen=%s,coordinator=%s,restore_timeout=15,"
                      "secret_file=%s" % (c.addrs[i], coord, c.secret))
        c.start()
        # ranks come from replicator.yaml here: nothing to write before it
        for d in c.nodes:
            self.assertIsNone(self.jaxinfo(d))
        start_ranks(c, "a", [0, 1, 2])
        for i in range(3):
            self.assertEqual(self.jaxinfo(c.nodes[i]),
                             ("%d\n127.0.0.1:8476\n" % i).encode())
        # the job restarts with nodes 1 and 2 swapped (their daemons too:
        # a running node keeps its rank)
        for i in (1, 2):
            c.nodes[i].stop()
            c.nodes[i].start()
        start_ranks(c, "b", [0, 2, 1])
        for i, r in enumerate([0, 2, 1]):
            self.assertEqual(self.jaxinfo(c.nodes[i]),
                             ("%d\n127.0.0.1:8476\n" % r).encode())


# =============================================================================
# (d) Orbax and (e) PyTorch replays over job incarnations
# =============================================================================

class OrbaxReplay(ProtoCase):

    def test_orbax_two_incarnations_and_mtcfs_restart(self):
        job = "run1"
        # --- incarnation 1: nothing to restore
        step, path = self.orbax_startup(job)
        self.assertEqual(self.orbax_markers, ["run1-s0-n0-w0.restore"])
        self.assertEqual(step, 0)
        self.assert_nothing_restored(job)
        saved = {}
        for s in (10, 20):
            saved[s] = self.orbax_save(s, seed=s)
            sh = self.wait_committed(s, job=job)
            assert_manifest(self, sh, saved[s])
        self.wait_steps(job, [20])                      # local GC
        self.assertNotIn("10", self.top())
        # --- incarnation 2 (the app restarted, mtcfs did not)
        step, path = self.orbax_startup(job)
        self.assertEqual(self.orbax_markers, ["run1-s20-n0-w0.restore"])
        self.assertEqual(step, 20)
        self.assertEqual(self.prerestore(), "restore-step: 20\n")
        self.assertTrue(os.path.islink(path))
        self.assertFalse(os.readlink(path).startswith("/"))
        self.assertEqual(self.top(), sorted([JAXINFO, "20", PRERESTORE]))
        self.assertEqual(read_tree(path), saved[20])
        for rel, data in saved[20].items():             # single reads too
            with open(os.path.join(path, rel), "rb") as f:
                self.assertEqual(f.read(), data, rel)
        self.assert_read_only(path)
        self.assert_read_only(os.path.join(path, "state"))
        self.assertErrno(errno.EROFS, os.truncate,
                         os.path.join(path, "commit_success.txt"), 0)
        saved[30] = self.orbax_save(30, seed=30)
        self.wait_committed(30, job=job)
        self.wait_steps(job, [30])       # the restored 20 goes after 30
        # --- mtcfs itself restarts (kill -9), then incarnation 3
        self.restart_kill9()
        self.wait_steps(job, [30])
        step, path = self.orbax_startup(job)
        self.assertEqual(self.orbax_markers, ["run1-s30-n0-w0.restore"])
        self.assertEqual(step, 30)
        self.assertEqual(self.top(), sorted([JAXINFO, "30", PRERESTORE]))
        self.assertEqual(read_tree(path), saved[30])
        saved[40] = self.orbax_save(40, seed=40)
        sh = self.wait_committed(40, job=job)
        assert_manifest(self, sh, saved[40])
        self.wait_steps(job, [40])


class PyTorchReplay(ProtoCase):
    OPTS = "ram_size=2G"

    def test_pytorch_two_incarnations(self):
        job = "run2"
        step, path = self.pytorch_startup(job)
        self.assertEqual(step, 0)
        self.assert_nothing_restored(job)
        saved = {}
        for s in (5, 10):
            saved[s] = self.pytorch_save(s, seed=s)
            assert_manifest(self, self.wait_committed(s, job=job), saved[s])
        self.wait_steps(job, [10])
        # incarnation 2
        step, path = self.pytorch_startup(job)
        self.assertEqual(step, 10)
        self.assertEqual(path, self.m("step=10"))
        self.assertTrue(os.path.islink(path))
        # jax-init-info.txt is there by default, as GKE's driver writes it
        self.assertEqual(self.top(), sorted([JAXINFO, PRERESTORE, "step=10"]))
        self.assertEqual(read_tree(path), saved[10])
        self.assert_read_only(os.path.join(path, "0"))
        saved[15] = self.pytorch_save(15, seed=15)
        assert_manifest(self, self.wait_committed(15, job=job), saved[15])
        self.wait_steps(job, [15])
        # incarnation 3, after an mtcfs restart
        self.restart_kill9()
        step, path = self.pytorch_startup(job)
        self.assertEqual(step, 15)
        self.assertEqual(read_tree(path), saved[15])


# =============================================================================
# (f) workers-per-node, (g) verification, (h) clean-up, (j) GC, restart
# =============================================================================

class Markers(ProtoCase):

    def test_workers_per_node_three(self):
        cfg = simple_yaml("wk", "workers-per-node: 3\n")
        self.configure(cfg, workers=3)
        self.assert_nothing_restored("wk", workers=3)
        files = self.orbax_save(5, seed=5)
        self.wait_committed(5, job="wk")
        self.configure(cfg, workers=3)
        self.assert_restore_markers("wk", 5, files, workers=3)
        targets = {os.readlink(self.m(n)) for n in self.markers()}
        self.assertEqual(len(targets), 1, targets)
        reals = {os.path.realpath(self.m(n)) for n in self.markers()}
        self.assertEqual(len(reals), 1, reals)
        # Orbax renames one of them
        os.rename(self.m("wk-s5-n0-w1.restore"), self.m("5"))
        self.assertEqual(read_tree(self.m("5")), files)

    def test_marker_target_is_read_only(self):
        self.configure(simple_yaml("ro"))
        files = self.orbax_save(8, seed=8)
        self.wait_committed(8, job="ro")
        self.configure(simple_yaml("ro"))
        self.assert_restore_markers("ro", 8, files)
        mk = self.m(self.markers()[0])
        p = os.path.join(mk, "commit_success.txt")
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_TRUNC,
                      os.O_WRONLY | os.O_APPEND):
            self.assertErrno(errno.EROFS, os.open, p, flags)
        self.assertErrno(errno.EROFS, os.open, os.path.join(mk, "new"),
                         os.O_WRONLY | os.O_CREAT, 0o644)
        self.assertErrno(errno.EROFS, os.mkdir, os.path.join(mk, "d"))
        self.assertErrno(errno.EROFS, os.unlink, p)
        self.assertErrno(errno.EROFS, os.rename, p, self.m("stolen"))
        self.assertEqual(read_tree(mk), files)

    def test_nodes_rank_in_marker_names(self):
        # rank=N mount option is for jax-init-info only; the marker uses
        # node-rank of the yaml
        self.configure(simple_yaml("nr", "workers-per-node: 2\n"), workers=2)
        self.assert_nothing_restored("nr", rank=0, workers=2)


class Verification(ProtoCase):

    def test_flipped_byte_in_only_step(self):
        self.fs.expect_log(VERIFY_LOG)
        self.configure(simple_yaml("vf"))
        files = self.orbax_save(5, seed=5)
        self.wait_committed(5, job="vf")
        self.flip_byte("vf", 5, "state/params.layer0/0.0")
        self.put_yaml(simple_yaml("vf"))
        self.wait_yaml_gone()
        self.wait_markers()
        self.assertFalse(os.path.lexists(self.m(FAILED)))
        errs = read_file(self.m(ERRORS)).decode()
        self.assertIn("step 5", errs)
        self.assertIn("fails verification", errs)
        self.assertTrue(errs.endswith("\n"))
        self.assert_nothing_restored("vf")
        s = harness.find_shard(harness.admin_ls(self.ramdir), 5, job="vf")
        self.assertEqual(s and s.get("state"), "bad", s)
        # the job goes on: a new step commits and is restored
        os.unlink(self.m(ERRORS))
        files6 = self.orbax_save(6, seed=6)
        self.wait_committed(6, job="vf")
        self.configure(simple_yaml("vf"))
        self.assert_restore_markers("vf", 6, files6)
        del files

    def test_fallback_to_older_verified_step(self):
        # Before any replicator.yaml there is no GC (job "default"), so two
        # steps can coexist; the newest is corrupted behind mtcfs's back.
        self.fs.expect_log(VERIFY_LOG)
        f5 = self.orbax_save(5, seed=5)
        self.wait_committed(5)
        f6 = self.orbax_save(6, seed=6)
        self.wait_committed(6)
        self.assertEqual(harness.shard_steps(self.ramdir), [5, 6])
        self.flip_byte("default", 6, "_CHECKPOINT_METADATA", off=3)
        self.put_yaml(orbax_yaml("default"), via_tmp=True)
        self.wait_yaml_gone()
        self.wait_markers()
        errs = read_file(self.m(ERRORS)).decode()
        self.assertIn("step 6", errs)
        self.assertNotIn("step 5", errs)
        self.assertFalse(os.path.lexists(self.m(FAILED)))
        self.assert_restore_markers("default", 5, f5)
        del f6


class Cleanup(ProtoCase):

    def test_stale_things_are_cleaned(self):
        self.configure(simple_yaml("cl"))
        committed = self.orbax_save(5, seed=5)
        self.wait_committed(5, job="cl")
        # the leftovers of a crashed incarnation
        os.symlink("cl-s3-n0-w0.restore", self.m("7"))
        write_file(self.m("junk.tmp"), b"junk")
        os.makedirs(self.m("9.orbax-checkpoint-tmp-77", "state"))
        write_file(self.m("9.orbax-checkpoint-tmp-77", "state", "f"), b"half")
        os.mkdir(self.m("11"))                      # digits, uncommitted
        write_file(self.m("11", "f"), b"uncommitted")
        os.makedirs(self.m("step=12", "0"))
        write_file(self.m("step=12-unfinished"), b"")
        write_file(self.m("old-s3-n0-w0.restore"), b"")
        os.symlink(".mtcfs/old/3/n0-w0", self.m("old-s4-n0-w0.restore"))
        write_file(self.m(ERRORS), b"old error\n")
        write_file(self.m(FAILED), b"old failure\n")
        write_file(self.m("replicator.yaml.tmp"), b"job-name: stale\n")
        os.symlink("/nonexistent", self.m("dangling"))
        self.assertIn(PRERESTORE, self.top())
        self.put_yaml(simple_yaml("cl"))
        self.wait_yaml_gone()
        self.wait_markers()
        self.assertEqual(self.top(), sorted([JAXINFO, "cl-s5-n0-w0.restore",
                                      PRERESTORE]))
        self.assert_restore_markers("cl", 5, committed)
        # committed data stays in the store
        self.assertEqual(harness.shard_steps(self.ramdir, "cl"), [5])

    def test_cleanup_keeps_only_jax_info_even_when_nothing(self):
        write_file(self.m("a.tmp"), b"x")
        os.mkdir(self.m("3"))
        self.configure(simple_yaml("cl2"))
        self.assertEqual(self.top(), sorted([JAXINFO, "cl2-s0-n0-w0.restore",
                                      PRERESTORE]))


class GC(ProtoCase):

    def test_older_steps_dropped_after_commit(self):
        self.configure(simple_yaml("gc"))
        f10 = self.orbax_save(10, seed=10)
        self.wait_committed(10, job="gc")
        self.pytorch_save(20, seed=20)
        self.wait_committed(20, job="gc")
        self.wait_steps("gc", [20])
        self.wait(lambda: "10" not in self.top(), "MNT/10 gone")
        self.assertEqual(self.top(), sorted([JAXINFO, "20", PRERESTORE,
                                      "gc-s0-n0-w0.restore"]))
        self.assertFalse(os.path.exists(
            harness.shard_dir(self.ramdir, 10, "gc")))
        del f10

    def test_restored_step_kept_until_newer_commit(self):
        self.configure(simple_yaml("gr"))
        f10 = self.orbax_save(10, seed=10)
        self.wait_committed(10, job="gr")
        self.configure(simple_yaml("gr"))
        self.assert_restore_markers("gr", 10, f10)
        # an in-place digits dir + commit_success.txt
        os.mkdir(self.m("20"))
        write_file(self.m("20", "w"), b"twenty")
        self.assertEqual(harness.shard_steps(self.ramdir, "gr"), [10])
        write_file(self.m("20", "commit_success.txt"), b"ok")
        self.wait_committed(20, job="gr")
        self.wait_steps("gr", [20])

    def test_restored_step_leaves_mnt_when_dropped(self):
        # Orbax renamed the marker to MNT/10; once a newer commit lets GC
        # drop step 10 from the store, MNT/10 must go too ("dropped from the
        # store and from MNT") rather than stay as a dangling symlink.
        self.configure(simple_yaml("gd"))
        self.orbax_save(10, seed=10)
        self.wait_committed(10, job="gd")
        step, path = self.orbax_startup("gd")
        self.assertEqual((step, os.path.islink(path)), (10, True))
        self.orbax_save(20, seed=20)
        self.wait_committed(20, job="gd")
        self.wait_steps("gd", [20])
        self.assertFalse(os.path.exists(path), "MNT/10 still resolves")
        try:
            self.wait(lambda: not os.path.lexists(path),
                      "MNT/10 (the restored step's symlink) gone", timeout=5)
        except AssertionError:
            self.fail("after GC dropped step 10, MNT/10 is left as a dangling "
                      "symlink -> %s; top: %s"
                      % (os.readlink(path), self.top()))

    def test_gc_keeps_other_jobs(self):
        # job "a" commits; job "b" is configured: a's step is not b's to drop
        self.configure(simple_yaml("a"))
        self.orbax_save(1, seed=1)
        self.wait_committed(1, job="a")
        self.configure(simple_yaml("b"))
        self.orbax_save(2, seed=2)
        self.wait_committed(2, job="b")
        self.orbax_save(3, seed=3)
        self.wait_committed(3, job="b")
        self.wait_steps("b", [3])
        self.assertEqual(harness.shard_steps(self.ramdir, "a"), [1])


class StartWithYaml(ProtoCase):

    def test_yaml_present_at_start_is_processed(self):
        self.configure(simple_yaml("sy"))
        files = self.orbax_save(4, seed=4)
        self.wait_committed(4, job="sy")
        self.fs.stop()
        with open(os.path.join(self.ramdir, "ns", YAML), "w") as f:
            f.write(orbax_yaml("sy"))
        self.fs.start()
        self.wait_yaml_gone()
        self.wait_markers()
        self.assertNoProblemFiles()
        self.assert_restore_markers("sy", 4, files)


# =============================================================================
# (h) side by side with GKE's running replicator (issue 12)
# =============================================================================

def gke_yaml(job, rank=0, nodes=1, framework="orbax"):
    """The exact text fed to GKE's replicator in the side-by-side runs."""
    return ("job-name: %s\nframework: %s\nnode-rank: %d\nnodes: %d\n"
            "peer-ranks: []\nbackup-interval-minutes: 30\n"
            "master: tcp://127.0.0.1:4242\nmaster-port: 4242\n"
            % (job, framework, rank, nodes))


class GkeSideBySide(ProtoCase):
    """The sequences of issue 12 on mtcfs. GKE's replicator (repl.py, its
    VM_TEST platform, one node, scratch dirs, loopback) was run on the same
    sequences; "GKE (run, 2026-12-01)" lines are what it did. Where mtcfs
    differs on purpose the test asserts mtcfs and the comment says what GKE
    did (notes/rcfg.md, "GKE replicator vs mtcfs")."""

    def new_incarnation(self, job, step, framework="orbax"):
        """A new replicator.yaml after saves: wait for exactly this step's
        marker (the last incarnation's s0 marker goes with the yaml)."""
        self.put_yaml(gke_yaml(job, framework=framework), via_tmp=True)
        self.wait_yaml_gone()
        want = ["%s-s%d-n0-w0.restore" % (job, step)]
        self.wait(lambda: self.markers() == want, "markers %s" % want)
        self.assertNoProblemFiles()

    def test_a_fresh_start(self):
        self.put_yaml(gke_yaml("joba"), via_tmp=True)
        # GKE (run, 2026-12-01): the yaml is gone 0.2-0.7 s after the
        # rename (mtcfs: within one 50 ms poll); prerestore and markers
        # come after it
        self.wait_yaml_gone()
        self.wait_markers()
        # GKE (run, 2026-12-01): replicator.prerestore is "{}\n" and
        # joba-s0-n0-w0.restore is an empty regular file, not a symlink
        self.assert_nothing_restored("joba")
        # GKE (run, 2026-12-01): it also writes replicator.errors, two
        # ERROR log lines ("No valid checkpoints found anywhere", "Cannot
        # restore, no checkpoint to restore from: ..."); mtcfs: a fresh
        # start is no error, no replicator.errors
        self.assertNoProblemFiles()
        # GKE (run, 2026-12-01): nothing else (its VM_TEST platform writes
        # no jax-init-info.txt; GKE's node driver does)
        self.assertEqual(self.top(), sorted([JAXINFO, PRERESTORE,
                                             "joba-s0-n0-w0.restore"]))

    def test_b_orbax_steps_then_new_yaml(self):
        job = "jobb"
        self.put_yaml(gke_yaml(job), via_tmp=True)
        self.wait_yaml_gone()
        self.wait_markers()
        self.orbax_save(1, seed=1)
        self.wait_steps(job, [1])
        files = self.orbax_save(2, seed=2)
        # GKE (run, 2026-12-01): once step 2 is replicated only step 2 is
        # kept; step 1 is gone. GKE also renames <step> away at once (to
        # jobb-s2-n0-w0.save, then D<blake3>.data + jobb-s2-n0-w0.meta, both
        # visible); mtcfs keeps <step> under its name and hides its store
        self.wait(lambda: "1" not in self.top() and "2" in self.top(),
                  "only step 2 listed")
        self.assertEqual(read_tree(self.m("2")), files)
        # GKE (run, 2026-12-01): the s0 marker and prerestore "{}\n" stay
        # while the incarnation runs
        self.assertIn("jobb-s0-n0-w0.restore", self.top())
        self.assertEqual(read_file(self.m(PRERESTORE)), b"{}\n")
        self.wait_steps(job, [2])
        self.new_incarnation(job, 2)
        # GKE (run, 2026-12-01): step 2 is picked; prerestore is exactly
        # "restore-step: 2\n"; one marker jobb-s2-n0-w0.restore, a symlink
        # with a relative target, "D<blake3>.data" in the same directory
        # (mtcfs: relative, into .mtcfs/, read-only); the old s0 marker,
        # the old prerestore and replicator.errors are gone
        self.assert_restore_markers(job, 2, files)
        self.assertEqual(os.readlink(self.m("jobb-s2-n0-w0.restore")),
                         ".mtcfs/jobb/2/n0-w0")
        self.assertEqual(self.top(), sorted([JAXINFO, PRERESTORE,
                                             "jobb-s2-n0-w0.restore"]))
        # Orbax renames the marker to <step>. GKE (run, 2026-12-01): the
        # symlink keeps its target under the new name and reads the step;
        # it is not taken for a new save
        os.rename(self.m("jobb-s2-n0-w0.restore"), self.m("2"))
        self.assertTrue(os.path.islink(self.m("2")))
        self.assertEqual(read_tree(self.m("2")), files)
        files3 = self.orbax_save(3, seed=3)
        # GKE (run, 2026-12-01): after step 3 the link "2" stays, dangling
        # (step 2's data is collected); mtcfs removes the link with the step
        self.wait(lambda: "2" not in self.top(), "the link 2 removed with step 2")
        self.assertEqual(read_tree(self.m("3")), files3)

    def test_c_nemo_steps_then_new_yaml(self):
        job = "jobc"
        fw = "pytorch.distributed"
        self.put_yaml(gke_yaml(job, framework=fw), via_tmp=True)
        self.wait_yaml_gone()
        self.wait_markers()
        self.assert_nothing_restored(job)
        self.pytorch_save(1, seed=1)
        self.wait_steps(job, [1])
        files = self.pytorch_save(2, seed=2)
        # GKE (run, 2026-12-01): step=N-unfinished and step=N are not steps;
        # the rename to N is the save; step 1 is collected after step 2
        self.wait(lambda: "1" not in self.top() and "2" in self.top(),
                  "only step 2 listed")
        for n in ("step=1", "step=2", "step=1-unfinished", "step=2-unfinished"):
            self.assertNotIn(n, self.top())
        self.wait_steps(job, [2])
        self.new_incarnation(job, 2, framework=fw)
        # GKE (run, 2026-12-01): "restore-step: 2\n", jobc-s2-n0-w0.restore
        self.assert_restore_markers(job, 2, files)
        # the PyTorch reference renames the marker to step=N and reads it
        os.rename(self.m("jobc-s2-n0-w0.restore"), self.m("step=2"))
        self.assertTrue(os.path.islink(self.m("step=2")))
        self.assertEqual(read_tree(self.m("step=2")), files)

    def test_d_invalid_yaml(self):
        # GKE (run, 2026-12-01), job-name missing: the yaml is NOT deleted;
        # replicator.failed and replicator.errors both get the Python
        # traceback ending "KeyError: 'job-name'", once more on every
        # container restart. mtcfs: yaml deleted, one line, no .errors
        self.fs.expect_log(REJECTED_LOG)
        text = gke_yaml("x").replace("job-name: x\n", "")
        self.put_yaml(text, via_tmp=True)
        self.wait_yaml_gone()
        self.assertEqual(read_file(self.m(FAILED)),
                         b"missing required key: job-name\n")
        self.assertFalse(os.path.lexists(self.m(ERRORS)))
        self.assertEqual(self.markers(), [])
        # GKE (run, 2026-12-01), node-rank 1 of nodes 1: the yaml is
        # deleted, then nothing, ever: no markers, no prerestore, no
        # .failed (the node waits for a coordinator that only rank 0 runs).
        # mtcfs: replicator.failed, so the app does not wait forever
        self.put_yaml(gke_yaml("x", rank=1, nodes=1), via_tmp=True)
        self.wait_yaml_gone()
        self.wait(lambda: read_file(self.m(FAILED)).startswith(b"line 3:"),
                  "the new replicator.failed")
        self.assertEqual(read_file(self.m(FAILED)),
                         b"line 3: 'node-rank' 1 must be less than 'nodes' 1 "
                         b"(ranks are 0..0)\n")
        self.assertEqual(self.markers(), [])
        self.assertFalse(os.path.lexists(self.m(PRERESTORE)))

    def test_e_unknown_key(self):
        # GKE (run, 2026-12-01): the key is ignored, no line about it (its
        # replicator.errors holds only the fresh-start ERROR lines); mtcfs:
        # one WARNING line
        self.configure_warned(gke_yaml("jobe") + "colour: blue\n", [
            'WARNING: replicator.yaml: line 9: unknown key "colour" ignored'])
        self.assert_nothing_restored("jobe")
        # GKE (run, 2026-12-01): the next yaml's clean-up deletes
        # replicator.errors and any other file but jax-init-info.txt and
        # its own store files; mtcfs too
        write_file(self.m(ERRORS), b"stale\n")
        write_file(self.m("userfile"), b"x")
        self.configure(gke_yaml("jobe"), via_tmp=True)
        self.assertEqual(self.top(), sorted([JAXINFO, PRERESTORE,
                                             "jobe-s0-n0-w0.restore"]))

    def test_f_empty_yaml(self):
        # GKE (run, 2026-12-01): an empty replicator.yaml is deleted and the
        # replicator exits (restarted by its entrypoint) after one ERROR line
        # in replicator.errors ("Config file '...' is empty, deleting it and
        # terminating."); mtcfs deletes it and writes nothing
        before = self.top()
        self.put_yaml(b"")
        self.wait_yaml_gone()
        self.assertEqual(self.top(), before)


    def test_g_workers_leftover_tmp_and_other_job(self):
        # GKE (run, 2026-12-01), workers-per-node 2, nothing saved:
        # ja-s0-n0-w0.restore and ja-s0-n0-w1.restore, both empty files
        self.configure(gke_yaml("ja") + "workers-per-node: 2\n", via_tmp=True,
                       workers=2)
        self.assert_nothing_restored("ja", workers=2)
        self.configure(gke_yaml("ja"), via_tmp=True)
        files = self.orbax_save(1, seed=1)
        self.wait_steps("ja", [1])
        os.makedirs(self.m("2.orbax-checkpoint-tmp-9", "state"))
        # GKE (run, 2026-12-01): another job's yaml deletes the leftover
        # Orbax tmp dir and the old markers: only jb-s0-n0-w0.restore
        self.configure(gke_yaml("jb"), via_tmp=True)
        self.assertEqual(self.top(), sorted([JAXINFO, PRERESTORE,
                                             "jb-s0-n0-w0.restore"]))
        # GKE (run, 2026-12-01): jb's clean-up and GC also delete ja's step
        # 1 (.meta and .data), so ja's next incarnation restores nothing
        # ("{}\n", ja-s0 marker). mtcfs keeps committed data of other jobs
        # (DESIGN 3.2): ja restores step 1
        self.new_incarnation("ja", 1)
        self.assert_restore_markers("ja", 1, files)

class GkeSideBySideTwoNodes(unittest.TestCase):
    """GKE (run, 2026-12-01) on two nodes on loopback (peer-ranks [], so
    its VM_TEST platform mounts no NFS peers)."""

    def two_nodes(self, job):
        """A 2-node cluster on which job (GKE's yaml) has started."""
        from cluster import Cluster
        c = Cluster(2, ram_size="256M")
        self.addCleanup(c.close)
        c.start()
        start_ranks(c, job, [0, 1], text=self.text)
        return c

    @staticmethod
    def text(j, r, n):
        return gke_yaml(j, rank=r, nodes=n)

    def restart_expect(self, c, job, step):
        """The job restarts on both nodes: each shows exactly its marker of
        step and "restore-step: <step>" in replicator.prerestore."""
        for r in (0, 1):
            y = os.path.join(c.nodes[r].mnt, YAML)
            with open(y + ".tmp", "w") as f:
                f.write(self.text(job, r, 2))
            os.rename(y + ".tmp", y)
        for r in (0, 1):
            mnt = c.nodes[r].mnt
            want = ["%s-s%d-n%d-w0.restore" % (job, step, r)]
            wait_until(lambda: sorted(x for x in os.listdir(mnt)
                                      if x.endswith(".restore")) == want,
                       60, "node %d markers %s" % (r, want))
            self.assertEqual(read_file(os.path.join(mnt, PRERESTORE)),
                             b"restore-step: %d\n" % step)

    def test_two_nodes_names_and_prerestore(self):
        job = "jobt"
        c = self.two_nodes(job)
        # GKE (run, 2026-12-01): per node "{}\n" and jobt-s0-n<rank>-w0.restore
        # (empty regular file); rank 1's replicator.errors has one ERROR
        # line, rank 0's two (mtcfs: none)
        for r in (0, 1):
            mnt = c.nodes[r].mnt
            self.assertEqual(read_file(os.path.join(mnt, PRERESTORE)), b"{}\n")
            m = os.path.join(mnt, "jobt-s0-n%d-w0.restore" % r)
            self.assertFalse(os.path.islink(m))
            self.assertEqual(os.path.getsize(m), 0)
        c.save(job, 1)
        c.save(job, 2)
        # peer-ranks []: no replicas, on GKE as on mtcfs; each node's own
        # copy is committed
        wait_until(lambda: all(c.holds(r, job).get((r, 2)) in
                               harness.COMMITTED_STATES for r in (0, 1)),
                   60, "step 2 committed on both nodes")
        # GKE (run, 2026-12-01): "restore-step: 2\n" on both nodes,
        # jobt-s2-n<rank>-w0.restore -> D<blake3>.data (mtcfs: into
        # .mtcfs/jobt/2/n<rank>-w0)
        self.restart_expect(c, job, 2)
        for r in (0, 1):
            mnt = c.nodes[r].mnt
            self.assertEqual(os.readlink(os.path.join(mnt, "jobt-s2-n%d-w0.restore" % r)),
                             ".mtcfs/jobt/2/n%d-w0" % r)
            for n in (FAILED, ERRORS):
                self.assertFalse(os.path.lexists(os.path.join(mnt, n)), n)
            c.restore_and_verify(job, r, 2)


    def test_two_nodes_step_on_one_node_only(self):
        job = "jobk"
        c = self.two_nodes(job)
        c.save(job, 1)
        wait_until(lambda: all(c.holds(r, job).get((r, 1)) in
                               harness.COMMITTED_STATES for r in (0, 1)),
                   60, "step 1 committed on both nodes")
        c.save(job, 2, ranks=[0])
        wait_until(lambda: c.holds(0, job).get((0, 2)) in
                   harness.COMMITTED_STATES, 60, "step 2 committed on rank 0")
        # GKE (run, 2026-12-01): step 2 only on rank 0 (peer-ranks [], no
        # replicas): both nodes restore step 1, "restore-step: 1\n",
        # jobk-s1-n<rank>-w0.restore
        self.restart_expect(c, job, 1)
        for r in (0, 1):
            c.restore_and_verify(job, r, 1)

# =============================================================================
# (i) time to markers with a 1 GiB committed step
# =============================================================================

class TimeToMarkers(ProtoCase):
    OPTS = "ram_size=2G,jax_init_info"

    def test_time_to_markers_1gib(self):
        self.configure(simple_yaml("big"))
        tmp = self.m("50.orbax-checkpoint-tmp-1")
        os.mkdir(tmp)
        body = pattern(500, 64 * MiB - 8)
        body_crc = crcmod.crc32c(body)
        files = {}
        for i in range(16):
            head = struct.pack("<Q", 0xABCDEF00 + i)
            name = "shard-%02d.bin" % i
            fd = os.open(os.path.join(tmp, name),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, head)
                for off in range(0, len(body), 8 * MiB):
                    write_all(fd, memoryview(body)[off:off + 8 * MiB])
            finally:
                os.close(fd)
            files[name] = (64 * MiB, crcmod.crc32c_combine(
                crcmod.crc32c(head), body_crc, len(body)))
        write_file(os.path.join(tmp, "commit_success.txt"), b"ok")
        files["commit_success.txt"] = b"ok"
        os.rename(tmp, self.m("50"))
        sh = self.wait_committed(50, job="big", timeout=300)
        assert_manifest(self, sh, files)
        times = []
        for rnd in range(3):
            self.wait_yaml_gone()
            t0 = time.monotonic()
            with open(self.m(YAML_TMP), "w") as f:
                f.write(orbax_yaml("big"))
            os.replace(self.m(YAML_TMP), self.m(YAML))
            want = "big-s50-n0-w0.restore"
            deadline = t0 + 60
            while not os.path.lexists(self.m(want)):
                self.assertLess(time.monotonic(), deadline,
                                "markers never appeared: %s" % self.top())
                time.sleep(0.0005)
            dt = time.monotonic() - t0
            times.append(dt)
            self.assertNoProblemFiles()
            self.assertEqual(self.prerestore(), "restore-step: 50\n")
            # Orbax takes the marker (so the next round cannot see it)
            os.rename(self.m(want), self.m("50"))
        sys.stderr.write("[time from replicator.yaml to markers, 1 GiB "
                         "step: %s s] " % ", ".join("%.3f" % t
                                                    for t in times))
        print("\nTIME-TO-MARKERS-1GiB: %s" % " ".join("%.4f" % t
                                                     for t in times))
        for dt in times:
            self.assertLess(dt, 5.0, "markers took %.2f s" % dt)
        # the restore reads back the right bytes
        mk = self.m("50")
        self.assertTrue(os.path.islink(mk))
        self.assertEqual(os.path.getsize(os.path.join(mk, "shard-07.bin")),
                         64 * MiB)
        with open(os.path.join(mk, "shard-07.bin"), "rb") as f:
            self.assertEqual(f.read(8), struct.pack("<Q", 0xABCDEF07))


if __name__ == "__main__":
    harness.main()
