#!/usr/bin/python3
"""gcs_server: mtcfs's own Cloud Storage test server (JSON API subset).

Speaks the part of the Cloud Storage JSON API that mtcfs's bucket tier and
`gcloud storage` use, on a loopback port, with fault injection and a request
log so tests can state the exact requests a client sent:

  POST   /upload/storage/v1/b/B/o?uploadType=media|multipart|resumable
         (&name=, &ifGenerationMatch=); resumable sessions: PUT with
         Content-Range chunks (308 + Range), "bytes */N" status queries,
         a persisted partial offset when a chunk is cut by a reset
  GET    /storage/v1/b/B/o/NAME            object metadata (size, crc32c, ...)
  GET    /storage/v1/b/B/o/NAME?alt=media  data, with Range, x-goog-hash
  GET    /storage/v1/b/B/o?prefix=&delimiter=&pageToken=&maxResults=
  DELETE /storage/v1/b/B/o/NAME
  GET    /storage/v1/b/B                   bucket metadata (for gcloud)
  POST   /token                            OAuth2 JWT-bearer grant: verifies the
                                           RS256 signature and the claims
  GET    /computeMetadata/v1/instance/service-accounts/default/token
                                           metadata server (Metadata-Flavor)
Uploads are checked against the CRC32C (and MD5) the client declares
(400 on mismatch); ifGenerationMatch preconditions give 412.

Control endpoints (never logged, never faulted, never authenticated):
  POST /_fault   {"match": "upload|download|meta|list|delete|token|metadata|
                  any", "kind": "500|503|429|408|412|reset|truncate|corrupt|
                  slow|drop", "count": N, "after_bytes": K, "delay_ms": D,
                  "name": substring of the object name (a multipart
                  upload's from its body), "method": "PUT",
                  "query": "uploadType=resumable", "retry_after": S,
                  "skip": M (let M matching requests pass first)}
  GET  /_log     the requests seen, oldest first (see Log.add for fields)
  POST /_reset   {"log": true, "faults": true, "data": false, "config": false}
  POST /_config  {"auth": "none|bearer", "jwt_key": PEM (public, PKCS#8 or
                  PKCS#1), "client_email": ..., "token_ttl": seconds,
                  "deny": ["storage.objects.create", ...], "revoke": true,
                  "reject_tokens": bool, "max_results_cap": N,
                  "persist_granularity": bytes}
  POST /_corrupt {"bucket", "name", "kind": "flip|truncate", "offset": N}
                 damage a stored object without touching its metadata
  GET  /_objects the stored objects' metadata (for test assertions)

Run: /usr/bin/python3 gcs_server.py --port 0 [--host H] [--dir D] [--verbose]
     [--tls-cert CERT.pem --tls-key KEY.pem]   (HTTPS instead of HTTP)
The first line on stdout is "PORT=NNNN". With --exit-on-eof the server
exits when its stdin closes (its parent test died). Standard library only;
CRC32C uses ISA-L through ctypes when libisal is installed, else the
project's pure-Python tests/integration/crc32c.py.
"""

import argparse
import base64
import ctypes
import ctypes.util
import hashlib
import http.server
import importlib.util
import json
import os
import secrets
import socket
import socketserver
import ssl
import struct
import sys
import tempfile
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))


# --- CRC32C ------------------------------------------------------------------

def _load_pure_crc():
    path = os.path.join(HERE, "..", "integration", "crc32c.py")
    spec = importlib.util.spec_from_file_location("mtcfs_crc32c", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_pure = _load_pure_crc()


class _IsalCrc:
    """crc32_iscsi from libisal: the raw register, so invert in and out."""

    def __init__(self):
        name = ctypes.util.find_library("isal") or "libisal.so.2"
        self.lib = ctypes.CDLL(name)
        self.fn = self.lib.crc32_iscsi
        self.fn.restype = ctypes.c_uint32
        self.fn.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32)

    def __call__(self, data, crc=0):
        if isinstance(data, memoryview):
            data = data.tobytes()
        if isinstance(data, bytearray):
            n = len(data)
            if n == 0:
                return crc
            buf = (ctypes.c_char * n).from_buffer(data)
            addr = ctypes.addressof(buf)
        else:
            n = len(data)
            if n == 0:
                return crc
            addr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
        state = (~crc) & 0xFFFFFFFF
        off = 0
        while off < n:
            step = min(n - off, 1 << 30)
            state = self.fn(addr + off, step, state)
            off += step
        return (~state) & 0xFFFFFFFF


def _pick_crc(force_pure):
    if not force_pure:
        try:
            fast = _IsalCrc()
            for data, want in _pure.CHECK_VECTORS:
                if fast(data) != want:
                    raise ValueError("libisal disagrees")
            probe = os.urandom(5000)
            if fast(probe[1000:], fast(probe[:1000])) != _pure.crc32c(probe):
                raise ValueError("libisal chaining disagrees")
            return fast, "isa-l"
        except (OSError, AttributeError, ValueError):
            pass
    return _pure.crc32c, "pure-python"


crc32c = _pure.crc32c
CRC_IMPL = "pure-python"
MD5 = True                      # --no-md5: objects without md5Hash (like composites)


def md5_of(data):
    return hashlib.md5(data).digest() if MD5 else None


def crc_b64(c):
    return base64.b64encode(struct.pack(">I", c)).decode()


def b64_crc(s):
    raw = base64.b64decode(s, validate=True)
    if len(raw) != 4:
        raise ValueError("crc32c must be 4 bytes")
    return struct.unpack(">I", raw)[0]


# --- RSA / JWT verification (PKCS#1 v1.5, SHA-256) ----------------------------

def _der_read(buf, off):
    """One DER TLV at off: (tag, value_start, value_end)."""
    tag = buf[off]
    ln = buf[off + 1]
    off += 2
    if ln & 0x80:
        nb = ln & 0x7F
        ln = int.from_bytes(buf[off:off + nb], "big")
        off += nb
    if off + ln > len(buf):
        raise ValueError("DER length beyond input")
    return tag, off, off + ln


def _der_children(buf, start, end):
    out = []
    while start < end:
        tag, vs, ve = _der_read(buf, start)
        out.append((tag, vs, ve))
        start = ve
    return out


def _der_int(buf, vs, ve):
    return int.from_bytes(buf[vs:ve], "big")


def rsa_public_from_pem(pem):
    """(n, e) from a PEM public key, PKCS#8/PKCS#1 private key, or cert-less SA key."""
    lines = [ln.strip() for ln in pem.strip().splitlines()]
    kind = lines[0]
    der = base64.b64decode("".join(ln for ln in lines if not ln.startswith("-----")))
    tag, vs, ve = _der_read(der, 0)
    kids = _der_children(der, vs, ve)
    if "BEGIN PUBLIC KEY" in kind:              # SubjectPublicKeyInfo
        bt, bvs, bve = kids[1]
        rsa = der[bvs + 1:bve]                  # skip the unused-bits byte
        _, rvs, rve = _der_read(rsa, 0)
        n, e = _der_children(rsa, rvs, rve)[:2]
        return _der_int(rsa, n[1], n[2]), _der_int(rsa, e[1], e[2])
    if "BEGIN RSA PUBLIC KEY" in kind:          # PKCS#1 public
        return _der_int(der, kids[0][1], kids[0][2]), _der_int(der, kids[1][1], kids[1][2])
    if "BEGIN RSA PRIVATE KEY" in kind:         # PKCS#1 private: ver, n, e, ...
        return _der_int(der, kids[1][1], kids[1][2]), _der_int(der, kids[2][1], kids[2][2])
    if "BEGIN PRIVATE KEY" in kind:             # PKCS#8: ver, alg, OCTET STRING
        _, ovs, ove = kids[2]
        inner = der[ovs:ove]
        _, ivs, ive = _der_read(inner, 0)
        ik = _der_children(inner, ivs, ive)
        return _der_int(inner, ik[1][1], ik[1][2]), _der_int(inner, ik[2][1], ik[2][2])
    raise ValueError("unsupported key PEM: " + kind)


_SHA256_DIGESTINFO = bytes.fromhex("3031300d060960864801650304020105000420")


def rsa_verify_sha256(n, e, msg, sig):
    k = (n.bit_length() + 7) // 8
    if len(sig) != k:
        return False
    s = int.from_bytes(sig, "big")
    if s >= n:
        return False
    em = pow(s, e, n).to_bytes(k, "big")
    t = _SHA256_DIGESTINFO + hashlib.sha256(msg).digest()
    want = b"\x00\x01" + b"\xff" * (k - len(t) - 3) + b"\x00" + t
    return secrets.compare_digest(em, want)


def b64url_dec(s):
    s += "=" * (-len(s) % 4)
    return base64.urlsafe_b64decode(s)


# --- state -------------------------------------------------------------------

class Obj:
    __slots__ = ("data", "generation", "crc", "md5", "ctype", "created",
                 "meta", "path")

    def size(self):
        return len(self.data)


class Session:
    def __init__(self, bucket, name, total, meta, precond, ctype):
        self.bucket = bucket
        self.name = name
        self.total = total          # None until a chunk gives it
        self.meta = meta
        self.precond = precond
        self.ctype = ctype
        self.buf = bytearray()
        self.crc = 0
        self.md5 = hashlib.md5() if MD5 else None
        self.done = None            # the Obj once finalized
        self.lock = threading.Lock()


class Fault:
    def __init__(self, spec):
        self.match = spec.get("match", "any")
        self.kind = str(spec["kind"])
        self.count = int(spec.get("count", 1))
        self.after = int(spec.get("after_bytes", 0))
        self.delay = float(spec.get("delay_ms", 0)) / 1000.0
        self.name = spec.get("name")
        self.method = spec.get("method")
        self.query = spec.get("query")
        self.retry_after = spec.get("retry_after")
        self.skip = int(spec.get("skip", 0))
        self.hit = 0


class State:
    def __init__(self, datadir):
        self.lock = threading.Lock()
        self.objects = {}           # (bucket, name) -> Obj
        self.sessions = {}          # upload_id -> Session
        self.faults = []
        self.log = []
        self.datadir = datadir
        self.gen = int(time.time() * 1e6)
        self.tokens = {}            # token -> (expiry, who)
        self.ntokens = 0
        self.cfg = self.default_cfg()

    @staticmethod
    def default_cfg():
        return {"auth": "none", "jwt_keys": [], "client_email": None,
                "token_ttl": 3599, "deny": [], "reject_tokens": False,
                "max_results_cap": 0, "persist_granularity": 1}

    def next_gen(self):
        with self.lock:
            self.gen += 1
            return self.gen

    def take_fault(self, cls, method, name, query):
        with self.lock:
            for f in self.faults:
                if f.count <= 0:
                    continue
                if f.match != "any" and f.match != cls:
                    continue
                if f.match == "any" and cls in ("token", "metadata"):
                    continue
                if f.name is not None and (name is None or f.name not in name):
                    continue
                if f.method is not None and f.method != method:
                    continue
                if f.query is not None and f.query not in query:
                    continue
                if f.skip > 0:
                    f.skip -= 1
                    continue
                f.count -= 1
                f.hit += 1
                return f
        return None

    def store(self, bucket, name, data, crc, md5, ctype, meta):
        o = Obj()
        o.generation = self.next_gen()
        o.crc = crc
        o.md5 = md5
        o.ctype = ctype or "application/octet-stream"
        o.created = time.time()
        o.meta = meta or {}
        o.path = None
        if self.datadir:
            fd, p = tempfile.mkstemp(dir=self.datadir)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            o.path = p
            o.data = b""
            o.data = _FileData(p, len(data))
        else:
            o.data = data
        with self.lock:
            old = self.objects.get((bucket, name))
            self.objects[(bucket, name)] = o
        if old is not None:
            _drop(old)
        return o


class _FileData:
    """Object bytes kept in a file (--dir): len() and slicing like bytes."""

    def __init__(self, path, n):
        self.path = path
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, sl):
        start, stop, _ = sl.indices(self.n)
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(max(0, stop - start))


def _drop(o):
    if o.path:
        try:
            os.unlink(o.path)
        except OSError:
            pass


def rfc3339(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + \
        ".%03dZ" % int((t % 1) * 1000)


def obj_json(bucket, name, o):
    j = {
        "kind": "storage#object",
        "id": "%s/%s/%d" % (bucket, name, o.generation),
        "selfLink": "/storage/v1/b/%s/o/%s" % (bucket, urllib.parse.quote(name, safe="")),
        "mediaLink": "/download/storage/v1/b/%s/o/%s?generation=%d&alt=media" % (
            bucket, urllib.parse.quote(name, safe=""), o.generation),
        "name": name,
        "bucket": bucket,
        "generation": str(o.generation),
        "metageneration": "1",
        "contentType": o.ctype,
        "storageClass": "STANDARD",
        "size": str(o.size()),
        "crc32c": crc_b64(o.crc),
        "etag": base64.b64encode(struct.pack(">Q", o.generation)).decode(),
        "timeCreated": rfc3339(o.created),
        "updated": rfc3339(o.created),
        "timeStorageClassUpdated": rfc3339(o.created),
    }
    if o.md5 is not None:
        j["md5Hash"] = base64.b64encode(o.md5).decode()
    return j


PERM = {"upload": "storage.objects.create", "download": "storage.objects.get",
        "meta": "storage.objects.get", "list": "storage.objects.list",
        "delete": "storage.objects.delete", "bucket": "storage.buckets.get"}

LOG_HEADERS = ("content-type", "content-length", "content-range", "range",
               "x-goog-hash", "authorization", "x-upload-content-length",
               "x-upload-content-type", "metadata-flavor", "transfer-encoding",
               "expect", "user-agent")


class Abort(Exception):
    """The handler has already dealt with the connection (reset, drop)."""


# --- the handler -------------------------------------------------------------

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mtcfs-gcs-test/1"
    disable_nagle_algorithm = True      # headers and body go out as separate writes
    st = None                       # State, set by main()
    verbose = False
    scheme = "http"                 # "https" with --tls-cert: in the URLs it hands out

    def log_message(self, fmt, *args):
        if self.verbose:
            sys.stderr.write("gcs_server: " + (fmt % args) + "\n")

    def finish(self):
        try:
            super().finish()
        except OSError:
            pass

    # plumbing

    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    def dispatch(self):
        u = urllib.parse.urlsplit(self.path)
        self.rawpath = u.path
        self.rawquery = u.query
        self.q = dict(urllib.parse.parse_qsl(u.query, keep_blank_values=True))
        self.entry = None
        self.body_read = False
        try:
            if u.path.startswith("/_"):
                return self.control(u.path)
            self.route(u.path)
        except Abort:
            self.close_connection = True
        except (ConnectionError, BrokenPipeError, socket.timeout):
            self.close_connection = True

    def read_body(self, limit=None):
        """The request body (Content-Length or chunked). With limit, read at
        most limit bytes and return (data, complete)."""
        self.body_read = True
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            out = bytearray()
            while True:
                line = self.rfile.readline(65537)
                n = int(line.split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                out += self.rfile.read(n)
                self.rfile.readline(65537)
            data = bytes(out)
            if limit is not None:
                return data[:limit], len(data) <= limit
            return data
        n = int(self.headers.get("Content-Length", "0") or "0")
        if limit is not None and limit < n:
            return self._read_n(limit), False
        data = self._read_n(n)
        return (data, True) if limit is not None else data

    def _read_n(self, n):
        buf = bytearray(n)
        mv = memoryview(buf)
        got = 0
        while got < n:
            k = self.rfile.readinto(mv[got:])
            if not k:
                raise ConnectionError("client closed mid-body")
            got += k
        return buf

    def discard_body(self):
        if not self.body_read:
            try:
                self.read_body()
            except (ValueError, ConnectionError):
                self.close_connection = True

    def send(self, status, body=b"", ctype="application/json; charset=UTF-8",
             headers=None, close=False):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        self.discard_body()
        if self.entry is not None:
            self.entry["status"] = status   # before the client can see the answer
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if status not in (204, 304):
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, message, reason="invalid", headers=None):
        self.send(status, {"error": {"code": status, "message": message,
                                     "errors": [{"message": message, "domain": "global",
                                                 "reason": reason}]}},
                  headers=headers)

    def reset(self, status="reset"):
        """Abort the connection with a TCP RST."""
        if self.entry is not None:
            self.entry["status"] = status
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.wfile.flush()
        except OSError:
            pass
        for f in (self.rfile, self.wfile):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.connection.close()
        except OSError:
            pass
        raise Abort()

    # the log

    def log_request_entry(self, cls, bucket=None, name=None):
        hdrs = {}
        for k in LOG_HEADERS:
            v = self.headers.get(k)
            if v is not None:
                hdrs[k] = v
        e = {"t": time.time(), "method": self.command, "path": self.rawpath,
             "rawquery": self.rawquery, "query": self.q, "headers": hdrs,
             "class": cls, "bucket": bucket, "name": name, "status": None}
        with self.st.lock:
            self.st.log.append(e)
            if len(self.st.log) > 200000:
                del self.st.log[:100000]
        self.entry = e
        return e

    # control

    def control(self, path):
        st = self.st
        if path == "/_log" and self.command == "GET":
            with st.lock:
                return self.send(200, list(st.log))
        if path == "/_objects" and self.command == "GET":
            with st.lock:
                items = [obj_json(b, n, o) for (b, n), o in sorted(st.objects.items())]
            return self.send(200, items)
        body = self.read_body() if self.command in ("POST", "PUT") else b""
        req = json.loads(body or b"{}")
        if path == "/_fault":
            specs = req if isinstance(req, list) else [req]
            with st.lock:
                st.faults.extend(Fault(s) for s in specs)
            return self.send(200, {"ok": True})
        if path == "/_reset":
            with st.lock:
                if req.get("log", True):
                    st.log.clear()
                if req.get("faults", True):
                    st.faults.clear()
                if req.get("data", False):
                    for o in st.objects.values():
                        _drop(o)
                    st.objects.clear()
                    st.sessions.clear()
                if req.get("config", False):
                    st.cfg = st.default_cfg()
                    st.tokens.clear()
            return self.send(200, {"ok": True})
        if path == "/_config":
            with st.lock:
                for k, v in req.items():
                    if k == "jwt_key":
                        st.cfg["jwt_keys"].append(rsa_public_from_pem(v))
                    elif k == "revoke":
                        if v:
                            st.tokens.clear()
                    elif k in st.cfg:
                        st.cfg[k] = v
                    else:
                        return self.send(400, {"error": "unknown config " + k})
            return self.send(200, {"ok": True, "crc": CRC_IMPL})
        if path == "/_corrupt":
            key = (req["bucket"], req["name"])
            with st.lock:
                o = st.objects.get(key)
                if o is None:
                    return self.send(404, {"error": "no such object"})
                data = bytearray(o.data[0:len(o.data)])   # a copy: in-flight readers keep theirs
                off = int(req.get("offset", 0))
                if req.get("kind", "flip") == "flip":
                    data[off] ^= 0x5A
                else:
                    del data[off:]
                o.data = bytes(data)
                o.path = None
            return self.send(200, {"ok": True})
        if path == "/_faults" and self.command == "GET":
            with st.lock:
                return self.send(200, [{"kind": f.kind, "match": f.match, "count": f.count,
                                        "hit": f.hit} for f in st.faults])
        return self.send(404, {"error": "unknown control " + path})

    # routing

    def route(self, path):
        parts = path.split("/")
        if path == "/token" and self.command == "POST":
            self.log_request_entry("token")
            return self.token()
        if path == "/computeMetadata/v1/instance/service-accounts/default/token":
            self.log_request_entry("metadata")
            return self.metadata()
        # /upload/storage/v1/b/B/o
        if len(parts) == 7 and parts[1:5] == ["upload", "storage", "v1", "b"] and parts[6] == "o":
            bucket = urllib.parse.unquote(parts[5])
            if self.command == "POST":
                return self.upload_start(bucket)
            if self.command == "PUT" and "upload_id" in self.q:
                return self.upload_chunk(bucket)
            if self.command == "DELETE" and "upload_id" in self.q:
                self.log_request_entry("upload", bucket)
                with self.st.lock:
                    self.st.sessions.pop(self.q["upload_id"], None)
                return self.send(499, b"")
        # /storage/v1/b/B[/o[/NAME]]
        if len(parts) >= 5 and parts[1:4] == ["storage", "v1", "b"]:
            bucket = urllib.parse.unquote(parts[4])
            if len(parts) == 5 and self.command == "GET":
                self.log_request_entry("bucket", bucket)
                if self.auth("bucket"):
                    return
                return self.send(200, {"kind": "storage#bucket", "id": bucket, "name": bucket,
                                       "projectNumber": "0", "metageneration": "1",
                                       "location": "US", "storageClass": "STANDARD",
                                       "timeCreated": rfc3339(0), "updated": rfc3339(0),
                                       "locationType": "multi-region"})
            if len(parts) == 6 and parts[5] == "o" and self.command == "GET":
                return self.list_objects(bucket)
            if len(parts) >= 7 and parts[5] == "o":
                name = urllib.parse.unquote("/".join(parts[6:]))
                if self.command == "GET" and self.q.get("alt") == "media":
                    return self.download(bucket, name)
                if self.command == "GET":
                    return self.get_meta(bucket, name)
                if self.command == "DELETE":
                    return self.delete(bucket, name)
        # /download/storage/v1/b/B/o/NAME (mediaLink)
        if len(parts) >= 8 and parts[1:5] == ["download", "storage", "v1", "b"] and parts[6] == "o":
            bucket = urllib.parse.unquote(parts[5])
            name = urllib.parse.unquote("/".join(parts[7:]))
            return self.download(bucket, name)
        self.log_request_entry("unknown")
        return self.error(404, "Not Found: %s %s" % (self.command, path), "notFound")

    # auth and faults

    def auth(self, cls, bucket=None):
        """True when the request was answered with 401/403."""
        st = self.st
        if st.cfg["auth"] != "bearer":
            return False
        perm = PERM.get(cls, "storage.objects.get")
        h = self.headers.get("Authorization", "")
        if not h.startswith("Bearer "):
            self.error(401, "Anonymous caller does not have %s access to the Google Cloud "
                       "Storage object. Permission '%s' denied on resource (or it may not "
                       "exist)." % (perm, perm), "required",
                       headers={"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/"'})
            return True
        tok = h[7:].strip()
        with st.lock:
            rec = st.tokens.get(tok)
            reject = st.cfg["reject_tokens"]
            deny = list(st.cfg["deny"])
        if rec is None or rec[0] < time.time() or reject:
            self.error(401, "Invalid Credentials", "authError",
                       headers={"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/", '
                                'error="invalid_token"'})
            return True
        if perm in deny:
            self.error(403, "%s does not have %s access to the Google Cloud Storage object. "
                       "Permission '%s' denied on resource (or it may not exist)."
                       % (rec[1], perm, perm), "forbidden")
            return True
        return False

    def fault(self, cls, name=None):
        """Apply an injected fault before the request is processed. Returns
        the fault when it must act later (reset/truncate/corrupt/drop after
        some bytes), None when the request goes on normally."""
        f = self.st.take_fault(cls, self.command, name, self.rawquery)
        if f is None:
            return None
        if self.entry is not None:
            self.entry["fault"] = f.kind
        if f.kind == "slow":
            time.sleep(f.delay)
            return None
        if f.kind.isdigit():
            code = int(f.kind)
            hdrs = {}
            if f.retry_after is not None:
                hdrs["Retry-After"] = str(f.retry_after)
            msgs = {408: "Request Timeout", 412: "At least one of the pre-conditions you "
                    "specified did not hold.", 429: "The rate of change requests to the "
                    "object is too high.", 500: "Internal error", 503: "Service Unavailable"}
            self.error(code, msgs.get(code, "injected %d" % code),
                       "conditionNotMet" if code == 412 else "backendError", headers=hdrs)
            raise Abort() if code == 408 else _Handled()
        return f

    # token endpoints

    def grant(self, who):
        st = self.st
        with st.lock:
            st.ntokens += 1
            tok = "ya29.test-%d-%s" % (st.ntokens, secrets.token_hex(8))
            ttl = int(st.cfg["token_ttl"])
            st.tokens[tok] = (time.time() + ttl, who)
        return {"access_token": tok, "expires_in": ttl, "token_type": "Bearer"}

    def token(self):
        try:
            self.fault("token")
        except _Handled:
            return
        body = self.read_body().decode()
        form = dict(urllib.parse.parse_qsl(body))
        self.entry["form"] = {k: v for k, v in form.items() if k != "assertion"}
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return self.send(400, {"error": "unsupported_grant_type"})
        jwt = form.get("assertion", "")
        try:
            h64, c64, s64 = jwt.split(".")
            hdr = json.loads(b64url_dec(h64))
            claims = json.loads(b64url_dec(c64))
            sig = b64url_dec(s64)
        except ValueError:
            return self.send(400, {"error": "invalid_grant", "error_description": "bad JWT"})
        self.entry["jwt_header"] = hdr
        self.entry["jwt_claims"] = claims
        if hdr.get("alg") != "RS256":
            return self.send(400, {"error": "invalid_grant", "error_description": "alg"})
        msg = (h64 + "." + c64).encode()
        with self.st.lock:
            keys = list(self.st.cfg["jwt_keys"])
            email = self.st.cfg["client_email"]
        if not any(rsa_verify_sha256(n, e, msg, sig) for n, e in keys):
            self.entry["jwt_ok"] = False
            return self.send(400, {"error": "invalid_grant",
                                   "error_description": "Invalid JWT Signature."})
        self.entry["jwt_ok"] = True
        now = time.time()
        host = self.headers.get("Host", "")
        why = None
        if email is not None and claims.get("iss") != email:
            why = "iss"
        elif "devstorage" not in claims.get("scope", "") and \
                "cloud-platform" not in claims.get("scope", ""):
            why = "scope"
        elif claims.get("aud") != "%s://%s/token" % (self.scheme, host):
            why = "aud"
        elif not (claims.get("iat", 0) <= now + 60 and claims.get("exp", 0) > now and
                  claims.get("exp", 0) - claims.get("iat", 0) <= 3600):
            why = "iat/exp"
        if why:
            return self.send(400, {"error": "invalid_grant",
                                   "error_description": "bad claim " + why})
        return self.send(200, self.grant(claims.get("iss")))

    def metadata(self):
        try:
            self.fault("metadata")
        except _Handled:
            return
        if self.headers.get("Metadata-Flavor") != "Google":
            return self.send(403, "Missing required header: Metadata-Flavor", "text/html")
        return self.send(200, self.grant("default-sa@test.iam.gserviceaccount.com"))

    # uploads

    def upload_start(self, bucket):
        st = self.st
        utype = self.q.get("uploadType", "media")
        e = self.log_request_entry("upload", bucket, self.q.get("name"))
        if self.auth("upload"):
            return
        try:
            f = self.fault("upload", self.q.get("name"))
        except _Handled:
            return
        ctype = self.headers.get("Content-Type", "")
        if utype == "resumable":
            body = self.read_body()
            meta = json.loads(body) if body else {}
            e["metadata"] = meta
            name = meta.get("name") or self.q.get("name")
            if not name:
                return self.error(400, "Required object name")
            e["name"] = name
            if f is not None and f.kind in ("reset", "drop"):
                self.reset()
            pre = self.precondition(bucket, name)
            if pre:
                return
            total = self.headers.get("X-Upload-Content-Length")
            sid = secrets.token_hex(12)
            s = Session(bucket, name, int(total) if total else None, meta,
                        self.q.get("ifGenerationMatch"),
                        self.headers.get("X-Upload-Content-Type") or meta.get("contentType"))
            with st.lock:
                st.sessions[sid] = s
            host = self.headers.get("Host", "")
            loc = "%s://%s/upload/storage/v1/b/%s/o?uploadType=resumable&name=%s&upload_id=%s" % (
                self.scheme, host, urllib.parse.quote(bucket, safe=""), urllib.parse.quote(name, safe=""), sid)
            e["upload_id"] = sid
            return self.send(200, b"", headers={"Location": loc, "X-GUploader-UploadID": sid})
        if utype == "multipart":
            body = self.read_body()
            try:
                meta, data, dctype = parse_multipart(ctype, body)
            except ValueError as ex:
                return self.error(400, "bad multipart body: %s" % ex)
            e["metadata"] = meta
            name = meta.get("name") or self.q.get("name")
            e["name"] = name
            e["body_len"] = len(data)
            if f is None and name and not self.q.get("name"):
                # a fault's "name" filter also matches the object name
                # that only the multipart body carries (.meta, manifests)
                try:
                    f = self.fault("upload", name)
                except _Handled:
                    return
            return self.finish_upload(bucket, name, data, crc32c(data),
                                      md5_of(data), meta,
                                      meta.get("contentType") or dctype, f)
        if utype == "media":
            name = self.q.get("name")
            if not name:
                return self.error(400, "Required object name (the name query parameter)")
            if f is not None and f.kind == "reset":
                self.read_body(limit=f.after)
                self.reset()
            data = self.read_body()
            e["body_len"] = len(data)
            return self.finish_upload(bucket, name, data, crc32c(data),
                                      md5_of(data), {}, ctype, f)
        return self.error(400, "unknown uploadType " + utype)

    def precondition(self, bucket, name, pre=None):
        if pre is None:
            pre = self.q.get("ifGenerationMatch")
        if pre is None:
            return False
        with self.st.lock:
            o = self.st.objects.get((bucket, name))
        cur = o.generation if o is not None else 0
        if int(pre) != cur:
            self.error(412, "At least one of the pre-conditions you specified did not hold.",
                       "conditionNotMet")
            return True
        return False

    def check_hashes(self, meta, crc, md5):
        want = []
        if meta.get("crc32c"):
            want.append(("crc32c", meta["crc32c"]))
        if meta.get("md5Hash"):
            want.append(("md5", meta["md5Hash"]))
        for part in self.headers.get("X-Goog-Hash", "").split(","):
            k, _, v = part.strip().partition("=")
            if k in ("crc32c", "md5") and v:
                want.append((k, v))
        for k, v in want:
            if k == "crc32c":
                try:
                    if b64_crc(v) != crc:
                        return ("Provided CRC32C \"%s\" doesn't match calculated CRC32C \"%s\"."
                                % (v, crc_b64(crc)))
                except ValueError:
                    return "Invalid CRC32C value %r" % v
            elif md5 is not None and base64.b64decode(v) != md5:
                return ("Provided MD5 hash \"%s\" doesn't match calculated MD5 hash \"%s\"."
                        % (v, base64.b64encode(md5).decode()))
        return None

    def finish_upload(self, bucket, name, data, crc, md5, meta, ctype, f, pre=None):
        if not name:
            return self.error(400, "Required object name")
        bad = self.check_hashes(meta, crc, md5)
        if bad:
            return self.error(400, bad)
        if self.precondition(bucket, name, pre):
            return
        o = self.st.store(bucket, name, data, crc, md5, ctype, meta.get("metadata"))
        if f is not None and f.kind == "drop":
            self.reset()            # committed, but the client never hears of it
        return self.send(200, obj_json(bucket, name, o))

    def upload_chunk(self, bucket):
        st = self.st
        sid = self.q["upload_id"]
        with st.lock:
            s = st.sessions.get(sid)
        e = self.log_request_entry("upload", bucket, s.name if s else self.q.get("name"))
        e["upload_id"] = sid
        if s is None:
            return self.error(404, "No such upload session", "notFound")
        try:
            f = self.fault("upload", s.name)
        except _Handled:
            return
        cr = self.headers.get("Content-Range", "")
        if not cr.startswith("bytes "):
            return self.error(400, "Content-Range required")
        rng, _, total = cr[6:].partition("/")
        with s.lock:
            if total != "*":
                s.total = int(total)
            if rng == "*":                              # status query
                self.discard_body()
                if s.done is not None:
                    return self.send(200, obj_json(s.bucket, s.name, s.done))
                return self.send_308(s)
            start, _, end = rng.partition("-")
            start, end = int(start), int(end)
            n = end - start + 1
            final = s.total is not None and end + 1 == s.total
            if s.done is not None:
                self.discard_body()
                return self.send(200, obj_json(s.bucket, s.name, s.done))
            if start > len(s.buf):
                return self.error(400, "Content-Range starts at %d beyond the persisted %d"
                                  % (start, len(s.buf)))
            if not final and n % (256 << 10):
                return self.error(400, "non-final chunk of %d bytes is not a multiple of "
                                  "256 KiB" % n)
            if f is not None and f.kind == "reset":
                got, _ = self.read_body(limit=f.after)
                self.absorb(s, start, got)
                self.reset()
            data = self.read_body()
            if len(data) != n:
                return self.error(400, "body of %d bytes for a range of %d" % (len(data), n))
            self.absorb(s, start, data)
            e["persisted"] = len(s.buf)
            if s.total is None or len(s.buf) < s.total:
                return self.send_308(s)
            if len(s.buf) > s.total:
                return self.error(400, "more bytes than the declared size")
            crc, md5 = s.crc, s.md5.digest() if s.md5 else None
            bad = self.check_hashes(s.meta, crc, md5)
            if bad:
                with st.lock:
                    st.sessions.pop(sid, None)
                return self.error(400, bad)
            if self.precondition(s.bucket, s.name, s.precond):
                return
            s.done = st.store(s.bucket, s.name, s.buf, crc, md5, s.ctype,
                              s.meta.get("metadata"))
            s.buf = bytearray()
            if f is not None and f.kind == "drop":
                self.reset()
            return self.send(200, obj_json(s.bucket, s.name, s.done))

    def absorb(self, s, start, data):
        """Append data given at offset start, skipping what is already persisted."""
        skip = len(s.buf) - start
        if skip > 0:
            data = data[skip:]
        if not data:
            return
        g = max(1, int(self.st.cfg["persist_granularity"]))
        keep = ((len(s.buf) + len(data)) // g) * g - len(s.buf) if g > 1 else len(data)
        if keep <= 0:
            return
        data = data[:keep]
        s.buf += data
        s.crc = crc32c(data, s.crc)
        if s.md5:
            s.md5.update(data)

    def send_308(self, s):
        hdrs = {}
        if len(s.buf):
            hdrs["Range"] = "bytes=0-%d" % (len(s.buf) - 1)
        self.send(308, b"", "text/plain", headers=hdrs)

    # reads

    def lookup(self, bucket, name):
        with self.st.lock:
            o = self.st.objects.get((bucket, name))
        gen = self.q.get("generation")
        if o is not None and gen is not None and int(gen) != o.generation:
            o = None
        if o is None:
            self.error(404, "No such object: %s/%s" % (bucket, name), "notFound")
        return o

    def get_meta(self, bucket, name):
        self.log_request_entry("meta", bucket, name)
        if self.auth("meta"):
            return
        try:
            self.fault("meta", name)
        except _Handled:
            return
        o = self.lookup(bucket, name)
        if o is not None:
            self.send(200, obj_json(bucket, name, o))

    def download(self, bucket, name):
        e = self.log_request_entry("download", bucket, name)
        if self.auth("download"):
            return
        try:
            f = self.fault("download", name)
        except _Handled:
            return
        o = self.lookup(bucket, name)
        if o is None:
            return
        size = o.size()
        start, end = 0, size - 1
        status = 200
        rh = self.headers.get("Range")
        hdrs = {"x-goog-hash": "crc32c=%s" % crc_b64(o.crc) + (
                    ",md5=" + base64.b64encode(o.md5).decode() if o.md5 else ""),
                "x-goog-generation": str(o.generation), "x-goog-metageneration": "1",
                "x-goog-stored-content-length": str(size),
                "x-goog-stored-content-encoding": "identity",
                "Accept-Ranges": "bytes"}
        if rh:
            try:
                unit, _, spec = rh.partition("=")
                a, _, b = spec.partition("-")
                if unit.strip() != "bytes" or "," in spec:
                    raise ValueError
                if a == "":
                    start, end = max(0, size - int(b)), size - 1
                else:
                    start = int(a)
                    end = min(int(b), size - 1) if b else size - 1
            except ValueError:
                return self.error(400, "bad Range " + rh)
            if start >= size:
                hdrs = {"Content-Range": "bytes */%d" % size}
                return self.error(416, "The requested range cannot be satisfied.",
                                  "requestedRangeNotSatisfiable", headers=hdrs)
            status = 206
            hdrs["Content-Range"] = "bytes %d-%d/%d" % (start, end, size)
        e["range"] = [start, end]
        body = memoryview(o.data)[start:end + 1] if isinstance(o.data, (bytes, bytearray)) \
            else o.data[start:end + 1]
        if f is not None and f.kind == "corrupt" and len(body):
            body = bytearray(body)
            body[min(f.after, len(body) - 1)] ^= 0x01
            body = bytes(body)
        e["status"] = "truncated" if f is not None and f.kind in ("reset", "truncate") else status
        self.send_response(status)
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.send_header("Content-Type", o.ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if f is not None and f.kind in ("reset", "truncate"):
            self.wfile.write(body[:f.after])
            self.wfile.flush()
            if f.kind == "reset":
                self.reset(status="truncated")
            self.close_connection = True
            raise Abort()
        mv = memoryview(body)
        for off in range(0, len(mv), 8 << 20):
            self.wfile.write(mv[off:off + (8 << 20)])

    def list_objects(self, bucket):
        self.log_request_entry("list", bucket)
        if self.auth("list"):
            return
        try:
            self.fault("list")
        except _Handled:
            return
        prefix = self.q.get("prefix", "")
        delim = self.q.get("delimiter", "")
        try:
            maxr = int(self.q.get("maxResults", "1000"))
        except ValueError:
            return self.error(400, "bad maxResults")
        maxr = max(1, min(maxr, 1000))
        cap = int(self.st.cfg["max_results_cap"])
        if cap:
            maxr = min(maxr, cap)
        token = self.q.get("pageToken")
        after = base64.urlsafe_b64decode(token.encode()).decode() if token else None
        with self.st.lock:
            names = sorted(n for (b, n) in self.st.objects if b == bucket and n.startswith(prefix))
            objs = {n: self.st.objects[(bucket, n)] for n in names}
        entries = []            # (key, is_prefix)
        seen = set()
        for n in names:
            rest = n[len(prefix):]
            if delim and delim in rest:
                p = prefix + rest[:rest.index(delim) + len(delim)]
                if p not in seen:
                    seen.add(p)
                    entries.append((p, True))
            else:
                entries.append((n, False))
        entries.sort()
        if after is not None:
            entries = [x for x in entries if x[0] > after]
        page, more = entries[:maxr], len(entries) > maxr
        out = {"kind": "storage#objects"}
        items = [obj_json(bucket, k, objs[k]) for k, p in page if not p]
        prefs = [k for k, p in page if p]
        if items:
            out["items"] = items
        if prefs:
            out["prefixes"] = prefs
        if more:
            out["nextPageToken"] = base64.urlsafe_b64encode(page[-1][0].encode()).decode()
        self.send(200, out)

    def delete(self, bucket, name):
        self.log_request_entry("delete", bucket, name)
        if self.auth("delete"):
            return
        try:
            f = self.fault("delete", name)
        except _Handled:
            return
        if self.lookup(bucket, name) is None:
            return
        pre = self.q.get("ifGenerationMatch")
        if pre is not None and self.precondition(bucket, name, pre):
            return
        with self.st.lock:
            o = self.st.objects.pop((bucket, name), None)
        if o is not None:
            _drop(o)
        if f is not None and f.kind == "drop":
            self.reset()
        self.send(204)


class _Handled(Exception):
    """An injected error reply has been sent."""


def parse_multipart(ctype, body):
    """(metadata dict, data bytes, data content type) of a multipart/related
    body. Tolerant like real servers: a quoted boundary ("..." or '...', as
    gcloud's apitools sends), CRLF or bare LF line ends, a preamble."""
    bnd = None
    for p in ctype.split(";"):
        k, _, v = p.strip().partition("=")
        if k.lower() == "boundary":
            bnd = v.strip().strip("\"'")
    if not ctype.lower().startswith("multipart/related") or not bnd:
        raise ValueError("not multipart/related with a boundary")
    delim = b"--" + bnd.encode()
    pos = body.find(delim)
    if pos < 0 or (pos > 0 and body[pos - 1:pos] != b"\n"):
        raise ValueError("no opening boundary")
    pos += len(delim)
    parts = []
    while True:
        if body[pos:pos + 2] == b"--":
            break
        nl = body.find(b"\n", pos)
        if nl < 0:
            raise ValueError("boundary line not ended")
        pos = nl + 1
        hdrs = {}
        while True:
            nl = body.find(b"\n", pos)
            if nl < 0:
                raise ValueError("part headers not ended")
            line = body[pos:nl].rstrip(b"\r")
            pos = nl + 1
            if not line:
                break
            k, _, v = line.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        nxt = body.find(b"\n" + delim, pos - 1)
        if nxt < 0:
            raise ValueError("part without closing boundary")
        end = nxt - 1 if nxt > pos and body[nxt - 1:nxt] == b"\r" else nxt
        parts.append((hdrs, body[pos:max(pos, end)]))
        pos = nxt + 1 + len(delim)
    if len(parts) != 2:
        raise ValueError("want 2 parts, got %d" % len(parts))
    meta = json.loads(parts[0][1] or b"{}")
    return meta, parts[1][1], parts[1][0].get("content-type")


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        if Handler.verbose:
            super().handle_error(request, client_address)


def main():
    global crc32c, CRC_IMPL, MD5
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--dir", help="keep object data in files here (default: memory)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--pure-crc", action="store_true", help="do not use libisal")
    ap.add_argument("--no-md5", action="store_true",
                    help="no md5Hash (saves the server's CPU in benchmarks)")
    ap.add_argument("--exit-on-eof", action="store_true",
                    help="exit when stdin reaches EOF (the parent died)")
    ap.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (chain)")
    ap.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    args = ap.parse_args()
    if bool(args.tls_cert) != bool(args.tls_key):
        ap.error("--tls-cert and --tls-key go together")
    crc32c, CRC_IMPL = _pick_crc(args.pure_crc)
    MD5 = not args.no_md5
    Handler.st = State(args.dir)
    Handler.verbose = args.verbose
    srv = Server((args.host, args.port), Handler)
    if args.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        # the handshake runs on the handler's first read, in its own thread:
        # a client that never completes one cannot stall accept()
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True,
                                     do_handshake_on_connect=False)
        Handler.scheme = "https"
    sys.stdout.write("PORT=%d\n" % srv.server_address[1])
    sys.stdout.flush()
    if args.verbose:
        sys.stderr.write("gcs_server: listening on %s:%d, crc32c via %s\n"
                         % (args.host, srv.server_address[1], CRC_IMPL))
    if args.exit_on_eof:
        def watch():
            try:
                while sys.stdin.buffer.read(4096):
                    pass
            except OSError:
                pass
            os._exit(0)
        threading.Thread(target=watch, daemon=True).start()
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
