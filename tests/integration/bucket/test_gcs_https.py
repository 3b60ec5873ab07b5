"""The container image's gs:// path over HTTPS (issue 15: "the container
image reaches Cloud Storage over HTTPS"; before, the image had no
ca-certificates and every gs:// request failed with a CA error).

There is no Docker daemon here, so the image's filesystem is reproduced
where it matters: the whole test re-executes itself in a private mount
namespace (unshare -m), and each test bind-mounts over /etc/ssl/certs a
directory holding what Debian's ca-certificates leaves there (the
ca-certificates.crt bundle, the CA's .pem and its hashed link, here with a
test CA made by openssl), or nothing at all (the image without the
package). mtcfs runs for real (FUSE mount, daemon, bucket=gs://...,
gcs_endpoint=https://127.0.0.1:PORT) against the project's Cloud Storage
test server serving HTTPS (--tls-cert/--tls-key); the token comes from a
second test server over plain HTTP, as GKE's metadata server is.

 1. the Debian layout with the test CA: a step's backup goes over HTTPS and
    restores on a wiped node byte for byte; (1b) with 9 MiB files, as
    resumable uploads;
 2. an empty /etc/ssl/certs: the backup fails with one ERROR naming the
    certificate problem and what to do (over several coordinator ticks:
    no ERROR each tick); the committed step stays, byte for byte;
 3. a server certificate not signed by the bundle's CA: the same;
 4. what libcurl in mtcfs reads: the bundle file alone suffices
    (CURLOPT_CAINFO's built-in default /etc/ssl/certs/ca-certificates.crt),
    the hashed links alone (its CA path) do not; SSL_CERT_FILE (a bundle)
    and SSL_CERT_DIR (hashed links) replace the built-in file and path and
    are logged; CURL_CA_BUNDLE (the curl tool's) is not consulted;
 5. packaging/container/Dockerfile's runtime stage installs
    ca-certificates.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \\
     /usr/bin/python3 tests/integration/bucket/test_gcs_https.py [-k NAME]
"""

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

NS_MARK = "MTCFS_TEST_HTTPS_NS"
CERTS = "/etc/ssl/certs"

if __name__ == "__main__" and os.environ.get(NS_MARK) != "1":
    # everything below runs in a private mount namespace: the bind mounts
    # over /etc/ssl/certs (and the FUSE mounts) never reach the host
    os.environ[NS_MARK] = "1"
    os.execv("/usr/bin/unshare", ["unshare", "--mount", "--propagation", "private",
                                  sys.executable, os.path.abspath(__file__)] + sys.argv[1:])

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from gcs import GcsServer  # noqa: E402
from harness import Daemon, wait_until  # noqa: E402
from cluster import shard_files  # noqa: E402
from test_backup_restore import (  # noqa: E402
    start_job, save_step, verify_restore, read_text, NAME_RE, SIZE, GCS_RETRY,
    TEST_MINUTE_SECS)

REPO = os.path.dirname(os.path.dirname(INTEG))
DOCKERFILE = os.path.join(REPO, "packaging", "container", "Dockerfile")
BUCKET = "mtcfs-tls"
JOB = "tls"
CERT_ERR = r"SSL certificate problem|certificate verify failed|CA cert|certificate file"
# what the ERROR adds, so that whoever reads the log knows what to do
NO_CA = (r"error setting certificate file: /etc/ssl/certs/ca-certificates\.crt "
         r"\(no CA certificates to verify https://127\.0\.0\.1:\d+ with: install "
         r"ca-certificates, or name a PEM bundle in SSL_CERT_FILE\)")
UNTRUSTED = (r"SSL certificate problem: unable to get local issuer certificate "
             r"\(verified with CA file /etc/ssl/certs/ca-certificates\.crt, "
             r"CA path /etc/ssl/certs\)")


def run(*argv):
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)


def make_ca(d, name):
    key, crt = os.path.join(d, name + ".key"), os.path.join(d, name + ".pem")
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", key, "-out", crt, "-subj", "/CN=mtcfs test CA " + name,
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return key, crt


def make_server_cert(d, ca_key, ca_crt, name):
    key, csr, crt = (os.path.join(d, name + x) for x in (".key", ".csr", ".pem"))
    ext = os.path.join(d, name + ".ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                "extendedKeyUsage=serverAuth\n")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
        "-subj", "/CN=127.0.0.1")
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key,
        "-CAcreateserial", "-days", "2", "-out", crt, "-extfile", ext)
    return key, crt


def debian_certs_dir(d, ca_crt, bundle=True, hashes=True):
    """What update-ca-certificates leaves in /etc/ssl/certs: NAME.pem, its
    subject-hash link HASH.0 and the concatenated ca-certificates.crt."""
    os.makedirs(d)
    if hashes:
        shutil.copy(ca_crt, os.path.join(d, "mtcfs-test-ca.pem"))
        run("openssl", "rehash", d)
        assert any(re.match(r"^[0-9a-f]{8}\.0$", x) for x in os.listdir(d)), os.listdir(d)
    if bundle:
        shutil.copy(ca_crt, os.path.join(d, "ca-certificates.crt"))
    return d


# gcs_server.py on a loopback port (HTTPS with cert/key): the suite's launcher
Server = GcsServer


class HttpsBase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mtcfs-https-", dir="/tmp")
        cls.ca_key, cls.ca = make_ca(cls.tmp, "ca")
        cls.other_key, cls.other_ca = make_ca(cls.tmp, "other")
        cls.key, cls.crt = make_server_cert(cls.tmp, cls.ca_key, cls.ca, "srv")
        cls.meta = Server()               # the metadata server: plain HTTP

    @classmethod
    def tearDownClass(cls):
        cls.meta.stop()
        shutil.rmtree(cls.tmp, True)

    def setUp(self):
        self.n = getattr(self, "n", 0)

    def bind_certs(self, src):
        """src over /etc/ssl/certs, in this namespace, until the test ends."""
        run("mount", "--bind", src, CERTS)
        self.addCleanup(run, "umount", CERTS)

    def certs(self, name, **kw):
        return debian_certs_dir(os.path.join(self.tmp, self._testMethodName + "-" + name),
                                self.ca, **kw)

    def server(self, cert=None, key=None):
        srv = Server(cert or self.crt, key or self.key)
        self.addCleanup(srv.stop)
        return srv

    def node(self, srv, expect=None, env=None):
        d = Daemon(opts="ram_size=256M,bucket=gs://%s/%s,gcs_endpoint=%s"
                   % (BUCKET, self._testMethodName, srv.base), extra_args=["-d"],
                   name="tls")
        for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS",
                  "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE"):
            d.env.pop(k, None)
        d.env["GCE_METADATA_HOST"] = self.meta.host
        d.env["MTCFS_GCS_RETRY"] = GCS_RETRY
        d.env["MTCFS_TEST_MINUTE_SECS"] = TEST_MINUTE_SECS
        d.env.update(env or {})
        if expect:
            d.expect_log(expect)
        self.addCleanup(d.close)
        return d

    YAML = ("job-name: %s\nframework: orbax\nnode-rank: 0\nnodes: 1\n"
            "backup-interval-steps: 1\n" % JOB)

    def wait_backup(self, d, step):
        rx = re.compile(r"backup job=%s name=(%s) step=%d complete" % (JOB, NAME_RE, step))

        def done():
            d.check_alive()
            m = rx.search(d.log_text())
            return m.group(1) if m else None
        return wait_until(done, 60, "backup of step %d complete" % step)

    def backup_restores(self, srv, env=None, size=SIZE):
        """Step 5 is backed up over HTTPS; a wiped node restores it exactly."""
        d = self.node(srv, env=env)
        d.srv_host = srv.host
        d.start()
        self.assertEqual(start_job(d.mnt, self.YAML), 0)
        save_step(d.mnt, JOB, 5, 0, size=size)
        name = self.wait_backup(d, 5)
        d.kill9()
        d.wipe_ramdir()
        d.start()
        self.assertEqual(start_job(d.mnt, self.YAML), 5)
        self.assertEqual(read_text(os.path.join(d.mnt, "replicator.prerestore")),
                         "restore-backup: %s\nrestore-step: 5\n" % name)
        verify_restore(d.mnt, JOB, 5, 0, size=size)
        d.stop()
        return d

    def backup_fails(self, srv, want, env=None):
        """The backup of step 5 fails with one ERROR naming the certificate
        problem; step 5 stays committed, byte for byte; nothing was
        uploaded."""
        d = self.node(srv, expect=CERT_ERR, env=env)
        d.start()
        self.assertEqual(start_job(d.mnt, self.YAML), 0)
        save_step(d.mnt, JOB, 5, 0)
        rx = re.compile(r"^.*ERROR.*$", re.M)

        def failed():
            d.check_alive()
            return rx.findall(d.log_text()) or None
        errs = wait_until(failed, 60, "an ERROR for the failed backup")
        wait_until(lambda: "abandoned" in d.log_text() or "failed" in d.log_text(), 30,
                   "the backup given up")
        # a window of several coordinator ticks (a test minute is 1 s):
        # the refused backup is not retried with an ERROR each tick
        end = time.monotonic() + 4
        while time.monotonic() < end:
            errs = rx.findall(d.log_text())
            self.assertEqual(len(errs), 1, "one ERROR per failure: %s" % errs)
            time.sleep(0.1)
        self.assertRegex(errs[0], CERT_ERR)
        self.assertRegex(errs[0], want)
        self.assertIn(srv.host, errs[0], "the ERROR names the endpoint")
        self.assertNotRegex(d.log_text(), r"backup job=%s name=\S+ step=5 complete" % JOB)
        for rel, data in shard_files(JOB, 5, 0, SIZE).items():
            with open(os.path.join(d.mnt, "5", rel), "rb") as f:
                self.assertEqual(f.read(), data, "step 5 %s after the failed backup" % rel)
        ls = harness.admin_ls(d.ramdir)
        shard = harness.find_shard(ls, 5, job=JOB)
        self.assertIsNotNone(shard, ls)
        self.assertIn(shard.get("state"), harness.COMMITTED_STATES, shard)
        d.stop()
        return errs[0]


class HttpsTest(HttpsBase):
    def test_1_debian_layout_backup_restore(self):
        self.bind_certs(self.certs("debian"))
        self.backup_restores(self.server())

    def test_1b_resumable_uploads(self):
        """9 MiB files go as resumable uploads: the session URL the server
        hands out is https:// too, and every chunk goes over it."""
        self.bind_certs(self.certs("debian"))
        srv = self.server()
        self.backup_restores(srv, size=9 << 20)
        ctx = ssl.create_default_context(cafile=self.ca)
        with urllib.request.urlopen(srv.base + "/_log", timeout=30, context=ctx) as r:
            log = json.loads(r.read())
        puts = [e for e in log if e["method"] == "PUT" and e["class"] == "upload"]
        self.assertTrue(puts, "no resumable chunk PUT in the server's log")
        self.assertTrue(all(e["status"] in (200, 201) for e in puts if
                            e["query"].get("upload_id")), puts[:5])

    def test_2_no_ca_certificates(self):
        self.empty_certs()
        self.assertEqual(os.listdir(CERTS), [])
        self.backup_fails(self.server(), NO_CA)

    def test_3_server_cert_not_from_bundle_ca(self):
        self.bind_certs(self.certs("debian"))
        key, crt = make_server_cert(self.tmp, self.other_key, self.other_ca, "rogue")
        self.backup_fails(self.server(crt, key), UNTRUSTED)

    def test_4a_bundle_file_alone(self):
        self.bind_certs(self.certs("bundle", hashes=False))
        self.backup_restores(self.server())

    def empty_certs(self):
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty, exist_ok=True)
        self.bind_certs(empty)

    def test_4e_hashed_links_alone(self):
        """libcurl's built-in CA file must exist: the hashed links of
        /etc/ssl/certs (its CA path) without ca-certificates.crt do not
        suffice (curl 7.88 fails on the missing file first)."""
        self.bind_certs(self.certs("hashes", bundle=False))
        self.backup_fails(self.server(), NO_CA)

    def test_4b_ssl_cert_file(self):
        """SSL_CERT_FILE names the CA bundle (as OpenSSL and Go, hence
        gcsfuse, read it): a private endpoint's CA without touching
        /etc/ssl/certs."""
        self.empty_certs()
        d = self.backup_restores(self.server(), env={"SSL_CERT_FILE": self.ca})
        self.assertRegex(d.log_text(), r"endpoint https://%s, CA file %s \(SSL_CERT_FILE\)"
                         % (re.escape(d.srv_host), re.escape(self.ca)))

    def test_4c_ssl_cert_dir(self):
        """SSL_CERT_DIR names a hashed-links directory (openssl rehash)."""
        self.empty_certs()
        self.backup_restores(self.server(), env={
            "SSL_CERT_DIR": self.certs("dir", bundle=False)})

    def test_4d_curl_ca_bundle_not_consulted(self):
        """CURL_CA_BUNDLE is the curl tool's variable, not libcurl's: with
        it alone the backup fails as without CA certificates."""
        self.empty_certs()
        self.backup_fails(self.server(), NO_CA, env={"CURL_CA_BUNDLE": self.ca})


class DockerfileTest(unittest.TestCase):
    def test_5_runtime_stage_installs_ca_certificates(self):
        with open(DOCKERFILE) as f:
            text = f.read().replace("\\\n", " ")
        stages = re.split(r"(?im)^FROM\s+", text)[1:]
        self.assertGreaterEqual(len(stages), 1, "no FROM in the Dockerfile")
        runtime = stages[-1]            # the last stage is the image
        installs = [ln for ln in runtime.splitlines()
                    if re.search(r"\bapt-get\b.*\binstall\b", ln)]
        self.assertTrue(installs, "the runtime stage has no apt-get install")
        pkgs = set()
        for ln in installs:
            seg = re.split(r"\binstall\b", ln, 1)[1]
            seg = re.split(r"&&|;|\|\|", seg)[0]
            pkgs |= {w for w in seg.split() if not w.startswith("-")}
        self.assertIn("ca-certificates", pkgs, "runtime stage installs: %s" % sorted(pkgs))


if __name__ == "__main__":
    harness.main()
