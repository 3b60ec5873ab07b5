"""mtcfs-csi --watch-config (issue 15: the node's RAM tier is "freed when the
configuration is deleted", as GKE frees its RAM disks when the
CheckpointConfiguration is deleted).

A fake Kubernetes API server (stdlib http.server over HTTPS, with a CA and
a server certificate made here with openssl, a bearer token checked)
serves the CheckpointConfiguration (or the ConfigMap of its spec); the
driver polls it every second, two not-found polls in a row mean deleted.

- Deleted while a pod publishes the job: new publishes are refused with
  FAILED_PRECONDITION naming the configuration; the published job keeps
  working until its unpublish, then its mount and the tmpfs are unmounted
  (/proc/mounts). Restored: a publish works again on a new tmpfs of the
  restored size; the step saved before is gone (its RAM was freed).
- 500s, 401s (a wrong token) and single 404s between them free nothing.
- inMemoryVolumeSize grows: the tmpfs is remounted bigger; a size below
  what the tmpfs holds is refused with a WARN and the size kept.
- Deleted while a pod holds a file open: at its unpublish the bind is
  detached lazily and the job mount and the tmpfs still leave the mount table.
- The ConfigMap form (named through @FILE): deleted -> the idle RAM tier
  goes at once.
- GKE's example JobSet with only the driver name (issue 26): four nodes,
  two Jobs of parallelism 2, no volume attributes: the parallelism and rank
  0's node (status.hostIP) come from the API; UNAVAILABLE while rank 0 is
  unscheduled; the job forms and restores from RAM after a restart.

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin MTCFS_BUILD=build \\
     MTCFS_TEST_PY=/path/to/venv/bin/python /usr/bin/python3 tests/integration/packaging/test_csi_watch.py
"""
import http.server
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import unittest
import urllib.parse

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
import test_csi  # noqa: E402
from test_csi import (Driver, pod_ctx, write_yaml, wait_markers, save_step,  # noqa: E402
                      committed, TIMEOUT)
from harness import wait_until, mount_fstype  # noqa: E402
from cluster import free_ports  # noqa: E402

TOKEN = "test-token-0123456789"
CRD_PATH = "/apis/checkpointing.mtcfs.dev/v1/checkpointconfigurations/tpu-config"
CM_PATH = "/api/v1/namespaces/mtcfs-system/configmaps/mtcfs-config"


def make_certs(d):
    """A test CA and a server certificate for 127.0.0.1 signed by it."""
    def run(*argv):
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        assert r.returncode == 0, r.stdout.decode()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca, cakey = os.path.join(d, "ca.crt"), os.path.join(d, "ca.key")
    srv, srvkey = os.path.join(d, "srv.crt"), os.path.join(d, "srv.key")
    csr, ext = os.path.join(d, "srv.csr"), os.path.join(d, "ext.cnf")
    run("openssl", "req", "-x509", *ec, "-keyout", cakey, "-out", ca, "-days", "2",
        "-subj", "/CN=mtcfs-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("openssl", "req", *ec, "-keyout", srvkey, "-out", csr, "-subj", "/CN=kube-apiserver")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", cakey, "-CAcreateserial",
        "-out", srv, "-days", "2", "-extfile", ext)
    return ca, srv, srvkey


class FakeApi:
    """objects: path -> dict (404 when absent); fail: a status every GET
    answers instead (500, ...), or a list of them taken in turn."""

    def __init__(self, tc, tmp):
        self.objects, self.fail, self.gets, self.closed = {}, None, 0, False
        self.lock = threading.Lock()
        ca, crt, key = make_certs(tmp)
        self.ca = ca
        api = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                with api.lock:
                    api.gets += 1
                    fail = api.fail
                    if isinstance(fail, list):
                        fail = fail[api.gets % len(fail)]
                    obj = api.objects.get(self.path)
                if self.headers.get("Authorization") != "Bearer " + TOKEN:
                    return self.answer(401, {"kind": "Status", "code": 401})
                if fail and fail != 404:
                    return self.answer(fail, {"kind": "Status", "code": fail})
                if obj is None or fail == 404:
                    return self.answer(404, {"kind": "Status", "code": 404,
                                             "reason": "NotFound"})
                return self.answer(200, obj)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = "https://127.0.0.1:%d" % self.httpd.server_address[1]
        self.th = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.th.start()
        tc.addCleanup(self.close)

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.httpd.shutdown()
        self.httpd.server_close()
        self.th.join()

    def set(self, path, obj):
        with self.lock:
            if obj is None:
                self.objects.pop(path, None)
            else:
                self.objects[path] = obj

    def wait_gets(self, n):
        """n more GETs served from now (the driver polled n times)."""
        with self.lock:
            end = self.gets + n
        wait_until(lambda: self.gets >= end, TIMEOUT, "%d API polls" % n)


def crd(size, peer_port):
    return {"apiVersion": "checkpointing.mtcfs.dev/v1", "kind": "CheckpointConfiguration",
            "metadata": {"name": "tpu-config", "uid": "u-1", "resourceVersion": "7",
                         "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"inMemoryVolumeSize": size, "peerPort": peer_port}}


def tmpfs_size(path):
    """size= of the tmpfs mounted at path, per /proc/mounts (None: none)."""
    found = None
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[1] == path and fields[2] == "tmpfs":
                m = re.search(r"size=(\d+k)", fields[3])
                found = m.group(1) if m else "?"
    return found


class WatchDriver(Driver):
    def __init__(self, tc, kubelet, name, config, api, what, token):
        self.api, self.what, self.token = api, what, token
        super().__init__(tc, kubelet, name, config)

    def argv(self):
        return super().argv() + ["--watch-config", self.what, "--watch-interval", "1",
                                 "--watch-grace", "2", "--kube-api", self.api.url,
                                 "--kube-token", self.token, "--kube-ca", self.api.ca]


class CsiWatchTest(unittest.TestCase):

    def setUp(self):
        test_csi.CsiTest.setUp(self)
        self.api = FakeApi(self, self.tmp)
        self.token = os.path.join(self.tmp, "token")
        with open(self.token, "w") as f:
            f.write(TOKEN + "\n")

    def driver(self, config, what="checkpointconfiguration/tpu-config"):
        return WatchDriver(self, self.k, "node-w", config, self.api, what, self.token).start()

    def test_deleted_refuses_publish_and_frees_ram_restored_works(self):
        port = free_ports(1)[0]
        self.api.set(CRD_PATH, crd("256Mi", port))
        d = self.driver(json.dumps(crd("256Mi", port)))
        job, key = "wjob", "default.wjob"
        ctx = pod_ctx("wjob-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % port)
        t = d.target("p1")
        self.assertEqual(d.publish(t, ctx)["code"], "OK")
        self.assertEqual(tmpfs_size(d.ram), "262144k")
        write_yaml(t, job, 0, 1)
        self.assertEqual(wait_markers(t)[0], 0)
        save_step(t, job, 3, 0)
        wait_until(lambda: committed(os.path.join(d.ram, key), job, 3, 0), TIMEOUT,
                   "step 3 committed")

        self.api.set(CRD_PATH, None)
        wait_until(lambda: re.search(r"configuration checkpointconfiguration/tpu-config "
                                     r"deleted: refusing new publishes", d.log()),
                   TIMEOUT, "deletion noticed")
        r = d.publish(d.target("p2"), pod_ctx("other-w-0-0-bbbbb",
                                               coordinator="127.0.0.1:%d" % port))
        self.assertEqual(r["code"], "FAILED_PRECONDITION", r)
        self.assertIn("checkpointconfiguration/tpu-config is deleted", r["details"])
        # the published job is in use: it stays until its pod goes
        self.assertEqual(mount_fstype(d.job_mnt(key)), "fuse.mtcfs")
        self.assertEqual(mount_fstype(d.ram), "tmpfs")
        with open(os.path.join(t, "3", "commit_success.txt"), "rb") as f:
            self.assertEqual(f.read(), b"ok\n")
        self.assertEqual(d.unpublish(t)["code"], "OK")
        self.assertIsNone(mount_fstype(d.job_mnt(key)))
        self.assertIsNone(mount_fstype(d.ram))
        self.assertEqual(len(re.findall(r"RAM tier at \S+ is unmounted", d.log())), 1)
        self.assertEqual(len(re.findall(r"refusing new publishes", d.log())), 1)

        # restored, bigger: the next publish gets a new tmpfs of that size
        self.api.set(CRD_PATH, crd("384Mi", port))
        wait_until(lambda: re.search(r"configuration \S+ is back", d.log()), TIMEOUT,
                   "restore noticed")
        self.assertIsNone(mount_fstype(d.ram))
        t3 = d.target("p3")
        r = d.publish(t3, ctx)
        self.assertEqual(r["code"], "OK", r)
        self.assertEqual(tmpfs_size(d.ram), "393216k")
        write_yaml(t3, job, 0, 1)
        self.assertEqual(wait_markers(t3)[0], 0)     # step 3 went with the RAM
        self.assertEqual(d.unpublish(t3)["code"], "OK")

    def test_api_errors_free_nothing(self):
        port = free_ports(1)[0]
        self.api.set(CRD_PATH, crd("256Mi", port))
        d = self.driver("spec:\n  peerPort: %d\n  inMemoryVolumeSize: 256Mi\n" % port)
        d.expected += [r"watch \S+: .*(HTTP 500|HTTP 401|HTTP 503)"]
        ctx = pod_ctx("errs-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % port)
        self.api.fail = 500
        self.api.wait_gets(3)
        self.assertRegex(d.log(), r"HTTP 500 \(nothing changed")
        # a 404 never twice in a row: not a deletion
        self.api.fail = [404, 500, 404, 503]
        self.api.wait_gets(6)
        with open(self.token, "w") as f:
            f.write("wrong-token\n")
        self.api.fail = None
        self.api.wait_gets(3)
        self.assertRegex(d.log(), r"HTTP 401")
        self.assertEqual(mount_fstype(d.ram), "tmpfs")
        self.assertNotRegex(d.log(), r"deleted: refusing|is unmounted")
        t = d.target("e1")
        self.assertEqual(d.publish(t, ctx)["code"], "OK")
        # the API down entirely (connection refused) while published
        with open(self.token, "w") as f:
            f.write(TOKEN + "\n")
        self.api.close()
        wait_until(lambda: re.search(r"watch \S+: https://\S+: (?!HTTP )[^\n]*nothing changed",
                                     d.log()), TIMEOUT, "API down noticed")
        self.assertEqual(mount_fstype(d.ram), "tmpfs")
        self.assertEqual(mount_fstype(d.job_mnt("default.errs")), "fuse.mtcfs")
        self.assertEqual(d.unpublish(t)["code"], "OK")
        self.assertEqual(mount_fstype(d.ram), "tmpfs")

    def test_size_grows_remounts_shrink_below_used_refused(self):
        port = free_ports(1)[0]
        self.api.set(CRD_PATH, crd("256Mi", port))
        d = self.driver(json.dumps(crd("256Mi", port)))
        d.expected.append(r"below the \d+ bytes the RAM tier")
        self.assertEqual(tmpfs_size(d.ram), "262144k")
        self.api.set(CRD_PATH, crd("512Mi", port))
        wait_until(lambda: tmpfs_size(d.ram) == "524288k", TIMEOUT, "tmpfs remounted at 512Mi")
        self.assertRegex(d.log(), r"resized 268435456 -> 536870912 bytes")
        with open(os.path.join(d.ram, "filler"), "wb") as f:
            f.write(b"x" * (8 << 20))
        self.api.set(CRD_PATH, crd("4Mi", port))
        wait_until(lambda: re.search(r"inMemoryVolumeSize 4194304 is below", d.log()),
                   TIMEOUT, "shrink refused")
        self.assertEqual(tmpfs_size(d.ram), "524288k")
        os.unlink(os.path.join(d.ram, "filler"))

    def test_configmap_deleted_frees_idle_ram_at_once(self):
        port = free_ports(1)[0]
        spec = "peerPort: %d\ninMemoryVolumeSize: 128Mi\n" % port
        self.api.set(CM_PATH, {"apiVersion": "v1", "kind": "ConfigMap",
                               "metadata": {"name": "mtcfs-config", "namespace": "mtcfs-system"},
                               "data": {"config.yaml": spec}})
        # the DaemonSet's form: the init container writes which object it read
        wf = os.path.join(self.tmp, "watch")
        with open(wf, "w") as f:
            f.write("configmap/mtcfs-system/mtcfs-config\n")
        d = self.driver(spec, what="@" + wf)
        self.assertEqual(tmpfs_size(d.ram), "131072k")
        self.api.wait_gets(2)
        self.assertEqual(mount_fstype(d.ram), "tmpfs")
        self.api.set(CM_PATH, None)
        wait_until(lambda: mount_fstype(d.ram) is None, TIMEOUT, "RAM tier unmounted")
        r = d.publish(d.target("c1"), pod_ctx("cm-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % port))
        self.assertEqual(r["code"], "FAILED_PRECONDITION", r)
        self.assertIn("configmap/mtcfs-system/mtcfs-config is deleted", r["details"])

    def test_deleted_busy_job_goes_lazily_at_its_unpublish(self):
        port = free_ports(1)[0]
        self.api.set(CRD_PATH, crd("64Mi", port))
        d = self.driver(json.dumps(crd("64Mi", port)))
        d.expected.append(r"busy, detached lazily")
        key = "default.busy"
        t = d.target("b1")
        ctx = pod_ctx("busy-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % port)
        self.assertEqual(d.publish(t, ctx)["code"], "OK")
        f = open(os.path.join(t, "open-file"), "wb")
        try:
            self.api.set(CRD_PATH, None)
            wait_until(lambda: re.search(r"deleted: refusing new publishes", d.log()), TIMEOUT,
                       "deletion noticed")
            self.assertEqual(mount_fstype(d.job_mnt(key)), "fuse.mtcfs")
            r = d.unpublish(t)
            self.assertEqual(r["code"], "OK", r)
            self.assertRegex(d.log(), r"busy, detached lazily")
            # nothing of it is left in the mount table, open file or not
            self.assertIsNone(mount_fstype(t))
            self.assertIsNone(mount_fstype(d.job_mnt(key)))
            self.assertIsNone(mount_fstype(d.ram))
        finally:
            try:
                f.close()
            except OSError:
                pass      # its mount is gone: ENOTCONN on the flush is expected

    def test_bad_watch_option_refused(self):
        r = subprocess.run([test_csi.CSI_BIN, "--endpoint", "unix://" + self.tmp + "/x.sock",
                            "--node-id", "n", "--no-tmpfs", "--ram-root", self.tmp + "/ram",
                            "--state-dir", self.tmp + "/jobs", "--watch-config", "configmap/x",
                            "--kube-api", self.api.url],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("expected configmap/NAMESPACE/NAME", r.stdout.decode())


def rank0_pods_path(ns, jobset, rjob):
    """The pod list mtcfs-csi asks for rank 0 (JobSet's labels)."""
    sel = ("jobset.sigs.k8s.io/jobset-name=%s,jobset.sigs.k8s.io/replicatedjob-name=%s,"
           "jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0"
           % (jobset, rjob))
    return "/api/v1/namespaces/%s/pods?labelSelector=%s" % (ns, urllib.parse.quote(sel, safe=""))


class GkeJobSetTest(unittest.TestCase):
    """GKE's example JobSet with only the driver name changed (issue 26):
    two Jobs of parallelism 2 on the pod network, no volume attributes at
    all. Four simulated nodes (drivers on 127.0.0.1-4, one peer port, the
    API stand-in above): podsPerJob is the Job's parallelism, read from the
    API (pod slice-1-1 is rank 3), and the coordinator is rank 0's node
    (its pod's status.hostIP), not the pod's DNS name; while rank 0's pod
    is not scheduled the publish is UNAVAILABLE (kubelet retries). The job
    forms across the four nodes and a step saved on each restores after a
    JobSet restart, from RAM."""

    def setUp(self):
        test_csi.CsiTest.setUp(self)
        self.api = FakeApi(self, self.tmp)
        self.token = os.path.join(self.tmp, "token")
        with open(self.token, "w") as f:
            f.write(TOKEN + "\n")

    def test_no_attributes_pod_network(self):
        port = free_ports(1)[0]
        ns, js, rj, job = "ml", "gke", "slice", "gke"
        kube = ["--kube-api", self.api.url, "--kube-token", self.token, "--kube-ca", self.api.ca]
        nodes = [Driver(self, self.k, "node-%d" % i, "peerPort: %d\nrestoreTimeout: 30\n" % port,
                        node_address="127.0.0.%d" % (i + 1), extra=kube).start()
                 for i in range(4)]
        for i in (0, 1):
            self.api.set("/apis/batch/v1/namespaces/%s/jobs/%s-%s-%d" % (ns, js, rj, i),
                         {"kind": "Job", "spec": {"parallelism": 2, "completions": 2}})
        pods0 = rank0_pods_path(ns, js, rj)

        def generation(suffix):
            pod0 = "%s-%s-0-0-%s" % (js, rj, suffix)
            # rank 0's pod exists, not scheduled yet: no coordinator to give
            self.api.set(pods0, {"kind": "PodList", "items": [
                {"metadata": {"name": pod0}, "status": {"phase": "Pending"}}]})
            last = nodes[3]
            t3 = last.target("p3" + suffix)
            r = last.publish(t3, pod_ctx("%s-%s-1-1-%s" % (js, rj, suffix), ns=ns))
            self.assertEqual(r["code"], "UNAVAILABLE", r)
            self.assertIn("rank 0's pod %s/%s is not scheduled yet" % (ns, pod0), r["details"])
            self.api.set(pods0, {"kind": "PodList", "items": [
                {"metadata": {"name": "%s-%s-0-0-old" % (js, rj),
                              "deletionTimestamp": "2026-01-01T00:00:00Z"},
                 "status": {"hostIP": "127.0.0.9"}},
                {"metadata": {"name": pod0}, "status": {"hostIP": "127.0.0.1"}}]})
            ts = {}
            for rank, (ji, pi) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
                d = nodes[rank]
                ts[rank] = d.target("p%d%s" % (rank, suffix))
                r = d.publish(ts[rank], pod_ctx("%s-%s-%d-%d-%s" % (js, rj, ji, pi, suffix), ns=ns))
                self.assertEqual(r["code"], "OK", r)
            out, errs = {}, []

            def start(r):
                try:
                    write_yaml(ts[r], job, r, 4)
                    out[r] = wait_markers(ts[r])
                except Exception as e:
                    errs.append(e)
            th = [threading.Thread(target=start, args=(r,)) for r in ts]
            for t in th:
                t.start()
            for t in th:
                t.join()
            if errs:
                raise errs[0]
            return ts, out

        ts, out = generation("aaaaa")
        self.assertEqual({r: o[0] for r, o in out.items()}, {0: 0, 1: 0, 2: 0, 3: 0})
        for rank, d in enumerate(nodes):
            self.assertRegex(d.log(), r"starting mtcfs rank=%d: \S+ -f -o listen=127.0.0.%d:%d,"
                             r"coordinator=127.0.0.1:%d,rank_hint=%d[ ,]"
                             % (rank, rank + 1, port, port, rank))
            self.assertNotRegex(d.job_log("ml.gke"), r"node-rank \d differs from rank_hint")
        self.assertRegex(nodes[3].log(), r"pod ml/gke-slice-1-1-aaaaa: rank 0 is pod "
                         r"gke-slice-0-0-aaaaa on node 127.0.0.1: coordinator 127.0.0.1:%d" % port)
        for r in ts:
            save_step(ts[r], job, 5, r)
        for r, d in enumerate(nodes):
            wait_until(lambda: committed(os.path.join(d.ram, "ml.gke"), job, 5, r), TIMEOUT,
                       "step 5 committed by rank %d" % r)
        for r, d in enumerate(nodes):
            self.assertEqual(d.unpublish(ts[r])["code"], "OK")
        ts, out = generation("bbbbb")
        self.assertEqual({r: o[0] for r, o in out.items()}, {0: 5, 1: 5, 2: 5, 3: 5})
        for r, d in enumerate(nodes):
            self.assertRegex(d.job_log("ml.gke"), r"restore job=gke step=5 source=local")
            self.assertEqual(d.starts(), 1, d.log())
            self.assertEqual(d.unpublish(ts[r])["code"], "OK")


if __name__ == "__main__":
    unittest.main()
