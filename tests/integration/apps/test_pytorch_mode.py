"""GKE's `framework: pytorch` mode (DESIGN §3.3).

The application writes one file per worker at the top of the mount,
`<job>-s<S>-n<rank>-w<w>.save`. Each worker's file is its own shard
(rank, worker, step), committed when it is closed and replicated at once;
step S is the node's (and, with the coordinator, the job's) once every
(node, worker) committed it. After a restart of the job each worker's
`<job>-s<S>-n<rank>-w<w>.restore` marker is a relative symlink to that
worker's file. GKE's replicator (src/replicator/framework/
pytorch.py, file_naming.py, restore.py) behaves the same way, except that
it renames the .save files to <hash>.data where mtcfs leaves them in place,
read-only.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/apps/test_pytorch_mode.py [-k NAME]
"""

import errno
import json
import os
import random
import re
import sys

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
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


def steps_of(ramdir, job):
    """Sorted distinct steps mtcfs-admin ls lists for job (a step has one
    shard per worker)."""
    return sorted({s["step"] for s in admin_ls(ramdir).get("shards", [])
                   if s.get("job") == job})


def assert_worker_shards(tc, ls, job, step, rank, files):
    """Worker w's shard of (rank, step) holds exactly w's file, its bytes."""
    for w, data in enumerate(files):
        sh = harness.find_shard(ls, int(step), job=job, rank=rank, worker=w)
        tc.assertIsNotNone(sh, "no shard of %s step %s n%d-w%d" % (job, step, rank, w))
        assert_manifest(tc, sh, {save_name(job, step, rank, w): data})


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
            # worker 0's file is its own shard, committed once closed;
            # worker 1's is still open: not committed, even after a later
            # step of this node is
            assert_manifest(self, self.committed(job, 10),
                            {save_name(job, 10, 0, 0): files[0]})
            os.mkdir(self.m("3.tmp"))
            write_file(self.m("3.tmp", "x"), b"barrier")
            os.rename(self.m("3.tmp"), self.m("3"))
            self.committed(job, 3)
            self.assertIsNone(harness.find_shard(admin_ls(self.ramdir), 10, job=job,
                                                 worker=1))
        finally:
            os.close(fd)
        harness.wait_committed(self.ramdir, 10, job=job, worker=1,
                               daemon=self.fs)
        assert_worker_shards(self, admin_ls(self.ramdir), job, 10, 0, files)
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

    def test_create_racing_another_workers_close_is_not_committed(self):
        """Worker 0 creates its .save file while worker 1 closes its own:
        the scan that worker 1's close runs must not take worker 0's file
        as closed in the moment it exists in RAMDIR but is not yet counted
        as written (it committed it empty, and worker 0's torch.save then
        failed with EROFS). MTCFS_TEST_CREATE_PAUSE holds worker 0's create
        in that moment."""
        import threading
        job = "ptrace"
        self.fs.stop()
        self.fs.env["MTCFS_TEST_CREATE_PAUSE"] = "-w0.save:1500"
        self.fs.start()
        self.start(job)
        for n in markers(self.mnt):
            os.unlink(self.m(n))
        data = [body(job, 7, 0, w) for w in (0, 1)]
        res = {}

        def worker0():
            try:
                write_file(self.m(save_name(job, 7, 0, 0)), data[0])
                res["ok"] = True
            except OSError as e:
                res["err"] = e

        # worker 1's file is open and written before worker 0's create
        # (creates in one directory are serialized by the kernel; a close is
        # not), and is closed while worker 0's file exists in RAMDIR
        p1 = self.m(save_name(job, 7, 0, 1))
        fd1 = os.open(p1, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        t = threading.Thread(target=worker0)
        try:
            os.write(fd1, data[1])
            t.start()
            wait_until(lambda: os.path.exists(os.path.join(
                self.ramdir, "ns", save_name(job, 7, 0, 0))), TIMEOUT,
                "worker 0's file created in RAMDIR", check=self.fs.check_alive)
        finally:
            os.close(fd1)
            if t.is_alive() or t.ident:
                t.join(TIMEOUT)
        self.assertFalse(t.is_alive())
        self.assertEqual(res, {"ok": True}, "worker 0's write")
        harness.wait_committed(self.ramdir, 7, job=job, worker=0, daemon=self.fs)
        harness.wait_committed(self.ramdir, 7, job=job, worker=1, daemon=self.fs)
        assert_worker_shards(self, admin_ls(self.ramdir), job, 7, 0, data)

    def test_restore_after_mtcfs_restart_and_newer_step(self):
        job = "ptr"
        self.start(job)
        self.save(job, 10)
        self.committed(job, 10)
        files, _ = self.save(job, 20)
        self.committed(job, 20)
        # the older step goes with its .save names (policy keeps the newest)
        wait_until(lambda: not os.path.exists(self.m(save_name(job, 10, 0, 0)))
                   and steps_of(self.ramdir, job) == [20],
                   TIMEOUT, "step 10 dropped with its .save files")
        self.fs.restart(kill=True)
        # still read-only after the restart of mtcfs: the bytes are the shard's
        for w in (0, 1):
            with self.assertRaises(OSError) as cm:
                os.close(os.open(self.m(save_name(job, 20, 0, w)), os.O_WRONLY))
            self.assertEqual(cm.exception.errno, errno.EROFS)
        self.start(job)
        assert_markers(self, self.mnt, job, 20, 0, files)

    def test_incomplete_step_is_not_restored(self):
        """Worker 0's step 7 and worker 1's step 8 are each their worker's
        own shard, committed; neither step has every worker: the restore
        takes step 2. Files of another job, node or a worker >= W are not
        this node's: not committed."""
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
        harness.wait_committed(self.ramdir, 7, job=job, worker=0, daemon=self.fs)
        harness.wait_committed(self.ramdir, 8, job=job, worker=1, daemon=self.fs)
        self.assertEqual(sorted((s["step"], s["rank"], s["worker"])
                                for s in admin_ls(self.ramdir)["shards"]
                                if s["job"] == job), [(2, 0, 0), (7, 0, 0), (8, 0, 1)])
        self.assertEqual(steps_of(self.ramdir, "other"), [])
        write_file(self.m(save_name(job, 9, 0, 2)), b"still writable")
        write_file(self.m(save_name(job, 9, 1, 0)), b"still writable")
        self.start(job)
        self.assertEqual(read_file(self.m("replicator.prerestore")),
                         b"restore-step: 2\n")

    def test_save_file_renamed_into_place(self):
        # GKE's watcher also takes a .save name that appears by rename
        job = "ptm"
        self.start(job)
        w0 = body(job, 40, 0, 0)
        w1 = body(job, 40, 0, 1)
        write_file(self.m(save_name(job, 40, 0, 0)), w0)
        write_file(self.m("w1.partial"), w1)
        os.rename(self.m("w1.partial"), self.m(save_name(job, 40, 0, 1)))
        self.committed(job, 40)
        harness.wait_committed(self.ramdir, 40, job=job, worker=1, daemon=self.fs)
        assert_worker_shards(self, admin_ls(self.ramdir), job, 40, 0, [w0, w1])

    def test_replacing_one_workers_file_replaces_its_shard_only(self):
        """Each worker's file is its own unit (GKE's replicator): a new
        worker-0 file over the committed name is a new save of worker 0,
        which replaces worker 0's shard; worker 1's shard stays as it was."""
        job = "ptx"
        self.start(job)
        old, _ = self.save(job, 50)
        self.committed(job, 50)
        harness.wait_committed(self.ramdir, 50, job=job, worker=1, daemon=self.fs)
        assert_worker_shards(self, admin_ls(self.ramdir), job, 50, 0, old)
        write_file(self.m("w0.new"), b"new worker 0")
        os.rename(self.m("w0.new"), self.m(save_name(job, 50, 0, 0)))

        def replaced():
            sh = harness.find_shard(admin_ls(self.ramdir), 50, job=job, worker=0)
            return sh if sh and sh["state"] in harness.COMMITTED_STATES and \
                sh["bytes"] == 12 else None
        wait_until(replaced, TIMEOUT, "worker 0's shard of step 50 again")
        assert_worker_shards(self, admin_ls(self.ramdir), job, 50, 0,
                             [b"new worker 0", old[1]])
        self.start(job)
        assert_markers(self, self.mnt, job, 50, 0, [b"new worker 0", old[1]])

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
        for w in (0, 1):
            self.wait_committed(60, job=job, worker=w, timeout=120)
        assert_worker_shards(self, admin_ls(self.ramdir), job, 60, 0, files)
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
                wait_until(lambda: all(harness.find_shard(
                    admin_ls(c.nodes[r].ramdir), step, job=job, rank=r, worker=w)
                    for w in (0, 1)), TIMEOUT, "node %d: both workers' shards" % r)
                assert_worker_shards(self, admin_ls(c.nodes[r].ramdir), job, step, r,
                                     files[r])
            c.nodes[1].kill9()
            c.nodes[1].wipe_ramdir()
            c.nodes[1].start()
            self.assertEqual(c.job_start(job), {0: step, 1: step})
            for r in range(2):
                assert_markers(self, c.nodes[r].mnt, job, step, r, files[r])
            log = c.nodes[1].log_text()
            for w in (0, 1):
                self.assertTrue(re.search(r"(?m)restored job=%s step=%d from rank 0 .* worker=%d$"
                                          % (job, step, w), log),
                                "node 1 did not restore worker %d from its peer: %s" % (
                                    w, "\n".join(l for l in log.splitlines()
                                                  if "restor" in l)))

    def test_each_workers_shard_replicated_on_its_own(self):
        """2 nodes x 2 workers (GKE: each worker's .save is its own unit).
        Worker 0 of node 0 saves step 40 before anyone else: its shard is
        replicated to node 1 at once, while step 40 is not the job's (not
        the LKG: three (node, worker) shards are missing). Once all four
        are in, step 40 is the job's last good step. Node 1 is then wiped:
        each of its workers' exact bytes come back from node 0."""
        job, step = "ptw", 40
        c = PtCluster(2)
        for d in c.nodes:
            d.extra_args.append("-d")
        self.daemons = list(c.nodes)
        with c:
            self.assertEqual(c.job_start(job), {0: 0, 1: 0})
            for r in range(2):
                for n in markers(c.nodes[r].mnt):
                    os.unlink(os.path.join(c.nodes[r].mnt, n))
            files = {r: [body(job, step, r, w) for w in (0, 1)] for r in range(2)}

            def put(r, w):
                write_file(os.path.join(c.nodes[r].mnt, save_name(job, step, r, w)),
                           files[r][w])

            def steps_row():
                out = harness.admin("steps", c.nodes[0].ramdir, "--job", job, "--json")
                rows = [x for x in json.loads(out)["steps"] if x["step"] == step]
                return rows[0] if rows else None

            put(0, 0)
            held = wait_until(lambda: harness.find_shard(
                admin_ls(c.nodes[1].ramdir), step, job=job, rank=0, worker=0),
                TIMEOUT, "node 0's worker-0 shard of step %d held by node 1" % step)
            assert_manifest(self, held, {save_name(job, step, 0, 0): files[0][0]})
            # in node 1's RAMDIR, the file itself
            found = [os.path.join(d, f) for d, _, fs in os.walk(c.nodes[1].ramdir)
                     for f in fs if f == save_name(job, step, 0, 0)]
            self.assertEqual(len(found), 1, found)
            self.assertEqual(read_file(found[0]), files[0][0])
            self.assertIsNone(harness.find_shard(admin_ls(c.nodes[1].ramdir), step,
                                                 job=job, rank=0, worker=1))
            row = steps_row()
            self.assertIsNotNone(row)
            self.assertFalse(row["lkg"], "step %d is the LKG with one of 4 shards" % step)
            # mtcfs-admin steps judges each node's shards per worker: node 0
            # holds only worker 0's, so the step is not complete (it said
            # complete when any one worker's shard was held)
            self.assertFalse(row["complete"], row)
            self.assertIn(0, row["missing"], row)
            self.assertNotRegex(c.nodes[0].log_text(),
                                r"job %s: step %d is complete" % (job, step))
            put(1, 0)
            put(1, 1)
            harness.wait_committed(c.nodes[1].ramdir, step, job=job, rank=1, worker=1,
                                   daemon=c.nodes[1])
            row = steps_row()
            self.assertFalse(row["lkg"], "step %d is the LKG without "
                             "node 0's worker 1" % step)
            self.assertEqual((row["complete"], row["missing"]), (False, [0]), row)
            put(0, 1)
            wait_until(lambda: (steps_row() or {}).get("lkg"), TIMEOUT,
                       "step %d the job's last good step" % step)
            self.assertTrue(steps_row()["complete"])
            for r in range(2):
                o = 1 - r
                wait_until(lambda: all(harness.find_shard(
                    admin_ls(c.nodes[o].ramdir), step, job=job, rank=r, worker=w)
                    for w in (0, 1)), TIMEOUT,
                    "node %d's two shards held by node %d" % (r, o))
                assert_worker_shards(self, admin_ls(c.nodes[o].ramdir), job, step, r,
                                     files[r])
            c.nodes[1].kill9()
            c.nodes[1].wipe_ramdir()
            c.nodes[1].start()
            self.assertEqual(c.job_start(job), {0: step, 1: step})
            for r in range(2):
                assert_markers(self, c.nodes[r].mnt, job, step, r, files[r])
            assert_worker_shards(self, admin_ls(c.nodes[1].ramdir), job, step, 1,
                                 files[1])
            log = c.nodes[1].log_text()
            for w in (0, 1):
                self.assertRegex(log, r"(?m)restored job=%s step=%d from rank 0 .* worker=%d$"
                                 % (job, step, w))

    def test_data_parallel_column_agrees_per_worker_content(self):
        """assume-data-parallelism: 3 over 3 nodes (one column), 2 workers.
        Nodes 0 and 1 save step 30 with the same bytes per worker (data
        parallel replicas); node 2 never saves it. Their shards' names
        carry the rank, so the shards' hashes differ: the column agrees on
        each worker's content (GKE compares per-worker file hashes), and
        node 2 restores worker w's bytes under its own names."""
        job, step, dp = "ptdp3", 30, "assume-data-parallelism: 3\n"
        c = PtCluster(3)
        for d in c.nodes:
            d.extra_args.append("-d")
        self.daemons = list(c.nodes)
        with c:
            self.assertEqual(c.job_start(job, extra=dp), {0: 0, 1: 0, 2: 0})
            for r in range(3):
                for n in markers(c.nodes[r].mnt):
                    os.unlink(os.path.join(c.nodes[r].mnt, n))
            files = [body(job, step, 0, w) for w in (0, 1)]   # one column's bytes
            for r in (0, 1):
                for w in (0, 1):
                    write_file(os.path.join(c.nodes[r].mnt, save_name(job, step, r, w)),
                               files[w])
            for r in (0, 1):
                for w in (0, 1):
                    harness.wait_committed(c.nodes[r].ramdir, step, job=job, rank=r,
                                           worker=w, daemon=c.nodes[r])
            self.assertEqual(c.job_start(job, extra=dp), {0: step, 1: step, 2: step})
            for r in range(3):
                assert_markers(self, c.nodes[r].mnt, job, step, r, files)

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
