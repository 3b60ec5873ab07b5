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
  thread left blocked on its own mount) and nothing committed is lost.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/test_crash.py [-k NAME]
"""

import errno
import os
import random
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import crc32c as crcmod  # noqa: E402
import test_protocol as tp  # noqa: E402
from harness import (assert_manifest, assert_shard_on_disk, read_file,  # noqa
                     read_tree, write_file)

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


if __name__ == "__main__":
    harness.main()
