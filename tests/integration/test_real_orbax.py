"""The real Orbax client (issue 12, DESIGN §3.2, §3.3, §7): two JAX
processes on the CPU (jax.distributed on loopback), one mtcfs node each,
running Orbax's own multi-tier checkpointing start-up
(initialize_multi_tier_checkpointing with its default use_mtc_process_ids:
the process id and JAX coordinator come from jax-init-info.txt) and its
ReplicatorCheckpointManager, as MaxText does (tests/clients/orbax_mtc.py).

- A fresh job: both processes find nothing to restore; they save steps
  1, 2, 3 of a pytree whose leaves are sharded over the two processes
  (Orbax's LatestN(2) deletes old steps through the mount); every node commits
  each step and replicates it to its peer.
- Node 1's mtcfs killed -9 and its RAMDIR wiped, both processes restarted:
  Orbax renames the s3 marker to DIR/3, latest_step() is 3, and the
  restored local shards equal, byte for byte, what each process saved
  (the test regenerates them itself); then it saves step 4. A plain
  restart after that restores step 4.
- Every node's mtcfs killed -9 and its RAMDIR wiped: the processes restore
  the backup in the file:// bucket.

The clients run under the venv python (tests/clients/launch.py: skipped
without it, failed in CI; run in the release build only).

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin MTCFS_BUILD=build \\
     MTCFS_TEST_PY=/var/cache/mtcfs-test-venv/bin/python \\
     /usr/bin/python3 tests/integration/test_real_orbax.py
"""
import json
import os
import re
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "clients"))
import harness  # noqa: E402
from harness import admin_ls, wait_until  # noqa: E402
from cluster import Cluster, free_ports  # noqa: E402
import ckpt_data  # noqa: E402
import launch  # noqa: E402

N = 2
JOB = "orbax-mtc"
CLIENT_TIMEOUT = 170


class RealOrbax(unittest.TestCase):

    def make_cluster(self, extra=""):
        # jax-init-info.txt: the JAX coordinator beside rank 0, on a port
        # of its own (parallel test runs must not share 8476)
        opts = "jax_init_info,jax_port=%d" % free_ports(1)[0]
        if extra:
            opts += "," + extra
        self.c = Cluster(N, ram_size="512M", restore_timeout=20, extra=opts)
        for d in self.c.nodes:
            d.extra_args.append("-d")
        self.daemons = list(self.c.nodes)
        self.addCleanup(self.c.close)
        self.c.start()

    def setUp(self):
        self.py = launch.check_runnable(self)
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-orbax-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def check_alive(self):
        for d in self.c.nodes:
            d.check_alive()

    def run_job(self, name, steps, extra_args=()):
        dump = os.path.join(self.tmp, name)
        os.mkdir(dump)
        argvs, envs = [], []
        for r in range(N):
            argvs.append(["--dir", self.c.nodes[r].mnt, "--job", JOB,
                          "--steps", ",".join(map(str, steps)),
                          "--out", os.path.join(self.tmp, "%s.%d.json" % (name, r)),
                          "--dump-dir", dump] + list(extra_args))
            env = {"JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1",
                   "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}
            # On the CPU, JAX has no platform that tells it the number of
            # processes (GKE's TPU environment does: TPU_WORKER_HOSTNAMES),
            # and Orbax passes only the process id and coordinator it reads
            # from jax-init-info.txt. JAX's Slurm environment supplies the
            # count; its process id (rotated) and coordinator (an unknown
            # host) are decoys: a process that used them would get the
            # wrong id or never connect.
            env.update({"SLURM_JOB_ID": "4242", "SLURM_NTASKS": str(N),
                        "SLURM_PROCID": str((r + 1) % N), "SLURM_LOCALID": "0",
                        "SLURM_STEP_NODELIST": "mtcfs-test-no-such-host"})
            envs.append(env)
        ranks = launch.Ranks(self, self.py, "orbax_mtc.py", argvs, envs, name)
        ranks.wait(CLIENT_TIMEOUT, check=self.check_alive)
        reports = {}
        for r in range(N):
            with open(os.path.join(self.tmp, "%s.%d.json" % (name, r))) as f:
                reports[r] = json.load(f)
        return reports, dump

    def assert_committed(self, step):
        for r in range(N):
            harness.wait_committed(self.c.nodes[r].ramdir, step, job=JOB,
                                   rank=r, daemon=self.c.nodes[r])

    def assert_restored(self, reports, dump, step, replicated=False):
        for r in range(N):
            rep = reports[r]
            self.assertEqual(rep["latest_step"], step, "process %d" % rep["process"])
            self.assertTrue(rep["equal"], "process %d: its own check" % r)
        # JAX process ids come from jax-init-info.txt: process p ran on node p
        self.assertEqual(sorted(rep["process"] for rep in reports.values()),
                         list(range(N)))
        for r, rep in reports.items():
            p = rep["process"]
            self.assertEqual(p, r, "node %d's process got JAX id %d" % (r, p))
            self.assertEqual(sorted(rep["restored_leaves"]), sorted(ckpt_data.ORBAX_TREE))
            for name in ckpt_data.ORBAX_TREE:
                with open(os.path.join(dump, "p%d.%s" % (p, name.replace("/", "."))),
                          "rb") as f:
                    got = f.read()
                want = ckpt_data.orbax_local(name, step, p, N, replicated)
                self.assertEqual(len(got), len(want), "%s size" % name)
                self.assertTrue(got == want, "process %d: restored %s differs "
                                "from what it saved at step %d" % (p, name, step))

    def test_replicator_manager_restore_after_node_loss(self):
        self.make_cluster()
        c = self.c
        # Orbax's preservation policy keeps 2 and deletes older steps
        # through the mount, racing mtcfs, which drops a step from the view
        # once a newer one is complete job-wide (GKE's replicator renames
        # each step away into <hash>.data right after the commit)
        reports, _ = self.run_job("first", [1, 2, 3], ["--keep", "2"])
        for r in range(N):
            self.assertIsNone(reports[r]["latest_step"], "fresh job, node %d" % r)
            self.assertEqual(reports[r]["all_steps_end"], [2, 3],
                             "node %d: Orbax's steps at the end" % r)
            top = {x for x in reports[r]["top"] if x.isdigit()}
            self.assertIn("3", top, "node %d: step directories" % r)
            self.assertLessEqual(top, {"2", "3"}, "node %d: step directories" % r)
        self.assert_committed(3)
        c.wait_replicated(JOB, 3)

        c.nodes[1].kill9()
        c.nodes[1].wipe_ramdir()
        c.nodes[1].start()
        self.assertEqual(admin_ls(c.nodes[1].ramdir)["shards"], [])

        reports, dump = self.run_job("second", [4])
        self.assert_restored(reports, dump, 3)
        self.assertRegex(c.nodes[1].log_text(),
                         r"restored job=%s step=3 from rank 0" % JOB,
                         "the wiped node fetched its shard from its peer")
        self.assert_committed(4)
        c.wait_replicated(JOB, 4)

        # a plain restart (no failure): the step saved after the restore is
        # restored, beside the old restored step's symlink
        reports, dump = self.run_job("third", [5])
        self.assert_restored(reports, dump, 4)
        self.assert_committed(5)

    def test_data_parallel_restarts(self):
        """MaxText's default: data_parallelism = the number of slices
        (assume-data-parallelism: 2), every leaf replicated on both
        processes. Orbax's two shards of a step still differ (per-process
        OCDBT files, process metadata), which GKE's replicator logs as
        "Conflicting meta" and restores anyway.
        - a plain restart restores the newest step;
        - node 1 wiped: it restores its own shard from its peer's replica."""
        self.make_cluster()
        c = self.c
        dp = ["--data-parallelism", "0", "--replicated"]
        reports, _ = self.run_job("first", [1, 2], dp)
        for r in range(N):
            self.assertIsNone(reports[r]["latest_step"])
        self.assert_committed(2)
        c.wait_replicated(JOB, 2)

        reports, dump = self.run_job("second", [3], dp)
        self.assert_restored(reports, dump, 2, replicated=True)
        self.assert_committed(3)
        c.wait_replicated(JOB, 3)

        c.nodes[1].kill9()
        c.nodes[1].wipe_ramdir()
        c.nodes[1].start()
        reports, dump = self.run_job("third", [4], dp)
        self.assert_restored(reports, dump, 3, replicated=True)
        self.assert_committed(4)

    def test_every_node_wiped_restores_from_bucket(self):
        """Every node's RAM lost: the job restores the backup in the
        file:// bucket (backup-interval-steps 100: the first complete
        step is backed up, no later one), byte for byte."""
        bucket = tempfile.mkdtemp(prefix="mtcfs-bucket-", dir="/tmp")
        self.addCleanup(shutil.rmtree, bucket, True)
        self.make_cluster("bucket=file://" + bucket)
        c = self.c
        reports, _ = self.run_job("first", [1, 2, 3],
                                  ["--backup-interval-steps", "100"])
        for r in range(N):
            self.assertIsNone(reports[r]["latest_step"])
        self.assert_committed(3)
        done = re.compile(r"coord: backup job=%s name=(\S+) step=(\d+) complete" % JOB)
        m = wait_until(lambda: done.search(c.nodes[0].log_text()), 60,
                       "the first backup complete")
        name, step = m.group(1), int(m.group(2))
        self.assertIn(step, (1, 2, 3))
        for r in range(N):
            self.assertTrue(os.path.isfile(os.path.join(
                bucket, JOB, name, "%s-s%d-n%d-w0.meta" % (JOB, step, r))),
                "node %d's .meta of step %d in backup %s" % (r, step, name))

        for d in c.nodes:
            d.kill9()
        for d in c.nodes:
            d.wipe_ramdir()
            d.start()
        reports, dump = self.run_job("second", [4])
        self.assert_restored(reports, dump, step)
        for r in range(N):
            self.assertIn("restored job=%s step=%d from backup %s" % (JOB, step, name),
                          c.nodes[r].log_text(), "node %d" % r)
        self.assert_committed(4)


if __name__ == "__main__":
    harness.main()
