"""Peer-tier security (issue 4, DESIGN §6): a Python peer that speaks the
wire format of net/frame.h and the HMAC handshake of net/auth.h.

- wrong secret, no secret, a MAC made for another rank or purpose: the HELLO
  is refused (NT_ERROR EACCES, then the server closes); a fetch or push
  without a handshake is never answered;
- the right secret with hostile data requests: job names with "/" or "..",
  manifests with "../x" or absolute paths, symlinks pointing out of the
  shard, a manifest whose hash does not match, counts and sizes beyond the
  limits, a frame over NET_MAX_PAYLOAD, NT_FILE frames for other paths or
  with bytes that fail their CRC32C, an unknown op, a push that would
  replace the node's own committed shard: each gets an error reply or the
  connection is dropped; nothing appears outside RAMDIR/shards, no new
  shard is listed by mtcfs-admin ls, the daemon keeps serving; a pushed
  file never lands set-user-ID/set-group-ID in RAMDIR;
- erasure coding (rs:2+1 on 6 nodes, two groups; issue 22): ec_meta and
  ec_data are refused for another job, for a step older than the job's
  protected step, from a rank outside the receiver's group; a manifest
  that would replace a stored one with other bytes is refused (the same
  bytes again are accepted); at most 4 steps above the LKG get fragment
  directories (a lower step takes the highest one's place); the bytes
  stored count in ram_size;
- the positive path: a correct authenticated push of a small shard is
  accepted, stored under RAMDIR/shards/JOB/STEP/nOWNER-w0, listed as a
  replica ("own": false, "rank" = the owner) and can be fetched back.

The wire helpers here (frame(), Wire, build_manifest(), ...) are also used
by test_cluster.py.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/security/test_peer_security.py [-k NAME]
"""

import base64
import errno
import hashlib
import hmac
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import harness  # noqa: E402
from crc32c import crc32c  # noqa: E402
from cluster import Cluster  # noqa: E402

# --- the wire format (net/frame.h) ------------------------------------------

MAGIC = 0x5043544d               # "MTCP" little-endian
VERSION = 1
HDR_LEN = 24
NET_MAX_PAYLOAD = 16 << 20
(NT_CHALLENGE, NT_HELLO, NT_WELCOME, NT_REQ, NT_RESP, NT_EVENT, NT_FILE,
 NT_ERROR) = range(1, 9)
TYPE_NAMES = {1: "CHALLENGE", 2: "HELLO", 3: "WELCOME", 4: "REQ", 5: "RESP",
              6: "EVENT", 7: "FILE", 8: "ERROR"}
_HDR20 = struct.Struct("<IBBHIII")   # magic version type flags req_id len pcrc

HELLO_LABEL = b"mtcfs-hello-v1"
WELCOME_LABEL = b"mtcfs-welcome-v1"
NONCE_LEN = 32


def header(ftype, length, payload_crc, req_id=0, flags=0, magic=MAGIC,
           version=VERSION, bad_hdr_crc=False):
    """The 24-byte frame header; bad_hdr_crc flips a bit of its CRC."""
    h = _HDR20.pack(magic, version, ftype, flags, req_id, length, payload_crc)
    c = crc32c(h)
    if bad_hdr_crc:
        c ^= 0x1
    return h + struct.pack("<I", c)


def jbytes(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def frame(ftype, payload=b"", req_id=0, bad_payload_crc=False, **kw):
    """A whole frame; payload: bytes or a JSON-able object."""
    if not isinstance(payload, (bytes, bytearray)):
        payload = jbytes(payload)
    pcrc = crc32c(payload)
    if bad_payload_crc:
        pcrc ^= 0x80000000
    return header(ftype, len(payload), pcrc, req_id, **kw) + bytes(payload)


def file_frame(path, data, crc=None):
    """NT_FILE {"path","size","crc32c"} followed by the raw bytes."""
    crc = crc32c(data) if crc is None else crc
    return frame(NT_FILE, {"path": path, "size": len(data),
                           "crc32c": "%08x" % crc}) + bytes(data)


def hello_mac(secret, nonce_s, nonce_c, rank, purpose):
    msg = (HELLO_LABEL + nonce_s + nonce_c + str(rank).encode()
           + purpose.encode())
    return hmac.new(secret, msg, hashlib.sha256).digest()


def welcome_mac(secret, nonce_c, nonce_s, server_rank):
    msg = WELCOME_LABEL + nonce_c + nonce_s + str(server_rank).encode()
    return hmac.new(secret, msg, hashlib.sha256).digest()


def read_secret(path):
    """The secret as mtcfs reads it: the first line, without its newline."""
    with open(path, "rb") as f:
        return f.read().split(b"\n", 1)[0].rstrip(b"\r")


class Closed(Exception):
    """The server closed (or reset) the connection."""


class Refused(Exception):
    """The server answered with NT_ERROR."""

    def __init__(self, err, text):
        super().__init__("NT_ERROR errno=%s: %s" % (err, text))
        self.errno = err
        self.text = text


class Wire:
    """One TCP connection to a node's peer port, with frame I/O."""

    def __init__(self, addr, timeout=10.0):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.settimeout(timeout)
        self.nonce_s = None

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def send(self, data):
        """sendall; a reset by the peer (it already dropped us) is Closed."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Closed(str(e))

    def recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                b = self.sock.recv(min(n - len(buf), 1 << 20))
            except ConnectionResetError as e:
                raise Closed(str(e))
            if not b:
                raise Closed("EOF after %d of %d bytes" % (len(buf), n))
            buf += b
        return bytes(buf)

    def recv_frame(self):
        """(type, req_id, payload bytes), with both CRCs checked."""
        h = self.recv_exact(HDR_LEN)
        magic, ver, ftype, flags, req_id, length, pcrc = _HDR20.unpack(h[:20])
        (hcrc,) = struct.unpack("<I", h[20:])
        assert magic == MAGIC and ver == VERSION, "bad magic/version from mtcfs"
        assert hcrc == crc32c(h[:20]), "bad header CRC from mtcfs"
        assert length <= NET_MAX_PAYLOAD, "oversize frame from mtcfs"
        p = self.recv_exact(length)
        assert crc32c(p) == pcrc, "bad payload CRC from mtcfs"
        return ftype, req_id, p

    def recv_json(self):
        """(type, req_id, object); NT_ERROR raises Refused."""
        ftype, req_id, p = self.recv_frame()
        o = json.loads(p.decode()) if p else {}
        if ftype == NT_ERROR:
            raise Refused(o.get("errno"), o.get("error"))
        return ftype, req_id, o

    def challenge(self):
        ftype, _, p = self.recv_frame()
        assert ftype == NT_CHALLENGE and len(p) == NONCE_LEN, \
            "first frame is %s (%d bytes), want a 32-byte CHALLENGE" % (
                TYPE_NAMES.get(ftype, ftype), len(p))
        self.nonce_s = p
        return p

    def handshake(self, secret, rank=-1, purpose="data", mac_rank=None,
                  mac_purpose=None, server_rank=None):
        """CHALLENGE / HELLO / WELCOME. secret None: an all-zero MAC (what
        net/client.c sends without a secret). mac_rank/mac_purpose: compute
        the MAC for other values than the ones announced. Returns the
        WELCOME object after checking the server's MAC; Refused/Closed when
        the server refuses."""
        nonce_s = self.challenge()
        nonce_c = os.urandom(NONCE_LEN)
        if secret is None:
            mac = bytes(32)
        else:
            mac = hello_mac(secret, nonce_s, nonce_c,
                            rank if mac_rank is None else mac_rank,
                            purpose if mac_purpose is None else mac_purpose)
        self.send(frame(NT_HELLO, {"rank": rank, "purpose": purpose,
                                   "nonce": nonce_c.hex(), "mac": mac.hex()}))
        ftype, _, w = self.recv_json()
        assert ftype == NT_WELCOME, "got %s instead of WELCOME" % ftype
        if secret is not None:
            want = welcome_mac(secret, nonce_c, nonce_s, w["rank"])
            assert bytes.fromhex(w["mac"]) == want, \
                "the server's WELCOME MAC does not prove the secret"
        if server_rank is not None:
            assert w["rank"] == server_rank, w
        return w

    def wait_closed(self, timeout=10.0):
        """Read (and discard) until the server closes; True if it did
        within timeout. Returns the bytes received meanwhile in .leftover."""
        self.leftover = b""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                b = self.sock.recv(65536)
            except socket.timeout:
                return False
            except ConnectionResetError:
                return True
            if not b:
                return True
            self.leftover += b


# --- manifests (tiers/manifest.c mf_encode) ----------------------------------

MF_MAGIC = 0x4d43544d
MF_FILE, MF_DIR, MF_SYMLINK = 1, 2, 3


def mf_entries(entries):
    """Canonical entry bytes: u32 n, then per entry u8 type, u32 mode,
    u64 size, u32 crc32c, u16 path len, path, u16 target len, target."""
    out = bytearray(struct.pack("<I", len(entries)))
    for t, mode, size, crc, path, target in entries:
        p = path.encode() if isinstance(path, str) else path
        tg = (target or "").encode() if not isinstance(target, bytes) \
            else target
        out += struct.pack("<BIQIH", t, mode, size, crc, len(p)) + p
        out += struct.pack("<H", len(tg)) + tg
    return bytes(out)


def mf_encode(entries, hash_override=None, count_override=None):
    body = mf_entries(entries)
    if count_override is not None:
        body = struct.pack("<I", count_override) + body[4:]
    h = hashlib.sha256(body).digest() if hash_override is None \
        else hash_override
    return struct.pack("<II", MF_MAGIC, 1) + h + body


def manifest_entries(files, symlinks=None, dirs=()):
    """Entries (sorted bytewise by path) for files {path: bytes}, the
    ancestors of every path, extra dirs and symlinks {path: target}."""
    symlinks = symlinks or {}
    ds = set(dirs)
    for p in list(files) + list(symlinks):
        parts = p.split("/")[:-1]
        for i in range(len(parts)):
            ds.add("/".join(parts[:i + 1]))
    ents = [(MF_DIR, 0o755, 0, 0, d, None) for d in ds]
    ents += [(MF_FILE, 0o644, len(b), crc32c(b), p, None)
             for p, b in files.items()]
    ents += [(MF_SYMLINK, 0o777, 0, 0, p, t) for p, t in symlinks.items()]
    ents.sort(key=lambda e: e[4].encode() if isinstance(e[4], str) else e[4])
    return ents


def b64(b):
    return base64.b64encode(b).decode()


def push_request(job, step, owner, manifest, worker=0, op="push"):
    return {"op": op, "key": {"job": job, "step": step, "owner": owner,
                              "worker": worker},
            "manifest": b64(manifest)}


def push_shard(addr, secret, job, step, owner, files, rank=None):
    rank = owner if rank is None else rank   # replicas are pushed by their owner
    """A complete, correct push. Returns the final reply object."""
    ents = manifest_entries(files)
    with Wire(addr) as w:
        w.handshake(secret, rank=rank, purpose="data")
        w.send(frame(NT_REQ, push_request(job, step, owner, mf_encode(ents)),
                     req_id=7))
        ftype, rid, r = w.recv_json()
        assert ftype == NT_RESP and rid == 7, (ftype, rid, r)
        if r.get("have"):
            return r
        assert r.get("send") is True, r
        for t, _, _, _, p, _ in ents:
            if t == MF_FILE:
                w.send(file_frame(p, files[p]))
        ftype, rid, r = w.recv_json()
        assert ftype == NT_RESP, (ftype, r)
        return r


def fetch_shard(addr, secret, job, step, owner, rank=-1):
    """fetch: returns (manifest bytes, {path: bytes})."""
    with Wire(addr) as w:
        w.handshake(secret, rank=rank, purpose="data")
        w.send(frame(NT_REQ, {"op": "fetch", "job": job, "step": step,
                              "owner": owner, "worker": 0}, req_id=3))
        ftype, rid, r = w.recv_json()
        assert ftype == NT_RESP and rid == 3, (ftype, rid, r)
        mf = base64.b64decode(r["manifest"])
        nfiles = sum(1 for e in parse_manifest(mf) if e[0] == MF_FILE)
        files = {}
        for _ in range(nfiles):
            ftype, _, p = w.recv_frame()
            assert ftype == NT_FILE, ftype
            h = json.loads(p)
            data = w.recv_exact(h["size"])
            assert "%08x" % crc32c(data) == h["crc32c"], h
            files[h["path"]] = data
        return mf, files


def parse_manifest(mf):
    """[(type, mode, size, crc, path, target)] of an encoded manifest:
    version 1, or 2 (the shard directory's mode, uid, gid before the count,
    each entry's uid, gid after its mode; what an mtcfs seals now)."""
    magic, ver = struct.unpack_from("<II", mf, 0)
    assert magic == MF_MAGIC and ver in (1, 2), (magic, ver)
    off = 40 + (12 if ver == 2 else 0)
    (n,) = struct.unpack_from("<I", mf, off)
    off, out = off + 4, []
    for _ in range(n):
        if ver == 2:
            t, mode, _uid, _gid, size, crc, pl = struct.unpack_from("<BIIIQIH", mf, off)
            off += 27
        else:
            t, mode, size, crc, pl = struct.unpack_from("<BIQIH", mf, off)
            off += 19
        path = mf[off:off + pl].decode()
        off += pl
        (tl,) = struct.unpack_from("<H", mf, off)
        off += 2
        target = mf[off:off + tl].decode() if tl else None
        off += tl
        out.append((t, mode, size, crc, path, target))
    return out


# --- RAMDIR snapshots -----------------------------------------------------------

def ramdir_tree(ramdir):
    """{relpath: (kind, size)} of everything under RAMDIR except the LMDB
    catalog (db/, whose files change on every write)."""
    out = {}
    for dp, dns, fns in os.walk(ramdir):
        rel_dp = os.path.relpath(dp, ramdir)
        if rel_dp == "db" or rel_dp.startswith("db/"):
            dns[:] = []
            continue
        for n in dns + fns:
            p = os.path.join(dp, n)
            rel = os.path.relpath(p, ramdir)
            if rel == "db":
                continue
            st = os.lstat(p)
            kind = ("dir" if os.path.isdir(p) and not os.path.islink(p)
                    else "link" if os.path.islink(p) else "file")
            out[rel] = (kind, st.st_size if kind == "file" else 0)
    return out


def tree_diff(before, after):
    """(added, removed, changed) relpaths."""
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after)
                     if before[p] != after[p])
    return added, removed, changed


# --- the tests --------------------------------------------------------------------

JOB = "secjob"
SHUT_WR = object()      # in hostile_push's files: half-close our side here


class PeerSecurity(unittest.TestCase):
    """A 2-node cluster (k=1) with a secret; step 10 committed and
    replicated on both; the hostile peer talks to node 1 (not the
    coordinator) unless a test says otherwise."""

    N = 2

    def setUp(self):
        self.c = Cluster(self.N, ram_size="256M", restore_timeout=10)
        for d in self.c.nodes:
            d.extra_args.append("-d")
        self.daemons = list(self.c.nodes)
        self.addCleanup(self.c.close)
        self.c.start()
        self.secret = read_secret(self.c.secret)
        self.assertEqual(self.c.job_start(JOB), {r: 0 for r in range(self.N)})
        self.c.save(JOB, 10, size=64 * 1024)
        self.c.wait_replicated(JOB, 10)
        self.target = 1
        self.addr = self.c.addrs[self.target]
        self.node = self.c.nodes[self.target]
        self.tag = "mtcfs-escape-%d-%s" % (os.getpid(), os.urandom(4).hex())
        self.baseline()

    # -- helpers --

    def baseline(self):
        self.ls0 = self.shards()
        self.tree0 = ramdir_tree(self.node.ramdir)

    def shards(self, node=None):
        node = self.node if node is None else node
        return sorted((s["job"], s["step"], s["rank"], s["worker"], s["own"],
                       s["hash"])
                      for s in harness.admin_ls(node.ramdir)["shards"])

    def assert_nothing_stored(self, what):
        """No new shard listed, RAMDIR unchanged except empty directories
        under shards/ (parents of an aborted stage), no escape file."""
        self.node.check_alive()
        self.assertEqual(self.shards(), self.ls0,
                         "%s: mtcfs-admin ls changed" % what)
        # a stage being aborted on the data thread may lag our reply: poll
        def settled():
            added, removed, changed = tree_diff(self.tree0,
                                                ramdir_tree(self.node.ramdir))
            bad = [p for p in added
                   if not (p.startswith("shards/") and os.path.isdir(
                       os.path.join(self.node.ramdir, p))
                       and not os.listdir(os.path.join(self.node.ramdir, p)))]
            bad += [p for p in removed]
            bad += [p for p in changed
                    if not os.path.isdir(os.path.join(self.node.ramdir, p))]
            return (not bad, bad)
        try:
            harness.wait_until(lambda: settled()[0], 5,
                               "%s: RAMDIR unchanged" % what)
        except AssertionError:
            self.fail("%s: RAMDIR changed: %s" % (what, settled()[1]))
        self.assert_no_escape(what)

    def assert_no_escape(self, what):
        """No file named self.tag anywhere a hostile path could reach."""
        roots = {os.path.dirname(self.node.ramdir), "/tmp", "/",
                 self.node.ramdir, os.path.dirname(self.node.mnt),
                 self.node.workdir}
        hits = []
        for r in roots:
            if os.path.lexists(os.path.join(r, self.tag)):
                hits.append(os.path.join(r, self.tag))
        for dp, dns, fns in os.walk(self.node.ramdir):
            if self.tag in dns + fns:
                hits.append(os.path.join(dp, self.tag))
        self.assertEqual(hits, [], "%s: a file escaped the shard store" % what)

    def data_conn(self, rank=0):
        # rank 0 pushes shards it owns (owner 0), as replication does
        w = Wire(self.addr)
        self.addCleanup(w.close)
        w.handshake(self.secret, rank=rank, purpose="data",
                    server_rank=self.target)
        return w

    def expect_refused_or_dropped(self, w, what, errnos=None, req_id=None):
        """The next thing from the server is NT_ERROR (errno in errnos, if
        given) or the connection closes; then the server closes."""
        try:
            ftype, rid, o = w.recv_json()
        except Refused as e:
            if errnos is not None:
                self.assertIn(e.errno, errnos, "%s: %s" % (what, e))
            self.assertTrue(w.wait_closed(10), "%s: connection not closed "
                            "after the error" % what)
            return e
        except (Closed, socket.timeout) as e:
            if isinstance(e, socket.timeout):
                self.fail("%s: no answer and no close within the timeout"
                          % what)
            return e
        self.fail("%s: accepted: %s %r" % (what, TYPE_NAMES.get(ftype),
                                            o))

    def hostile_push(self, what, req, files=(), errnos=None):
        """Send push request req (then NT_FILE frames for files if the
        server says send); expect a refusal; nothing stored."""
        w = self.data_conn()
        w.send(frame(NT_REQ, req, req_id=11))
        try:
            ftype, rid, o = w.recv_json()
        except Refused as e:
            if errnos is not None:
                self.assertIn(e.errno, errnos, "%s: %s" % (what, e))
            self.assertTrue(w.wait_closed(10), what)
            self.assert_nothing_stored(what)
            return e
        except Closed as e:
            self.assert_nothing_stored(what)
            return e
        if o.get("send") is True:
            # the request passed the first checks: what follows must fail
            try:
                for f in files:
                    if f is SHUT_WR:
                        w.sock.shutdown(socket.SHUT_WR)
                    else:
                        w.send(f)
            except Closed:
                pass
            e = self.expect_refused_or_dropped(w, what, errnos)
            self.assert_nothing_stored(what)
            return e
        self.fail("%s: accepted: %r" % (what, o))

    def good_files(self):
        return {"state/params/0.0": os.urandom(3000) + self.tag.encode(),
                "commit_success.txt": b"ok\n"}

    def still_serves(self):
        """A correct push is still accepted and the cluster still restores."""
        files = {"x/y.bin": os.urandom(1000)}
        r = push_shard(self.addr, self.secret, "probe", 1, 0, files)
        self.assertEqual(r, {"ok": True})
        self.node.check_alive()

    # -- authentication --

    def test_wrong_secret_rejected(self):
        for purpose in ("data", "control"):
            with Wire(self.addr) as w:
                with self.assertRaises(Refused, msg=purpose) as cm:
                    w.handshake(b"not-the-secret-of-this-cluster", rank=0,
                                purpose=purpose)
                self.assertEqual(cm.exception.errno, errno.EACCES)
                self.assertTrue(w.wait_closed(5), "not closed after refusal")
        self.assertRegex(self.node.log_text(),
                         r"authentication failed: bad HELLO MAC")
        self.assert_nothing_stored("wrong secret")
        self.still_serves()

    def test_no_secret_rejected(self):
        """An all-zero MAC (a client without secret_file) and a client
        that sends HELLO without the mac field at all."""
        with Wire(self.addr) as w:
            with self.assertRaises(Refused) as cm:
                w.handshake(None, rank=0, purpose="data")
            self.assertEqual(cm.exception.errno, errno.EACCES)
            self.assertTrue(w.wait_closed(5))
        with Wire(self.addr) as w:
            w.challenge()
            w.send(frame(NT_HELLO, {"rank": 0, "purpose": "data",
                                    "nonce": os.urandom(32).hex()}))
            self.assertTrue(w.wait_closed(5), "HELLO without a MAC")
            self.assertEqual(w.leftover, b"")
        self.assert_nothing_stored("no secret")
        self.still_serves()

    def test_mac_for_other_rank_or_purpose_rejected(self):
        """The MAC binds rank and purpose: one made for rank 0 does not
        authenticate rank 5, one made for control does not open data."""
        for kw in ({"rank": 5, "mac_rank": 0},
                   {"purpose": "data", "mac_purpose": "control"}):
            with Wire(self.addr) as w:
                with self.assertRaises(Refused, msg=str(kw)) as cm:
                    w.handshake(self.secret, **kw)
                self.assertEqual(cm.exception.errno, errno.EACCES)
        # a replayed HELLO (nonce_s differs per connection) is refused too
        with Wire(self.addr) as w:
            ns = w.challenge()
            nc = os.urandom(32)
            hello = frame(NT_HELLO, {"rank": 0, "purpose": "data",
                                     "nonce": nc.hex(),
                                     "mac": hello_mac(self.secret, ns, nc, 0,
                                                      "data").hex()})
            w.send(hello)
            self.assertEqual(w.recv_json()[0], NT_WELCOME)
        with Wire(self.addr) as w:
            w.challenge()
            w.send(hello)
            with self.assertRaises(Refused):
                w.recv_json()
        self.assert_nothing_stored("mac for another rank/purpose")

    def test_requests_without_handshake_get_nothing(self):
        """fetch and push frames sent instead of HELLO: dropped, no data."""
        for req in ({"op": "fetch", "job": JOB, "step": 10, "owner": 0,
                     "worker": 0},
                    push_request(JOB, 99, 0, mf_encode(manifest_entries(
                        self.good_files()))),
                    {"op": "catalog", "job": JOB, "nodes": 2, "holds": []}):
            with Wire(self.addr) as w:
                w.challenge()
                w.send(frame(NT_REQ, req, req_id=1))
                self.assertTrue(w.wait_closed(5), req["op"])
                self.assertEqual(w.leftover, b"", "answered %s" % req["op"])
        self.assert_nothing_stored("requests without a handshake")

    def test_right_secret_handshake_and_fetch(self):
        """Positive control: our client speaks the protocol — WELCOME's MAC
        checks out and a fetch returns node 0's replica byte for byte."""
        w = Wire(self.addr)
        self.addCleanup(w.close)
        wel = w.handshake(self.secret, rank=0, purpose="control",
                          server_rank=self.target)
        self.assertEqual(wel["rank"], self.target)
        mf, files = fetch_shard(self.addr, self.secret, JOB, 10, 0)
        from cluster import shard_files
        want = shard_files(JOB, 10, 0, 64 * 1024)
        want["commit_success.txt"] = b"ok\n"
        self.assertEqual(files, want)

    # -- the positive push --

    def test_valid_push_accepted_and_listed(self):
        files = self.good_files()
        r = push_shard(self.addr, self.secret, "pushed", 42, 0, files, rank=0)
        self.assertEqual(r, {"ok": True})
        ls = harness.admin_ls(self.node.ramdir)
        s = harness.find_shard(ls, 42, job="pushed", rank=0)
        self.assertIsNotNone(s, "pushed shard not listed")
        self.assertFalse(s["own"], s)
        self.assertIn(s["state"], harness.COMMITTED_STATES)
        harness.assert_manifest(self, s, files)
        self.assertEqual(s["hash"], hashlib.sha256(mf_entries(
            manifest_entries(files))).hexdigest())
        harness.assert_shard_on_disk(self, self.node.ramdir, 42, files,
                                     job="pushed", rank=0)
        # a second push of the same content: "have", nothing sent
        r = push_shard(self.addr, self.secret, "pushed", 42, 0, files, rank=0)
        self.assertEqual(r, {"have": True})
        # and it can be fetched back
        _, got = fetch_shard(self.addr, self.secret, "pushed", 42, 0)
        self.assertEqual(got, files)

    def test_push_by_non_owner_refused(self):
        # rank 2 (authenticated) pushing rank 0's shard: only owners push
        files = self.good_files()
        with self.assertRaises(Refused) as cm:
            push_shard(self.addr, self.secret, "notmine", 43, 0, files, rank=2)
        self.assertEqual(cm.exception.errno, errno.EPERM)
        self.assertIsNone(harness.find_shard(harness.admin_ls(self.node.ramdir), 43,
                                             job="notmine", rank=0))
        self.still_serves()

    # -- hostile requests with the right secret --

    def test_hostile_job_names(self):
        mf = mf_encode(manifest_entries(self.good_files()))
        for job in ("../x", "a/b", "/abs", "..", ".hidden", "-x", "",
                    "j" * 129, "a\nb", self.tag + "/../../" + self.tag):
            self.hostile_push("job %r" % job, push_request(job, 5, 0, mf),
                              errnos=(errno.EINVAL,))
        for key in ({"job": JOB, "step": -1, "owner": 0, "worker": 0},
                    {"job": JOB, "step": 5, "owner": 65536, "worker": 0},
                    {"job": JOB, "step": 5, "owner": 0, "worker": 64},
                    {"job": JOB, "step": "5", "owner": 0, "worker": 0},
                    {"job": JOB, "step": 5.5, "owner": 0, "worker": 0},
                    {"job": JOB, "owner": 0, "worker": 0},
                    "not-an-object"):
            self.hostile_push("key %r" % (key,),
                              {"op": "push", "key": key, "manifest": b64(mf)},
                              errnos=(errno.EINVAL,))
        self.still_serves()

    def test_hostile_manifest_paths(self):
        data = b"escape!"
        cases = {
            "dotdot file": [(MF_FILE, 0o644, len(data), crc32c(data),
                             "../" + self.tag, None)],
            "deep dotdot": [(MF_FILE, 0o644, len(data), crc32c(data),
                             "../../../../../../tmp/" + self.tag, None)],
            "absolute": [(MF_FILE, 0o644, len(data), crc32c(data),
                          "/tmp/" + self.tag, None)],
            "inner dotdot": [(MF_DIR, 0o755, 0, 0, "a", None),
                             (MF_FILE, 0o644, len(data), crc32c(data),
                              "a/../../" + self.tag, None)],
            "dot component": [(MF_FILE, 0o644, len(data), crc32c(data),
                               "./" + self.tag, None)],
            "empty component": [(MF_FILE, 0o644, len(data), crc32c(data),
                                 "a//" + self.tag, None)],
            "NUL in path": [(MF_FILE, 0o644, len(data), crc32c(data),
                             self.tag.encode() + b"\0/../x", None)],
            "dir dotdot": [(MF_DIR, 0o755, 0, 0, "..", None)],
            "unsorted": [(MF_FILE, 0o644, len(data), crc32c(data), "b", None),
                         (MF_FILE, 0o644, len(data), crc32c(data), "a",
                          None)],
            "duplicate": [(MF_FILE, 0o644, len(data), crc32c(data), "a",
                           None),
                          (MF_FILE, 0o644, len(data), crc32c(data), "a",
                           None)],
            "mode bits outside 07777": [(MF_FILE, 0o100644, len(data),
                                         crc32c(data), "a", None)],
        }
        for what, ents in cases.items():
            self.hostile_push(what, push_request(JOB, 77, 0, mf_encode(ents)),
                              files=[file_frame(ents[-1][4] if isinstance(
                                  ents[-1][4], str) else "a", data)],
                              errnos=(errno.EINVAL,))
        self.still_serves()

    def test_hostile_symlinks(self):
        """Symlinks in a manifest that point out of the shard are refused;
        a file path through a symlink cannot leave the stage either."""
        data = b"through the link"
        for target in ("/tmp", "..", "../..", "a/../../..", "/" + self.tag):
            ents = manifest_entries({}, symlinks={"l": target})
            self.hostile_push("symlink -> %s" % target,
                              push_request(JOB, 78, 0, mf_encode(ents)))
            ents = sorted(ents + [(MF_FILE, 0o644, len(data), crc32c(data),
                                   "l/" + self.tag, None)],
                          key=lambda e: e[4])
            self.hostile_push("file via symlink -> %s" % target,
                              push_request(JOB, 78, 0, mf_encode(ents)),
                              files=[file_frame("l/" + self.tag, data)])
        self.still_serves()

    def test_manifest_hash_mismatch(self):
        files = self.good_files()
        ents = manifest_entries(files)
        good = mf_encode(ents)
        bad_hash = mf_encode(ents, hash_override=bytes(32))
        flipped = bytearray(good)
        flipped[-1] ^= 0x01                       # an entry byte, not the hash
        for what, mf in (("zero hash", bad_hash),
                         ("entry changed after hashing", bytes(flipped)),
                         ("truncated", good[:-3]),
                         ("trailing bytes", good + b"\0"),
                         ("bad magic", b"XXXX" + good[4:]),
                         ("bad version", good[:4] + struct.pack("<I", 2)
                          + good[8:]),
                         ("empty", b""),
                         ("not base64", None)):
            req = push_request(JOB, 79, 0, mf or b"")
            if mf is None:
                req["manifest"] = "!!!!not*base64"
            self.hostile_push(what, req, files=[
                file_frame(p, files[p]) for p in sorted(files)],
                errnos=(errno.EINVAL,))
        self.still_serves()

    def test_oversized_and_absurd_manifests(self):
        # counts beyond MF_MAX_ENTRIES, or more than the bytes can hold
        one = [(MF_FILE, 0o644, 1, crc32c(b"x"), "a", None)]
        self.hostile_push("count 1000001", push_request(
            JOB, 80, 0, mf_encode(one, count_override=1000001)),
            errnos=(errno.EINVAL,))
        self.hostile_push("count 1000000, one entry", push_request(
            JOB, 80, 0, mf_encode(one, count_override=1000000)),
            errnos=(errno.EINVAL,))
        self.hostile_push("count 2^32-1", push_request(
            JOB, 80, 0, mf_encode(one, count_override=0xFFFFFFFF)),
            errnos=(errno.EINVAL,))
        # a file size beyond MF_MAX_FILE_SIZE (16 TiB)
        self.hostile_push("17 TiB file", push_request(JOB, 80, 0, mf_encode(
            [(MF_FILE, 0o644, 17 << 40, 0, "a", None)])),
            errnos=(errno.EINVAL,))
        # a valid manifest announcing far more than ram_size: the server
        # may say "send", but the file is refused (ENOSPC), nothing kept
        big = 1 << 40
        req = push_request(JOB, 81, 0, mf_encode(
            [(MF_FILE, 0o644, big, 0, "huge", None)]))
        hdr = frame(NT_FILE, {"path": "huge", "size": big,
                              "crc32c": "00000000"})
        self.hostile_push("1 TiB file", req, files=[hdr + bytes(1 << 16)],
                          errnos=(errno.ENOSPC, errno.EPROTO, errno.EINVAL))
        # a ~12 MiB manifest field of garbage (a frame under 16 MiB)
        req = push_request(JOB, 82, 0, b"")
        req["manifest"] = "A" * (12 << 20)
        self.hostile_push("12 MiB garbage manifest", req,
                          errnos=(errno.EINVAL,))
        # a frame announcing more than NET_MAX_PAYLOAD: dropped unanswered
        w = self.data_conn()
        w.send(header(NT_REQ, NET_MAX_PAYLOAD + 1, 0, req_id=1)
               + b"{" * 4096)
        self.assertTrue(w.wait_closed(10), "oversize frame not dropped")
        self.assertEqual(w.leftover, b"")
        self.assert_nothing_stored("frame over NET_MAX_PAYLOAD")
        self.still_serves()

    def test_bad_file_frames(self):
        """A valid manifest, then NT_FILE frames that do not match it."""
        files = self.good_files()
        ents = manifest_entries(files)
        mf = mf_encode(ents)
        order = [e[4] for e in ents if e[0] == MF_FILE]
        p0 = order[0]
        wrong = bytearray(files[p0])
        wrong[0] ^= 0xFF
        cases = {
            "path ../x": [file_frame("../" + self.tag, files[p0])],
            "absolute path": [file_frame("/tmp/" + self.tag, files[p0])],
            "other path": [file_frame("zzz", files[p0])],
            "wrong size": [file_frame(p0, files[p0] + b"extra")],
            "bytes fail CRC (header claims the manifest's CRC)":
                [file_frame(p0, bytes(wrong), crc=crc32c(files[p0]))],
            "CRC differs from manifest": [file_frame(p0, bytes(wrong))],
            "a REQ instead of a file": [frame(NT_REQ, {"op": "push"}, 3)],
            "truncated file then close": [file_frame(p0, files[p0])[:-10],
                                          SHUT_WR],
        }
        for what, frames in cases.items():
            self.hostile_push(what, push_request(JOB, 83, 0, mf),
                              files=frames,
                              errnos=(errno.EINVAL, errno.EPROTO,
                                      errno.EBADMSG, errno.EIO,
                                      errno.ECONNRESET, errno.EPIPE))
        self.still_serves()

    def test_unknown_and_malformed_ops(self):
        for req in ({"op": "delete", "job": JOB, "step": 10, "owner": 0},
                    {"op": "x" * 100},
                    {"noop": True},
                    {"op": 7}):
            w = self.data_conn()
            w.send(frame(NT_REQ, req, req_id=5))
            self.expect_refused_or_dropped(w, "op %r" % (req,),
                                           errnos=(errno.ENOSYS,))
        # a first frame that is not a REQ, and JSON that is not an object
        for f in (frame(NT_EVENT, {"op": "push"}),
                  frame(NT_REQ, b"[1,2,3]", req_id=1),
                  frame(NT_REQ, b"{\"op\":\"push\",\"op\":\"fetch\"}", 1),
                  frame(NT_REQ, b"{" * 100 + b"}" * 100, 1),
                  frame(NT_REQ, {"op": "push"}, 1, bad_payload_crc=True)):
            w = self.data_conn()
            w.send(f)
            self.expect_refused_or_dropped(w, "bad first frame")
        # hostile fetch keys
        for key in ({"job": "../" + JOB, "step": 10, "owner": 0},
                    {"job": JOB + "/..", "step": 10, "owner": 0},
                    {"job": JOB, "step": 10, "owner": 99999}):
            w = self.data_conn()
            w.send(frame(NT_REQ, dict(key, op="fetch", worker=0), 2))
            self.expect_refused_or_dropped(w, "fetch %r" % key,
                                           errnos=(errno.EINVAL,
                                                   errno.ENOENT))
        self.assert_nothing_stored("unknown ops")
        self.still_serves()

    def test_pushed_files_are_not_setuid(self):
        """Modes come from the network: a pushed file must not land in
        RAMDIR (often a tmpfs without nosuid) as a set-user-ID or
        set-group-ID file of the daemon's user (root)."""
        data = b"#!/bin/sh\necho owned\n"
        ents = [(MF_FILE, 0o6755, len(data), crc32c(data), "bin", None)]
        w = self.data_conn()
        w.send(frame(NT_REQ, push_request("modes", 1, 0, mf_encode(ents)),
                     req_id=1))
        try:
            _, _, o = w.recv_json()
            if o.get("send"):
                w.send(file_frame("bin", data))
                w.recv_json()
        except (Refused, Closed):
            return                      # refusing such a shard is fine too
        p = os.path.join(harness.shard_dir(self.node.ramdir, 1, job="modes",
                                           rank=0), "bin")
        if os.path.exists(p):
            mode = os.lstat(p).st_mode
            self.assertEqual(mode & 0o7000, 0,
                             "pushed file stored with mode %o" % mode)

    def test_push_cannot_replace_own_shard(self):
        """A peer pushing different bytes under the key of this node's own
        committed step must not replace it (DESIGN §6: a committed step is
        never silently lost): the catalog keeps the own shard and its hash,
        and the next job restart restores the bytes this node wrote."""
        from cluster import shard_files
        own = harness.find_shard(harness.admin_ls(self.node.ramdir), 10,
                                 job=JOB, rank=self.target)
        self.assertTrue(own and own["own"], own)
        forged = {"state/params/0.0": b"not what node 1 wrote"}
        try:
            reply = push_shard(self.addr, self.secret, JOB, 10, self.target,
                               forged, rank=0)
        except (Refused, Closed) as e:
            reply = e
        after = harness.find_shard(harness.admin_ls(self.node.ramdir), 10,
                                   job=JOB, rank=self.target)
        # what the job gets back now
        got = self.c.job_start(JOB)
        restored = None
        mnt = self.node.mnt
        for m in os.listdir(mnt):
            if m.endswith(".restore") and os.path.islink(os.path.join(mnt, m)):
                restored = harness.read_tree(os.path.join(mnt, m))
        want = shard_files(JOB, 10, self.target, 64 * 1024)
        want["commit_success.txt"] = b"ok\n"
        self.assertIsNotNone(after, "node %d's own step 10 vanished"
                             % self.target)
        self.assertEqual(
            (after["hash"], after["own"], got[self.target],
             restored == want),
            (own["hash"], True, 10, True),
            "a push of node %d's own key (reply %r) replaced its committed "
            "shard; on job restart node %d restored step %s with files %r"
            % (self.target, reply, self.target, got.get(self.target),
               sorted(restored or {})))


EC_JOB = "ecsec"


class EcHostilePeer(unittest.TestCase):
    """rs:2+1 on 6 nodes (two groups of three), step 1 protected; the
    hostile peer authenticates as a rank of the cluster (it has the
    secret) and sends ec_meta / ec_data to node 1."""

    def setUp(self):
        self.c = Cluster(6, ram_size="256M", restore_timeout=10,
                         extra="redundancy=rs:2+1")
        for d in self.c.nodes:
            d.extra_args.append("-d")
            d.expect_log(r"ec: (manifest|data fragment) .*refused|"
                         r"fragments of step \d+ dropped for step")
        self.daemons = list(self.c.nodes)
        self.addCleanup(self.c.close)
        self.c.start()
        self.secret = read_secret(self.c.secret)
        self.assertEqual(self.c.job_start(EC_JOB), {r: 0 for r in range(6)})
        self.c.save(EC_JOB, 1, size=32 * 1024)
        harness.wait_until(lambda: all("protected" in self.frags(r, 1) for r in range(6)),
                           60, "step 1 protected on every node")
        self.target = 1
        self.node = self.c.nodes[1]
        self.group = {}
        for r in range(6):
            m = harness.wait_until(lambda: re.search(
                r"ec: job=%s step=1 parity complete here \(.* group (\d+)\)" % EC_JOB,
                self.c.nodes[r].log_text()), 10, "node %d's group" % r)
            self.group[r] = int(m.group(1))
        self.mates = [r for r in range(6) if self.group[r] == self.group[1] and r != 1]
        self.others = [r for r in range(6) if self.group[r] != self.group[1]]
        # what "older than protected" means on node 1: its protected step
        # moves to 1 with the coordinator's event, a moment after step 1's
        # parity is on disk everywhere (a request for step 0 in between is
        # one node 1 still takes, and waits for its data)
        harness.wait_until(lambda: re.search(
            r"job %s: step 1 committed and replicated on every node" % EC_JOB,
            self.node.log_text()), 30, "node 1 knowing step 1 is protected job-wide")

    def frags(self, r, step=None):
        return harness.parity_files(self.c.nodes[r].ramdir, EC_JOB, step)

    def ram_used(self):
        return json.loads(harness.admin("status", self.node.ramdir, "--json"))["ram_used"]

    def call(self, rank, req):
        """One request on a data connection authenticated as rank: the
        reply object, or Refused."""
        with Wire(self.c.addrs[self.target]) as w:
            w.handshake(self.secret, rank=rank, purpose="data", server_rank=self.target)
            w.send(frame(NT_REQ, req, req_id=5))
            return w.recv_json()[2]

    def meta(self, rank, step, manifest, job=EC_JOB, owner=None):
        return self.call(rank, {"op": "ec_meta", "job": job, "step": step,
                                "owner": rank if owner is None else owner,
                                "manifest": b64(manifest)})

    def refused(self, errno_, fn, *a, **kw):
        with self.assertRaises(Refused) as cm:
            fn(*a, **kw)
        self.assertEqual(cm.exception.errno, errno_, cm.exception)
        self.node.check_alive()
        return cm.exception

    def some_manifest(self, n=1, tag=b""):
        files = {"state/f%d" % i: tag + b"x" * 10 for i in range(n)}
        return mf_encode(manifest_entries(files))

    def test_ec_meta_other_job_refused(self):
        mate = self.mates[0]
        self.refused(errno.EPERM, self.meta, mate, 2, self.some_manifest(), job="otherjob")
        self.assertFalse(os.path.exists(os.path.join(self.node.ramdir, "shards", "otherjob")))

    def test_ec_meta_older_than_protected_refused(self):
        # step 1 is the protected (safe) step: step 0 is older
        mate = self.mates[0]
        harness.wait_until(lambda: self.frags(1) == ["1"], 30, "only step 1's fragments")
        self.refused(errno.ERANGE, self.meta, mate, 0, self.some_manifest())
        self.assertEqual(self.frags(1), ["1"])

    def test_ec_meta_from_other_group_refused(self):
        other = self.others[0]
        self.refused(errno.EPERM, self.meta, other, 2, self.some_manifest())
        self.assertEqual(self.frags(1, 2), [])

    def test_ec_meta_never_replaces_a_manifest(self):
        mate = self.mates[0]
        path = os.path.join(harness.parity_dir(self.node.ramdir, EC_JOB, 1), "m%d.mf" % mate)
        with open(path, "rb") as f:
            real = f.read()
        e = self.refused(errno.EEXIST, self.meta, mate, 1, self.some_manifest())
        self.assertIn("other content", e.text)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), real, "the protected step's manifest is unchanged")
        # the owner's own bytes again (a retry, a re-send after a restart): accepted
        self.assertEqual(self.meta(mate, 1, real), {"ok": True})
        with open(path, "rb") as f:
            self.assertEqual(f.read(), real)

    def test_ec_meta_steps_far_ahead_bounded(self):
        mate = self.mates[0]
        for s in (1000, 1001, 1002, 1003):
            self.assertEqual(self.meta(mate, s, self.some_manifest()), {"ok": True})
        e = self.refused(errno.ERANGE, self.meta, mate, 1004, self.some_manifest())
        self.assertIn("too far ahead", e.text)
        self.assertEqual(self.frags(1), ["1", "1000", "1001", "1002", "1003"])
        # a lower step takes the place of the highest
        self.assertEqual(self.meta(mate, 500, self.some_manifest()), {"ok": True})
        self.assertEqual(self.frags(1), ["1", "1000", "1001", "1002", "500"])

    def test_ec_meta_bytes_count_in_ram_size(self):
        mate = self.mates[0]
        big = self.some_manifest(n=4000, tag=b"y")     # a manifest of ~100 KB
        before = self.ram_used()
        self.assertEqual(self.meta(mate, 2, big), {"ok": True})
        harness.wait_until(lambda: self.ram_used() >= before + len(big), 10,
                           "ram_used grows by the manifest's %d bytes" % len(big))

    def test_ec_data_other_job_or_far_step_refused(self):
        mate = self.mates[0]
        for job, step, err in (("otherjob", 2, errno.EPERM), (EC_JOB, 0, errno.ERANGE)):
            if err == errno.ERANGE:
                harness.wait_until(lambda: self.frags(1) == ["1"], 30, "only step 1's fragments")
            self.refused(err, self.call, mate, {"op": "ec_data", "job": job, "step": step,
                                                "group": self.group[1], "cw": 0, "slot": 0})
        self.assertFalse(os.path.exists(os.path.join(self.node.ramdir, "shards", "otherjob")))
        self.assertEqual(self.frags(1), ["1"])


# --- a connection flood with secret_file= (issue 22 item 5) -------------------

FLOOD_ADDRS = ["127.0.0.1"] + ["127.0.0.%d" % i for i in range(21, 40)]   # 20
FLOOD_PER_ADDR = 256


FLOOD_SCRIPT = r"""
import selectors, socket, sys, time
src, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sel = selectors.DefaultSelector()
held = 0
while True:
    while held < n:
        s = socket.socket()
        s.settimeout(2.0)
        try:
            s.bind((src, 0))
            s.connect((host, port))
        except OSError:
            s.close()
            time.sleep(0.01)
            break
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        held += 1
        time.sleep(0.0002)       # about 5,000 a second from each address
    for key, _ in sel.select(0.02):
        s = key.fileobj
        try:
            d = s.recv(4096)     # the CHALLENGE, never answered
        except BlockingIOError:
            continue
        except OSError:
            d = b""
        if not d:                # closed by the server: open another
            sel.unregister(s)
            s.close()
            held -= 1
"""


class Flooder:
    """FLOOD_PER_ADDR idle connections (never a HELLO) from each of
    FLOOD_ADDRS to addr, one process per address: 5,120, above the server's
    4,096 handshakes and its per-address bound; 127.0.0.1 is the peers' own
    address. Each one the server closes is replaced at once, so the bounds
    stay hit until stop()."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.procs = [subprocess.Popen([sys.executable, "-c", FLOOD_SCRIPT, a, host, port,
                                        str(FLOOD_PER_ADDR)],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
                      for a in FLOOD_ADDRS]

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()


class ConnectionFlood(unittest.TestCase):
    """20 addresses x 256 idle connections on a node with secret_file= used
    to trip "too many connections authenticating" (and the per-address
    bound for the peers' own 127.0.0.1): the push of a step committed
    during the flood failed 4 times in 7 s and was never tried again. Now
    the oldest unauthenticated connections are shed for new ones, and a
    failed push is retried until the step is replicated."""

    def setUp(self):
        self.c = Cluster(2, ram_size="256M", restore_timeout=10)
        self.daemons = list(self.c.nodes)
        self.addCleanup(self.c.close)
        self.c.start()
        self.assertEqual(self.c.job_start(JOB), {0: 0, 1: 0})
        self.c.save(JOB, 10, size=64 * 1024)
        self.c.wait_replicated(JOB, 10)

    def test_step_committed_during_a_flood_is_replicated(self):
        node1 = self.c.nodes[1]
        mark = node1.log_size()
        f = Flooder(self.c.addrs[1])
        self.addCleanup(f.stop)
        # the bounds are hit: the server sheds (it used to refuse)
        node1.wait_log(r"refused \d+ connection\(s\) in the last second; the last from "
                       r"127\.0\.0\.\d+:\d+: (too many|connection limit)", 30,
                       "node 1 turning flood connections away", since=mark)
        self.c.save(JOB, 11, size=64 * 1024)
        # during the flood: node 0's push to node 1 gets through
        self.c.wait_replicated(JOB, 11, timeout=60)
        fails = len(re.findall(r"replicating job=%s step=11 to rank 1 failed" % JOB,
                               self.c.nodes[0].log_text()))
        shed = re.findall(r"refused (\d+) connection\(s\) in the last second",
                          node1.log_from(mark))
        sys.stderr.write("\n  step 11 replicated during the flood after %d failed pushes; "
                         "node 1 turned away %d connections\n"
                         % (fails, sum(int(x) for x in shed)))
        f.stop()
        self.c.save(JOB, 12, size=64 * 1024)
        self.c.wait_replicated(JOB, 12, timeout=60)

    def test_failed_push_is_retried_until_the_peer_is_back(self):
        # node 1 away for longer than the old retries (1 + 2 + 4 s)
        node0, node1 = self.c.nodes
        node1.stop()
        mark = node0.log_size()
        self.c.save(JOB, 11, ranks=[0], size=64 * 1024)
        node0.wait_log(r"job=%s step=11: 1 of 1 peers do not have it yet; retrying" % JOB,
                       30, "node 0's push of step 11 failing", since=mark)
        harness.wait_until(lambda: len(re.findall(r"replicating job=%s step=11 to rank 1 failed"
                                          % JOB, node0.log_from(mark))) >= 5,
                   60, "node 0 trying step 11 five times")
        node1.start()
        harness.wait_until(lambda: (0, 11) in self.c.holds(1, JOB), 60,
                   "node 1 holding node 0's step 11")
        self.assertEqual(self.c.holds(1, JOB)[(0, 11)] in harness.COMMITTED_STATES, True)


class BucketOnlyNode(unittest.TestCase):
    """A node with a bucket and no peers is a job of its own and its own
    coordinator, on an ephemeral loopback port. Without secret_file= any
    local process could connect there and fetch the node's shards (files
    the mount keeps 0600 among them): it must make a secret of its own,
    readable by root only, that mtcfs-admin (root) still uses."""

    def setUp(self):
        self.bucket = tempfile.mkdtemp(prefix="mtcfs-bucket-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.bucket, True)
        self.d = harness.Daemon(opts="ram_size=256M,bucket=file://" + self.bucket,
                                extra_args=["-d"])
        self.addCleanup(self.d.stop)
        self.d.start()

    def test_loopback_port_wants_the_nodes_own_secret(self):
        d = self.d
        step = os.path.join(d.mnt, "1")
        os.mkdir(step)
        harness.write_file(os.path.join(step, "private.bin"), b"s3cret" * 1000, mode=0o600)
        harness.write_file(os.path.join(step, "commit_success.txt"), b"")
        harness.wait_committed(d.ramdir, 1, daemon=d)
        m = harness.wait_until(lambda: re.search(r"peer tier up listen=(127\.0\.0\.1:\d+)",
                                                 d.log_text()), 30, "the peer tier's port")
        addr = m.group(1)
        secret = os.path.join(d.ramdir, "peer.secret")
        st = os.stat(secret)
        self.assertEqual(st.st_mode & 0o777, 0o600, oct(st.st_mode))
        self.assertEqual(st.st_uid, 0)
        key = read_secret(secret)
        self.assertEqual(len(key), 64)
        # without the secret: refused at the handshake, nothing fetched
        with self.assertRaises((Refused, Closed, AssertionError, ConnectionError)):
            fetch_shard(addr, None, "default", 1, 0)
        with self.assertRaises((Refused, Closed, AssertionError, ConnectionError)):
            fetch_shard(addr, os.urandom(32).hex().encode(), "default", 1, 0)
        # the node's own secret works, and it is the node's shard
        _, files = fetch_shard(addr, key, "default", 1, 0)
        self.assertEqual(files["private.bin"], b"s3cret" * 1000)
        # root's mtcfs-admin reaches the node's coordinator with it
        out = harness.admin("steps", d.ramdir, "--job", "default", "--json")
        self.assertTrue(json.loads(out)["coordinator_reachable"], out)
        # a new secret at every start: the old one no longer opens it
        d.stop()
        d.start()
        m = harness.wait_until(lambda: re.findall(r"peer tier up listen=(127\.0\.0\.1:\d+)",
                                                  d.log_text()), 30, "the peer tier's port")
        self.assertNotEqual(read_secret(secret), key)
        with self.assertRaises((Refused, Closed, AssertionError, ConnectionError)):
            fetch_shard(m[-1], key, "default", 1, 0)


if __name__ == "__main__":
    harness.main()
