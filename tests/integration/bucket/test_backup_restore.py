"""Bucket tier end to end (issue 5, DESIGN §4–§5): real mtcfs clusters back
up to a bucket and restore from it, with both backends: file:///DIR and
gs:// against the project's Cloud Storage test server
(tests/gcs_server/gcs_server.py).

Scenarios, each with both backends unless marked:
 1. backups appear: steps 10, 20, 30 saved with backup-interval-steps: 1
    give one backup each, in GKE's layout (a .meta per node naming the
    shard hash, <hash>.manifest, <hash>.data/ with the shard's bytes); the
    .meta of a shard is written last (gs: the server's request log; file:
    the objects' ctimes);
 2. every node loses its RAM (kill -9, RAMDIR wiped, restart): the job
    restart restores the newest complete backup's step on every node, byte
    for byte; replicator.prerestore names the backup;
 2b. a backup as GKE's replicator writes it (.meta = "D" + BLAKE3, no
    manifest) restores on every node, byte for byte;
 3. the newest backup lacks one node's .meta (deleted behind mtcfs's back):
    the older complete backup is restored, replicator.errors names the
    skipped one;
    3b: a data object of the newest backup has a flipped byte (it looks
    complete): the node whose fetch fails its CRC32C says so, that backup
    is excluded and every node restores the older one;
    3c: after 3b, the shard another node fetched from the excluded backup
    never makes a later restore mix that old step with a new one;
 4. restore.version naming an older good backup while RAM holds newer
    steps: that backup's step is restored on every node; restore.version is
    deleted after the next commit on every node (and not before);
    4b: after that rollback, a job restart before the next step is
    complete everywhere comes back at the rolled-back-to step, never at a
    step of the abandoned timeline still in RAM;
 5. restore.version naming a missing, an incomplete or no backup: s0
    markers everywhere, replicator.errors says why, nothing is restored
    (no fallback); it is used once all the same: deleted with the first
    checkpoint saved after that empty start, and the restart after that
    restores in-cluster steps again;
 6. (gs) uploads under injected faults (503s, 429 with Retry-After, a reset
    mid-upload, slow answers): the backups complete and restore byte for
    byte;
 7. (gs) 403 (caller lacks storage.objects.create) and (7b) 401 (token
    rejected): a message naming the bucket and the missing permission in
    the daemon log and in replicator.errors of the nodes; backups resume
    once the permission is granted; (7c) a refused backup is not restarted
    every coordinator tick;
 8. (gs) write-once: every upload mtcfs sends carries ifGenerationMatch=0,
    and mtcfs never deletes or rewrites an object of a backup;
 9. (file) a single node with a bucket and no peers: backup, wipe, restore;
 and (gs) the coordinator unmounted while a backup upload is in flight exits
 cleanly; when gcloud is installed, `gcloud storage ls/cat` reads a backup
 mtcfs wrote to the test server.

Backups are awaited through rank 0's "backup job=... complete" line (the
nodes run with -d) and checked object by object in the bucket. Shards are
~60 KiB (test 6: 9 MiB, for resumable uploads). Everything started here
(daemons, mounts, the test server, temp dirs) goes away even on failure:
the harness reaps daemons, the server exits when its stdin closes.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \\
     /usr/bin/python3 tests/integration/bucket/test_backup_restore.py [-k NAME]
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import Daemon, wait_until, admin_ls  # noqa: E402
import cluster  # noqa: E402
from cluster import Cluster, shard_files  # noqa: E402

REPO = os.path.dirname(os.path.dirname(INTEG))
GCLOUD = shutil.which("gcloud")

KiB = 1024
SIZE = 48 * KiB                 # shards stay small: ~60 KiB per node and step
BACKUP_TIMEOUT = 60
GS_BUCKET = "mtcfs-bk"
# quick retries against the local server (base ms, cap ms, attempts)
GCS_RETRY = "20,400,8"


# the Cloud Storage test server: the suite's one launcher
from gcs import GcsServer  # noqa: E402,F401


def qname(name):
    return urllib.parse.quote(name, safe="")


# --- the two backends, as the test sees them ------------------------------------

class FileStore:
    """bucket=file:///DIR: objects are files under DIR."""
    kind = "file"

    def __init__(self, tc):
        self.root = tempfile.mkdtemp(prefix="mtcfs-bucket-", dir="/tmp")
        if not harness.KEEP_TMP:
            tc.addCleanup(shutil.rmtree, self.root, True)
        self.url = "file://" + self.root

    def opts(self):
        return "bucket=" + self.url

    def setup_env(self, env):
        pass

    def names(self, prefix=""):
        out = []
        for dp, _, fns in os.walk(self.root):
            for fn in fns:
                rel = os.path.relpath(os.path.join(dp, fn), self.root)
                if rel.startswith(prefix) and not fn.startswith("."):
                    out.append(rel)
        return sorted(out)

    def read(self, name):
        with open(os.path.join(self.root, name), "rb") as f:
            return f.read()

    def exists(self, name):
        return os.path.isfile(os.path.join(self.root, name))

    def write(self, name, data):
        p = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)

    def delete(self, name):
        os.unlink(os.path.join(self.root, name))

    def ctime_ns(self, name):
        return os.stat(os.path.join(self.root, name)).st_ctime_ns


class GsStore:
    """bucket=gs://BUCKET/PREFIX on the test server, reached through
    STORAGE_EMULATOR_HOST (no credentials), as Google's libraries do."""
    kind = "gs"

    def __init__(self, tc, srv, prefix):
        self.srv = srv
        self.bucket = GS_BUCKET
        self.prefix = prefix.strip("/") + "/"
        self.url = "gs://%s/%s" % (self.bucket, self.prefix.rstrip("/"))

    def opts(self):
        return "bucket=" + self.url

    def setup_env(self, env):
        env["STORAGE_EMULATOR_HOST"] = self.srv.host
        env["MTCFS_GCS_RETRY"] = GCS_RETRY

    def names(self, prefix=""):
        full = self.prefix + prefix
        return sorted(o["name"][len(self.prefix):]
                      for o in self.srv.call("/_objects")
                      if o["bucket"] == self.bucket and o["name"].startswith(full))

    def read(self, name):
        _, data = self.srv.request("GET", "/storage/v1/b/%s/o/%s?alt=media" % (
            self.bucket, qname(self.prefix + name)))
        return data

    def exists(self, name):
        st, _ = self.srv.request("GET", "/storage/v1/b/%s/o/%s" % (
            self.bucket, qname(self.prefix + name)), ok=None)
        return st == 200

    def write(self, name, data):
        self.srv.request("POST", "/upload/storage/v1/b/%s/o?uploadType=media&name=%s" % (
            self.bucket, qname(self.prefix + name)), data,
            {"Content-Type": "application/octet-stream"})

    def delete(self, name):
        self.srv.request("DELETE", "/storage/v1/b/%s/o/%s" % (
            self.bucket, qname(self.prefix + name)), ok=(204,))


# --- a cluster whose yaml asks for backups --------------------------------------

class BackupCluster(Cluster):
    """Cluster.yaml() always writes backup-interval-minutes (and a second
    interval key is refused), so the yaml is written here in full."""

    def __init__(self, n, interval_steps=1, **kw):
        super().__init__(n, **kw)
        self.interval_steps = interval_steps

    def yaml(self, job, rank, extra=""):
        return ("job-name: %s\nframework: orbax\nnode-rank: %d\nnodes: %d\n"
                "peers-per-node: %d\nbackup-interval-steps: %d\n%s" % (
                    job, rank, self.n, self.k, self.interval_steps, extra))


def markers(mnt):
    return sorted(x for x in os.listdir(mnt) if x.endswith(".restore"))


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def meta_name(job, step, node, worker=0):
    return "%s-s%d-n%d-w%d.meta" % (job, step, node, worker)


# A backup as GKE's replicator writes it (sync.py: hash_and_wrap_into_meta,
# atomic_copy_file): per node JOB-s<S>-n<r>-w0.meta holding "D" + the BLAKE3
# merkle digest of its step directory (merkle.dir_digest), no newline, and
# the directory itself as <that>.data/, no manifest. The digests below are
# what GKE's own functions computed for these bytes (job "gk", step 40,
# SIZE, commit_success.txt "ok\n"), run beside the project; the tree this
# writes was compared with the one GKE's functions wrote: identical.
GKE_JOB, GKE_STEP, GKE_BACKUP = "gk", 40, "2025-06-30_14-30"
GKE_HASHES = {0: "D1e5f2c40eaa7e5cf69093fdc3edb7d703699e34abf9942293c65005dc63c34cb",
              1: "D05ad6fd235c384e48787ad7b3904470c03679b2e0138d8ec5e73dd725dd6af08"}


def write_gke_backup(store, job=GKE_JOB, step=GKE_STEP, backup=GKE_BACKUP, size=SIZE):
    base = "%s/%s/" % (job, backup)
    for r, h in GKE_HASHES.items():
        files = dict(shard_files(job, step, r, size))
        files["commit_success.txt"] = b"ok\n"
        for rel, data in sorted(files.items()):
            store.write(base + h + ".data/" + rel, data)
        store.write(base + "%s-s%d-n%d-w0.meta" % (job, step, r), h.encode())


# exactly GKE's form: its listing regex and Orbax's converter skip any other
NAME_RE = r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}"
# one backup per UTC minute: a minute of the daemons' backup clock lasts
# this many real seconds (MTCFS_TEST_MINUTE_SECS), so successive backups
# need not wait real minutes
TEST_MINUTE_SECS = "1"


def quiesce(c, timeout=10):
    """Before a cluster stops: let a backup rank 0 started end (complete or
    abandoned), so no test ends by unmounting in the middle of one. Best
    effort: a test whose backups keep failing just stops."""
    d = c.nodes[0]
    if not d.running():
        return
    started = re.compile(r"coord: backup job=\S+ name=(\S+) step=\d+ started")
    ended = re.compile(r"coord: (?:backup job=\S+ name=(\S+) step=\d+ complete|"
                       r"job \S+: backup (\S+) of step \d+ abandoned)")

    def idle():
        text = d.log_text()
        s = [m.group(1) for m in started.finditer(text)]
        e = {m.group(1) or m.group(2) for m in ended.finditer(text)}
        return all(x in e for x in s)
    try:
        wait_until(idle, timeout, "rank 0's backups ended")
    except AssertionError:
        pass


# --- the tests --------------------------------------------------------------------

class BackupBase(unittest.TestCase):
    """One bucket (self.store) per test; subclasses pick the backend."""

    def make_store(self):
        raise NotImplementedError

    def setUp(self):
        self.daemons = []
        self.store = self.make_store()

    # -- plumbing --

    def cluster(self, n=2, interval_steps=1, start=True, env=None, ram_size="256M"):
        c = BackupCluster(n, interval_steps=interval_steps, ram_size=ram_size,
                          restore_timeout=15, extra=self.store.opts())
        self.addCleanup(c.close)
        self.addCleanup(quiesce, c)            # runs before c.close
        for d in c.nodes:
            d.extra_args.append("-d")          # INFO: backup/restore lines
            d.env["MTCFS_TEST_MINUTE_SECS"] = TEST_MINUTE_SECS
            self.store.setup_env(d.env)
            if env:
                d.env.update(env)
            self.daemons.append(d)
        self.c = c
        if start:
            c.start()
        return c

    def wait_backup(self, job, step, node0=None, timeout=BACKUP_TIMEOUT):
        """Rank 0 logs the backup of step complete; returns its name. The
        backup's objects are then all there (every node reported done)."""
        return cluster.wait_backup(node0 or self.c.nodes[0], job, step, timeout)

    def save_backed_up(self, job, steps, size=SIZE):
        """Save each step on every node and wait for its backup: {step: name}."""
        out = {}
        for s in steps:
            self.c.save(job, s, size=size)
            out[s] = self.wait_backup(job, s)
        return out

    def lose_all_ram(self):
        self.c.lose_all_ram()

    def prerestore(self, r):
        return read_text(os.path.join(self.c.nodes[r].mnt, "replicator.prerestore"))

    def errors(self, r):
        return read_text(os.path.join(self.c.nodes[r].mnt, "replicator.errors"))

    def assert_backup_layout(self, job, name, step, nodes, size=SIZE):
        """JOB/NAME/ holds exactly: per node a .meta naming its shard hash,
        <hash>.manifest and <hash>.data/<files> with the bytes it saved."""
        st = self.store
        base = "%s/%s/" % (job, name)
        objs = st.names(base)
        want = set()
        hashes = {}
        for n in range(nodes):
            mn = base + meta_name(job, step, n)
            self.assertIn(mn, objs, "backup %s lacks node %d's .meta; has %s"
                          % (name, n, objs))
            h = st.read(mn).decode()
            self.assertRegex(h, r"^[0-9a-f]{64}$", ".meta content of %s" % mn)
            hashes[n] = h
            want.add(mn)
            want.add(base + h + ".manifest")
            self.assertGreater(len(st.read(base + h + ".manifest")), 0)
            files = shard_files(job, step, n, size)
            data = [x[len(base + h + ".data/"):] for x in objs
                    if x.startswith(base + h + ".data/")]
            self.assertEqual(sorted(set(data) - {"commit_success.txt"}),
                             sorted(files), "data objects of node %d in %s"
                             % (n, name))
            for rel in data:
                want.add(base + h + ".data/" + rel)
            for rel, b in files.items():
                self.assertEqual(st.read(base + h + ".data/" + rel), b,
                                 "bytes of %s%s.data/%s" % (base, h, rel))
        self.assertEqual(sorted(objs), sorted(want),
                         "objects of backup %s" % name)
        return hashes

    def assert_no_meta_before_data(self, job, name, hashes):
        """file://: each shard's objects are linked in (ctime) data, then the
        manifest, then the .meta last."""
        st = self.store
        base = "%s/%s/" % (job, name)
        for n, h in hashes.items():
            data = [x for x in st.names(base + h + ".data/")]
            tm = st.ctime_ns(base + h + ".manifest")
            step = int(re.search(r"-s(\d+)-", [x for x in st.names(base)
                                               if x.endswith("-n%d-w0.meta" % n)][0]).group(1))
            tmeta = st.ctime_ns(base + meta_name(job, step, n))
            self.assertLessEqual(max(st.ctime_ns(x) for x in data), tm,
                                 "node %d: a data object of %s after its manifest" % (n, name))
            self.assertLessEqual(tm, tmeta, "node %d: manifest of %s after its .meta"
                                 % (n, name))

    def job_restart(self, job, timeout=60):
        """Every node starts the job again; {rank: restored step}."""
        return self.c.job_start(job, timeout=timeout)

    # -- 1 --

    def test_1_backups_appear(self):
        job = "bk1"
        c = self.cluster()
        self.assertEqual(c.job_start(job), {0: 0, 1: 0})
        names = self.save_backed_up(job, (10, 20, 30))
        self.assertEqual(len(set(names.values())), 3, names)
        for s, name in names.items():
            self.assertRegex(name, "^%s$" % NAME_RE)
            hashes = self.assert_backup_layout(job, name, s, 2)
            self.check_order(job, name, hashes)
        # the newest one describes the shards the nodes hold
        for r in range(2):
            held = {(x["rank"], x["step"]): x for x in admin_ls(c.nodes[r].ramdir)["shards"]
                    if x["job"] == job}
            own = held.get((r, 30))
            self.assertIsNotNone(own, "node %d no longer holds step 30: %s" % (r, held))
            meta = self.store.read("%s/%s/%s" % (job, names[30], meta_name(job, 30, r)))
            self.assertEqual(meta.decode(), own["hash"], "node %d's .meta vs its catalog" % r)
        # nothing but the job's backups in the bucket (no restore.version)
        tops = {x.split("/")[1] for x in self.store.names(job + "/")}
        self.assertEqual(tops, set(names.values()))

    def test_1b_same_minute_waits_for_the_next(self):
        """Two backups due in one UTC minute (backup-interval-steps: 1, steps
        saved back to back): the second waits for the next minute of the
        backup clock and gets that minute's bare name, never "-2"."""
        job = "bk1b"
        c = self.cluster(env={"MTCFS_TEST_MINUTE_SECS": "12"})
        c.job_start(job)
        c.save(job, 10, size=SIZE)
        a = self.wait_backup(job, 10)
        c.save(job, 20, size=SIZE)
        b = self.wait_backup(job, 20)
        for name in (a, b):
            self.assertRegex(name, "^%s$" % NAME_RE)
        self.assertGreater(b, a)
        self.assertRegex(c.nodes[0].log_text(),
                         r"job %s: backup of step 20 waits \d+ s for the next UTC minute" % job)
        tops = {x.split("/")[1] for x in self.store.names(job + "/")}
        self.assertEqual(tops, {a, b})
        self.assert_backup_layout(job, b, 20, 2)

    def check_order(self, job, name, hashes):
        self.assert_no_meta_before_data(job, name, hashes)

    # -- 2 --

    def test_2_all_ram_lost_newest_backup_restored(self):
        job = "bk2"
        c = self.cluster()
        c.job_start(job)
        names = self.save_backed_up(job, (10, 20))
        self.lose_all_ram()
        got = self.job_restart(job)
        self.assertEqual(got, {0: 20, 1: 20}, "restored steps")
        for r in range(2):
            self.assertEqual(self.prerestore(r), "restore-backup: %s\nrestore-step: 20\n"
                             % names[20], "node %d prerestore" % r)
            c.restore_and_verify(job, r, 20, size=SIZE)
        # restored shards are the backup's: same hashes as the .meta
        for r in range(2):
            meta = self.store.read("%s/%s/%s" % (job, names[20], meta_name(job, 20, r)))
            own = [x for x in admin_ls(c.nodes[r].ramdir)["shards"]
                   if x["job"] == job and x["rank"] == r and x["step"] == 20]
            self.assertEqual([x["hash"] for x in own], [meta.decode()])
            self.assertIn("restored job=%s step=20 from backup %s" % (job, names[20]),
                          c.nodes[r].log_text())
        # and the job goes on: the next step is saved and backed up again
        n3 = self.save_backed_up(job, (30,))
        self.assert_backup_layout(job, n3[30], 30, 2)
        self.assert_backups_untouched(job, names)

    def test_2d_restored_newest_step_backed_up_after_a_restart(self):
        """A step committed job-wide but not backed up when every node
        (the coordinator too) is killed is restored from RAM by the job
        restart; it is backed up then, not only after the next commit."""
        job = "bk2d"
        c = self.cluster()
        c.job_start(job)
        self.save_backed_up(job, (10,))
        c.save(job, 20, size=SIZE)
        for d in c.nodes:
            d.kill9()
        backups20 = [x for x in self.store.names(job + "/") if "-s20-" in x]
        for d in c.nodes:
            d.start()
        got = self.job_restart(job)
        self.assertEqual(got, {0: 20, 1: 20}, "restored steps")
        if backups20:
            self.skipTest("step 20 was backed up before the kill")
        self.wait_backup(job, 20)

    def test_2c_sparse_file_restored_sparse(self):
        """A 256 MiB file with 8 KiB of data, backed up, every node wiped,
        restored from the bucket: same bytes, and the restored file (and a
        file:// object) allocates about its data, not its size. ram_size
        (64M) is below the logical size: the restore still fits."""
        job = "bk2c"
        big, step = 256 * 1024 * KiB, 10
        data = {r: bytes((r * 31 + i * 7) & 0xff or 1 for i in range(8 * KiB))
                for r in range(2)}
        at = 100 * 1024 * KiB + 123           # not block-aligned
        c = self.cluster(ram_size="64M")
        c.job_start(job)
        for r in range(2):
            tmp = os.path.join(c.nodes[r].mnt, "%d.orbax-checkpoint-tmp-%d" % (step, r))
            os.makedirs(tmp)
            with open(os.path.join(tmp, "sparse.bin"), "wb") as f:
                f.truncate(big)
                f.seek(at)
                f.write(data[r])
            harness.write_file(os.path.join(tmp, "commit_success.txt"), b"ok\n")
            os.rename(tmp, os.path.join(c.nodes[r].mnt, str(step)))
        name = self.wait_backup(job, step)
        if self.store.kind == "file":
            objs = [x for x in self.store.names("%s/%s/" % (job, name))
                    if x.endswith(".data/sparse.bin")]
            self.assertEqual(len(objs), 2, objs)
            for o in objs:
                st = os.stat(os.path.join(self.store.root, o))
                self.assertEqual(st.st_size, big)
                self.assertLessEqual(st.st_blocks * 512, 1024 * KiB,
                                     "file:// object %s allocates %d bytes"
                                     % (o, st.st_blocks * 512))
        self.lose_all_ram()
        self.assertEqual(self.job_restart(job), {0: step, 1: step})
        for r in range(2):
            mnt = c.nodes[r].mnt
            ms = [x for x in os.listdir(mnt) if x.endswith(".restore")]
            self.assertEqual(len(ms), 1, os.listdir(mnt))
            os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, str(step)))
            p = os.path.join(mnt, str(step), "sparse.bin")
            st = os.stat(p)
            self.assertEqual(st.st_size, big)
            self.assertLessEqual(st.st_blocks * 512, 1024 * KiB,
                                 "node %d: restored file allocates %d bytes"
                                 % (r, st.st_blocks * 512))
            zero = bytes(1024 * KiB)
            with open(p, "rb") as f:
                off = 0
                while off < big:
                    chunk = f.read(1024 * KiB)
                    lo, hi = max(at, off), min(at + len(data[r]), off + len(chunk))
                    if lo < hi:
                        want = bytearray(len(chunk))
                        want[lo - off:hi - off] = data[r][lo - at:hi - at]
                        self.assertEqual(chunk, bytes(want), "node %d at %d" % (r, off))
                    else:
                        self.assertEqual(chunk, zero[:len(chunk)], "node %d at %d" % (r, off))
                    off += len(chunk)
            self.assertIn("restored job=%s step=%d from backup %s" % (job, step, name),
                          c.nodes[r].log_text())
        # the restored shard costs its blocks, not 256 MiB of the 64M: the job goes on
        self.save_backed_up(job, (step + 10,))

    def assert_backups_untouched(self, job, names):
        for s, name in names.items():
            self.assert_backup_layout(job, name, s, 2)

    def test_2b_gke_written_backup_restored(self):
        """A bucket GKE's replicator wrote (D<BLAKE3>.data/ directories, no
        manifest) restores through mtcfs on every node, byte for byte, and
        mtcfs writes nothing into that backup."""
        write_gke_backup(self.store)
        before = self.store.names(GKE_JOB + "/")
        c = self.cluster()
        got = self.job_restart(GKE_JOB)
        self.assertEqual(got, {0: GKE_STEP, 1: GKE_STEP})
        for r in range(2):
            self.assertEqual(self.prerestore(r), "restore-backup: %s\nrestore-step: %d\n"
                             % (GKE_BACKUP, GKE_STEP))
            c.restore_and_verify(GKE_JOB, r, GKE_STEP, size=SIZE)
            with open(os.path.join(c.nodes[r].mnt, str(GKE_STEP), "commit_success.txt"),
                      "rb") as f:
                self.assertEqual(f.read(), b"ok\n")
        self.assertEqual(self.store.names(GKE_JOB + "/"), before)

    # -- 3 --

    def test_3_incomplete_newest_backup_skipped(self):
        job = "bk3"
        c = self.cluster()
        c.job_start(job)
        names = self.save_backed_up(job, (10, 20))
        self.store.delete("%s/%s/%s" % (job, names[20], meta_name(job, 20, 1)))
        self.lose_all_ram()
        got = self.job_restart(job)
        self.assertEqual(got, {0: 10, 1: 10}, "restored steps")
        for r in range(2):
            self.assertEqual(self.prerestore(r), "restore-backup: %s\nrestore-step: 10\n"
                             % names[10], "node %d prerestore" % r)
            err = self.errors(r)
            self.assertIn(names[20], err, "node %d replicator.errors" % r)
            self.assertIn("skipped", err, "node %d replicator.errors" % r)
            c.restore_and_verify(job, r, 10, size=SIZE)
        # the incomplete backup was left as it was
        self.assertFalse(self.store.exists("%s/%s/%s" % (job, names[20], meta_name(job, 20, 1))))
        self.assertTrue(self.store.exists("%s/%s/%s" % (job, names[20], meta_name(job, 20, 0))))

    def test_3b_corrupt_shard_in_newest_backup(self):
        """A data object of the newest backup has one byte flipped (same
        size, so the backup looks complete): node 1's fetch fails its
        CRC32C, that backup is excluded, and every node restores the older
        one — never a corrupt or mixed restore."""
        job = "bk3b"
        names = self.corrupt_newest(job)
        c = self.c
        for r in range(2):
            self.assertEqual(self.prerestore(r), "restore-backup: %s\nrestore-step: 10\n"
                             % names[10], "node %d prerestore" % r)
            c.restore_and_verify(job, r, 10, size=SIZE)
        err = self.errors(1)
        self.assertIn("restore of step 20 from backup %s failed" % names[20], err,
                      "node 1 replicator.errors: %r" % err)
        self.assertIn("crc32c", err)

    def corrupt_newest(self, job):
        """Backups of 10 and 20; node 1's params file in the newest flipped;
        every node loses its RAM and the job restarts: step 10 on both."""
        c = self.cluster(start=False)
        for d in c.nodes:
            d.expect_log(r"ERROR backup: backup .* crc32c")
        c.start()
        c.job_start(job)
        names = self.save_backed_up(job, (10, 20))
        h = self.store.read("%s/%s/%s" % (job, names[20], meta_name(job, 20, 1))).decode()
        self.corrupt("%s/%s/%s.data/state/params/0.0" % (job, names[20], h), 1000)
        self.lose_all_ram()
        self.assertEqual(self.job_restart(job), {0: 10, 1: 10}, "restored steps")
        return names

    def test_3c_excluded_backup_not_mixed_later(self):
        """After the restore of test 3b, node 0 still holds the shard it
        fetched from the excluded backup (step 20 of the old timeline). The
        job goes on from 10; node 1 saves a new step 20, node 0 dies before
        it does; the job restarts: step 20 is not complete (node 0 never
        saved the new one), so 10 is restored — not node 0's old-timeline
        20 mixed with node 1's new 20."""
        job = "bk3c"
        self.corrupt_newest(job)
        c = self.c
        held = sorted(x["step"] for x in admin_ls(c.nodes[0].ramdir)["shards"]
                      if x["job"] == job and x["rank"] == 0)
        # node 1: the new timeline's step 20 (other bytes than the old one)
        mnt = c.nodes[1].mnt
        tmp = os.path.join(mnt, "20.orbax-checkpoint-tmp-new")
        cluster.write_shard(tmp, job + "-new", 20, 1, SIZE)
        mark = c.nodes[0].log_size()
        os.rename(tmp, os.path.join(mnt, "20"))
        harness.wait_committed(c.nodes[1].ramdir, 20, job=job, rank=1)
        # the restart is planned with node 1's new 20 known
        c.wait_coord("committed", job, 1, step=20, since=mark)
        got = self.job_restart(job)
        what = ""
        if got.get(0) == 20:
            m = [x for x in markers(c.nodes[0].mnt) if "-s20-" in x]
            with open(os.path.join(c.nodes[0].mnt, m[0], "state/params/0.0"), "rb") as f:
                old = f.read() == shard_files(job, 20, 0, SIZE)["state/params/0.0"]
            what = "; node 0's restored step 20 is %s" % (
                "the OLD timeline's (the excluded backup's)" if old else "other bytes")
        self.assertEqual(got, {0: 10, 1: 10}, "restart: node 0 never saved the new "
                         "step 20 (it held own steps %s after the restore: 20 was "
                         "fetched from the excluded backup)%s" % (held, what))

    def corrupt(self, name, offset):
        p = os.path.join(self.store.root, name)
        with open(p, "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0x5A]))

    # -- 4 --

    def test_4_restore_version_forces_older_backup(self):
        job = "bk4"
        c = self.cluster()
        c.job_start(job)
        names = self.save_backed_up(job, (10, 20))
        c.save(job, 30, size=SIZE)
        self.wait_backup(job, 30)
        rv = "%s/restore.version" % job
        self.store.write(rv, names[10].encode())
        got = self.job_restart(job)
        self.assertEqual(got, {0: 10, 1: 10}, "restored steps (RAM holds step 30)")
        for r in range(2):
            self.assertEqual(self.prerestore(r), "restore-backup: %s\nrestore-step: 10\n"
                             % names[10], "node %d prerestore" % r)
            c.restore_and_verify(job, r, 10, size=SIZE)
        # no commit yet: restore.version stays (the rollback armed its
        # delete at the barrier release, before the markers appeared)
        self.assertTrue(self.store.exists(rv), "restore.version deleted before any commit")
        self.assertEqual(self.store.read(rv), names[10].encode())
        # one node commits: step 40 is not complete job-wide yet (the other
        # node's newest is the restored 10; its step 30 is of the timeline
        # the job rolled back from), so restore.version stays
        mark = c.nodes[0].log_size()
        c.save(job, 40, ranks=[0], size=SIZE)
        harness.wait_committed(c.nodes[0].ramdir, 40, job=job, rank=0)
        # the coordinator has taken node 0's commit (where a wrong delete
        # would be decided) and node 0 has pushed its replica of 40 (time
        # for the bucket's delete of such a decision to be done)
        c.wait_coord("committed", job, 0, step=40, since=mark)
        c.nodes[0].wait_log(r"replicated job=%s step=40 to rank 1 " % job, 30, since=mark)
        early = not self.store.exists(rv)
        # the next commit on every node: then it goes
        c.save(job, 40, ranks=[1], size=SIZE)
        wait_until(lambda: not self.store.exists(rv), 30,
                   "restore.version deleted after the commit of step 40")
        want = "deleted %s/%s/restore.version" % (self.store.url, job)
        wait_until(lambda: want in c.nodes[0].log_text(), 10, "rank 0 logs: " + want)
        self.wait_backup(job, 40)
        # backups themselves untouched
        self.assert_backups_untouched(job, names)
        self.assertFalse(early, "restore.version was deleted when only node 0 had "
                         "committed step 40 (the job-wide LKG after the restore "
                         "was still 10)")

    def test_4b_rolled_back_steps_stay_rolled_back(self):
        """After a restore.version rollback to step 10, steps 20/30 still in
        RAM belong to the abandoned timeline: if the job restarts before its
        next step is complete on every node, it must come back at 10, never
        at 30."""
        job = "bk4b"
        c = self.cluster()
        c.job_start(job)
        names = self.save_backed_up(job, (10, 20))
        c.save(job, 30, size=SIZE)
        self.wait_backup(job, 30)
        self.store.write("%s/restore.version" % job, names[10].encode())
        self.assertEqual(self.job_restart(job), {0: 10, 1: 10})
        # node 0 saves step 40, node 1 dies before it does: job restart
        mark = c.nodes[0].log_size()
        c.save(job, 40, ranks=[0], size=SIZE)
        harness.wait_committed(c.nodes[0].ramdir, 40, job=job, rank=0)
        c.wait_coord("committed", job, 0, step=40, since=mark)
        got = self.job_restart(job)
        self.assertEqual(got, {0: 10, 1: 10}, "restart after the rollback to 10 "
                         "(step 30 is of the abandoned timeline; 40 is on node 0 only)")

    # -- 5 --

    def test_5_restore_version_bad_nothing_restored(self):
        job = "bk5"
        c = self.cluster()
        c.job_start(job)
        names = self.save_backed_up(job, (10, 20))
        self.store.delete("%s/%s/%s" % (job, names[20], meta_name(job, 20, 0)))
        rv = "%s/restore.version" % job
        cases = [
            ("2001-01-01_00-00", "2001-01-01_00-00", "does not exist"),
            (names[20], names[20], ""),                      # incomplete
            ("../../etc/passwd", "restore.version", "does not name a backup"),
        ]
        for content, must1, must2 in cases:
            if self.store.exists(rv):
                self.store.delete(rv)
            self.store.write(rv, content.encode())
            got = self.job_restart(job)
            self.assertEqual(got, {0: 0, 1: 0}, "restore.version=%r: restored steps"
                             % content)
            for r in range(2):
                mnt = c.nodes[r].mnt
                self.assertEqual(markers(mnt), ["%s-s0-n%d-w0.restore" % (job, r)])
                self.assertEqual(os.path.getsize(os.path.join(mnt, markers(mnt)[0])), 0)
                self.assertFalse(os.path.islink(os.path.join(mnt, markers(mnt)[0])))
                self.assertEqual(self.prerestore(r).strip(), "{}",
                                 "restore.version=%r: node %d prerestore" % (content, r))
                err = self.errors(r)
                self.assertIn(must1, err, "restore.version=%r: node %d errors: %r"
                              % (content, r, err))
                if must2:
                    self.assertIn(must2, err)
                self.assertIn("nothing is restored", err)
            # not yet used up: no checkpoint was saved since (not rewritten)
            self.assertEqual(self.store.read(rv), content.encode())
        # nothing of the bucket was touched
        self.assert_backup_layout(job, names[10], 10, 2)
        # Used once all the same (GKE's documented rule): the first
        # checkpoint saved after that empty start deletes it ...
        c.save(job, 30, size=SIZE)
        wait_until(lambda: not self.store.exists(rv), 30,
                   "restore.version deleted after the first checkpoint saved")
        wait_until(lambda: re.search(r"deleted .*restore\.version after the first commit",
                                     c.nodes[0].log_text()), 10, "rank 0 logs the delete")
        # ... and the next restart restores the in-cluster step again
        self.assertEqual(self.job_restart(job), {0: 30, 1: 30})


class FileBackupTest(BackupBase):
    def make_store(self):
        return FileStore(self)

    # -- 9 --

    def test_2d_setuid_setgid_not_restored(self):
        """A backup of 04755/02755 files and a 01777 directory, every node
        wiped, restored from the bucket: no set-id bit (0755, 0755; the
        directory keeps its sticky bit, 01777, which only narrows who may
        delete in it), as a peer or erasure-code restore gives them."""
        job = "bk2d"
        step = 10
        c = self.cluster()
        c.job_start(job)
        for r in range(2):
            tmp = os.path.join(c.nodes[r].mnt, "%d.orbax-checkpoint-tmp-%d" % (step, r))
            os.makedirs(os.path.join(tmp, "bin"))
            os.makedirs(os.path.join(tmp, "shared"))
            harness.write_file(os.path.join(tmp, "shared", "f"), b"x\n")
            for rel, mode in (("bin/suid", 0o4755), ("bin/sgid", 0o2755)):
                harness.write_file(os.path.join(tmp, rel), b"#!/bin/sh\n")
                os.chmod(os.path.join(tmp, rel), mode)
            os.chmod(os.path.join(tmp, "shared"), 0o1777)
            harness.write_file(os.path.join(tmp, "commit_success.txt"), b"ok\n")
            os.rename(tmp, os.path.join(c.nodes[r].mnt, str(step)))
        self.wait_backup(job, step)
        self.lose_all_ram()
        self.assertEqual(self.job_restart(job), {0: step, 1: step})
        for r in range(2):
            mnt = c.nodes[r].mnt
            ms = [x for x in os.listdir(mnt) if x.endswith(".restore")]
            os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, str(step)))
            d = os.path.join(mnt, str(step))
            got = {rel: os.stat(os.path.join(d, rel)).st_mode & 0o7777
                   for rel in ("bin/suid", "bin/sgid", "shared")}
            self.assertEqual(got, {"bin/suid": 0o755, "bin/sgid": 0o755, "shared": 0o1777},
                             "node %d" % r)
            self.assertIn("restored job=%s step=%d from backup" % (job, step),
                          c.nodes[r].log_text())

    def test_9_single_node_no_peers(self):
        job = "solo"
        d = Daemon(opts="ram_size=256M," + self.store.opts(), extra_args=["-d"],
                   name="solo")
        self.daemons.append(d)
        self.addCleanup(d.close)
        d.start()
        yaml = ("job-name: %s\nframework: orbax\nnode-rank: 0\nnodes: 1\n"
                "backup-interval-steps: 1\n" % job)
        self.assertEqual(start_job(d.mnt, yaml), 0)
        save_step(d.mnt, job, 5, 0)
        name = self.wait_backup(job, 5, node0=d)
        self.assert_backup_layout(job, name, 5, 1)
        d.kill9()
        d.wipe_ramdir()
        d.start()
        self.assertEqual(start_job(d.mnt, yaml), 5)
        self.assertEqual(read_text(os.path.join(d.mnt, "replicator.prerestore")),
                         "restore-backup: %s\nrestore-step: 5\n" % name)
        verify_restore(d.mnt, job, 5, 0)


def start_job(mnt, yaml, timeout=60):
    """replicator.yaml on one mount; the restored step (0: nothing)."""
    p = os.path.join(mnt, "replicator.yaml")
    with open(p + ".tmp", "w") as f:
        f.write(yaml)
    os.rename(p + ".tmp", p)
    failed = os.path.join(mnt, "replicator.failed")

    def ms():
        if os.path.exists(failed):
            raise AssertionError("replicator.failed: " + read_text(failed))
        return markers(mnt) or None
    m = wait_until(ms, timeout, "markers on " + mnt)
    return int(re.match(r".*-s(\d+)-n\d+-w\d+\.restore$", m[0]).group(1))


def save_step(mnt, job, step, rank, size=SIZE):
    cluster.save_step(mnt, job, step, rank, size)


def verify_restore(mnt, job, step, rank, size=SIZE):
    ms = [x for x in markers(mnt) if "-s%d-" % step in x]
    assert ms, os.listdir(mnt)
    os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, str(step)))
    for rel, data in shard_files(job, step, rank, size).items():
        with open(os.path.join(mnt, str(step), rel), "rb") as f:
            assert f.read() == data, "step %d %s differs" % (step, rel)


class GsServerStore:
    """Mixed into a TestCase: one Cloud Storage test server per class, a
    fresh bucket prefix (and a reset server) per test."""
    srv = None

    @classmethod
    def setUpClass(cls):
        cls.srv = GcsServer()

    @classmethod
    def tearDownClass(cls):
        if cls.srv is not None:
            cls.srv.stop()

    def make_store(self):
        self.srv.call("/_reset", {"log": True, "faults": True, "data": True, "config": True})
        return GsStore(self, self.srv, "pfx/" + self._testMethodName)


class GsBackupTest(GsServerStore, BackupBase):

    def corrupt(self, name, offset):
        self.srv.call("/_corrupt", {"bucket": GS_BUCKET, "name": self.store.prefix + name,
                                    "kind": "flip", "offset": offset})

    def mtcfs_log(self):
        """The server's log entries of mtcfs's requests (not the test's)."""
        return [e for e in self.srv.log()
                if e["headers"].get("user-agent", "").startswith("mtcfs")]

    def check_order(self, job, name, hashes):
        """In the server's log, each shard's .meta upload comes after the
        successful uploads of every other object of that shard."""
        log = [e for e in self.mtcfs_log() if e["class"] == "upload"
               and e["status"] == 200]
        idx = {}
        for i, e in enumerate(log):
            idx.setdefault(e["name"], i)
        base = self.store.prefix + "%s/%s/" % (job, name)
        for n, h in hashes.items():
            metas = [k for k in idx if k.startswith(base) and k.endswith("-n%d-w0.meta" % n)]
            self.assertEqual(len(metas), 1, metas)
            others = [k for k in idx if k.startswith(base + h + ".")]
            self.assertTrue(others)
            last_other = max(idx[k] for k in others)
            self.assertLess(last_other, idx[metas[0]],
                            "node %d: the .meta of %s was not the last object written"
                            % (n, name))
            data = [idx[k] for k in others if ".data/" in k]
            self.assertLess(max(data), idx[base + h + ".manifest"],
                            "node %d: the manifest of %s before a data object" % (n, name))

    def assert_write_once(self):
        """Every upload mtcfs started carries ifGenerationMatch=0; it never
        deleted anything but restore.version; no object was written twice."""
        log = self.mtcfs_log()
        starts = [e for e in log if e["class"] == "upload" and e["method"] == "POST"]
        self.assertTrue(starts, "mtcfs uploaded nothing")
        for e in starts:
            self.assertEqual(e["query"].get("ifGenerationMatch"), "0",
                             "upload without ifGenerationMatch=0: %s ?%s"
                             % (e["path"], e["rawquery"]))
        for e in log:
            if e["class"] == "upload" and e["method"] == "PUT":
                self.assertIn("upload_id", e["query"], e)
            if e["method"] == "DELETE" and e["class"] != "upload":
                self.assertTrue((e["name"] or "").endswith("/restore.version"),
                                "mtcfs deleted %s" % e["name"])
        ok = {}
        for e in starts:
            if e["status"] == 200:
                ok[e["name"]] = ok.get(e["name"], 0) + 1
        twice = {k: v for k, v in ok.items() if v > 1
                 and not k.endswith("/restore.version")}
        self.assertEqual(twice, {}, "objects written more than once")
        return starts

    # -- 8 --

    def test_8_every_upload_is_write_once(self):
        job = "bk8"
        c = self.cluster()
        c.job_start(job)
        names = self.save_backed_up(job, (10, 20))
        starts = self.assert_write_once()
        # per backup and node: 3 data files + commit_success.txt, manifest, .meta
        per = {}
        for e in starts:
            if e["status"] == 200:
                bk = e["name"][len(self.store.prefix):].split("/")[1]
                per[bk] = per.get(bk, 0) + 1
        self.assertEqual(per, {names[10]: 12, names[20]: 12}, "uploads per backup")
        # a restore (list/get only) and a restore.version cycle add no write
        # to a backup
        self.store.write("%s/restore.version" % job, names[10].encode())
        self.assertEqual(self.job_restart(job), {0: 10, 1: 10})
        c.save(job, 30, size=SIZE)
        wait_until(lambda: not self.store.exists("%s/restore.version" % job), 30,
                   "restore.version deleted")
        self.wait_backup(job, 30)
        self.assert_write_once()
        self.assert_backups_untouched(job, names)

    # -- 6 --

    def test_6_uploads_under_faults(self):
        """9 MiB files go as resumable uploads (above the 8 MiB single-request
        limit), the rest as media (files) and multipart (manifest, .meta)
        uploads: each kind meets a fault. Specific faults come first in the
        server's list: a request takes the first fault that matches it."""
        job = "bk6"
        big = 9 << 20
        c = self.cluster()
        c.job_start(job)
        self.srv.call("/_fault", [
            # a resumable chunk cut after 3 MiB: resumed from the persisted offset
            {"match": "upload", "method": "PUT", "kind": "reset",
             "after_bytes": 3 << 20, "count": 1},
            # a media upload cut mid-body
            {"match": "upload", "kind": "reset", "after_bytes": 9000, "count": 1,
             "name": "state/opt/"},
            # multipart: a 500, then one stored but its answer lost (the retry
            # meets 412 and must see that the object is its own)
            {"match": "upload", "kind": "500", "query": "uploadType=multipart", "count": 1},
            {"match": "upload", "kind": "drop", "query": "uploadType=multipart", "count": 1},
            {"match": "upload", "kind": "503", "count": 3},
            {"match": "upload", "kind": "429", "count": 1, "retry_after": 1},
            {"match": "upload", "kind": "slow", "delay_ms": 1500, "count": 2},
        ])
        names = self.save_backed_up(job, (10,), size=big)
        faults = self.srv.call("/_faults")
        self.assertEqual([f["count"] for f in faults], [0] * len(faults),
                         "every injected fault was met: %s" % faults)
        self.assert_backup_layout(job, names[10], 10, 2, size=big)
        log = self.mtcfs_log()
        self.assertTrue(any(e["class"] == "upload" and e["status"] == 412 for e in log),
                        "the retry of the dropped upload did not meet its own object")
        self.assertTrue(any(e["class"] == "upload" and e["headers"].get(
            "content-range", "").startswith("bytes */") for e in log),
            "no resumable status query after the reset chunk")
        # the second backup: listings (naming) and a ranged part fail too
        self.srv.call("/_reset", {"log": False, "faults": True})
        self.srv.call("/_fault", [
            {"match": "list", "kind": "503", "count": 2},
            {"match": "upload", "method": "PUT", "kind": "503", "count": 1},
            {"match": "upload", "kind": "408", "count": 1},
        ])
        names.update(self.save_backed_up(job, (20,), size=big))
        faults = self.srv.call("/_faults")
        self.assertEqual([f["count"] for f in faults], [0] * len(faults), faults)
        self.assert_backup_layout(job, names[20], 20, 2, size=big)
        self.assert_write_once()
        # the bytes come back: every node loses its RAM and restores from the
        # backup, with download faults too
        self.srv.call("/_reset", {"log": False, "faults": True})
        self.srv.call("/_fault", [
            {"match": "download", "kind": "reset", "after_bytes": 1 << 20, "count": 1,
             "name": "state/params/"},
            {"match": "download", "kind": "503", "count": 2},
        ])
        self.lose_all_ram()
        self.assertEqual(self.job_restart(job), {0: 20, 1: 20})
        for r in range(2):
            self.assertIn("restore-backup: %s" % names[20], self.prerestore(r))
            c.restore_and_verify(job, r, 20, size=big)
        faults = self.srv.call("/_faults")
        self.assertEqual([f["count"] for f in faults], [0] * len(faults), faults)

    # -- failed attempts: resumed under the same name, or removed --

    def abandoned(self, job, step):
        rx = re.compile(r"job %s: backup (%s) of step %d abandoned" % (
            re.escape(job), NAME_RE, step))
        d = self.c.nodes[0]
        return wait_until(lambda: (rx.search(d.log_text()) or [None, None])[1], 60,
                          "backup of step %d abandoned" % step)

    def meta_upload_fails(self, job, count):
        """Node 1's .meta of step 10 gets HTTP 500 count times; every node
        saves step 10. Returns the cluster and the abandoned attempt's name."""
        c = self.cluster()
        for d in c.nodes:
            d.expect_log(r"abandoned|backup .* failed|500")
        c.job_start(job)
        self.srv.call("/_fault", [{"match": "upload", "kind": "500", "count": count,
                                   "name": "%s-s10-n1-w0.meta" % job}])
        c.save(job, 10, size=SIZE)
        return c, self.abandoned(job, 10)

    def test_4c_failed_attempt_resumed_same_name(self):
        """Node 1's .meta upload keeps failing (500) past its retries: the
        attempt is abandoned; the retry of the same step resumes it under
        the same name and completes it; no other directory appears."""
        job = "bk4c"
        c, first = self.meta_upload_fails(job, 12)
        name = self.wait_backup(job, 10)
        self.assertEqual(name, first)
        self.assertEqual({x.split("/")[1] for x in self.store.names(job + "/")}, {name})
        self.assert_backup_layout(job, name, 10, 2)

    def test_4d_failed_attempt_removed_when_step_moved(self):
        """The attempt for step 10 fails for good (node 1's .meta); step 20
        becomes the one to back up: the step-10 directory is removed before
        step 20's backup is named, so only that one is left."""
        job = "bk4d"
        c, first = self.meta_upload_fails(job, 100000)
        wait_until(lambda: any(x.startswith("%s/%s/" % (job, first))
                               for x in self.store.names(job + "/")), 10,
                   "node 0's objects of the failed attempt")
        c.save(job, 20, size=SIZE)
        name = self.wait_backup(job, 20)
        self.assertNotEqual(name, first)
        self.assertEqual({x.split("/")[1] for x in self.store.names(job + "/")}, {name})
        self.assertRegex(c.nodes[0].log_text(), r"%s/%s/: failed backup attempt removed"
                         % (re.escape(job), re.escape(first)))

    # -- 7 --

    def auth_cluster(self, expect):
        """Nodes with real credentials: a token from the metadata server (the
        test server's), the endpoint from gcs_endpoint= (STORAGE_EMULATOR_HOST
        would mean no credentials)."""
        srv = self.srv
        c = BackupCluster(2, interval_steps=1, ram_size="256M", restore_timeout=15,
                          extra="%s,gcs_endpoint=%s" % (self.store.opts(), srv.base))
        self.addCleanup(c.close)
        self.addCleanup(quiesce, c)
        self.c = c
        for d in c.nodes:
            d.extra_args.append("-d")
            d.env.pop("STORAGE_EMULATOR_HOST", None)
            d.env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
            d.env["GCE_METADATA_HOST"] = srv.host
            d.env["MTCFS_GCS_RETRY"] = GCS_RETRY
            d.env["MTCFS_TEST_MINUTE_SECS"] = TEST_MINUTE_SECS
            d.expect_log(expect)
            self.daemons.append(d)
        return c

    DENIED = (r"403 Forbidden: the caller lacks storage\.objects\.create .*gs://%s"
              % re.escape(GS_BUCKET))

    def start_denied(self, job):
        c = self.auth_cluster(r"storage\.objects\.create|backup .* failed|abandoned")
        self.srv.call("/_config", {"auth": "bearer", "deny": ["storage.objects.create"]})
        c.start()
        c.job_start(job)
        c.save(job, 10, size=SIZE)
        want = re.compile(self.DENIED)
        wait_until(lambda: all(want.search(self.errors(r)) for r in range(2)), 30,
                   "the 403 in replicator.errors of both nodes")
        return c, want

    def test_7_permission_denied_reported(self):
        job = "bk7"
        c, want = self.start_denied(job)
        for r in range(2):
            err = self.errors(r)
            self.assertRegex(err, r"backup %s of job %s step 10 failed: gs://%s/"
                             % (NAME_RE, job, re.escape(GS_BUCKET)), "node %d" % r)
            self.assertIn("roles/storage.objectUser", err)
            self.assertRegex(c.nodes[r].log_text(), r"ERROR .*" + self.DENIED,
                             "node %d log" % r)
        self.assertEqual(self.store.names(job + "/"), [], "nothing may be written")
        # the permission is granted: the next backup succeeds
        self.srv.call("/_config", {"deny": []})
        c.save(job, 20, size=SIZE)
        name = self.wait_backup(job, 20)
        self.srv.call("/_config", {"auth": "none"})     # the test's own reads
        self.assert_backup_layout(job, name, 20, 2)

    def test_7c_failed_backup_not_retried_in_a_loop(self):
        """A backup refused with 403 is reported; it is not restarted every
        coordinator tick (100 ms), each time with an ERROR line and a
        replicator.errors line on every node: consecutive failures of the
        backup on a node are at least 1 s apart."""
        job = "bk7c"
        c, want = self.start_denied(job)
        n0 = [len(self.errors(r).splitlines()) for r in range(2)]
        u0 = len([e for e in self.mtcfs_log() if e["class"] == "upload"])
        # the window is the thing under test: 30 coordinator ticks in
        # which a retry loop would show (no event marks "nothing happened")
        time.sleep(3.0)
        n1 = [len(self.errors(r).splitlines()) for r in range(2)]
        u1 = len([e for e in self.mtcfs_log() if e["class"] == "upload"])
        rx = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z ERROR engine: "
                        r"backup \S+ of job %s step 10 failed" % job, re.M)
        gaps = []
        for r in range(2):
            ts = [time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%dT%H:%M:%S"))
                  + float("0" + m.group(1)[19:]) for m in rx.finditer(c.nodes[r].log_text())]
            gaps += [b - a for a, b in zip(ts, ts[1:])]
        self.assertGreaterEqual(min(gaps or [1.0]), 1.0,
                                "backup failures %s s apart; in 3 s after the first "
                                "report: %s lines added to replicator.errors per node, "
                                "%d upload requests" % (
                                    sorted(round(g, 3) for g in gaps)[:5],
                                    [b - a for a, b in zip(n0, n1)], u1 - u0))

    def test_7b_token_rejected_reported(self):
        """The server rejects the token (401): the backup cannot even be
        named (listing needs storage.objects.list). The nodes must say so,
        naming the bucket and the permission, in the log and in
        replicator.errors."""
        job = "bk7b"
        c = self.auth_cluster(r"401|storage\.objects|backup .* failed|abandoned|"
                              r"cannot name a backup")
        self.srv.call("/_config", {"auth": "bearer", "reject_tokens": True})
        c.start()
        c.job_start(job)
        c.save(job, 10, size=SIZE)
        want = re.compile(r"401 Unauthorized.*storage\.objects\.(create|list|get).*gs://%s"
                          % re.escape(GS_BUCKET))
        wait_until(lambda: want.search(c.nodes[0].log_text()), 20,
                   "the 401 in rank 0's log")
        try:
            wait_until(lambda: all(want.search(self.errors(r)) for r in range(2)), 10,
                       "the 401 in replicator.errors of both nodes")
        except AssertionError as e:
            self.fail("%s; replicator.errors: %r; rank 0 log: %d lines 'cannot name a "
                      "backup in the bucket'" % (
                          e, {r: self.errors(r)[-600:] for r in range(2)},
                          c.nodes[0].log_text().count("cannot name a backup")))

    # -- unmount while a backup is uploading --

    def test_unmount_during_backup(self):
        """Node 0 (the coordinator) is unmounted while its backup upload is
        slowed down by the server: it exits cleanly (status 0). The
        abandoned backup may be logged; a crash may not."""
        job = "bku"
        c = self.cluster(start=False)
        for d in c.nodes:
            d.expect_log(r"abandoned")
        c.start()
        c.job_start(job)
        self.srv.call("/_fault", [{"match": "upload", "kind": "slow", "delay_ms": 1500,
                                   "count": 2}])
        c.save(job, 10, size=SIZE)
        wait_until(lambda: self.srv.call("/_faults")[0]["hit"] >= 1, 20,
                   "an upload of the backup in flight")
        t0 = time.monotonic()
        c.nodes[0].stop()          # raises DaemonError on a crash (status != 0)
        self.assertLess(time.monotonic() - t0, 20, "unmount took too long")
        c.nodes[1].stop()

    # -- gcloud --

    def test_gcloud_reads_backup(self):
        if not GCLOUD:
            self.skipTest("gcloud is not installed")
        job = "bkg"
        c = self.cluster()
        c.job_start(job)
        names = self.save_backed_up(job, (10,))
        hashes = self.assert_backup_layout(job, names[10], 10, 2)
        tmp = tempfile.mkdtemp(prefix="mtcfs-gcloud-")
        self.addCleanup(shutil.rmtree, tmp, True)
        env = dict(os.environ)
        env.update({
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": self.srv.base + "/",
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "True",
            "CLOUDSDK_CORE_PROJECT": "mtcfs-test",
            "CLOUDSDK_CONFIG": os.path.join(tmp, "gcloud-config"),
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        })

        def gcloud(*args):
            p = subprocess.run([GCLOUD, "storage"] + list(args), env=env,
                               capture_output=True, timeout=120)
            if p.returncode != 0:
                self.fail("gcloud storage %s: rc %d: %s" % (
                    " ".join(args), p.returncode, p.stderr.decode()[-2000:]))
            return p.stdout
        base = "%s/%s/%s/" % (self.store.url, job, names[10])
        listed = sorted(x for x in gcloud("ls", "-r", base + "**").decode().split()
                        if not x.endswith(":"))
        self.assertEqual(listed, sorted("%s/%s" % (self.store.url, x)
                                        for x in self.store.names("%s/%s/" % (job, names[10]))))
        h1 = hashes[1]
        f = shard_files(job, 10, 1, SIZE)
        out = gcloud("cat", base + meta_name(job, 10, 1),
                     base + h1 + ".data/state/params/0.0")
        self.assertEqual(out, h1.encode() + f["state/params/0.0"])


del BackupBase   # not a test case itself


if __name__ == "__main__":
    harness.main()
