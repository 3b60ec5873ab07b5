"""GKE's `framework: pytorch` mode (DESIGN §3.3).

The application writes one file per worker at the top of the mount,
`<job>-s<S>-n<rank>-w<w>.save`. Step S of the node is committed when the
files of all `workers-per-node` workers are closed; after a restart of the
job each worker's `<job>-s<S>-n<rank>-w<w>.restore` marker is a relative
symlink to that worker's file. GKE's replicator (src/replicator/framework/
pytorch.py, file_naming.py, restore.py) behaves the same way, except that
it renames the .save files to <hash>.data where mtcfs leaves them in place,
read-only.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/test_pytorch_mode.py [-k NAME]
"""

import errno
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from cluster import Cluster  # noqa: E402
from harness import (admin_ls, assert_manifest, read_file, wait_until,  # noqa
                     write_file)

TIMEOUT = 60


def body(job, step, rank, w, n=200 * 1024):
    return random.Random("%s/%s/%d/%d" % (job, step, rank, w)).randbytes(n)


def save_name(job, step, rank, w, ext="save"):
    return "%s-s%s-n%d-w%d.%s" % (job, step, rank, w, ext)


def pt_yaml(job, rank=0, nodes=1, workers=2, peers=1):
    return ("job-name: %s\nframework: pytorch\nnode-rank: %d\nnodes: %d\n"
            "peers-per-node: %d\nworkers-per-node: %d\n"
            "backup-interval-minutes: 30\n" % (job, rank, nodes, peers, workers))


def markers(mnt):
    return sorted(n for n in os.listdir(mnt) if n.endswith(".restore"))


def start_job(mnt, text, want, check=None):
    """Write replicator.yaml (tmp + rename), wait for `want` markers."""
    y = os.path.join(mnt, "replicator.yaml")
    wait_until(lambda: not os.path.exists(y), TIMEOUT, "yaml absent", check=check)
    for n in markers(mnt):       # the app consumed the previous run's
        os.unlink(os.path.join(mnt, n))
    write_file(y + ".tmp", text.encode())
    os.rename(y + ".tmp", y)
    wait_until(lambda: not os.path.exists(y), TIMEOUT, "yaml consumed", check=check)
    failed = os.path.join(mnt, "replicator.failed")

    def ready():
        if os.path.exists(failed):
            raise AssertionError("replicator.failed: %r" % read_file(failed))
        ms = markers(mnt)
        return ms if len(ms) >= want else None
    return wait_until(ready, TIMEOUT, "%d .restore markers" % want, check=check)


def assert_markers(tc, mnt, job, step, rank, files):
    """One marker per worker, named exactly, each a relative symlink that
    resolves inside the mount to that worker's .save file with its bytes."""
    want = [save_name(job, step, rank, w, "restore") for w in range(len(files))]
    tc.assertEqual(markers(mnt), want)
    real_mnt = os.path.realpath(mnt)
    for w, name in enumerate(want):
        p = os.path.join(mnt, name)
        tc.assertTrue(os.path.islink(p), name)
        target = os.readlink(p)
        tc.assertFalse(target.startswith("/"), "%s -> %s" % (name, target))
        tc.assertTrue(target.endswith("/" + save_name(job, step, rank, w)),
                      "%s -> %s: not worker %d's file" % (name, target, w))
        tc.assertTrue(os.path.realpath(p).startswith(real_mnt + os.sep))
        tc.assertTrue(os.path.isfile(p), name)
        tc.assertEqual(read_file(p), files[w], "bytes behind %s" % name)


class SingleNode(harness.MountTestCase):
    START = False

    def setUp(self):
        super().setUp()
        self.fs.extra_args.append("-d")    # INFO lines: commits in the log
        self.fs.start()

    def wait_log(self, regex):
        wait_until(lambda: re.search(regex, self.fs.log_text()), TIMEOUT,
                   "log line %r" % regex, check=self.fs.check_alive)

    def m(self, *p):
        return os.path.join(self.mnt, *p)

    def start(self, job, workers=2):
        return start_job(self.mnt, pt_yaml(job, workers=workers), workers,
                         check=self.fs.check_alive)

    def save(self, job, step, workers=2, keep_open=None):
        """Write every worker's .save file; keep_open=w leaves w's open
        (returned fd) after its bytes are written."""
        files, fd = [], None
        for w in range(workers):
            data = body(job, step, 0, w)
            files.append(data)
            path = self.m(save_name(job, step, 0, w))
            if w == keep_open:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, data)
            else:
                write_file(path, data)
        return files, fd

    def committed(self, job, step):
        return self.wait_committed(int(step), job=job)

    def test_two_workers_commit_and_restore(self):
        job = "ptj"
        self.assertEqual(self.start(job),
                         [save_name(job, 0, 0, w, "restore") for w in (0, 1)])
        for n in markers(self.mnt):     # the app consumes the s0 markers
            os.unlink(self.m(n))
        files, fd = self.save(job, 10, keep_open=1)
        try:
            # worker 1's file is still open: nothing is committed, even
            # after a later step of this node is
            os.mkdir(self.m("3.tmp"))
            write_file(self.m("3.tmp", "x"), b"barrier")
            os.rename(self.m("3.tmp"), self.m("3"))
            self.committed(job, 3)
            self.assertEqual(harness.shard_steps(self.ramdir, job), [3])
        finally:
            os.close(fd)
        s = self.committed(job, 10)
        assert_manifest(self, s, {save_name(job, 10, 0, w): files[w]
                                  for w in (0, 1)})
        # committed files are read-only to the app
        self.assertEqual(read_file(self.m(save_name(job, 10, 0, 0))), files[0])
        for w in (0, 1):
            with self.assertRaises(OSError) as cm:
                os.close(os.open(self.m(save_name(job, 10, 0, w)), os.O_WRONLY))
            self.assertEqual(cm.exception.errno, errno.EROFS)
        # the job restarts: each worker's marker points at its own file
        self.start(job)
        self.assertEqual(read_file(self.m("replicator.prerestore")),
                         b"restore-step: 10\n")
        assert_markers(self, self.mnt, job, 10, 0, files)
        # the .save files of the previous run are gone from the view
        self.assertEqual([n for n in os.listdir(self.mnt) if n.endswith(".save")], [])

    def test_restore_after_mtcfs_restart_and_newer_step(self):
        job = "ptr"
        self.start(job)
        self.save(job, 10)
        self.committed(job, 10)
        files, _ = self.save(job, 20)
        self.committed(job, 20)
        # the older step goes with its .save names (policy keeps the newest)
        wait_until(lambda: not os.path.exists(self.m(save_name(job, 10, 0, 0)))
                   and harness.shard_steps(self.ramdir, job) == [20],
                   TIMEOUT, "step 10 dropped with its .save files")
        self.fs.restart(kill=True)
        # still read-only after the restart of mtcfs: the bytes are the shard's
        for w in (0, 1):
            with self.assertRaises(OSError) as cm:
                os.close(os.open(self.m(save_name(job, 20, 0, w)), os.O_WRONLY))
            self.assertEqual(cm.exception.errno, errno.EROFS)
        self.start(job)
        assert_markers(self, self.mnt, job, 20, 0, files)

    def test_incomplete_step_is_not_committed(self):
        job = "pti"
        self.start(job)
        write_file(self.m(save_name(job, 7, 0, 0)), b"only worker 0")
        write_file(self.m(save_name(job, 8, 0, 1)), b"only worker 1")
        write_file(self.m(save_name(job, 9, 0, 2)), b"no worker 2")   # W=2
        write_file(self.m(save_name("other", 9, 0, 0)), b"other job")
        write_file(self.m(save_name("other", 9, 0, 1)), b"other job")
        write_file(self.m(save_name(job, 9, 1, 0)), b"other node")
        write_file(self.m(save_name(job, 9, 1, 1)), b"other node")
        os.mkdir(self.m("2.tmp"))
        write_file(self.m("2.tmp", "x"), b"barrier")
        os.rename(self.m("2.tmp"), self.m("2"))
        self.committed(job, 2)
        self.assertEqual(harness.shard_steps(self.ramdir, job), [2])
        write_file(self.m(save_name(job, 7, 0, 0)), b"still writable")

    def test_save_file_renamed_into_place(self):
        # GKE's watcher also takes a .save name that appears by rename
        job = "ptm"
        self.start(job)
        w0 = body(job, 40, 0, 0)
        w1 = body(job, 40, 0, 1)
        write_file(self.m(save_name(job, 40, 0, 0)), w0)
        write_file(self.m("w1.partial"), w1)
        os.rename(self.m("w1.partial"), self.m(save_name(job, 40, 0, 1)))
        s = self.committed(job, 40)
        assert_manifest(self, s, {save_name(job, 40, 0, 0): w0,
                                  save_name(job, 40, 0, 1): w1})

    def test_replacing_one_file_does_not_mix_two_saves(self):
        job = "ptx"
        self.start(job)
        old, _ = self.save(job, 50)
        want = {save_name(job, 50, 0, w): old[w] for w in (0, 1)}
        assert_manifest(self, self.committed(job, 50), want)
        # a new worker-0 file over the committed name: worker 1's is still
        # the committed one, so this is no complete save of its own
        write_file(self.m("w0.new"), b"new worker 0")
        os.rename(self.m("w0.new"), self.m(save_name(job, 50, 0, 0)))
        # barrier: a later commit (policy drops it at once, being older
        # than 50, so it is seen in the log)
        os.mkdir(self.m("2.tmp"))
        write_file(self.m("2.tmp", "x"), b"barrier")
        os.rename(self.m("2.tmp"), self.m("2"))
        self.wait_log(r"committed job=%s step=2 " % job)
        sh = harness.find_shard(admin_ls(self.ramdir), 50, job=job)
        assert_manifest(self, sh, want)
        # both files new: a save of step 50 again, which replaces the shard
        write_file(self.m("w1.new"), b"new worker 1")
        os.rename(self.m("w1.new"), self.m(save_name(job, 50, 0, 1)))
        new = {save_name(job, 50, 0, 0): b"new worker 0",
               save_name(job, 50, 0, 1): b"new worker 1"}

        def replaced():
            sh = harness.find_shard(admin_ls(self.ramdir), 50, job=job)
            return sh if sh and sh["state"] in harness.COMMITTED_STATES and \
                sh["bytes"] == 24 else None
        assert_manifest(self, wait_until(replaced, TIMEOUT, "step 50 again"), new)

    def test_kill9_right_after_the_last_close(self):
        # the close's release (and so the commit) may not even have been
        # seen, or the seal may be running: after the restart the step is
        # committed from the files
        job = "ptk"
        self.start(job)
        files = [body(job, 60, 0, w, 48 << 20) for w in (0, 1)]
        for w in (0, 1):
            write_file(self.m(save_name(job, 60, 0, w)), files[w])
        self.fs.kill9()
        self.fs.start()
        s = self.wait_committed(60, job=job, timeout=120)
        assert_manifest(self, s, {save_name(job, 60, 0, w): files[w]
                                  for w in (0, 1)})
        with self.assertRaises(OSError) as cm:
            os.close(os.open(self.m(save_name(job, 60, 0, 1)), os.O_WRONLY))
        self.assertEqual(cm.exception.errno, errno.EROFS)
        self.start(job)
        assert_markers(self, self.mnt, job, 60, 0, files)

    def test_one_worker_zero_padded_step(self):
        job = "ptz"
        self.start(job, workers=1)
        files, _ = self.save(job, "05", workers=1)
        s = self.committed(job, 5)
        assert_manifest(self, s, {save_name(job, "05", 0, 0): files[0]})
        self.start(job, workers=1)
        assert_markers(self, self.mnt, job, "05", 0, files)


class PtCluster(Cluster):
    def yaml(self, job, rank, extra=""):
        return pt_yaml(job, rank, self.n, workers=2, peers=self.k) + extra


class TwoNodes(harness.unittest.TestCase):

    def test_wiped_node_restores_its_files_from_peer(self):
        job, step = "ptc", 30
        c = PtCluster(2)
        for d in c.nodes:
            d.extra_args.append("-d")      # INFO lines: where it restored from
        self.daemons = list(c.nodes)       # their logs on failure
        with c:
            c.job_start(job)
            files = {}
            for r in range(2):
                mnt = c.nodes[r].mnt
                for n in markers(mnt):
                    os.unlink(os.path.join(mnt, n))
                files[r] = [body(job, step, r, w) for w in (0, 1)]
                for w in (0, 1):
                    write_file(os.path.join(mnt, save_name(job, step, r, w)),
                               files[r][w])
            c.wait_replicated(job, step, timeout=TIMEOUT)
            for r in range(2):
                assert_manifest(self, harness.find_shard(
                    admin_ls(c.nodes[r].ramdir), step, job=job, rank=r),
                    {save_name(job, step, r, w): files[r][w] for w in (0, 1)})
            c.nodes[1].kill9()
            c.nodes[1].wipe_ramdir()
            c.nodes[1].start()
            self.assertEqual(c.job_start(job), {0: step, 1: step})
            for r in range(2):
                assert_markers(self, c.nodes[r].mnt, job, step, r, files[r])
            log = c.nodes[1].log_text()
            self.assertTrue(re.search(r"restored job=%s step=%d from rank 0"
                                      % (job, step), log),
                            "node 1 did not restore from its peer: %s" % "\n".join(
                                l for l in log.splitlines() if "restor" in l))

    def test_data_parallel_node_without_its_step_takes_its_column_mates_files(self):
        self.column_mate_case(wipe=True)

    def test_data_parallel_column_mates_replica_held_here_is_renamed(self):
        """As above, but node 1 keeps its RAM (it holds node 0's replica):
        the replica is linked under node 1's key with node 1's names."""
        self.column_mate_case(wipe=False)

    def column_mate_case(self, wipe):
        """assume-data-parallelism: 2 over 2 nodes (one column). Node 0
        commits step 30, node 1 is lost before it saves and comes back
        empty. GKE's coordinator then gives node 1 its column mate's
        per-worker hashes (coordinator.py: infer_missing_meta) and node 1's
        workers restore node 0's files through their own markers
        (<job>-s30-n1-w<w>.restore). mtcfs: the same bytes, under node 1's
        own names."""
        job, step, dp = "ptdpc", 30, "assume-data-parallelism: 2\n"
        c = PtCluster(2)
        for d in c.nodes:
            d.extra_args.append("-d")
        self.daemons = list(c.nodes)
        with c:
            self.assertEqual(c.job_start(job, extra=dp), {0: 0, 1: 0})
            mnt = c.nodes[0].mnt
            for n in markers(mnt):
                os.unlink(os.path.join(mnt, n))
            files = [body(job, step, 0, w) for w in (0, 1)]
            for w in (0, 1):
                write_file(os.path.join(mnt, save_name(job, step, 0, w)), files[w])
            # node 0's shard replicated to node 1: pushes are over
            wait_until(lambda: harness.find_shard(admin_ls(c.nodes[1].ramdir), step,
                                                  job=job, rank=0), TIMEOUT,
                       "node 0's step %d held by node 1" % step)
            if wipe:
                c.nodes[1].kill9()
                c.nodes[1].wipe_ramdir()
                c.nodes[1].start()
            self.assertEqual(c.job_start(job, extra=dp), {0: step, 1: step})
            assert_markers(self, c.nodes[0].mnt, job, step, 0, files)
            assert_markers(self, c.nodes[1].mnt, job, step, 1, files)


if __name__ == "__main__":
    harness.main()
