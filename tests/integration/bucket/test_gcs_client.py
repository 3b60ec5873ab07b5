"""gs:// client end to end: mtcfs-bucket-cli (tests/unit/bucket_cli.c, over
tiers/bucket and tiers/backup) against tests/gcs_server/gcs_server.py, with
`gcloud storage` as an independent reader of what mtcfs wrote and an
independent writer of what mtcfs reads.

- a shard uploaded with upload-shard (data, manifest, .meta last) is listed
  by `gcloud storage ls`, its .meta and data read back by `gcloud storage cat`
  byte for byte (gcloud checks the crc32c the server reports), and its
  crc32c in `gcloud storage ls --json` equals the manifest's;
- an object gcloud uploads is read by mtcfs with its CRC checked;
- upload-shard under injected faults (503s, a reset mid-chunk) completes;
- backups/verify/fetch-shard/restore-version through the CLI.
gcloud tests are skipped when gcloud is absent or cannot reach the server.

Environment: MTCFS_BUILD (for mtcfs-bucket-cli). Standard library only.
"""

import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
from crc32c import crc32c  # noqa: E402
from gcs import GcsServer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(INTEG))
BUILD = os.environ.get("MTCFS_BUILD") or os.path.join(REPO, "build")
CLI = os.path.join(BUILD, "mtcfs-bucket-cli")
GCLOUD = shutil.which("gcloud")
JOB = "job-g"


# the Cloud Storage test server: the suite's one launcher
Server = GcsServer


def b64crc(c):
    return base64.b64encode(struct.pack(">I", c)).decode()


class GcsClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(CLI, os.X_OK):
            raise unittest.SkipTest("no %s (build the mtcfs-bucket-cli target)" % CLI)
        cls.srv = Server()
        cls.tmp = tempfile.mkdtemp(prefix="mtcfs-gcs-client-")
        cls.env = dict(os.environ)
        cls.env["STORAGE_EMULATOR_HOST"] = "127.0.0.1:%d" % cls.srv.port
        cls.env["MTCFS_GCS_RETRY"] = "1,20,6"
        cls.gcloud_env = dict(os.environ)
        cls.gcloud_env.update({
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": cls.srv.base + "/",
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "True",
            "CLOUDSDK_CORE_PROJECT": "mtcfs-test",
            "CLOUDSDK_CONFIG": os.path.join(cls.tmp, "gcloud-config"),
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        })
        cls.shard = os.path.join(cls.tmp, "shard")
        os.makedirs(os.path.join(cls.shard, "state", "deep"))
        os.makedirs(os.path.join(cls.shard, "empty"))
        cls.files = {}
        for rel, n in (("_METADATA", 333), ("state/big.bin", 3 * 1024 * 1024 + 11),
                       ("state/deep/x.bin", 70000), ("zero", 0)):
            data = os.urandom(n)
            with open(os.path.join(cls.shard, rel), "wb") as f:
                f.write(data)
            cls.files[rel] = data
        os.symlink("state/big.bin", os.path.join(cls.shard, "link"))

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def cli(self, *args, ok=True, opts=()):
        p = subprocess.run([CLI, "--simple-max", "256K", "--chunk", "1M", "--part", "1M",
                            "--list-page", "5"] + list(opts) + list(args),
                           env=self.env, capture_output=True, timeout=120)
        if ok and p.returncode != 0:
            self.fail("%s: rc %d: %s" % (" ".join(args), p.returncode, p.stderr.decode()))
        return p

    def gcloud(self, *args):
        if not GCLOUD:
            self.skipTest("gcloud is not installed")
        p = subprocess.run([GCLOUD, "storage"] + list(args), env=self.gcloud_env,
                           capture_output=True, timeout=120)
        if p.returncode != 0:
            self.fail("gcloud storage %s: rc %d: %s" % (" ".join(args), p.returncode,
                                                        p.stderr.decode()[-2000:]))
        return p.stdout

    def upload(self, url, backup, node=0):
        self.cli(url, "upload-shard", JOB, backup, "42", str(node), "0", self.shard)
        out = self.cli(url, "backups", JOB, "1", "1").stdout
        return json.loads(out)

    def test_1_gcloud_reads_what_mtcfs_wrote(self):
        url = "gs://bkt/pfx1"
        self.srv.call("/_reset", {})
        bk = self.upload(url, "2024-05-05_05-05")
        self.assertEqual(len(bk), 1)
        self.assertTrue(bk[0]["complete"], bk[0]["why"])
        h = bk[0]["shards"][0]["hash"]
        # the upload order: every data object, then the manifest, then the .meta
        names = [e["name"] for e in self.srv.call("/_log")
                 if e["class"] == "upload" and e["method"] == "POST"]
        self.assertTrue(names[-1].endswith("%s-s42-n0-w0.meta" % JOB), names)
        self.assertTrue(names[-2].endswith(h + ".manifest"), names)
        self.assertEqual(len(names), 4 + 2)     # 4 files (empty one too) + manifest + .meta

        base = "gs://bkt/pfx1/%s/2024-05-05_05-05/" % JOB
        listing = self.gcloud("ls", base).decode().split()
        self.assertEqual(sorted(listing), sorted([
            base + "%s-s42-n0-w0.meta" % JOB, base + h + ".data/", base + h + ".manifest"]))
        deep = self.gcloud("ls", "-r", base + h + ".data/**").decode().split()
        self.assertEqual(sorted(x for x in deep if not x.endswith(":")),
                         sorted(base + h + ".data/" + r for r in self.files))
        self.assertEqual(self.gcloud("cat", base + "%s-s42-n0-w0.meta" % JOB).decode(), h)
        for rel, data in self.files.items():
            if data:
                self.assertEqual(self.gcloud("cat", base + h + ".data/" + rel), data, rel)
        meta = self.gcloud("ls", "--json", base + h + ".data/state/big.bin").decode()
        js = json.loads(meta)
        rec = js[0] if isinstance(js, list) else js
        blob = json.dumps(rec)
        self.assertIn(b64crc(crc32c(self.files["state/big.bin"])), blob)

    def test_2_mtcfs_reads_what_gcloud_wrote(self):
        src = os.path.join(self.tmp, "from-gcloud.bin")
        data = os.urandom(2 * 1024 * 1024 + 5)
        with open(src, "wb") as f:
            f.write(data)
        self.gcloud("cp", src, "gs://bkt/pfx2/by-gcloud.bin")
        dst = os.path.join(self.tmp, "by-mtcfs.bin")
        self.cli("gs://bkt/pfx2", "get", "by-gcloud.bin", dst)
        with open(dst, "rb") as f:
            self.assertEqual(f.read(), data)
        st = self.cli("gs://bkt/pfx2", "stat", "by-gcloud.bin").stdout.decode().split()
        self.assertEqual(st, [str(len(data)), "%08x" % crc32c(data)])

    def test_3_faults_during_upload(self):
        url = "gs://bkt/pfx3"
        self.srv.call("/_reset", {})
        self.srv.call("/_fault", [
            {"match": "upload", "kind": "503", "count": 3},
            {"match": "upload", "method": "PUT", "kind": "reset", "after_bytes": 400000,
             "count": 1},
            {"match": "list", "kind": "429", "count": 1},
        ])
        bk = self.upload(url, "2024-05-05_05-06")
        self.assertTrue(bk[0]["complete"], bk[0]["why"])
        faults = self.srv.call("/_faults")
        self.assertTrue(all(f["count"] == 0 for f in faults), faults)
        log = self.srv.call("/_log")
        queries = [e for e in log if e["class"] == "upload" and
                   e["headers"].get("content-range", "").startswith("bytes */")]
        self.assertEqual(len(queries), 1)
        v = json.loads(self.cli(url, "verify", JOB, "2024-05-05_05-06", "1", "1").stdout)
        self.assertTrue(v[0]["complete"])
        out = os.path.join(self.tmp, "fetched3")
        self.cli(url, "fetch-shard", JOB, "2024-05-05_05-06", "0", "0", out)
        for rel, data in self.files.items():
            with open(os.path.join(out, rel), "rb") as f:
                self.assertEqual(f.read(), data, rel)
        self.assertEqual(os.readlink(os.path.join(out, "link")), "state/big.bin")
        self.assertTrue(os.path.isdir(os.path.join(out, "empty")))

    def test_4_restore_version_and_names(self):
        url = "gs://bkt/pfx4"
        p = self.cli(url, "restore-version", JOB, "show", ok=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"-2 (No such file or directory)", p.stderr)
        self.cli(url, "restore-version", JOB, "set", "2024-05-05_05-05")
        self.assertEqual(self.cli(url, "restore-version", JOB, "show").stdout, b"2024-05-05_05-05\n")
        if GCLOUD:
            self.assertEqual(self.gcloud("cat", "gs://bkt/pfx4/%s/restore.version" % JOB),
                             b"2024-05-05_05-05")
        self.cli(url, "restore-version", JOB, "clear")
        self.assertEqual(self.cli(url, "restore-version", JOB, "show", ok=False).returncode, 1)
        self.assertEqual(self.cli(url, "new-name", JOB, "1714885500").stdout,
                         b"2024-05-05_05-05\n")
        self.cli(url, "putbuf", "%s/2024-05-05_05-05/x" % JOB, "x")
        # the minute is taken: no "-2" name (GKE lists only the bare
        # stamp); the next backup waits for the next minute
        p = self.cli(url, "new-name", JOB, "1714885500", ok=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"-11 (Resource temporarily unavailable)", p.stderr)
        self.assertIn(b"next minute", p.stderr)
        self.assertEqual(self.cli(url, "new-name", JOB, "1714885560").stdout,
                         b"2024-05-05_05-06\n")


if __name__ == "__main__":
    unittest.main(verbosity=2)
