"""Crash safety of one node (issue 2): kill -9 of mtcfs at several moments.

After each kill the dead mount is cleared (fusermount3 -u / umount -l, done
by harness.Daemon.kill9 under the watchdog of tp.safe_kill9) and a new mtcfs
starts on the same RAMDIR:
- after commits: every committed step is listed again with an identical
  record (manifest, hash, state), its bytes readable under MNT/<step> and in
  RAMDIR/shards;
- with a half-written, uncommitted directory: still there for the app, not
  in the catalog, and committable later;
- right after the commit rename of a large step returned: the new daemon
  finishes (resumes) the seal, and the manifest matches the bytes;
- around replicator.yaml: a yaml written just before the kill is processed
  by the next daemon;
- with a store file truncated while mtcfs was down: the shard is "bad" and
  is not restored;
- right after the mount appears, many times: the daemon always dies (no
  thread left blocked on its own mount) and nothing committed is lost;
- a committed 5000-level tree (issue 13): the step is marked bad and
  reported, the daemon serves on, and restarts on the same RAMDIR are fine;
- during the drop of a big shard (kill injected after the drop marked its
  record): the next start finishes the drop, leaves no orphan directory,
  and ram_used is what the catalog holds;
- during a seal: `mtcfs-admin verify` fails while the shard is stuck in
  `sealing`, and passes once the next daemon has resumed the seal;
- symlinks (issue 13 item 7): one that points out of the step is refused
  when the step is committed (bad, reported), one inside it ("../x" too)
  is sealed, replicated to the peer, and restored from the peer;
- a FIFO in a step (issue 13 item 9) is sealed with its mode, replicated,
  and restored from the peer with its mode; backed up as a manifest entry
  (no data object) and restored from the bucket with its mode.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/posix/test_crash.py [-k NAME]
"""

import errno
import json
import os
import random
import re
import signal
import stat
import struct
import subprocess
import sys
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
sys.path.insert(1, os.path.join(INTEG, "apps"))  # test_protocol
sys.path.insert(1, os.path.join(INTEG, "bucket"))  # test_backup_restore
import harness  # noqa: E402
import cluster  # noqa: E402
import crc32c as crcmod  # noqa: E402
import test_protocol as tp  # noqa: E402
import test_backup_restore as tbr  # noqa: E402
from harness import (assert_manifest, assert_shard_on_disk, read_file,  # noqa
                     read_tree, wait_until, write_file)

MiB = tp.MiB
BAD_SHARD_LOG = r"does not match its manifest"


def shards_by_key(ramdir):
    return {(s["job"], s["step"], s["rank"], s["worker"]): s
            for s in harness.admin_ls(ramdir).get("shards", [])}


class CrashCase(tp.ProtoCase):
    OPTS = "ram_size=2G,jax_init_info"

    def check_step(self, step, files, job="default"):
        """Committed, manifest == files, bytes in the store and in MNT."""
        s = self.wait_committed(step, job=job)
        assert_manifest(self, s, files)
        assert_shard_on_disk(self, self.ramdir, step, files, job=job)
        self.assertEqual(read_tree(self.m(str(step))), files,
                         "MNT/%d after restart" % step)
        return s

    def kill_and_restart(self):
        self.restart_kill9()

    def wait_state(self, step, state, job="default"):
        """The mount shows up before the daemon's catalog recovery is done
        (FUSE requests wait for it; mtcfs-admin reads LMDB directly): poll."""
        os.listdir(self.mnt)          # answered only once the loop runs
        last = {}

        def cond():
            s = harness.find_shard(harness.admin_ls(self.ramdir), step,
                                   job=job)
            last["s"] = s and s.get("state")
            return s is not None and s.get("state") == state
        try:
            self.wait(cond, "step %d state %s" % (step, state), timeout=10)
        except AssertionError as e:
            raise AssertionError("%s; last seen %s" % (e, last.get("s")))


class AfterCommits(CrashCase):

    def test_unconfigured_steps_survive_kill(self):
        # no replicator.yaml yet: job "default", no GC, all steps kept
        saved = {}
        for st in (1, 2, 3):
            saved[st] = self.orbax_save(st, seed=st)
        saved[4] = self.pytorch_save(4, seed=4)
        os.mkdir(self.m("5"))
        write_file(self.m("5", "data"), tp.pattern(5, 12345))
        write_file(self.m("5", "commit_success.txt"), b"ok")
        saved[5] = {"data": tp.pattern(5, 12345), "commit_success.txt": b"ok"}
        for st, files in saved.items():
            self.check_step(st, files)
        before = shards_by_key(self.ramdir)
        self.assertEqual(len(before), 5)
        self.kill_and_restart()
        after = shards_by_key(self.ramdir)
        self.assertEqual(sorted(after), sorted(before))
        for k in before:
            self.assertEqual(after[k], before[k], "record of %s" % (k,))
        for st, files in saved.items():
            self.check_step(st, files)
            self.assertErrno(errno.EROFS, os.open,
                             self.m(str(st), sorted(files)[0]), os.O_WRONLY)
        # a second kill, right after start, changes nothing either
        self.kill_and_restart()
        self.assertEqual(shards_by_key(self.ramdir), before)
        # the new daemon commits new steps
        saved[6] = self.orbax_save(6, seed=6)
        self.check_step(6, saved[6])

    def test_configured_job_survives_kill(self):
        job = "crash1"
        self.configure(tp.orbax_yaml(job), via_tmp=True)
        saved = {}
        for st in (10, 20):
            saved[st] = self.orbax_save(st, seed=st)
            self.wait_committed(st, job=job)
        self.wait_steps(job, [20])
        before = shards_by_key(self.ramdir)
        self.kill_and_restart()
        self.assertEqual(shards_by_key(self.ramdir), before)
        self.check_step(20, saved[20], job=job)
        # the job's identity survives: a commit before any new yaml belongs
        # to it, and GC goes on
        saved[30] = self.orbax_save(30, seed=30)
        self.check_step(30, saved[30], job=job)
        self.wait_steps(job, [30])
        self.assertEqual(harness.shard_steps(self.ramdir, "default"), [])
        # and the app restores it
        self.kill_and_restart()
        step, path = self.orbax_startup(job)
        self.assertEqual(step, 30)
        self.assertEqual(read_tree(path), saved[30])

    def test_kill_while_restored_step_in_use(self):
        job = "crash2"
        self.configure(tp.simple_yaml(job))
        f7 = self.orbax_save(7, seed=7)
        self.wait_committed(7, job=job)
        step, path = self.orbax_startup(job)
        self.assertEqual(step, 7)
        fd = os.open(os.path.join(path, "commit_success.txt"), os.O_RDONLY)
        try:
            self.kill_and_restart()
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
        self.wait_steps(job, [7])
        step, path = self.orbax_startup(job)
        self.assertEqual(step, 7)
        self.assertEqual(read_tree(path), f7)


class Uncommitted(CrashCase):

    def test_half_written_dir_survives_uncommitted(self):
        self.configure(tp.simple_yaml("hw"))
        done = self.orbax_save(3, seed=3)
        self.wait_committed(3, job="hw")
        # an Orbax tmp dir and an in-place digits dir, half written, with a
        # file still open for writing when mtcfs dies
        tmp = self.m("4.orbax-checkpoint-tmp-9")
        os.makedirs(os.path.join(tmp, "state"))
        part1 = tp.pattern(41, 3 * MiB)
        write_file(os.path.join(tmp, "state", "done.bin"), part1)
        os.mkdir(self.m("5"))
        write_file(self.m("5", "a"), b"in place")
        fd = os.open(os.path.join(tmp, "state", "open.bin"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        tp.write_all(fd, tp.pattern(42, MiB))
        try:
            self.kill_and_restart()
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
        self.assertEqual(harness.shard_steps(self.ramdir, "hw"), [3])
        self.assertEqual(read_file(os.path.join(tmp, "state", "done.bin")),
                         part1)
        self.assertEqual(read_file(os.path.join(tmp, "state", "open.bin")),
                         tp.pattern(42, MiB))
        self.assertEqual(read_file(self.m("5", "a")), b"in place")
        # still writable (not frozen), and committable after the restart
        write_file(os.path.join(tmp, "state", "open.bin"), b"rewritten")
        write_file(os.path.join(tmp, "commit_success.txt"), b"ok")
        os.rename(tmp, self.m("4"))
        s = self.wait_committed(4, job="hw")
        assert_manifest(self, s, {"state/done.bin": part1,
                                  "state/open.bin": b"rewritten",
                                  "commit_success.txt": b"ok"})
        write_file(self.m("5", "commit_success.txt"), b"ok")
        s = self.wait_committed(5, job="hw")
        assert_manifest(self, s, {"a": b"in place",
                                  "commit_success.txt": b"ok"})
        self.wait_steps("hw", [5])
        del done


class LargeCommit(CrashCase):

    def test_kill_right_after_rename_of_512mib_step(self):
        tmp = self.m("40.orbax-checkpoint-tmp-1")
        os.mkdir(tmp)
        body = tp.pattern(400, 32 * MiB - 8)
        body_crc = crcmod.crc32c(body)
        files = {}
        for i in range(16):
            head = struct.pack("<Q", 0x5150000 + i)
            name = "shard-%02d.bin" % i
            fd = os.open(os.path.join(tmp, name),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                tp.write_all(fd, head)
                for off in range(0, len(body), 8 * MiB):
                    tp.write_all(fd, memoryview(body)[off:off + 8 * MiB])
            finally:
                os.close(fd)
            files[name] = (32 * MiB, crcmod.crc32c_combine(
                crcmod.crc32c(head), body_crc, len(body)))
        write_file(os.path.join(tmp, "commit_success.txt"), b"ok")
        files["commit_success.txt"] = b"ok"
        os.rename(tmp, self.m("40"))
        tp.safe_kill9(self, self.fs)
        s_dead = harness.find_shard(harness.admin_ls(self.ramdir), 40)
        sys.stderr.write("[state at kill: %s] "
                         % (s_dead and s_dead.get("state")))
        self.assertIsNotNone(s_dead, "the commit was not recorded before "
                             "the rename returned")
        self.fs.extra_args = ["-d"]            # INFO lines: "resuming the seal"
        self.fs.start()
        s = self.wait_committed(40, timeout=300)
        if s_dead.get("state") == "sealing":
            self.assertIn("resuming the seal of step 40",
                          self.fs.log_text().split("=== mtcfs start")[-1])
        assert_manifest(self, s, files)
        self.assertEqual(s["bytes"], 512 * MiB + 2)
        assert_shard_on_disk(self, self.ramdir, 40, files)
        self.assertEqual(sorted(os.listdir(self.m("40"))), sorted(files))
        with open(self.m("40", "shard-09.bin"), "rb") as f:
            self.assertEqual(f.read(8), struct.pack("<Q", 0x5150009))
            f.seek(32 * MiB - 4)
            self.assertEqual(f.read(), body[-4:])
        self.assertErrno(errno.EROFS, os.open, self.m("40", "shard-00.bin"),
                         os.O_WRONLY)
        # restorable
        self.configure(tp.simple_yaml("default"))
        self.assertEqual(self.prerestore(), "restore-step: 40\n")

    def test_kill_during_seal_repeated(self):
        # several kill/restart rounds while the seal may still be running
        tmp = self.m("41.tmp")
        os.mkdir(tmp)
        files = {}
        for i in range(8):
            data = tp.pattern(4100 + i, 16 * MiB + i)
            write_file(os.path.join(tmp, "f%d" % i), data)
            files["f%d" % i] = data
        os.rename(tmp, self.m("41"))
        for _ in range(3):
            tp.safe_kill9(self, self.fs)
            self.fs.start()
        s = self.wait_committed(41, timeout=300)
        assert_manifest(self, s, files)
        assert_shard_on_disk(self, self.ramdir, 41, files)
        self.assertEqual(read_tree(self.m("41")), files)


class YamlAroundKill(CrashCase):

    def test_yaml_written_then_kill(self):
        self.configure(tp.simple_yaml("yk"))
        files = self.orbax_save(8, seed=8)
        self.wait_committed(8, job="yk")
        self.put_yaml(tp.orbax_yaml("yk"), via_tmp=True)
        tp.safe_kill9(self, self.fs)
        # processed or not before the kill: the next daemon finishes it
        self.fs.start()
        self.wait_yaml_gone()
        self.wait_markers()
        self.assertNoProblemFiles()
        self.assert_restore_markers("yk", 8, files)
        self.assertEqual(read_file(self.m(tp.JAXINFO)), b"0\n127.0.0.1:8476\n")

    def test_yaml_in_ns_while_down(self):
        self.configure(tp.simple_yaml("yd"))
        files = self.orbax_save(9, seed=9)
        self.wait_committed(9, job="yd")
        tp.safe_kill9(self, self.fs)
        with open(os.path.join(self.ramdir, "ns", tp.YAML), "w") as f:
            f.write(tp.pytorch_yaml("yd"))
        self.fs.start()
        self.wait_yaml_gone()
        self.wait_markers()
        self.assert_restore_markers("yd", 9, files)


class TruncatedWhileDown(CrashCase):

    def _truncated(self, kill):
        job = "tr"
        self.fs.expect_log(BAD_SHARD_LOG)
        self.configure(tp.simple_yaml(job))
        files = self.orbax_save(5, seed=5)
        self.wait_committed(5, job=job)
        if kill:
            tp.safe_kill9(self, self.fs)
        else:
            self.fs.stop()
        victim = os.path.join(harness.shard_dir(self.ramdir, 5, job),
                              "state", "params.layer1", "0.0")
        self.assertTrue(os.path.isfile(victim))
        os.truncate(victim, 1000)
        self.fs.start()
        self.wait_state(5, "bad", job=job)
        # not restored
        self.put_yaml(tp.simple_yaml(job))
        self.wait_yaml_gone()
        self.wait_markers()
        self.assertFalse(os.path.lexists(self.m(tp.FAILED)))
        self.assert_nothing_restored(job)
        if os.path.exists(self.m(tp.ERRORS)):
            self.assertIn("step 5", read_file(self.m(tp.ERRORS)).decode())
        # the job goes on
        f6 = self.orbax_save(6, seed=6)
        self.wait_committed(6, job=job)
        self.configure(tp.simple_yaml(job))
        self.assert_restore_markers(job, 6, f6)
        del files

    def test_truncated_after_kill9(self):
        self._truncated(kill=True)

    def test_truncated_after_clean_stop(self):
        self._truncated(kill=False)

    def test_store_file_deleted_while_down(self):
        self.fs.expect_log(BAD_SHARD_LOG)
        f1 = self.orbax_save(1, seed=1)
        self.wait_committed(1)
        f2 = self.orbax_save(2, seed=2)
        self.wait_committed(2)
        tp.safe_kill9(self, self.fs)
        os.unlink(os.path.join(harness.shard_dir(self.ramdir, 2),
                               "commit_success.txt"))
        self.fs.start()
        self.wait_state(2, "bad")
        ls = harness.admin_ls(self.ramdir)
        self.assertEqual(harness.find_shard(ls, 1).get("state"), "committed")
        # the older good step is restored instead, and the bad one reported
        self.put_yaml(tp.simple_yaml("default"))
        self.wait_yaml_gone()
        self.wait_markers()
        self.assertFalse(os.path.lexists(self.m(tp.FAILED)))
        self.assertIn("step 2", read_file(self.m(tp.ERRORS)).decode())
        self.assertIn("no longer match", read_file(self.m(tp.ERRORS)).decode())
        os.unlink(self.m(tp.ERRORS))
        self.assert_restore_markers("default", 1, f1)
        del f2


class KillAtStart(CrashCase):

    def test_kill9_right_after_mount_repeated(self):
        files = self.orbax_save(3, seed=3)
        s3 = self.check_step(3, files)
        rnd = random.Random(7)
        for i in range(100):
            tp.safe_kill9(self, self.fs)
            self.fs.start()
            # at once, or a little later while start-up work runs
            if i % 2:
                time.sleep(rnd.uniform(0, 0.015))
        tp.safe_kill9(self, self.fs)
        self.fs.start()
        self.assertEqual(self.check_step(3, files), s3)


def mtcfs_admin_rc(*args):
    """(exit status, stdout) of mtcfs-admin ARGS, whatever the status."""
    r = subprocess.run([harness.MTCFS_ADMIN] + [str(a) for a in args],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    return r.returncode, r.stdout.decode()


def make_chain(top, depth, leaf=b"deep"):
    """top/d/d/.../d (depth-1 levels of d) with a file at the bottom, made
    through descriptors: the full path is far beyond PATH_MAX."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth - 1):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        wfd = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(wfd, leaf)
        os.close(wfd)
    finally:
        os.close(fd)


def ramdir_usage(ramdir, shard_dirs):
    """st_blocks*512 of the regular files under RAMDIR/ns and the given
    shard directories, every inode once: what ram_used counts."""
    seen, total = set(), 0
    for root in [os.path.join(ramdir, "ns")] + list(shard_dirs):
        for dp, dns, fns in os.walk(root):
            for n in fns:
                st = os.lstat(os.path.join(dp, n))
                if stat.S_ISREG(st.st_mode) and st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
    return total


def shard_dirs_on_disk(ramdir):
    """{(job, step, 'nR-wW')} of RAMDIR/shards/JOB/STEP/NAME directories."""
    out = set()
    base = os.path.join(ramdir, "shards")
    for job in os.listdir(base):
        for step in os.listdir(os.path.join(base, job)):
            for name in os.listdir(os.path.join(base, job, step)):
                out.add((job, step, name))
    return out


class DeepTree(CrashCase):

    def test_5000_level_tree_is_marked_bad_and_daemon_serves_on(self):
        # issue 13 item 3: the seal's recursive walk overflowed the worker's
        # stack, and the resumed seal did again at every start
        job = "deep"
        # shutil.rmtree (the harness's cleanup) recurses: rm -rf does not
        for sub in ("ns", "shards"):
            self.addCleanup(subprocess.run, ["rm", "-rf", "--one-file-system",
                                             os.path.join(self.ramdir, sub)])
        self.fs.expect_log(r"cannot be sealed|was not committed")
        self.fs.extra_args = ["-d"]
        self.fs.restart()
        self.configure(tp.simple_yaml(job))
        f6 = self.orbax_save(6, seed=6)
        self.wait_committed(6, job=job)
        tmp = self.m("7.orbax-checkpoint-tmp-1")
        os.mkdir(tmp)
        make_chain(tmp, 5000)
        os.rename(tmp, self.m("7"))
        self.wait_state(7, "bad", job=job)
        self.alive()
        self.wait(lambda: os.path.exists(self.m(tp.ERRORS)) and
                  b"step 7 was not committed" in read_file(self.m(tp.ERRORS)),
                  "replicator.errors about step 7")
        self.assertIn("step 7 was not committed: the tree is more than 48 "
                      "levels deep", read_file(self.m(tp.ERRORS)).decode())
        os.unlink(self.m(tp.ERRORS))
        rc, out = mtcfs_admin_rc("verify", self.ramdir)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"bad\s+deep\s+step 7 .*could not be sealed")
        # the same RAMDIR comes back, after a kill and after a clean stop
        self.kill_and_restart()
        self.wait_state(7, "bad", job=job)
        self.assertNotIn("resuming the seal of step 7", self.fs.log_text())
        self.fs.restart()
        self.wait_state(7, "bad", job=job)
        self.check_step(6, f6, job=job)
        # and goes on: a good step commits, GC drops the deep one (its
        # namespace tree too) and the older good one
        f8 = self.orbax_save(8, seed=8)
        self.check_step(8, f8, job=job)
        self.wait_steps(job, [8])
        self.wait(lambda: not os.path.lexists(os.path.join(self.ramdir, "ns",
                                                           "7")),
                  "the deep namespace tree removed")
        rc, out = mtcfs_admin_rc("verify", self.ramdir)
        self.assertEqual(rc, 0, out)
        self.kill_and_restart()
        self.check_step(8, f8, job=job)


class DropCrash(CrashCase):

    def test_kill_during_drop_of_big_shard(self):
        # issue 13 item 5: the record went before the files, so a kill
        # during the deletion leaked them (counted in ram_used, never freed)
        job = "dropk"
        self.configure(tp.simple_yaml(job))
        tmp = self.m("1.orbax-checkpoint-tmp-1")
        os.mkdir(tmp)
        for i in range(4):
            write_file(os.path.join(tmp, "big%d.bin" % i),
                       tp.pattern(900 + i, 32 * MiB))
        write_file(os.path.join(tmp, "commit_success.txt"), b"ok")
        os.rename(tmp, self.m("1"))
        self.wait_committed(1, job=job, timeout=120)
        # the next daemon dies by SIGKILL as soon as a drop has marked its
        # record, before any file is gone
        self.fs.stop()
        self.fs.env["MTCFS_TEST_CRASH"] = "drop-marked"
        self.fs.start()
        self.wait_steps(job, [1])
        f2 = self.orbax_save(2, seed=2)
        wait_until(lambda: not self.fs.running(), 60,
                   "mtcfs killed itself in the drop of step 1")
        self.fs.kill9()                       # reap it and clear the mount
        self.assertTrue(os.path.isdir(harness.shard_dir(self.ramdir, 1, job)))
        del self.fs.env["MTCFS_TEST_CRASH"]
        self.fs.extra_args = ["-d"]           # the INFO line with ram_used
        self.fs.start()
        self.check_step(2, f2, job=job)
        self.wait_steps(job, [2])
        self.assertFalse(os.path.lexists(os.path.join(self.ramdir, "shards",
                                                      job, "1")))
        recs = shards_by_key(self.ramdir)
        named = {(j, str(st), "n%d-w%d" % (r, w)) for (j, st, r, w) in recs}
        self.assertEqual(shard_dirs_on_disk(self.ramdir), named)
        log = self.fs.log_text().split("=== mtcfs start")[-1]
        used = int(re.search(r"serving ramdir=\S+ mount=\S+ ram_size=\d+ "
                             r"used=(\d+)", log).group(1))
        self.assertEqual(used, ramdir_usage(self.ramdir, [
            os.path.join(self.ramdir, "shards", j, st, n)
            for (j, st, n) in named]))
        self.assertLess(used, 8 * MiB, "the 128 MiB of step 1 are free")


class SealingVerify(CrashCase):

    def test_verify_fails_while_stuck_sealing(self):
        # standing check: a shard stuck in `sealing` fails mtcfs-admin verify
        self.fs.stop()
        self.fs.env["MTCFS_TEST_CRASH"] = "seal-started"
        self.fs.start()
        files = {}
        tmp = self.m("3.tmp")
        os.mkdir(tmp)
        write_file(os.path.join(tmp, "a"), b"alpha")
        files["a"] = b"alpha"
        os.rename(tmp, self.m("3"))
        wait_until(lambda: not self.fs.running(), 60,
                   "mtcfs killed itself in the seal of step 3")
        self.fs.kill9()
        self.assertEqual(harness.find_shard(harness.admin_ls(self.ramdir),
                                            3).get("state"), "sealing")
        rc, out = mtcfs_admin_rc("verify", self.ramdir)
        self.assertEqual(rc, 1, out)
        self.assertIn("the seal has not finished and mtcfs is not running",
                      out)
        rc, out = mtcfs_admin_rc("verify", self.ramdir, "--json")
        self.assertEqual(rc, 1, out)
        self.assertEqual(json.loads(out)["sealing"], 1)
        del self.fs.env["MTCFS_TEST_CRASH"]
        self.fs.start()
        self.check_step(3, files)
        rc, out = mtcfs_admin_rc("verify", self.ramdir)
        self.assertEqual(rc, 0, out)


class SymlinkRule(CrashCase):

    def test_escaping_symlink_refused_at_commit(self):
        job = "sym"
        self.fs.expect_log(r"cannot be sealed|was not committed")
        self.configure(tp.simple_yaml(job))
        for step, target, why in (
                (4, "/etc/passwd", "the target is absolute"),
                (5, "../../elsewhere", "the target leaves the shard"),
                (6, "sub/../..", "'..' after a name in the target")):
            tmp = self.m("%d.orbax-checkpoint-tmp-1" % step)
            os.makedirs(os.path.join(tmp, "state", "sub"))
            write_file(os.path.join(tmp, "state", "a"), b"alpha")
            os.symlink(target, os.path.join(tmp, "state", "ln"))
            os.rename(tmp, self.m(str(step)))
            self.wait_state(step, "bad", job=job)
            want = ("step %d was not committed: symlink state/ln -> %s: %s"
                    % (step, target, why))
            self.wait(lambda: os.path.exists(self.m(tp.ERRORS)) and
                      want.encode() in read_file(self.m(tp.ERRORS)),
                      "replicator.errors: %s" % want)
            os.unlink(self.m(tp.ERRORS))
        rc, out = mtcfs_admin_rc("verify", self.ramdir)
        self.assertEqual(rc, 1, out)
        # a link inside the step is sealed, and the step restores with it;
        # GC drops the bad ones
        tmp = self.m("7.orbax-checkpoint-tmp-1")
        os.makedirs(os.path.join(tmp, "state", "sub"))
        write_file(os.path.join(tmp, "state", "a"), b"alpha")
        os.symlink("../a", os.path.join(tmp, "state", "sub", "ln"))
        os.rename(tmp, self.m("7"))
        s7 = self.wait_committed(7, job=job)
        self.assertIn({"path": "state/sub/ln", "type": "symlink",
                       "target": "../a"},
                      [{k: f.get(k) for k in ("path", "type", "target")}
                       for f in s7["files"]])
        self.wait_steps(job, [7])
        rc, out = mtcfs_admin_rc("verify", self.ramdir)
        self.assertEqual(rc, 0, out)
        self.configure(tp.simple_yaml(job))
        step, path = self.orbax_startup(job)
        self.assertEqual(step, 7)
        self.assertEqual(read_file(os.path.join(path, "state", "sub", "ln")),
                         b"alpha")


class SymlinkReplicated(unittest.TestCase):

    def test_inside_symlink_replicates_and_restores(self):
        # before: the seal took any link, the peer refused every target
        # with ".." in it, so this step was never replicated
        job = "symrep"
        with cluster.Cluster(2) as c:
            c.job_start(job)
            for r in range(2):
                tmp = os.path.join(c.nodes[r].mnt, "3.orbax-checkpoint-tmp-1")
                cluster.write_shard(tmp, job, 3, r)
                os.symlink("../params/0.0", os.path.join(tmp, "state", "opt",
                                                        "latest"))
                os.rename(tmp, os.path.join(c.nodes[r].mnt, "3"))
            c.wait_replicated(job, 3)
            rep = os.path.join(c.nodes[1].ramdir, "shards", job, "3", "n0-w0",
                               "state", "opt", "latest")
            self.assertEqual(os.readlink(rep), "../params/0.0")
            # node 0 comes back empty: its shard, link included, from node 1
            c.nodes[0].kill9()
            c.nodes[0].wipe_ramdir()
            c.nodes[0].start()
            self.assertEqual(c.job_start(job), {0: 3, 1: 3})
            c.restore_and_verify(job, 0, 3)
            with open(os.path.join(c.nodes[0].mnt, "3", "state", "opt",
                                   "latest"), "rb") as f:
                self.assertEqual(f.read(), cluster.shard_bytes(job, 3, 0))


class FifoReplicated(unittest.TestCase):

    def test_fifo_replicates_and_restores_with_its_mode(self):
        # before: the seal and the manifest skipped FIFOs, so the restored
        # step had no state/pipe
        job = "fiforep"
        with cluster.Cluster(2) as c:
            c.job_start(job)
            for r in range(2):
                tmp = os.path.join(c.nodes[r].mnt, "3.orbax-checkpoint-tmp-1")
                cluster.write_shard(tmp, job, 3, r)
                pipe = os.path.join(tmp, "state", "pipe")
                os.mkfifo(pipe, 0o600)
                os.chmod(pipe, 0o640)
                os.rename(tmp, os.path.join(c.nodes[r].mnt, "3"))
            c.wait_replicated(job, 3)
            rep = os.lstat(os.path.join(c.nodes[1].ramdir, "shards", job,
                                        "3", "n0-w0", "state", "pipe"))
            self.assertTrue(stat.S_ISFIFO(rep.st_mode))
            self.assertEqual(stat.S_IMODE(rep.st_mode), 0o640)
            # node 0 comes back empty: its shard, FIFO included, from node 1
            c.nodes[0].kill9()
            c.nodes[0].wipe_ramdir()
            c.nodes[0].start()
            self.assertEqual(c.job_start(job), {0: 3, 1: 3})
            c.restore_and_verify(job, 0, 3)
            st = os.lstat(os.path.join(c.nodes[0].mnt, "3", "state", "pipe"))
            self.assertTrue(stat.S_ISFIFO(st.st_mode))
            self.assertEqual(stat.S_IMODE(st.st_mode), 0o640)


# test_backup_restore deletes its BackupBase name (so that it is not run as a
# test case itself); its plumbing is reached through a subclass, and bound
# to no module-level name here, which the loader would run too
class FifoBackedUp(tbr.FileBackupTest.__mro__[1]):
    """A FIFO goes to the bucket as a manifest entry only (no data object)
    and comes back from it with its mode."""

    def make_store(self):
        return tbr.FileStore(self)

    def test_fifo_restored_from_bucket_with_its_mode(self):
        job = "fifobk"
        c = self.cluster()
        c.job_start(job)
        for r in range(2):
            tmp = os.path.join(c.nodes[r].mnt, "10.orbax-checkpoint-tmp-%d" % r)
            for rel, data in cluster.shard_files(job, 10, r, tbr.SIZE).items():
                p = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                write_file(p, data)
            os.mkfifo(os.path.join(tmp, "pipe"), 0o600)
            os.chmod(os.path.join(tmp, "pipe"), 0o604)
            os.rename(tmp, os.path.join(c.nodes[r].mnt, "10"))
        name = self.wait_backup(job, 10)
        data = [x for x in self.store.names("%s/%s/" % (job, name))
                if ".data/" in x]
        self.assertFalse([x for x in data if x.endswith("/pipe")], data)
        self.lose_all_ram()
        self.assertEqual(self.job_restart(job), {0: 10, 1: 10})
        for r in range(2):
            c.restore_and_verify(job, r, 10, size=tbr.SIZE)
            st = os.lstat(os.path.join(c.nodes[r].mnt, "10", "pipe"))
            self.assertTrue(stat.S_ISFIFO(st.st_mode), "node %d" % r)
            self.assertEqual(stat.S_IMODE(st.st_mode), 0o604, "node %d" % r)


# only the test above: the backup suite's own tests run in test_backup_restore
for _n in dir(FifoBackedUp.__mro__[1]):
    if _n.startswith("test") and _n != "test_fifo_restored_from_bucket_with_its_mode":
        setattr(FifoBackedUp, _n, None)
del _n


class StopWithOpenFiles(CrashCase):

    def test_sigterm_with_files_open_exits_clean(self):
        # A daemon stopped while files are still open (a driver stopping
        # its job mount, a node shutdown) gets no RELEASE for them after the
        # unmount: it must still exit 0 and free every handle. Under ASan a
        # leaked handle was a LeakSanitizer report (24 bytes from ll_create).
        w = os.open(self.m("open-for-write"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(w, b"x" * 4096)
        write_file(self.m("open-for-read"), b"y" * 4096)
        r = os.open(self.m("open-for-read"), os.O_RDONLY)
        try:
            self.fs.proc.send_signal(signal.SIGTERM)
            rc = self.fs.proc.wait(harness.EXIT_TIMEOUT)
            self.assertEqual(rc, 0, self.fs.log_tail())
        finally:
            for fd in (w, r):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fs.proc = None
        harness.force_unmount(self.mnt)
        self.fs._check_log()
        self.fs._raise_problems()


if __name__ == "__main__":
    harness.main()
