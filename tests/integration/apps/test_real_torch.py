"""The real PyTorch DCP client (issue 12, DESIGN §3.2, §3.3, §7): two ranks
of torch.distributed (gloo on loopback), one mtcfs node each, checkpointing
through the NeMo/resiliency reference protocol (tests/clients/torch_nemo.py
is that protocol around the real torch.distributed.checkpoint).

- A fresh job: the reference's replicator.yaml (written in place, yaml.dump,
  framework pytorch.distributed) is consumed, replicator.prerestore says
  step 0, the marker is <job>-s0-n<rank>-w0.restore; the job saves steps
  1, 2, 3 (step=N-unfinished, DCP into step=N/<rank>/, unlink, rename to N)
  and each node commits exactly the files DCP wrote.
- Node 1's mtcfs killed -9 and its RAMDIR wiped; both ranks restart: both
  see prerestore step 3, rename their marker to step=3, dcp.load it, and
  every tensor's bytes equal what that rank saved (the test regenerates
  them itself); then they save step 4, which both nodes commit. A plain
  restart after that restores step 4.
- GKE's `framework: pytorch` mode with two workers per node: one
  torch.save file per worker and step, restored through each worker's own
  marker after node 1 is wiped.
- Another job size (RealTorchResize, 4 nodes restarted as 2 and back):
  DCP shrink 4 -> 2, grow 2 -> 4 under assume-data-parallelism: 2 (a new
  rank gets its column mate's shard), restore.version naming a backup of
  the other size each way; pytorch mode grown 2 -> 4 with two workers per
  node, each new worker restoring its column mate's file under its own
  name.

The clients run under the venv python (tests/clients/launch.py: skipped
without it, failed in CI; run in the release build only).

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin MTCFS_BUILD=build \\
     MTCFS_TEST_PY=/var/cache/mtcfs-test-venv/bin/python \\
     /usr/bin/python3 tests/integration/apps/test_real_torch.py
"""
import json
import os
import re
import sys
import tempfile
import shutil
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
sys.path.insert(0, os.path.join(os.path.dirname(INTEG), "clients"))
import harness  # noqa: E402
from harness import admin_ls, find_shard  # noqa: E402
from cluster import Cluster, free_ports  # noqa: E402
import ckpt_data  # noqa: E402
import launch  # noqa: E402

N = 2
JOB = "nemo-dcp"
CLIENT_TIMEOUT = 150


class RealTorch(unittest.TestCase):

    def setUp(self):
        self.py = launch.check_runnable(self)
        self.c = Cluster(N, ram_size="512M", restore_timeout=20)
        for d in self.c.nodes:
            d.extra_args.append("-d")
        self.daemons = list(self.c.nodes)
        self.addCleanup(self.c.close)
        self.c.start()
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-torch-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def check_alive(self):
        for d in self.c.nodes:
            d.check_alive()

    def run_job(self, name, steps, script="torch_nemo.py", job=JOB, workers=1, extra=(),
                n=N):
        """Every rank of nodes 0..n-1 (workers per node, node-major):
        start-up handshake, restore if any, save steps. Returns ({rank:
        report}, dump dir)."""
        port = free_ports(1)[0]
        dump = os.path.join(self.tmp, name)
        os.mkdir(dump)
        argvs, envs = [], []
        world = n * workers
        for r in range(world):
            node = r // workers
            argvs.append(["--dir", self.c.nodes[node].mnt, "--job", job,
                          "--steps", ",".join(map(str, steps)),
                          "--out", os.path.join(self.tmp, "%s.%d.json" % (name, r)),
                          "--dump-dir", dump] + list(extra))
            envs.append({"RANK": str(r), "WORLD_SIZE": str(world),
                         "LOCAL_RANK": str(r % workers),
                         "LOCAL_WORLD_SIZE": str(workers),
                         "NODE_RANK": str(node), "NNODES": str(n),
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                         "OMP_NUM_THREADS": "1"})
        ranks = launch.Ranks(self, self.py, script, argvs, envs, name)
        ranks.wait(CLIENT_TIMEOUT, check=self.check_alive)
        reports = {}
        for r in range(world):
            with open(os.path.join(self.tmp, "%s.%d.json" % (name, r))) as f:
                reports[r] = json.load(f)
        return reports, dump

    def dcp_files(self, r):
        """The files the reference writes into step=N on node r (DCP with
        two writer threads: two .distcp files per rank)."""
        return {"common.pt", "metadata.json", "%d/.metadata" % r,
                "%d/__%d_0.distcp" % (r, r), "%d/__%d_1.distcp" % (r, r)}

    def assert_committed(self, step):
        """Every node committed its own shard of step with exactly the
        files DCP wrote (no marker, no step= prefix)."""
        for r in range(N):
            s = harness.wait_committed(self.c.nodes[r].ramdir, step, job=JOB,
                                       rank=r, daemon=self.c.nodes[r])
            files = {e["path"] for e in s["files"] if e.get("type") == "file"}
            self.assertEqual(files, self.dcp_files(r),
                             "node %d step %d: committed files" % (r, step))

    def test_nemo_dcp_restore_after_node_loss(self):
        c = self.c
        reports, _ = self.run_job("first", [1, 2, 3])
        for r in range(N):
            rep = reports[r]
            self.assertEqual(rep["restored_step"], 0, "rank %d: fresh job" % r)
            self.assertEqual(rep["prerestore_step"], 0,
                             "rank %d: replicator.prerestore of a fresh job" % r)
            self.assertEqual(rep["marker"], "%s-s0-n%d-w0.restore" % (JOB, r))
            self.assertNotIn("step=3", rep["top"])
            self.assertNotIn("step=3-unfinished", rep["top"])
            self.assertIn("3", rep["top"], "rank %d: the renamed step" % r)
        self.assert_committed(3)
        c.wait_replicated(JOB, 3)

        # node 1 loses its daemon and its RAM tier; the job restarts whole
        c.nodes[1].kill9()
        c.nodes[1].wipe_ramdir()
        c.nodes[1].start()
        self.assertEqual(admin_ls(c.nodes[1].ramdir)["shards"], [])

        reports, dump = self.run_job("second", [4])
        for r in range(N):
            rep = reports[r]
            self.assertEqual(rep["prerestore_step"], 3,
                             "rank %d: replicator.prerestore restore-step" % r)
            self.assertEqual(rep["restored_step"], 3, "rank %d" % r)
            self.assertEqual(rep["marker"], "%s-s3-n%d-w0.restore" % (JOB, r))
            res = rep["restore"]
            self.assertEqual(set(res["files"]), self.dcp_files(r),
                             "rank %d: files under step=3" % r)
            self.assertEqual(res["common"], {"world_size": N, "step": 3, "rank": r})
            for name in ckpt_data.TORCH_TENSORS:
                with open(os.path.join(dump, "rank%d.%s" % (r, name)), "rb") as f:
                    got = f.read()
                want = ckpt_data.torch_tensor(name, 3, r)
                self.assertEqual(len(got), len(want), "rank %d %s size" % (r, name))
                self.assertTrue(got == want, "rank %d: restored %s differs from "
                                "what it saved at step 3" % (r, name))
            self.assertTrue(res["equal"])
        self.assertRegex(c.nodes[1].log_text(),
                         r"restored job=%s step=3 from rank 0" % JOB,
                         "the wiped node fetched its shard from its peer")
        self.assert_committed(4)
        c.wait_replicated(JOB, 4)

        # a plain restart: step 4 (saved beside the restored step=3 link)
        reports, dump = self.run_job("third", [5])
        for r in range(N):
            self.assertEqual(reports[r]["restored_step"], 4, "rank %d" % r)
            self.assertTrue(reports[r]["restore"]["equal"], "rank %d" % r)
            for name in ckpt_data.TORCH_TENSORS:
                with open(os.path.join(dump, "rank%d.%s" % (r, name)), "rb") as f:
                    self.assertTrue(f.read() == ckpt_data.torch_tensor(name, 4, r),
                                    "rank %d: %s of step 4" % (r, name))
        self.assert_committed(5)

    def test_gke_pytorch_mode_restore_after_node_loss(self):
        """framework: pytorch, workers-per-node 2 (4 ranks): torch.save
        per worker per step; node 1 wiped; every worker torch.load()s its
        own marker (a symlink to its file) and gets its bytes back."""
        c, job, W = self.c, "gke-torch", 2
        reports, _ = self.run_job("first", [1, 2], "torch_gke.py", job, W)
        for r, rep in reports.items():
            self.assertEqual(rep["marker"], "%s-s0-n%d-w%d.restore"
                             % (job, r // W, r % W))
            self.assertEqual(rep["restored_step"], 0)
        # committed on every node and held by its peer (the shard layout,
        # one per worker or one per node, is mtcfs's business)
        c.wait_replicated(job, 2, timeout=15)
        c.nodes[1].kill9()
        c.nodes[1].wipe_ramdir()
        c.nodes[1].start()
        reports, dump = self.run_job("second", [3], "torch_gke.py", job, W)
        for r, rep in reports.items():
            n, w = r // W, r % W
            self.assertEqual(rep["marker"], "%s-s2-n%d-w%d.restore" % (job, n, w))
            self.assertTrue(rep["marker_is_symlink"], "rank %d" % r)
            self.assertFalse(os.path.isabs(rep["marker_target"]), rep["marker_target"])
            for name in ckpt_data.TORCH_TENSORS:
                with open(os.path.join(dump, "rank%d.%s" % (r, name)), "rb") as f:
                    self.assertTrue(f.read() == ckpt_data.torch_tensor(name, 2, r),
                                    "rank %d: restored %s of step 2" % (r, name))
            self.assertTrue(rep["equal"])
        c.wait_replicated(job, 3, timeout=15)


class RealTorchBucket(unittest.TestCase):
    """The same clients with a file:// bucket and a backup every step."""

    check_alive = RealTorch.check_alive
    run_job = RealTorch.run_job

    def setUp(self):
        self.py = launch.check_runnable(self)
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-torch-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.bucket = os.path.join(self.tmp, "bucket")
        os.mkdir(self.bucket)
        self.c = Cluster(N, ram_size="512M", restore_timeout=20,
                         extra="bucket=file://" + self.bucket)
        for d in self.c.nodes:
            d.extra_args.append("-d")
            d.env["MTCFS_TEST_MINUTE_SECS"] = "1"
        self.daemons = list(self.c.nodes)
        self.addCleanup(self.c.close)
        self.c.start()

    def test_gke_pytorch_mode_restore_from_bucket(self):
        """framework: pytorch, 2 nodes x 2 workers: the backup of step 2 holds
        each worker's torch.save file as its own <hash>.data (GKE's layout);
        with every node's RAM lost, every worker torch.load()s its marker and
        gets the tensors of step 2 back."""
        c, job, W = self.c, "gke-torch-bk", 2
        self.run_job("first", [1, 2], "torch_gke.py", job, W,
                     extra=["--backup-interval-steps", "1"])
        rx = re.compile(r"backup job=%s name=(\S+) step=2 complete" % job)
        name = harness.wait_until(lambda: (rx.search(c.nodes[0].log_text()) or [None, None])[1],
                                  60, "backup of step 2 complete")
        base = os.path.join(self.bucket, job, name)
        saved = {}
        for r in range(N * W):
            n, w = r // W, r % W
            fn = "%s-s2-n%d-w%d" % (job, n, w)
            with open(os.path.join(c.nodes[n].mnt, fn + ".save"), "rb") as f:
                saved[r] = f.read()
            with open(os.path.join(base, fn + ".meta")) as f:
                h = f.read()
            with open(os.path.join(base, h + ".data"), "rb") as f:
                self.assertTrue(f.read() == saved[r], "%s.data of rank %d" % (h, r))
        self.assertEqual(len([x for x in os.listdir(base) if x.endswith(".meta")]), N * W)
        c.lose_all_ram()
        reports, dump = self.run_job("second", [3], "torch_gke.py", job, W,
                                     extra=["--backup-interval-steps", "1"])
        for r, rep in reports.items():
            n, w = r // W, r % W
            self.assertEqual(rep["marker"], "%s-s2-n%d-w%d.restore" % (job, n, w))
            self.assertTrue(rep["marker_is_symlink"], "rank %d" % r)
            for tn in ckpt_data.TORCH_TENSORS:
                with open(os.path.join(dump, "rank%d.%s" % (r, tn)), "rb") as f:
                    self.assertTrue(f.read() == ckpt_data.torch_tensor(tn, 2, r),
                                    "rank %d: restored %s of step 2" % (r, tn))
            self.assertTrue(rep["equal"])



class RealTorchResize(unittest.TestCase):
    """A job restarted with another number of ranks (issue 24), on one
    cluster of 4 nodes with a file:// bucket. Through the NeMo reference's
    DCP protocol (torch_nemo.py), a backup every step
    (backup-interval-minutes: 0):
    - shrink: saved by 4 ranks, restarted with 2 on nodes 0 and 1 (mtcfs
      restarted there with a peers= table of 2, Cluster.resize; nodes 2
      and 3 down): each restores its own shard of the 4-node step from RAM;
    - restore.version naming the 4-node backup while RAM holds a newer
      2-node step: both ranks restore the backup's step;
    - grow: saved by 2, restarted with 4 and assume-data-parallelism: 2
      (columns {0, 2}, {1, 3}; nodes 2 and 3 back with only the 4-node
      step 1 in RAM): ranks 2 and 3 get their column mate's shard of the
      newest step, byte for byte; the same through restore.version naming the
      2-node backup.
    A new rank's step=S holds its column mate's files, DCP directory
    step=S/<mate>/ included (mtcfs copies the shard; it does not know
    DCP's layout): the client loads that directory (--dp-columns 2, as a
    data-parallel replica may: its state equals its mate's). The
    reference's restore, as torch_nemo.py plays it without --dp-columns,
    reads step=S/<rank>/ and would find nothing there."""

    check_alive = RealTorch.check_alive

    def setUp(self):
        self.py = launch.check_runnable(self)
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-torch-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.bucket = os.path.join(self.tmp, "bucket")
        os.mkdir(self.bucket)
        self.c = Cluster(4, ram_size="512M", restore_timeout=20,
                         extra="bucket=file://" + self.bucket)
        for d in self.c.nodes:
            d.extra_args.append("-d")
            d.env["MTCFS_TEST_MINUTE_SECS"] = "1"
        self.addCleanup(self.c.close)
        self.c.start()

    def run_job(self, name, n, steps, dp=0):
        """Ranks 0..n-1 on nodes 0..n-1. ({rank: report}, dump dir)."""
        port = free_ports(1)[0]
        dump = os.path.join(self.tmp, name)
        os.mkdir(dump)
        argvs, envs = [], []
        for r in range(n):
            argvs.append(["--dir", self.c.nodes[r].mnt, "--job", JOB,
                          "--steps", ",".join(map(str, steps)),
                          "--out", os.path.join(self.tmp, "%s.%d.json" % (name, r)),
                          "--dump-dir", dump, "--interval-minutes", "0"]
                         + (["--data-parallelism", str(dp), "--dp-columns", str(n // dp)]
                            if dp else []))
            envs.append({"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": "0",
                         "LOCAL_WORLD_SIZE": "1", "NODE_RANK": str(r), "NNODES": str(n),
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                         "OMP_NUM_THREADS": "1"})
        launch.Ranks(self, self.py, "torch_nemo.py", argvs, envs, name).wait(
            CLIENT_TIMEOUT, check=self.check_alive)
        reports = {}
        for r in range(n):
            with open(os.path.join(self.tmp, "%s.%d.json" % (name, r))) as f:
                reports[r] = json.load(f)
        return reports, dump

    def assert_restored(self, reports, dump, step, saved_by, columns=None):
        """Every rank restored step, saved by a job of saved_by ranks; rank
        r's data is that of rank r % columns (its own without columns)."""
        for r, rep in reports.items():
            src = r % columns if columns else r
            self.assertEqual(rep["restored_step"], step, "rank %d" % r)
            self.assertEqual(rep["marker"], "%s-s%d-n%d-w0.restore" % (JOB, step, r))
            res = rep["restore"]
            self.assertEqual(res["common"], {"world_size": saved_by, "step": step,
                                             "rank": src}, "rank %d: common.pt" % r)
            self.assertIn("%d/.metadata" % src, res["files"], "rank %d" % r)
            for name in ckpt_data.TORCH_TENSORS:
                with open(os.path.join(dump, "rank%d.%s" % (r, name)), "rb") as f:
                    got = f.read()
                self.assertTrue(got == ckpt_data.torch_tensor(name, step, src),
                                "rank %d: restored %s is not rank %d's of step %d"
                                % (r, name, src, step))
            self.assertTrue(res["equal"], "rank %d: its own check" % r)

    def set_restore_version(self, name):
        with open(os.path.join(self.bucket, JOB, "restore.version"), "w") as f:
            f.write(name)

    def wait_restore_version_used(self):
        rv = os.path.join(self.bucket, JOB, "restore.version")
        harness.wait_until(lambda: not os.path.exists(rv), 30, "restore.version deleted")

    def test_gke_pytorch_mode_grow(self):
        """framework: pytorch, 2 workers per node (torch.save per worker):
        saved by 2 nodes, restarted on 4 under assume-data-parallelism: 2:
        each worker of nodes 2 and 3 finds its own marker, a symlink to the
        same worker's file of node 0 or 1 under its own name, and
        torch.load()s exactly those tensors."""
        c, job, W = self.c, "gke-torch-grow", 2
        c.resize(2)
        reports, _ = RealTorch.run_job(self, "first", [1], "torch_gke.py", job, W, n=2)
        for rep in reports.values():
            self.assertEqual(rep["restored_step"], 0)
        c.wait_replicated(job, 1, timeout=30)
        c.resize(4)
        reports, dump = RealTorch.run_job(
            self, "grow", [2], "torch_gke.py", job, W, n=4,
            extra=["--data-parallelism", "2", "--dp-columns", "2"])
        self.assertEqual(len(reports), 4 * W)
        for r, rep in reports.items():
            n, w = r // W, r % W
            src = (n % 2) * W + w
            self.assertEqual(rep["marker"], "%s-s1-n%d-w%d.restore" % (job, n, w))
            self.assertTrue(rep["marker_is_symlink"], "rank %d" % r)
            self.assertTrue(rep["marker_target"].endswith("%s-s1-n%d-w%d.save" % (job, n, w)),
                            "rank %d: %s" % (r, rep["marker_target"]))
            self.assertEqual(rep["source_rank"], src)
            for tn in ckpt_data.TORCH_TENSORS:
                with open(os.path.join(dump, "rank%d.%s" % (r, tn)), "rb") as f:
                    self.assertTrue(f.read() == ckpt_data.torch_tensor(tn, 1, src),
                                    "rank %d: restored %s is not rank %d's of step 1"
                                    % (r, tn, src))
            self.assertTrue(rep["equal"], "rank %d" % r)

    def test_shrink_grow_and_restore_version_of_other_size(self):
        c = self.c
        reports, _ = self.run_job("four", 4, [1])
        for r in range(4):
            self.assertEqual(reports[r]["restored_step"], 0)
        big = c.wait_backup(JOB, 1)

        c.resize(2)
        reports, dump = self.run_job("shrink", 2, [2])
        self.assert_restored(reports, dump, 1, 4)
        small = c.wait_backup(JOB, 2)

        self.set_restore_version(big)
        reports, dump = self.run_job("rv-shrink", 2, [3])
        self.assert_restored(reports, dump, 1, 4)
        for r in range(2):
            self.assertIn("restored job=%s step=1 from backup %s" % (JOB, big),
                          c.nodes[r].log_text(), "node %d" % r)
        self.wait_restore_version_used()
        c.wait_backup(JOB, 3)

        # nodes 2 and 3 hold only their shards of step 1
        c.resize(4)
        reports, dump = self.run_job("grow", 4, [4], dp=2)
        self.assert_restored(reports, dump, 3, 2, columns=2)
        c.wait_backup(JOB, 4)

        self.set_restore_version(small)
        reports, dump = self.run_job("rv-grow", 4, [5], dp=2)
        self.assert_restored(reports, dump, 2, 2, columns=2)
        for r in range(4):
            self.assertIn("restored job=%s step=2 from backup %s" % (JOB, small),
                          c.nodes[r].log_text(), "node %d" % r)
        self.wait_restore_version_used()


if __name__ == "__main__":
    harness.main()
