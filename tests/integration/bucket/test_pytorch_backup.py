"""GKE's `framework: pytorch` mode and the bucket: one shard per worker.

Facts recorded from GKE's replicator (GoogleCloudPlatform/checkpoint-
replicator, src/replicator), read in its source:
- each worker w of node r writes `<job>-s<S>-n<r>-w<w>.save`, one file
  (framework/pytorch.py, file_naming.py); the step is saved on the node once
  all `workers-per-node` files are there;
- the replicator hashes each file alone (util.file_digest: BLAKE3 over the
  bytes, 64 hex digits, no "D" prefix: that one marks directories), renames
  it to `<hash>.data` and writes `<job>-s<S>-n<r>-w<w>.meta` holding the hash,
  no newline (sync.py: hash_and_wrap_into_meta). A file with the hash of an
  existing .data is dropped and its .meta points at that one;
- a backup copies each worker's .meta and .data flat into
  `JOB/YYYY-MM-DD_HH-MM/` (sync.py: copy_meta_and_data_files): no manifest,
  no directory, one .meta per (node, worker);
- a step is restorable when every (node, worker) of nodes x workers-per-node
  has a .meta whose .data exists (coordinator.py: validate_checkpoint);
- restore makes, per worker, `<job>-s<S>-n<r>-w<w>.restore` a symlink to the
  worker's `<hash>.data` (restore.py: create_restore_link).

mtcfs keeps the .save files under their names (the marker points at the
worker's own file) and does not recompute BLAKE3 (no library in Debian 12);
what it checks of a GKE-written file is its size and, on gs://, the CRC32C
the bucket lists.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \\
     /usr/bin/python3 tests/integration/bucket/test_pytorch_backup.py [-k NAME]
"""

import json
import os
import random
import re
import subprocess
import sys
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from cluster import Cluster  # noqa: E402
from harness import read_file, wait_until, write_file  # noqa: E402
from test_backup_restore import (FileStore, GsServerStore,  # noqa: E402
                                 TEST_MINUTE_SECS, quiesce)

TIMEOUT = 60
W = 2                                   # workers-per-node in every test here


def save_name(job, step, rank, w, ext="save"):
    return "%s-s%d-n%d-w%d.%s" % (job, step, rank, w, ext)


def markers(mnt):
    return sorted(n for n in os.listdir(mnt) if n.endswith(".restore"))


# --- a backup as GKE's replicator writes it in framework: pytorch mode ----------

GKE_JOB, GKE_STEP, GKE_BACKUP = "gkpt", 70, "2025-07-01_09-15"


def gke_body(r, w):
    # node 1's two workers saved identical bytes: GKE's replicator then keeps
    # one .data both .meta files name
    if r == 1:
        w = 0
    return random.Random("gkpt/%d/%d" % (r, w)).randbytes(40 * 1024 + r * 7 + w)


# BLAKE3 of gke_body(r, w), as util.file_digest computes it (blake3 1.0 from
# PyPI, run beside the project)
GKE_HASHES = {
    (0, 0): "e79cfc9e7e6781c0daf8d82a3ee6fe7ae80ab2671b0196840d6c9ffe9f44002f",
    (0, 1): "35ff84e9ffd8d554aa3f319483a98c79e84fa63d270de346f9c68fc584663479",
    (1, 0): "fba76b7e84e85ae9ca0e70627d1e0497b94a0c36b103e095a6d82a057d611088",
    (1, 1): "fba76b7e84e85ae9ca0e70627d1e0497b94a0c36b103e095a6d82a057d611088",
}


def write_gke_pytorch_backup(store):
    base = "%s/%s/" % (GKE_JOB, GKE_BACKUP)
    for (r, w), h in sorted(GKE_HASHES.items()):
        store.write(base + h + ".data", gke_body(r, w))
        store.write(base + save_name(GKE_JOB, GKE_STEP, r, w, "meta"), h.encode())


class PtBackupCluster(Cluster):
    def yaml(self, job, rank, extra=""):
        return ("job-name: %s\nframework: pytorch\nnode-rank: %d\nnodes: %d\n"
                "peers-per-node: %d\nworkers-per-node: %d\n"
                "backup-interval-steps: 1\n%s" % (job, rank, self.n, self.k, W, extra))


class Base:
    """The tests, on the backend make_store() gives (a mixin)."""

    def make_store(self):
        raise NotImplementedError

    def setUp(self):
        self.store = self.make_store()
        c = PtBackupCluster(2, restore_timeout=15, extra=self.store.opts())
        self.addCleanup(c.close)
        self.addCleanup(quiesce, c)
        for d in c.nodes:
            d.extra_args.append("-d")
            d.env["MTCFS_TEST_MINUTE_SECS"] = TEST_MINUTE_SECS
            self.store.setup_env(d.env)
        self.daemons = list(c.nodes)
        self.c = c
        c.start()

    def assert_worker_markers(self, job, step, files):
        """Per node and worker: the marker named as GKE names it, a relative
        symlink inside the mount to that worker's file, with its bytes."""
        for r in range(self.c.n):
            mnt = self.c.nodes[r].mnt
            want = [save_name(job, step, r, w, "restore") for w in range(W)]
            self.assertEqual(markers(mnt), want, "markers of node %d" % r)
            for w, name in enumerate(want):
                p = os.path.join(mnt, name)
                self.assertTrue(os.path.islink(p), name)
                t = os.readlink(p)
                self.assertFalse(t.startswith("/"), "%s -> %s" % (name, t))
                self.assertTrue(t.endswith("/" + save_name(job, step, r, w)),
                                "%s -> %s: not worker %d's file" % (name, t, w))
                self.assertEqual(read_file(p), files[r][w],
                                 "bytes of node %d worker %d" % (r, w))

    def wait_backup(self, job, step):
        return self.c.wait_backup(job, step, TIMEOUT)

    def test_mtcfs_backup_is_per_worker_and_restores(self):
        """2 nodes x 2 workers each save their own file; the backup holds
        exactly GKE's layout (a .meta per (node, worker) naming one
        <hash>.data object with that worker's bytes, no manifest, no
        directory); with every node's RAM lost, each worker's bytes come back
        from the bucket under its marker."""
        job, step = "ptbk", 40
        self.assertEqual(self.c.job_start(job), {0: 0, 1: 0})
        files = {r: [random.Random("ptbk/%d/%d" % (r, w)).randbytes(50 * 1024 + w)
                     for w in range(W)] for r in range(2)}
        for r in range(2):
            mnt = self.c.nodes[r].mnt
            for n in markers(mnt):
                os.unlink(os.path.join(mnt, n))
            for w in range(W):
                write_file(os.path.join(mnt, save_name(job, step, r, w)), files[r][w])
        name = self.wait_backup(job, step)
        base = "%s/%s/" % (job, name)
        objs = self.store.names(base)
        want = set()
        for r in range(2):
            for w in range(W):
                mn = base + save_name(job, step, r, w, "meta")
                self.assertIn(mn, objs)
                h = self.store.read(mn).decode()
                self.assertRegex(h, r"^[0-9a-f]{64}$", "content of " + mn)
                self.assertEqual(self.store.read(base + h + ".data"), files[r][w],
                                 "%s.data of node %d worker %d" % (h, r, w))
                want |= {mn, base + h + ".data"}
        self.assertEqual(sorted(objs), sorted(want), "objects of backup " + name)
        # what an operator sees of it: complete
        env = dict(os.environ)
        self.store.setup_env(env)
        r = subprocess.run([harness.MTCFS_ADMIN, "backups", "--bucket", self.store.url,
                            "--job", job, "--json"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60, check=True)
        js = json.loads(r.stdout)
        self.assertEqual([(x["name"], x["complete"]) for x in js["backups"]], [(name, True)],
                         js)
        self.c.lose_all_ram()
        self.assertEqual(self.c.job_start(job), {0: step, 1: step})
        for r in range(2):
            self.assertEqual(read_file(os.path.join(self.c.nodes[r].mnt,
                                                    "replicator.prerestore")),
                             ("restore-backup: %s\nrestore-step: %d\n" % (name, step)).encode())
        self.assert_worker_markers(job, step, files)

    def test_data_parallel_column_backs_up_once_and_restores(self):
        """assume-data-parallelism: 2 over 2 nodes (one column) whose workers
        save the same bytes: as in GKE's replicator, only the last partition
        (node 1) uploads data, node 0 only its .meta files, which name the
        same objects because a worker's file is hashed alone (not with the
        node's name in it). The backup is complete and restores every
        worker's bytes on both nodes."""
        job, step, dp = "ptdp", 50, "assume-data-parallelism: 2\n"
        self.assertEqual(self.c.job_start(job, extra=dp), {0: 0, 1: 0})
        files = [random.Random("ptdp/%d" % w).randbytes(30 * 1024 + w) for w in range(W)]
        complete = re.compile(r"job %s: step %d is complete on all" % (job, step))
        for r in range(2):
            mnt = self.c.nodes[r].mnt
            for n in markers(mnt):
                os.unlink(os.path.join(mnt, n))
            for w in range(W):
                write_file(os.path.join(mnt, save_name(job, step, r, w)), files[w])
            if r == 0:
                # node 0 alone has the step: it is not complete job-wide
                # (GKE's sync waits for every node), so no backup of it may
                # start. The coordinator is node 0's own: a wrong verdict
                # shows within the window polled here.
                ramdir = self.c.nodes[0].ramdir
                wait_until(lambda: (harness.find_shard(harness.admin_ls(ramdir), step,
                                                       job=job) or {}).get("state")
                           in ("committed", "replicated", "backed-up"),
                           TIMEOUT, "node 0 committed step %d" % step)
                with self.assertRaises(AssertionError):
                    wait_until(lambda: complete.search(self.c.nodes[0].log_text()), 2,
                               "a wrong job-wide verdict")
        name = self.wait_backup(job, step)
        base = "%s/%s/" % (job, name)
        hashes = {}
        for r in range(2):
            for w in range(W):
                hashes[r, w] = self.store.read(base + save_name(job, step, r, w, "meta")).decode()
        for w in range(W):
            self.assertEqual(hashes[0, w], hashes[1, w], "worker %d's .meta of both nodes" % w)
        self.assertEqual(sorted(x for x in self.store.names(base) if x.endswith(".data")),
                         sorted(base + hashes[1, w] + ".data" for w in range(W)))
        self.c.lose_all_ram()
        self.assertEqual(self.c.job_start(job, extra=dp), {0: step, 1: step})
        self.assert_worker_markers(job, step, {r: files for r in range(2)})

    def test_gke_written_pytorch_backup_restores(self):
        """Every node and worker gets its bytes back from the backup GKE's
        replicator wrote; replicator.prerestore names it; mtcfs writes nothing
        into it."""
        write_gke_pytorch_backup(self.store)
        before = self.store.names(GKE_JOB + "/")
        got = self.c.job_start(GKE_JOB)
        self.assertEqual(got, {0: GKE_STEP, 1: GKE_STEP},
                         "replicator.errors: %s" % [
                             read_file(os.path.join(d.mnt, "replicator.errors"))
                             if os.path.exists(os.path.join(d.mnt, "replicator.errors"))
                             else None for d in self.c.nodes])
        for r in range(2):
            self.assertEqual(read_file(os.path.join(self.c.nodes[r].mnt,
                                                    "replicator.prerestore")),
                             ("restore-backup: %s\nrestore-step: %d\n"
                              % (GKE_BACKUP, GKE_STEP)).encode())
        self.assert_worker_markers(GKE_JOB, GKE_STEP,
                                   {r: [gke_body(r, w) for w in range(W)] for r in range(2)})
        self.assertEqual(self.store.names(GKE_JOB + "/"), before)

    def test_gke_written_backup_missing_one_worker_is_not_restored(self):
        """GKE's validate_checkpoint: node 1 worker 1 without a .meta makes the
        step unusable; nothing is restored and the markers say so."""
        write_gke_pytorch_backup(self.store)
        self.store.delete("%s/%s/%s" % (GKE_JOB, GKE_BACKUP,
                                        save_name(GKE_JOB, GKE_STEP, 1, 1, "meta")))
        self.assertEqual(self.c.job_start(GKE_JOB), {0: 0, 1: 0})
        for r in range(2):
            mnt = self.c.nodes[r].mnt
            self.assertEqual(markers(mnt),
                             [save_name(GKE_JOB, 0, r, w, "restore") for w in range(W)])
            self.assertEqual(read_file(os.path.join(mnt, "replicator.errors")),
                             ("backup %s skipped: node 1 worker 1: no .meta\n"
                              % GKE_BACKUP).encode(), "node %d" % r)


class FilePtBackup(Base, unittest.TestCase):
    def make_store(self):
        return FileStore(self)


class GsPtBackup(GsServerStore, Base, unittest.TestCase):
    pass


if __name__ == "__main__":
    harness.main()
