"""Backups as GKE schedules them, and restores of a backup written by a job
of another size (issue 24 items 1 and 2, issue 27 point 4), on real
multi-node clusters on loopback with a file:// bucket.

1. The schedule: backup-interval-steps N backs up the first job-wide
   complete step, then each complete step at least N above the last one
   backed up; backup-interval-minutes: 0 is GKE's "every step" (it was
   rounded up to one minute). Backups are named by the UTC minute, one per
   minute: a step that becomes due in the minute of the previous backup
   waits for the next minute, and then the newest complete step is
   uploaded (steps committed meanwhile are skipped).
2. Another job size: a backup with more nodes than the job restores ranks
   0..nodes-1 and ignores the others; a backup with fewer nodes restores
   under assume-data-parallelism, each new rank taking the shard of the
   backup's node of its column (rank r mod nodes/D), byte for byte; the
   same with restore.version naming it. A backup the job cannot use is
   reported in replicator.errors with the reason, before the job starts
   from nothing.

Run: MTCFS_BUILD=build /usr/bin/python3 tests/integration/bucket/test_backup_shape.py
"""
import os
import re
import sys
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402,F401
from cluster import Cluster, shard_files  # noqa: E402
from test_backup_restore import (FileStore, NAME_RE, TEST_MINUTE_SECS,  # noqa: E402
                                 quiesce, read_text)
import test_pytorch_backup as pt  # noqa: E402

SIZE = 64 * 1024


class ShapeCluster(Cluster):
    """A cluster whose yaml says interval (the whole line) and extra."""

    def __init__(self, n, interval, **kw):
        super().__init__(n, **kw)
        self.interval = interval


class ShapeBase(unittest.TestCase):

    def setUp(self):
        self.store = FileStore(self)

    def cluster(self, n, interval="backup-interval-steps: 1", env=None, start=True):
        c = ShapeCluster(n, interval, ram_size="128M", restore_timeout=15,
                         extra=self.store.opts())
        self.addCleanup(c.close)
        self.addCleanup(quiesce, c)            # runs before c.close
        for d in c.nodes:
            d.extra_args.append("-d")          # INFO: backup/restore lines
            d.env["MTCFS_TEST_MINUTE_SECS"] = TEST_MINUTE_SECS
            if env:
                d.env.update(env)
        if start:
            c.start()
        return c

    def backups(self, job):
        """{backup name: step} of the job's complete backups in the
        bucket, judged by their .meta names (every node's, one step)."""
        out = {}
        for x in self.store.names(job + "/"):
            m = re.match(r"[^/]+/(%s)/%s-s(\d+)-n\d+-w0\.meta$" % (NAME_RE, re.escape(job)), x)
            if m:
                out[m.group(1)] = int(m.group(2))
        return out

    def backed_up_steps(self, c, job):
        """Steps whose backup rank 0 logged complete, in order."""
        rx = r"backup job=%s name=%s step=(\d+) complete" % (re.escape(job), NAME_RE)
        return [int(m.group(1)) for m in re.finditer(rx, c.nodes[0].log_text())]

    def errors(self, c, r):
        return read_text(os.path.join(c.nodes[r].mnt, "replicator.errors"))


class ScheduleTest(ShapeBase):

    def test_steps_interval(self):
        """backup-interval-steps: 20 with steps 10..60 saved one after
        another: backups of 10 (the first complete step), 30 and 50, each
        started once its step was complete on every node; 20, 40, 60 are
        not backed up."""
        job = "iv20"
        c = self.cluster(2, "backup-interval-steps: 20")
        self.assertEqual(c.job_start(job), {0: 0, 1: 0})
        for s in (10, 20, 30, 40, 50, 60):
            c.save(job, s, size=SIZE)
            if s in (10, 30, 50):
                c.wait_backup(job, s, timeout=30)
            else:
                # the coordinator has seen the step complete (and decided)
                c.nodes[0].wait_log(r"job %s: step %d is complete on all 2 nodes" % (job, s),
                                    30, "step %d complete" % s, since=0)
        quiesce(c)
        self.assertEqual(self.backed_up_steps(c, job), [10, 30, 50])
        self.assertEqual(sorted(self.backups(job).values()), [10, 30, 50])

    def test_minutes_zero_backs_up_every_step(self):
        """backup-interval-minutes: 0 is GKE's backup of every step: each
        step saved after the previous backup ended is backed up (the test's
        backup minute lasts 1 s). mtcfs used to round 0 up to one minute:
        no backup at all for the first 60 s."""
        job = "iv0"
        c = self.cluster(2, "backup-interval-minutes: 0")
        self.assertEqual(c.job_start(job), {0: 0, 1: 0})
        names = {}
        for s in (10, 20, 30):
            c.save(job, s, size=SIZE)
            names[s] = c.wait_backup(job, s, timeout=30)
        self.assertEqual(len(set(names.values())), 3, names)
        self.assertEqual({self.backups(job)[n] for n in names.values()}, {10, 20, 30})
        self.assertNotIn("rounded up", c.nodes[0].log_text())

    def test_minutes_zero_one_backup_per_minute(self):
        """Every step, but one backup per UTC minute (a backup minute of
        20 s here): steps that become complete in the minute of the last
        backup wait, and at the next minute the newest complete step is
        uploaded; the steps between are skipped."""
        job = "iv0m"
        c = self.cluster(2, "backup-interval-minutes: 0",
                         env={"MTCFS_TEST_MINUTE_SECS": "20"})
        c.job_start(job)
        c.save(job, 10, size=SIZE)
        a = c.wait_backup(job, 10, timeout=30)
        mark = c.nodes[0].log_size()
        # 20, 30 and 40 committed back to back, well within the minute of a
        # (unless it ends right now: then one of them is backed up at once
        # and the next waits; the rule below holds either way)
        for s in (20, 30, 40):
            c.save(job, s, size=SIZE)
        b = c.wait_backup(job, 40, timeout=60)
        quiesce(c)
        log = c.nodes[0].log_text()[mark:]
        waited = [int(x) for x in re.findall(
            r"job %s: backup of step (\d+) waits \d+ s for the next UTC minute" % job, log)]
        self.assertTrue(waited, "no backup waited for the next minute:\n" + log)
        done = self.backed_up_steps(c, job)
        self.assertEqual(done[0], 10)
        self.assertEqual(done[-1], 40)
        # one per minute, newest first in name order
        got = self.backups(job)
        self.assertEqual(sorted(got.values()), sorted(done), got)
        names = sorted(got)
        self.assertEqual(len(names), len(set(n[:16] for n in names)))
        self.assertEqual([got[n] for n in names], sorted(done))
        self.assertEqual(names[0], a)
        self.assertEqual(names[-1], b)
        # a step that waited is not uploaded when a newer one was complete
        # by the end of its wait (40 was committed within a second of 20)
        self.assertLessEqual(len(done), 3, done)
        if waited[0] == 20:
            self.assertEqual(done, [10, 40], log)


class ShapeTest(ShapeBase):
    """Backups of one job size restored by another (GKE checks only the
    current job's ranks)."""

    def saved_backup(self, n, job, step):
        """A cluster of n nodes saves step and backs it up; then it is
        gone (its RAM with it): only the bucket is left. The backup's name."""
        c = self.cluster(n)
        self.assertEqual(c.job_start(job), {r: 0 for r in range(n)})
        c.save(job, step, size=SIZE)
        name = c.wait_backup(job, step, timeout=60)
        quiesce(c)
        c.close()
        return name

    def restore_marker(self, c, job, r, step):
        """Orbax's restore on node r: rename the marker to <step>; the
        restored directory's path."""
        mnt = c.nodes[r].mnt
        ms = [x for x in os.listdir(mnt) if x.endswith(".restore")]
        self.assertEqual(ms, ["%s-s%d-n%d-w0.restore" % (job, step, r)], "node %d" % r)
        os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, str(step)))
        return os.path.join(mnt, str(step))

    def assert_shard(self, c, job, r, step, owner):
        """Node r restored exactly owner's shard of step, byte for byte."""
        d = self.restore_marker(c, job, r, step)
        want = shard_files(job, step, owner, SIZE)
        got = {}
        for dp, _, fns in os.walk(d):
            for fn in fns:
                rel = os.path.relpath(os.path.join(dp, fn), d)
                if rel != "commit_success.txt":
                    with open(os.path.join(dp, fn), "rb") as f:
                        got[rel] = f.read()
        self.assertEqual(sorted(got), sorted(want), "node %d's files" % r)
        for rel, data in want.items():
            self.assertEqual(got[rel], data, "node %d: %s is not node %d's" % (r, rel, owner))

    def set_restore_version(self, job, name):
        self.store.write("%s/restore.version" % job, name.encode())

    def test_larger_backup_restored_on_fewer_nodes(self):
        """4 nodes back up step 10; the job comes back with 2 nodes and
        every RAM lost: ranks 0 and 1 restore their shards of that backup
        (nodes 2 and 3 ignored, as GKE does), with no note in
        replicator.errors. Then, with step 20 saved and backed up by the 2
        nodes, restore.version naming the 4-node backup restores step 10
        again. (A backup with a node outside the job was incomplete: the
        job started from nothing.)"""
        job = "shrink"
        big = self.saved_backup(4, job, 10)
        c = self.cluster(2)
        self.assertEqual(c.job_start(job), {0: 10, 1: 10})
        for r in range(2):
            self.assertEqual(self.errors(c, r), "", "node %d's replicator.errors" % r)
            self.assertIn("restored job=%s step=10 from backup %s" % (job, big),
                          c.nodes[r].log_text())
            self.assert_shard(c, job, r, 10, r)
        c.save(job, 20, size=SIZE)
        small = c.wait_backup(job, 20, timeout=60)
        self.assertNotEqual(small, big)
        quiesce(c)
        self.set_restore_version(job, big)
        self.assertEqual(c.job_start(job), {0: 10, 1: 10})
        for r in range(2):
            self.assertEqual(self.errors(c, r), "", "node %d's replicator.errors" % r)
            self.assert_shard(c, job, r, 10, r)
        self.assertRegex(c.nodes[0].log_text(),
                         r"plan job=%s plan=\d+: restore backup %s \(step 10\) named by "
                         r"restore.version" % (job, big))

    def test_smaller_backup_grows_under_data_parallelism(self):
        """2 nodes (D = 1) back up step 10; the job comes back with 4
        nodes and assume-data-parallelism: 2 (columns {0, 2} and {1, 3}):
        ranks 0 and 1 restore their own shards, ranks 2 and 3 those of
        nodes 0 and 1, byte for byte. The same through restore.version
        after the 4 nodes saved and backed up step 20."""
        job = "grow"
        small = self.saved_backup(2, job, 10)
        c = self.cluster(4)
        dp = "assume-data-parallelism: 2\n"
        self.assertEqual(c.job_start(job, extra=dp), {r: 10 for r in range(4)})
        for r in range(4):
            self.assertEqual(self.errors(c, r), "", "node %d's replicator.errors" % r)
            self.assertIn("restored job=%s step=10 from backup %s" % (job, small),
                          c.nodes[r].log_text())
            self.assert_shard(c, job, r, 10, r % 2)
        c.save(job, 20, size=SIZE)
        big = c.wait_backup(job, 20, timeout=60)
        quiesce(c)
        self.set_restore_version(job, small)
        self.assertEqual(c.job_start(job, extra=dp), {r: 10 for r in range(4)})
        for r in range(4):
            self.assertEqual(self.errors(c, r), "", "node %d's replicator.errors" % r)
            self.assert_shard(c, job, r, 10, r % 2)
        self.assertIn("plan job=%s plan=" % job, c.nodes[0].log_text())
        self.assertNotEqual(big, small)

    def test_unusable_backup_reported(self):
        """2 nodes back up step 10; 4 nodes without data parallelism cannot
        tell what ranks 2 and 3 held: every node's replicator.errors says
        why the backup was passed over, the job starts from nothing; with
        restore.version naming it, the same reason, and nothing restored
        (no fallback)."""
        job = "nodp"
        small = self.saved_backup(2, job, 10)
        c = self.cluster(4)
        self.assertEqual(c.job_start(job), {r: 0 for r in range(4)})
        why = ("it was written by a job of 2 nodes and this job has 4: node 2 has no "
               "shard in it (with assume-data-parallelism a new node restores its column's)")
        for r in range(4):
            self.assertEqual(self.errors(c, r), "backup %s skipped: %s\n" % (small, why),
                             "node %d" % r)
        self.set_restore_version(job, small)
        self.assertEqual(c.job_start(job), {r: 0 for r in range(4)})
        for r in range(4):
            self.assertEqual(self.errors(c, r),
                             "restore.version names backup %s, which cannot be restored by "
                             "this job: %s; nothing is restored (no fallback)\n" % (small, why),
                             "node %d" % r)


class PytorchShapeTest(ShapeBase):
    """framework: pytorch, one shard per worker (workers-per-node 2)."""

    def test_gke_backup_of_two_nodes_restored_on_four_under_dp(self):
        """A backup as GKE's replicator writes it, 2 nodes x 2 workers (a
        .meta per worker naming one <hash>.data): a job of 4 nodes with
        assume-data-parallelism: 2 restores it, each worker of ranks 2 and
        3 getting the file of the same worker of nodes 0 and 1 under its own
        name, <job>-s70-n<rank>-w<w>.save, byte for byte."""
        pt.write_gke_pytorch_backup(self.store)
        job, step = pt.GKE_JOB, pt.GKE_STEP
        c = pt.PtBackupCluster(4, restore_timeout=15, extra=self.store.opts())
        self.addCleanup(c.close)
        self.addCleanup(quiesce, c)
        for d in c.nodes:
            d.extra_args.append("-d")
            d.env["MTCFS_TEST_MINUTE_SECS"] = TEST_MINUTE_SECS
        c.start()
        self.assertEqual(c.job_start(job, extra="assume-data-parallelism: 2\n"),
                         {r: step for r in range(4)})
        for r in range(4):
            mnt = c.nodes[r].mnt
            self.assertEqual(self.errors(c, r), "", "node %d's replicator.errors" % r)
            want = [pt.save_name(job, step, r, w, "restore") for w in range(pt.W)]
            self.assertEqual(pt.markers(mnt), want, "markers of node %d" % r)
            for w, name in enumerate(want):
                p = os.path.join(mnt, name)
                self.assertTrue(os.readlink(p).endswith("/" + pt.save_name(job, step, r, w)),
                                "%s -> %s" % (name, os.readlink(p)))
                self.assertEqual(pt.read_file(p), pt.gke_body(r % 2, w),
                                 "node %d worker %d: not node %d's bytes" % (r, w, r % 2))


if __name__ == "__main__":
    unittest.main()
