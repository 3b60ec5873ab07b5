"""The one launcher of the Cloud Storage test server for every Python user:
the integration tests, the fault suite (tests/fault/matrix.py) and the bench
(tests/bench/run).

    srv = GcsServer()                      # http://127.0.0.1:PORT
    srv = GcsServer(cert=c, key=k)         # https:// with that certificate
    srv = GcsServer(host="10.213.1.1", args=["--no-md5"], stderr=f)
    srv.host ("IP:PORT", for STORAGE_EMULATOR_HOST), srv.base (the URL),
    srv.request(), srv.call() (the /_control endpoints, JSON), srv.stop()

tests/gcs_server/gcs_server.py is started with --port 0 and prints PORT=N
once it listens: that line, not a sleep, says it is ready. --exit-on-eof:
the server also goes when this process dies (its stdin closes), and every
server still running at exit is stopped here.

Standard library only: run with /usr/bin/python3.
"""

import atexit
import json
import os
import select
import subprocess
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SERVER = os.path.join(REPO, "tests", "gcs_server", "gcs_server.py")
START_TIMEOUT = 30.0

_LIVE = set()
_MAIN_PID = os.getpid()


class GcsServerError(AssertionError):
    pass


class GcsServer:
    def __init__(self, cert=None, key=None, host="127.0.0.1", args=(), stderr=None,
                 timeout=START_TIMEOUT):
        argv = ["/usr/bin/python3", SERVER, "--host", host, "--port", "0", "--exit-on-eof"]
        if cert:                      # HTTPS with this certificate and key
            argv += ["--tls-cert", cert, "--tls-key", key]
        argv += list(args)
        self.p = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if stderr is None else stderr,
            start_new_session=True)
        _LIVE.add(self)
        try:
            r, _, _ = select.select([self.p.stdout], [], [], timeout)
            line = self.p.stdout.readline().decode() if r else ""
            if not line.startswith("PORT="):
                raise GcsServerError("gcs_server.py did not print PORT= within %.0fs: %r"
                                     % (timeout, line))
            self.port = int(line[5:])
        except BaseException:
            self.stop()
            raise
        self.host = "%s:%d" % (host, self.port)
        self.base = ("https://" if cert else "http://") + self.host
        # the driver talks to the server directly, never through a proxy
        # of the environment
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def pid(self):
        return self.p.pid if self.p is not None else None

    def request(self, method, path, body=None, headers=None, ok=(200,), timeout=60):
        """(status, body) of one request; an HTTP status outside ok raises
        (ok=None: any status is returned)."""
        req = urllib.request.Request(self.base + path, data=body, method=method,
                                     headers=headers or {})
        try:
            with self.opener.open(req, timeout=timeout) as r:
                status, data = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        if ok and status not in ok:
            raise GcsServerError("%s %s: HTTP %d: %s" % (method, path, status, data[:500]))
        return status, data

    def call(self, path, body=None):
        """A control endpoint: JSON in (POST) or GET, JSON out."""
        if body is None:
            _, data = self.request("GET", path)
        else:
            _, data = self.request("POST", path, json.dumps(body).encode(),
                                   {"Content-Type": "application/json"})
        return json.loads(data or b"null")

    def log(self):
        """The server's request log (/_log): one dict per request."""
        return self.call("/_log")

    def stop(self):
        _LIVE.discard(self)
        if self.p is None:
            return
        p, self.p = self.p, None
        try:
            p.stdin.close()
        except OSError:
            pass
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def _stop_all():
    if os.getpid() != _MAIN_PID:        # a forked child: not its servers
        return
    for s in list(_LIVE):
        s.stop()


atexit.register(_stop_all)
