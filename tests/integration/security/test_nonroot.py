#!/usr/bin/python3
"""Non-root trainers end to end (issue 26): a trainer running as uid 1000
with a Kubernetes-style fsGroup (supplementary group 2000; the mount root
chgrp'd to it with g+rwxs, as kubelet does) writes replicator.yaml, saves a
step, and after a restart reads exact bytes back through the .restore
marker, whichever source restored it:

  - local:  the same node's RAM tier, after a job restart and after the
            daemon's restart (a node-pod restart);
  - peer:   the node's RAMDIR wiped, its shard from the other node;
  - bucket: every RAMDIR wiped, the shards from a file:// bucket;
  - framework: pytorch .save files, locally and from the bucket.

What the restore hands back keeps the writer's owners and modes: another
member of the group reads what is group-readable but not a 0600 file, a uid
outside the group reads nothing, and the store view's directories
(.mtcfs, .mtcfs/JOB, .mtcfs/JOB/STEP) can be passed but not listed or
written by anyone but root. The trainer's operations are
nonroot_trainer.py, run through setpriv (from a copy any uid can read).
"""
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import cluster  # noqa: E402
import harness  # noqa: E402
from harness import Daemon, wait_committed  # noqa: E402

_TRAINER_SRC = os.path.join(INTEG, "nonroot_trainer.py")
_trainer_copy = None
UID, GID, FSGROUP = 1000, 1000, 2000
AS_TRAINER = ["setpriv", "--reuid", str(UID), "--regid", str(GID), "--groups", str(FSGROUP),
              "--"]
# another pod of the same fsGroup, and a uid with no group of the job
AS_GROUPMATE = ["setpriv", "--reuid", "1001", "--regid", "1001", "--groups", str(FSGROUP), "--"]
AS_OTHER = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--"]
DENIED = ("EACCES", "EPERM", "EROFS")


def trainer_path():
    """nonroot_trainer.py where any uid can read it (a CI checkout may sit
    under a directory only root can pass)."""
    global _trainer_copy
    if _trainer_copy is None:
        d = tempfile.mkdtemp(prefix="mtcfs-nonroot-trainer-")
        os.chmod(d, 0o755)
        shutil.copy(_TRAINER_SRC, d)
        os.chmod(os.path.join(d, "nonroot_trainer.py"), 0o644)
        atexit.register(shutil.rmtree, d, True)
        _trainer_copy = os.path.join(d, "nonroot_trainer.py")
    return _trainer_copy


def trainer_cmd(who, *args):
    return who + ["/usr/bin/python3", trainer_path()] + [str(a) for a in args]


def run_as(who, *args, timeout=180):
    p = subprocess.run(trainer_cmd(who, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, cwd="/")
    if p.returncode != 0:
        raise AssertionError("%s %s failed (%d): %s" % (who[2], args[0], p.returncode,
                                                        (p.stderr or p.stdout).decode()[-2000:]))
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def run_parallel(who, argss, timeout=180):
    """The same trainer command on several nodes at once (a job start
    waits for a job-wide barrier): their results, in order."""
    procs = [subprocess.Popen(trainer_cmd(who, *a), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd="/") for a in argss]
    out = []
    for a, p in zip(argss, procs):
        so, se = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise AssertionError("%s failed (%d): %s" % (a[0], p.returncode,
                                                         (se or so).decode()[-2000:]))
        out.append(json.loads(so.decode().strip().splitlines()[-1]))
    return out


def open_to_trainers(d):
    """The harness's temp directories are root's 0700: let a trainer walk
    to the mount (in Kubernetes the pod sees only the mount)."""
    if d.workdir:
        os.chmod(d.workdir, 0o755)


def fsgroup_root(mnt):
    """kubelet's fsGroup on the volume: group 2000, g+rwx and set-gid."""
    os.chown(mnt, 0, FSGROUP)
    os.chmod(mnt, 0o2775)


def yaml1(job, extra=""):
    return ("job-name: %s\nframework: orbax\nnode-rank: 0\nnodes: 1\n"
            "backup-interval-minutes: 30\n%s" % (job, extra))


def owner(path):
    st = os.stat(path)
    return (st.st_uid, st.st_gid, st.st_mode & 0o7777)


class NonRootBase(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root (FUSE mounts, setpriv)")
        self.daemons = []

    def daemon(self, **kw):
        d = Daemon(**kw)
        self.daemons.append(d)
        self.addCleanup(d.close)
        open_to_trainers(d)
        return d

    def cluster(self, n, **kw):
        c = cluster.Cluster(n, **kw)
        self.addCleanup(c.close)
        self.daemons.extend(c.nodes)
        for d in c.nodes:
            open_to_trainers(d)
        return c

    def restored_source(self, d, job, step):
        m = d.wait_log(r"restore job=%s step=%d source=(\w+)" % (re.escape(job), step),
                       30, "the restore of step %d logged" % step)
        return m.group(1)

    def assert_view(self, mnt, job, step):
        """The restored step (renamed to <step> by the trainer) as written:
        the writer's owners (the fsGroup by the set-gid root), its modes
        without set-gid; the store's directories passable, root's."""
        top = os.path.join(mnt, str(step))
        want = {
            "": (UID, FSGROUP, 0o750),
            "state": (UID, FSGROUP, 0o750),
            "state/params": (UID, FSGROUP, 0o750),
            "state/params/0.0": (UID, FSGROUP, 0o640),
            "state/secret.bin": (UID, FSGROUP, 0o600),
            "_CHECKPOINT_METADATA": (UID, FSGROUP, 0o644),
        }
        got = {rel: owner(os.path.join(top, rel)) for rel in want}
        self.assertEqual(got, want)
        for rel in (".mtcfs", ".mtcfs/" + job, ".mtcfs/%s/%d" % (job, step)):
            self.assertEqual(owner(os.path.join(mnt, rel)), (0, 0, 0o711), rel)

    def assert_others(self, mnt, job, step):
        top = os.path.join(mnt, str(step))
        secret = os.path.join(top, "state/secret.bin")
        params = os.path.join(top, "state/params/0.0")
        meta = os.path.join(top, "_CHECKPOINT_METADATA")
        store = os.path.join(mnt, ".mtcfs")
        # a member of the fsGroup: what the trainer made group-readable
        got = run_as(AS_GROUPMATE, "try", params, meta, secret)
        self.assertEqual(got[params], "ok")
        self.assertEqual(got[meta], "ok")
        self.assertEqual(got[secret], "EACCES")
        # a uid outside the group: nothing (the step directory is 0750)
        got = run_as(AS_OTHER, "try", secret, params, meta)
        self.assertEqual(set(got.values()), {"EACCES"}, got)
        # the store view: passable, never listable or writable by a trainer
        got = run_as(AS_TRAINER, "try", store + "/", store + "/%s/" % job,
                     "+" + os.path.join(store, job, "x"),
                     "+" + os.path.join(store, job, str(step), "x"))
        for p, v in got.items():
            self.assertIn(v, DENIED, p)


class LocalRestore(NonRootBase):
    def test_local_job_restart_and_daemon_restart(self):
        job = "nrlocal"
        d = self.daemon(opts="ram_size=256M", name="local")
        d.start()
        fsgroup_root(d.mnt)
        self.assertEqual(run_as(AS_TRAINER, "start", d.mnt, yaml1(job))["step"], 0)
        self.assertEqual(run_as(AS_TRAINER, "save", d.mnt, job, 4, 0), {"ok": True})
        wait_committed(d.ramdir, 4, job=job, daemon=d)
        # a JobSet restart: new trainer, same daemon
        self.assertEqual(run_as(AS_TRAINER, "start", d.mnt, yaml1(job))["step"], 4)
        self.assertEqual(self.restored_source(d, job, 4), "local")
        self.assertEqual(run_as(AS_TRAINER, "read", d.mnt, job, 4, 0), {"ok": True})
        self.assert_view(d.mnt, job, 4)
        self.assert_others(d.mnt, job, 4)
        # a node-pod restart: the daemon again on the same RAMDIR
        d.stop()
        d.start()
        pos = d.log_size()
        self.assertEqual(run_as(AS_TRAINER, "start", d.mnt, yaml1(job))["step"], 4)
        d.wait_log(r"restore job=%s step=4 source=local" % job, 30, "local restore",
                   since=pos)
        self.assertEqual(run_as(AS_TRAINER, "read", d.mnt, job, 4, 0), {"ok": True})
        self.assert_view(d.mnt, job, 4)
        self.assert_others(d.mnt, job, 4)


class ClusterRestore(NonRootBase):
    def start_all(self, c, job):
        return [r["step"] for r in run_parallel(AS_TRAINER, [
            ("start", c.nodes[r].mnt, c.yaml(job, r)) for r in range(c.n)])]

    def save_all(self, c, job, step):
        for r in range(c.n):
            self.assertEqual(run_as(AS_TRAINER, "save", c.nodes[r].mnt, job, step, r),
                             {"ok": True})

    def test_peer_restore(self):
        job = "nrpeer"
        c = self.cluster(2).start()
        for d in c.nodes:
            fsgroup_root(d.mnt)
        self.assertEqual(self.start_all(c, job), [0, 0])
        self.save_all(c, job, 4)
        c.wait_replicated(job, 4)
        # node 1 comes back with nothing: its shard from node 0's replica
        c.nodes[1].kill9()
        c.nodes[1].wipe_ramdir()
        c.nodes[1].start()
        fsgroup_root(c.nodes[1].mnt)
        self.assertEqual(self.start_all(c, job), [4, 4])
        self.assertEqual(self.restored_source(c.nodes[1], job, 4), "peer")
        for r in range(2):
            self.assertEqual(run_as(AS_TRAINER, "read", c.nodes[r].mnt, job, 4, r),
                             {"ok": True})
        self.assert_view(c.nodes[1].mnt, job, 4)
        self.assert_others(c.nodes[1].mnt, job, 4)

    def test_bucket_restore(self):
        job = "nrbucket"
        bucket = tempfile.mkdtemp(prefix="mtcfs-nonroot-bucket-")
        self.addCleanup(shutil.rmtree, bucket, True)
        c = self.cluster(2, extra="bucket=file://" + bucket)
        c.interval = "backup-interval-steps: 1"
        c.start()
        for d in c.nodes:
            fsgroup_root(d.mnt)
        self.assertEqual(self.start_all(c, job), [0, 0])
        self.save_all(c, job, 4)
        c.wait_backup(job, 4)
        # every node comes back with nothing (new machines, new volumes)
        c.lose_all_ram()
        for d in c.nodes:
            fsgroup_root(d.mnt)
        self.assertEqual(self.start_all(c, job), [4, 4])
        for r in range(2):
            self.assertEqual(self.restored_source(c.nodes[r], job, 4), "bucket")
            self.assertEqual(run_as(AS_TRAINER, "read", c.nodes[r].mnt, job, 4, r),
                             {"ok": True})
            self.assert_view(c.nodes[r].mnt, job, 4)
            self.assert_others(c.nodes[r].mnt, job, 4)


class PytorchSaveFiles(NonRootBase):
    """GKE's framework: pytorch mode: one .save file per worker at the top,
    the marker a symlink to that file in the store view."""

    def test_save_files_local_and_bucket(self):
        job = "nrpt"
        bucket = tempfile.mkdtemp(prefix="mtcfs-nonroot-bucket-")
        self.addCleanup(shutil.rmtree, bucket, True)
        d = self.daemon(opts="ram_size=256M,bucket=file://" + bucket, name="pt")
        d.start()
        fsgroup_root(d.mnt)
        yaml = ("job-name: %s\nframework: pytorch\nnode-rank: 0\nnodes: 1\n"
                "workers-per-node: 1\nbackup-interval-steps: 1\n" % job)
        self.assertEqual(run_as(AS_TRAINER, "start", d.mnt, yaml)["step"], 0)
        self.assertEqual(run_as(AS_TRAINER, "save_pt", d.mnt, job, 4, 0), {"ok": True})
        wait_committed(d.ramdir, 4, job=job, daemon=d)
        cluster.wait_backup(d, job, 4)

        def marker():
            ms = [x for x in os.listdir(d.mnt) if x.endswith(".restore")]
            self.assertEqual(len(ms), 1, ms)
            return os.path.join(d.mnt, ms[0])

        # the job restarts: the local copy
        self.assertEqual(run_as(AS_TRAINER, "start", d.mnt, yaml)["step"], 4)
        self.assertEqual(self.restored_source(d, job, 4), "local")
        self.assertEqual(run_as(AS_TRAINER, "read_pt", d.mnt, job, 4, 0), {"ok": True})
        m = marker()
        self.assertEqual(owner(m), (UID, FSGROUP, 0o600))
        self.assertEqual(owner(os.path.dirname(os.path.realpath(m)))[:2], (UID, FSGROUP))
        self.assertEqual(run_as(AS_GROUPMATE, "try", m), {m: "EACCES"})
        self.assertEqual(run_as(AS_OTHER, "try", m), {m: "EACCES"})

        # the node is replaced: the file from the bucket (GKE's layout,
        # which keeps no owner: the job's replicator.yaml writer's, and
        # no mode: GKE's 0644 less the umask the yaml shows)
        d.kill9()
        d.wipe_ramdir()
        d.start()
        fsgroup_root(d.mnt)
        pos = d.log_size()
        self.assertEqual(run_as(AS_TRAINER, "start", d.mnt, yaml)["step"], 4)
        d.wait_log(r"restore job=%s step=4 source=bucket" % job, 30, "bucket restore",
                   since=pos)
        self.assertEqual(run_as(AS_TRAINER, "read_pt", d.mnt, job, 4, 0), {"ok": True})
        # no mode either: GKE's 0644 less the umask of the trainer's
        # replicator.yaml (0640: 027)
        m = marker()
        self.assertEqual(owner(m), (UID, FSGROUP, 0o640))
        self.assertEqual(owner(os.path.dirname(os.path.realpath(m))), (UID, FSGROUP, 0o750))
        self.assertEqual(run_as(AS_GROUPMATE, "try", m), {m: "ok"})
        self.assertEqual(run_as(AS_OTHER, "try", m), {m: "EACCES"})


if __name__ == "__main__":
    harness.main()
