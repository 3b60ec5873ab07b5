"""Mutual TLS for peer traffic (tls_cert=, tls_key=, tls_ca=; net/tls.c).

Policy under test: TLS 1.3 only, both ends present a certificate, each
verifies the other's chain against tls_ca, host names are not checked. TLS
alone or together with secret_file (then the HMAC handshake runs inside
TLS). The certificates are made here with the openssl CLI: a cluster CA
(EC P-256, CA:true), one leaf per node signed by it (digitalSignature,
serverAuth+clientAuth, SAN IP:127.0.0.1), an unrelated "rogue" CA with a
node certificate of its own, and an expired leaf signed by the cluster CA
(`openssl ca -startdate/-enddate`, both in 2020).

- TLS only, 3 nodes: save, replicate, kill -9 + wipe a node, job restart:
  the wiped node restores from its peer byte for byte; every log says peer
  traffic runs over mutual TLS; a plain-TCP client sending a plaintext
  frame never sees a CHALLENGE in cleartext (nothing, or a TLS alert
  record), a silent plain-TCP client is dropped at the handshake timeout
  without a byte (so is a TLS client silent after the CHALLENGE); a Python
  TLS 1.3 client with a cluster certificate gets the CHALLENGE inside TLS
  and fetches a replica byte for byte;
  `mtcfs-admin status --json` reaches the coordinator (with the node's TLS
  files) and `mtcfs-admin steps` shows every node's holdings;
- TLS + secret, 2 nodes, 16 MiB shards (many TLS records): the same
  cycle; node 1's certificate names another host (host names are not
  checked); inside TLS the HMAC is still required (a client with a cluster
  certificate and the wrong secret gets EACCES);
- Python clients the policy refuses: no certificate, a rogue-CA
  certificate, an expired certificate, TLS 1.2 only: no CHALLENGE, the
  node logs "TLS handshake failed" and keeps serving;
- a node with a rogue-CA certificate, and a node without any tls_*, in a
  cluster with a TLS node (rank 0, the coordinator): the other node's
  restore cannot reach the coordinator, node 0 plans without it after
  restore_timeout, no replica crosses in either direction, node 0 logs
  "TLS handshake failed" and keeps serving (its mount, mtcfs-admin status);
- bad configuration fails the mount with a message naming the option or
  file: only some of the three, a key that does not match the certificate,
  a non-PEM CA or certificate, a missing file, TLS without listen=.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \\
     /usr/bin/python3 tests/integration/security/test_tls.py [-k NAME]
"""

import base64
import errno
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from harness import wait_until, admin_ls  # noqa: E402
from cluster import Cluster, free_ports, shard_files  # noqa: E402
import test_peer_security as ps  # noqa: E402

KiB = 1024
SIZE = 64 * KiB
BIG = 16 << 20         # many TLS records: partial writes, EAGAIN both ways
OPENSSL = shutil.which("openssl")
MAGIC_BYTES = ps.MAGIC.to_bytes(4, "little")       # b"MTCP"
TLS_ALERT = 0x15                                   # TLS record type "alert"
HS_FAILED = r"TLS handshake failed"


# --- certificates -------------------------------------------------------------

LEAF_EXT = ("basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            "subjectAltName=IP:127.0.0.1\n")

CA_CNF = """[ca]
default_ca = cadef
[cadef]
database = %(dir)s/index.txt
new_certs_dir = %(dir)s
serial = %(dir)s/serial
default_md = sha256
policy = pol
copy_extensions = none
unique_subject = no
[pol]
commonName = supplied
[leaf]
""" + LEAF_EXT



def wait_listening(addr, timeout=30):
    """The mount appears before the peer endpoint listens: wait (deadline)
    until addr accepts a TCP connection."""
    host, port = addr.rsplit(":", 1)

    def up():
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return True
        except OSError:
            return False
    wait_until(up, timeout, "%s listening" % addr)

class PKI:
    """The certificates of one test run, in a private directory."""

    def __init__(self, nnodes=3):
        self.dir = tempfile.mkdtemp(prefix="mtcfs-tls-pki-")
        try:
            self._make(nnodes)
        except Exception:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def p(self, name):
        return os.path.join(self.dir, name)

    def ossl(self, *args):
        r = subprocess.run([OPENSSL] + list(args), cwd=self.dir,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        if r.returncode != 0:
            raise AssertionError("openssl %s failed (rc=%d): %s" % (
                " ".join(args), r.returncode,
                r.stdout.decode(errors="replace")))
        return r.stdout.decode(errors="replace")

    def key(self, name):
        self.ossl("genpkey", "-algorithm", "EC", "-pkeyopt",
                  "ec_paramgen_curve:P-256", "-out", self.p(name + ".key"))
        os.chmod(self.p(name + ".key"), 0o600)
        return self.p(name + ".key")

    def ca(self, name, cn):
        self.key(name)
        self.ossl("req", "-x509", "-new", "-key", self.p(name + ".key"),
                  "-subj", "/CN=" + cn, "-days", "30",
                  "-addext", "basicConstraints=critical,CA:true",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                  "-out", self.p(name + ".pem"))

    def csr(self, name, cn):
        self.key(name)
        self.ossl("req", "-new", "-key", self.p(name + ".key"), "-subj",
                  "/CN=" + cn, "-out", self.p(name + ".csr"))

    def leaf(self, name, cn, ca, serial, san="IP:127.0.0.1"):
        self.csr(name, cn)
        ext = self.p(name + ".ext")
        with open(ext, "w") as f:
            f.write(LEAF_EXT.replace("IP:127.0.0.1", san))
        self.ossl("x509", "-req", "-in", self.p(name + ".csr"),
                  "-CA", self.p(ca + ".pem"), "-CAkey", self.p(ca + ".key"),
                  "-set_serial", str(serial), "-days", "30",
                  "-extfile", ext, "-out", self.p(name + ".pem"))

    def _make(self, nnodes):
        self.ca("ca", "mtcfs-test-cluster-ca")
        self.ca("rogue-ca", "mtcfs-test-rogue-ca")
        for i in range(nnodes):
            self.leaf("node%d" % i, "node%d" % i, "ca", 100 + i)
        # host names are not checked: a member whose names are elsewhere
        self.leaf("elsewhere", "node-elsewhere.invalid", "ca", 150,
                  san="DNS:node-elsewhere.invalid,IP:192.0.2.7")
        self.leaf("rogue", "node1", "rogue-ca", 200)
        # expired, signed by the cluster CA: openssl ca takes explicit dates
        with open(self.p("index.txt"), "w"):
            pass
        with open(self.p("serial"), "w") as f:
            f.write("0300\n")
        with open(self.p("ca.cnf"), "w") as f:
            f.write(CA_CNF % {"dir": self.dir})
        self.csr("expired", "node-expired")
        self.ossl("ca", "-batch", "-config", self.p("ca.cnf"),
                  "-cert", self.p("ca.pem"), "-keyfile", self.p("ca.key"),
                  "-in", self.p("expired.csr"), "-out", self.p("expired.pem"),
                  "-extensions", "leaf", "-notext",
                  "-startdate", "20200101000000Z",
                  "-enddate", "20200102000000Z")
        with open(self.p("notpem.pem"), "w") as f:
            f.write("this is not a PEM file\n")
        # sanity: the chain is what the tests assume
        self.ossl("verify", "-CAfile", self.p("ca.pem"), self.p("node0.pem"))
        out = subprocess.run([OPENSSL, "verify", "-CAfile", self.p("ca.pem"),
                              self.p("rogue.pem")], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        assert out.returncode != 0, "the rogue cert verifies against the CA"
        out = subprocess.run([OPENSSL, "verify", "-CAfile", self.p("ca.pem"),
                              self.p("expired.pem")], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        assert out.returncode != 0 and b"expired" in out.stdout, out.stdout

    def opts(self, name, ca="ca"):
        """tls_* mount options for the leaf name (cert name.pem, key
        name.key) and trust anchor ca.pem."""
        return "tls_cert=%s,tls_key=%s,tls_ca=%s" % (
            self.p(name + ".pem"), self.p(name + ".key"), self.p(ca + ".pem"))


# --- a Python TLS peer -----------------------------------------------------------

def client_ctx(pki, name=None, max_version=None):
    """A TLS client context trusting the cluster CA; with name, presenting
    that leaf (name.pem / name.key)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(pki.p("ca.pem"))
    if name:
        ctx.load_cert_chain(pki.p(name + ".pem"), pki.p(name + ".key"))
    if max_version is not None:
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = max_version
    return ctx


class TLSWire(ps.Wire):
    """ps.Wire over TLS: the same frame I/O, through an SSL socket."""

    def __init__(self, addr, ctx, timeout=10.0):
        super().__init__(addr, timeout)
        self.raw = self.sock
        try:
            self.sock = ctx.wrap_socket(self.raw, server_hostname=None)
        except BaseException:
            self.raw.close()
            raise
        self.sock.settimeout(timeout)

    def close(self):
        super().close()
        try:
            self.raw.close()
        except OSError:
            pass


def fetch_over(w, job, step, owner):
    """fetch on an authenticated wire w: {path: bytes}."""
    w.send(ps.frame(ps.NT_REQ, {"op": "fetch", "job": job, "step": step,
                                "owner": owner, "worker": 0}, req_id=3))
    ftype, rid, r = w.recv_json()
    assert ftype == ps.NT_RESP and rid == 3, (ftype, rid, r)
    mf = base64.b64decode(r["manifest"])
    nfiles = sum(1 for e in ps.parse_manifest(mf) if e[0] == ps.MF_FILE)
    files = {}
    for _ in range(nfiles):
        ftype, _, p = w.recv_frame()
        assert ftype == ps.NT_FILE, ftype
        h = json.loads(p)
        files[h["path"]] = w.recv_exact(h["size"])
    return files


def refused_at_tls(addr, ctx):
    """Connect with ctx; return a description of how the node refused.
    Fails if a CHALLENGE (or any protocol byte) arrives."""
    try:
        w = TLSWire(addr, ctx, timeout=10)
    except (ssl.SSLError, ConnectionError) as e:
        return "handshake: %s" % e
    try:
        w.sock.settimeout(10)
        try:
            b = w.sock.recv(64)
        except (ssl.SSLError, ConnectionError) as e:
            return "first read: %s" % e
        except socket.timeout:
            raise AssertionError("%s: the node neither refused nor answered"
                                 % addr)
        if b:
            raise AssertionError("%s: refused peer got protocol bytes %r"
                                 % (addr, b[:32]))
        return "closed"
    finally:
        w.close()


def plain_probe(addr, data, timeout=10.0):
    """Plain TCP: send data (a cleartext mtcfs frame), read until the node
    closes. Returns (closed, bytes received)."""
    with ps.Wire(addr) as w:
        try:
            w.send(data)
        except ps.Closed:
            pass
        closed = w.wait_closed(timeout)
        return closed, w.leftover


# --- the tests ------------------------------------------------------------------

def markers(mnt):
    return sorted(x for x in os.listdir(mnt) if x.endswith(".restore"))


class TLSCase(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        if not OPENSSL:
            raise unittest.SkipTest("openssl CLI not installed")
        cls.pki = PKI(3)
        if not harness.KEEP_TMP:
            cls.addClassCleanup(shutil.rmtree, cls.pki.dir,
                                ignore_errors=True)

    # -- helpers --

    def cluster(self, n, tls=None, secret=False, restore_timeout=15,
                start=True):
        """n nodes; tls[i]: tls_* options of node i ("" for none); default
        every node its cluster certificate."""
        c = Cluster(n, ram_size="256M", secret=secret,
                    restore_timeout=restore_timeout)
        self.addCleanup(c.close)
        tls = [self.pki.opts("node%d" % i) for i in range(n)] \
            if tls is None else tls
        for i, d in enumerate(c.nodes):
            if tls[i]:
                d.opts += "," + tls[i]
            d.extra_args.append("-d")        # INFO lines: the TLS evidence
        self.daemons = list(c.nodes)
        self.c = c
        if start:
            c.start()
            for a in c.addrs:
                wait_listening(a)
        return c

    def holdings(self, r, job):
        """{(owner, step)} node r lists for job."""
        return {(s["rank"], s["step"])
                for s in admin_ls(self.c.nodes[r].ramdir)["shards"]
                if s["job"] == job}

    def save_replicate_wipe_restore(self, job, victim, src, size=SIZE):
        c = self.c
        self.assertEqual(c.job_start(job), {r: 0 for r in range(c.n)},
                         "fresh job start")
        c.save(job, 10, size=size)
        c.wait_replicated(job, 10, timeout=30)
        c.nodes[victim].kill9()
        c.nodes[victim].wipe_ramdir()
        c.nodes[victim].start()
        self.assertEqual(admin_ls(c.nodes[victim].ramdir)["shards"], [])
        self.assertEqual(c.job_start(job), {r: 10 for r in range(c.n)},
                         "restored step per node after the wipe")
        for r in range(c.n):
            c.restore_and_verify(job, r, 10, size=size)
        log = c.nodes[victim].log_text()
        m = re.search(r"restored job=%s step=10 from rank (\d+)" % job, log)
        self.assertTrue(m, "node %d: no 'restored job=%s step=10 from rank' "
                        "line" % (victim, job))
        self.assertEqual(int(m.group(1)), src,
                         "node %d restored from the wrong rank" % victim)

    def assert_tls_logged(self, with_secret):
        for d in self.c.nodes:
            log = d.log_text()
            m = re.search(r"peer traffic runs over mutual TLS.*", log)
            self.assertTrue(m, "%s: no 'peer traffic runs over mutual TLS' "
                            "line" % d.name)
            self.assertEqual("proves the shared secret" in m.group(0),
                             with_secret, m.group(0))
            self.assertNotRegex(log, r"not authenticated")

    def assert_no_cleartext(self, addr):
        """A plaintext HELLO frame sent over plain TCP: the node answers
        nothing in cleartext (no CHALLENGE), at most a TLS alert, and
        closes."""
        hello = ps.frame(ps.NT_HELLO, {"rank": 0, "purpose": "data",
                                       "nonce": "00" * 32, "mac": "00" * 32})
        closed, got = plain_probe(addr, hello)
        self.assertTrue(closed, "%s: plaintext frame not dropped" % addr)
        self.assertNotIn(MAGIC_BYTES, got,
                         "%s: cleartext mtcfs frame on a TLS port: %r"
                         % (addr, got[:64]))
        self.assertTrue(got == b"" or got[0] == TLS_ALERT,
                        "%s: a plain client got %r (want nothing or a TLS "
                        "alert record)" % (addr, got[:64]))

    def still_serves(self, r):
        """Node r is alive, its mount works, mtcfs-admin status (with the
        node's own TLS files) reaches the coordinator when r is rank 0."""
        d = self.c.nodes[r]
        d.check_alive()
        p = os.path.join(d.mnt, "probe-%d" % os.getpid())
        harness.write_file(p, b"still here")
        self.assertEqual(harness.read_file(p), b"still here")
        os.unlink(p)
        st = json.loads(harness.admin("status", d.ramdir, "--json"))
        self.assertTrue(st["daemon_running"], st)
        self.assertTrue(st["coordinator_reachable"],
                        "node %d: status cannot reach the coordinator: %s"
                        % (r, st))

    # -- 1: TLS only, 3 nodes ------------------------------------------------------

    def test_1_tls_only_three_nodes_replicate_and_restore(self):
        job = "tls3"
        c = self.cluster(3)
        addr1 = c.addrs[1]
        # a plain client that says nothing: never gets a byte, dropped at
        # the handshake timeout (checked at the end, it runs meanwhile)
        silent = ps.Wire(addr1)
        self.addCleanup(silent.close)
        t_silent = time.monotonic()
        # a TLS client that reads the CHALLENGE and stays silent: the same
        silent_tls = TLSWire(addr1, client_ctx(self.pki, "node0"))
        self.addCleanup(silent_tls.close)
        silent_tls.challenge()
        self.assert_tls_logged(with_secret=False)
        self.assert_no_cleartext(addr1)
        self.assert_no_cleartext(c.addrs[0])          # the coordinator too

        self.assertEqual(c.job_start(job), {0: 0, 1: 0, 2: 0})
        c.save(job, 10, size=SIZE)
        c.wait_replicated(job, 10, timeout=30)

        # a TLS client with a cluster certificate: CHALLENGE inside TLS,
        # the (secretless) handshake, a fetch of node 0's replica on node 1
        with TLSWire(addr1, client_ctx(self.pki, "node2")) as w:
            self.assertEqual(w.sock.version(), "TLSv1.3")
            w.handshake(None, rank=-1, purpose="data", server_rank=1)
            got = fetch_over(w, job, 10, 0)
        want = shard_files(job, 10, 0, SIZE)
        want["commit_success.txt"] = b"ok\n"
        self.assertEqual(got, want, "fetch over TLS")

        # 6: mtcfs-admin on a TLS node talks TLS itself
        r1 = c.nodes[1].ramdir
        st = json.loads(harness.admin("status", r1, "--json"))
        self.assertTrue(st["coordinator_reachable"], st)
        self.assertEqual([p["connected"] for p in st["peers"]],
                         [True, True, True], st)
        self.assertEqual((st["job"], st["rank"], st["nodes"]), (job, 1, 3))
        s = json.loads(harness.admin("steps", r1, "--json"))
        self.assertTrue(s["coordinator_reachable"], s)
        row = [x for x in s["steps"] if x["step"] == 10]
        self.assertEqual(len(row), 1, s)
        # k=1, 3 nodes: 0 <-> 1, and 2's replica on (2 XOR 1) mod 3 = 0,
        # as GKE's replicator places it
        self.assertEqual({k: sorted(v) for k, v in row[0]["holders"].items()},
                         {"0": [0, 1], "1": [0, 1], "2": [0, 2]}, s)
        self.assertTrue(row[0]["complete"], s)
        # the human table: one cell per node, the ranks holding its shard
        self.assertRegex(harness.admin("steps", r1),
                         r"(?m)^10\s+[01],[01]\s+[01],[01]\s+[02],[02]\s+"
                         r"complete\s+<- LKG")

        # lose node 2: it restores from node 0, its only replica holder
        c.nodes[2].kill9()
        c.nodes[2].wipe_ramdir()
        c.nodes[2].start()
        self.assertEqual(admin_ls(c.nodes[2].ramdir)["shards"], [])
        self.assertEqual(c.job_start(job), {0: 10, 1: 10, 2: 10})
        for r in range(3):
            c.restore_and_verify(job, r, 10, size=SIZE)
        m = re.search(r"restored job=%s step=10 from rank (\d+)" % job,
                      c.nodes[2].log_text())
        self.assertTrue(m, "node 2: no 'restored ... from rank' line")
        self.assertEqual(int(m.group(1)), 0)
        # among the nodes every handshake succeeded (the refusals logged
        # are those of the plain probes above, server side)
        for d in c.nodes:
            log = d.log_text()
            self.assertNotRegex(log, r"WARN net: [0-9.]+:\d+: TLS handshake",
                                "%s: a node-to-node TLS handshake failed"
                                % d.name)
            self.assertNotRegex(log, r"replicating .* failed", d.name)

        self.assertTrue(silent.wait_closed(15), "a silent plain-TCP client "
                        "kept open past the handshake timeout")
        self.assertEqual(silent.leftover, b"",
                         "a silent plain-TCP client got bytes")
        self.assertGreaterEqual(time.monotonic() - t_silent, 3.0)
        try:
            closed = silent_tls.wait_closed(10)
        except ssl.SSLError:
            closed = True                  # closed without close_notify
        self.assertTrue(closed, "a silent TLS client kept open past the "
                        "handshake timeout")
        self.assertEqual(silent_tls.leftover, b"")
        self.assertRegex(c.nodes[1].log_text(), r"handshake timeout")

    # -- 2: TLS + secret -------------------------------------------------------------

    def test_2_tls_and_secret_two_nodes(self):
        job = "tlssec"
        # node 1's certificate names another host (DNS and IP): members
        # are who the CA signed, whatever their names
        c = self.cluster(2, secret=True, tls=[self.pki.opts("node0"),
                                              self.pki.opts("elsewhere")])
        self.assert_tls_logged(with_secret=True)
        self.assert_no_cleartext(c.addrs[1])
        secret = ps.read_secret(c.secret)
        # inside TLS the secret is still required
        with TLSWire(c.addrs[1], client_ctx(self.pki, "node0")) as w:
            with self.assertRaises(ps.Refused) as cm:
                w.handshake(b"not-the-secret-of-this-cluster", rank=0)
            self.assertEqual(cm.exception.errno, errno.EACCES)
        with TLSWire(c.addrs[1], client_ctx(self.pki, "node0")) as w:
            wel = w.handshake(secret, rank=-1, purpose="control",
                              server_rank=1)
            self.assertEqual(wel["rank"], 1)
        self.save_replicate_wipe_restore(job, victim=1, src=0, size=BIG)
        st = json.loads(harness.admin("status", c.nodes[1].ramdir, "--json"))
        self.assertTrue(st["coordinator_reachable"], st)

    # -- Python clients the policy refuses ---------------------------------------

    def test_3a_refused_clients(self):
        """No certificate, a rogue-CA one, an expired one, TLS 1.2: none
        gets a protocol byte; the node logs why and keeps serving."""
        c = self.cluster(2)
        addr = c.addrs[1]
        node = c.nodes[1]
        cases = [
            ("no client certificate", client_ctx(self.pki),
             r"TLS handshake failed.*(did not return a certificate|"
             r"certificate required)"),
            ("rogue CA", client_ctx(self.pki, "rogue"),
             r"TLS handshake failed.*(certificate|unknown ca|verify)"),
            ("expired", client_ctx(self.pki, "expired"),
             r"TLS handshake failed.*expired"),
            ("TLS 1.2 only", client_ctx(self.pki, "node0",
                                        ssl.TLSVersion.TLSv1_2),
             r"TLS handshake failed.*(unsupported protocol|version)"),
        ]
        for what, ctx, logged in cases:
            before = len(node.log_text())
            how = refused_at_tls(addr, ctx)
            wait_until(lambda: re.search(logged, node.log_text()[before:]),
                       10, "node 1 logs the refusal of %s (client saw: %s)"
                       % (what, how))
        # a good client right after: served
        with TLSWire(addr, client_ctx(self.pki, "node0")) as w:
            w.handshake(None, rank=-1, purpose="control", server_rank=1)
        self.still_serves(0)
        node.check_alive()

    # -- 3: a node with a rogue certificate ---------------------------------------

    def test_3b_rogue_node_cannot_join(self):
        self.cluster(2, restore_timeout=3,
                     tls=[self.pki.opts("node0"), self.pki.opts("rogue")])
        self.cut_off("rogue", bad=1, bad_err=r"Permission denied")
        # node 0 refused node 1's certificate (server side) and node 1's
        # certificate failed node 0's verification (client side)
        log0 = self.c.nodes[0].log_text()
        self.assertRegex(log0, r"closing unauthenticated connection: "
                         r"TLS handshake failed")
        self.assertRegex(log0, r"%s: TLS handshake failed.*(verify|unknown"
                         r" ca|issuer)" % re.escape(self.c.addrs[1]))

    # -- 4: a node without TLS --------------------------------------------------------

    def test_4_plain_node_cannot_talk_to_tls_nodes(self):
        c = self.cluster(2, restore_timeout=3,
                         tls=[self.pki.opts("node0"), ""])
        # the plain node's port really is plain: a CHALLENGE in cleartext
        with ps.Wire(c.addrs[1]) as w:
            w.challenge()
        self.cut_off("plain", bad=1, bad_err=r".")
        self.assertRegex(c.nodes[0].log_text(), r"%s: TLS handshake failed"
                         % re.escape(c.addrs[1]))

    def cut_off(self, job, bad, bad_err):
        """Node bad cannot join node 0 (TLS, rank 0, the coordinator): its
        restore cannot reach the coordinator (bad_err), node 0 plans
        without it after restore_timeout, the step each of them saves is
        never replicated to the other, node 0 logs "TLS handshake failed"
        and keeps serving."""
        c = self.c
        good = 0
        nb = c.nodes[bad]
        for d in (nb, c.nodes[good]):
            d.expect_log(r"ERROR engine: job %s step 10: could not be "
                         r"replicated" % job)
        nb.expect_log(r"ERROR engine: restore: the coordinator at .* did not "
                      r"answer")
        nb.expect_log(r"ERROR ctl: replicator.yaml rejected: restore failed")
        yaml = os.path.join(nb.mnt, "replicator.yaml")
        with open(yaml + ".tmp", "w") as f:
            f.write(c.yaml(job, bad))
        os.rename(yaml + ".tmp", yaml)
        got = c.job_start(job, ranks=[good], timeout=30)
        self.assertEqual(got, {good: 0})
        self.assertRegex(c.nodes[good].log_text(),
                         r"did not report within restore_timeout")
        pat = r"restore: the coordinator at %s did not answer: %s" % (
            re.escape(c.addrs[good]), bad_err)
        wait_until(lambda: re.search(pat, nb.log_text()), 30,
                   "node %d: restore cannot reach the coordinator" % bad)
        self.assertEqual(markers(nb.mnt), [],
                         "node %d got restore markers" % bad)
        # both save step 10; neither shard crosses
        c.save(job, 10, ranks=[good, bad], size=SIZE)
        for r in (good, bad):
            harness.wait_committed(c.nodes[r].ramdir, 10, job=job, rank=r,
                                   daemon=c.nodes[r])
        for src, dst in ((good, bad), (bad, good)):
            pat = r"replicating job=%s step=10 to rank %d failed" % (job, dst)
            wait_until(lambda: re.search(pat, c.nodes[src].log_text()), 30,
                       "node %d reports the failed replication to node %d"
                       % (src, dst))
        self.assertRegex(c.nodes[good].log_text(), HS_FAILED)
        self.assertEqual(self.holdings(bad, job), {(bad, 10)},
                         "node %d got node 0's replica" % bad)
        self.assertEqual(self.holdings(good, job), {(good, 10)},
                         "node 0 got node %d's replica" % bad)
        self.still_serves(good)
        # node bad would retry its restore for a while: not worth waiting
        nb.kill9()

    # -- 5: bad configuration -----------------------------------------------------------

    def mount_fails(self, tls_opts, listen=True):
        """mtcfs with these tls options: must exit non-zero without
        mounting. Returns its stderr."""
        opts = "ram_size=64M"
        if listen:
            opts += ",listen=127.0.0.1:%d" % free_ports(1)[0]
        d = harness.Daemon(opts=opts + "," + tls_opts, name="badtls")
        self.addCleanup(d.close)
        try:
            r = subprocess.run(d.argv(), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=20)
        except subprocess.TimeoutExpired:
            harness.force_unmount(d.mnt)
            self.fail("mtcfs -o %s did not exit (mounted?)" % tls_opts)
        self.assertIsNone(harness.mount_fstype(d.mnt),
                          "mounted with -o %s" % tls_opts)
        err = r.stderr.decode(errors="replace")
        self.assertNotEqual(r.returncode, 0, "-o %s: exit 0; stderr: %s"
                            % (tls_opts, err))
        self.assertNotRegex(err, r"AddressSanitizer|LeakSanitizer|"
                            r"runtime error:")
        return err

    def test_5_bad_configuration_fails_the_mount(self):
        p = self.pki.p
        cert, key, ca = p("node0.pem"), p("node0.key"), p("ca.pem")
        # only some of the three
        for opts in ("tls_cert=" + cert,
                     "tls_key=" + key,
                     "tls_cert=%s,tls_key=%s" % (cert, key),
                     "tls_cert=%s,tls_ca=%s" % (cert, ca)):
            err = self.mount_fails(opts)
            self.assertRegex(err, r"tls_cert=.*tls_key=.*tls_ca=", opts)
        # a key that is not the certificate's
        wrong = p("node1.key")
        err = self.mount_fails("tls_cert=%s,tls_key=%s,tls_ca=%s"
                               % (cert, wrong, ca))
        self.assertIn("tls_key=" + wrong, err)
        self.assertRegex(err, r"does not (belong|match)|mismatch")
        # a CA file that is not PEM
        err = self.mount_fails("tls_cert=%s,tls_key=%s,tls_ca=%s"
                               % (cert, key, p("notpem.pem")))
        self.assertIn("tls_ca=" + p("notpem.pem"), err)
        # a certificate file that is not PEM
        err = self.mount_fails("tls_cert=%s,tls_key=%s,tls_ca=%s"
                               % (p("notpem.pem"), key, ca))
        self.assertIn("tls_cert=" + p("notpem.pem"), err)
        # a key file that is a certificate
        err = self.mount_fails("tls_cert=%s,tls_key=%s,tls_ca=%s"
                               % (cert, cert, ca))
        self.assertIn("tls_key=" + cert, err)
        # missing files, each position
        missing = p("no-such-file.pem")
        for opts in ("tls_cert=%s,tls_key=%s,tls_ca=%s" % (missing, key, ca),
                     "tls_cert=%s,tls_key=%s,tls_ca=%s" % (cert, missing, ca),
                     "tls_cert=%s,tls_key=%s,tls_ca=%s" % (cert, key, missing)):
            err = self.mount_fails(opts)
            self.assertIn(missing, err, opts)
            self.assertRegex(err, r"No such file", opts)
        # TLS without a listen address
        err = self.mount_fails(self.pki.opts("node0"), listen=False)
        self.assertRegex(err, r"listen=")


if __name__ == "__main__":
    harness.main()
