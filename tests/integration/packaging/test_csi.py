"""The CSI node driver mtcfs-csi (issue 15), driven through its gRPC unix
socket the way kubelet drives it, with real mtcfs job mounts behind it.

- Identity and NodeGetInfo answer the driver name, no controller, ready,
  no STAGE_UNSTAGE, the node id given.
- Publish of one JobSet pod's volume to two targets, repeated, and
  concurrently to four more: one job mount, one mtcfs, every target is a
  bind of it; a step written through one target reads back the same bytes
  through the others; after unpublishing all, the job mount stays and a new
  publish shows the same bytes.
- A 2-node JobSet restart: two drivers (one per simulated node), the job
  saves a step through the pods' targets, every pod's volume is
  unpublished (pods gone, node daemons kept), new pods of the same JobSet
  are published, and the job restores that step from RAM: each daemon's
  log says source=local, though a bucket is configured.
- Unpublish of a busy target (an open file): lazily detached, OK, the open
  file still works, the job mount is untouched.
- Bad requests get the CSI spec's gRPC codes: INVALID_ARGUMENT for a
  missing target_path/volume_id/volume_capability, block access, an unknown
  volume attribute, a pod name that is not a JobSet pod's; ALREADY_EXISTS for
  a target holding another mount; UNIMPLEMENTED for NodeStageVolume.
- A bad --config is refused at start with the key named.
- Who may call it (issue 22.8): the socket is 0600 under umask 000 (uid
  65534 cannot connect); targets outside <kubelet-dir>/pods/<uid>/volumes/,
  with "..", "." or "//", or through a symlink are refused, the RAM tier
  among them; unpublish refuses a mount that is not an mtcfs bind and
  knows its own publishes after a driver restart (the record file).
- Lifecycle: five JobSets of one name in five namespaces, one after the
  other on one peer port: each takes the port of the idle one before it,
  one mtcfs at a time; with --idle-timeout 1 an idle mtcfs stops and the
  next pod restarts it on the same RAMDIR (a file written before reads
  back). RAM (issue 24.5): a stopped job alone keeps its RAMDIR; when
  another job starts over --free-above it is deleted, and the running
  job's 40 MiB fit where they would have hit ENOSPC.
- Hostile values: a coordinator ending in '\\', a newline in volume_id,
  a pod name or target_path, a namespace with '.': INVALID_ARGUMENT and
  no forged log line.
- The yaml's node-rank wins over the pod's index (issue 24.4): rank_hint=,
  a WARN in the job's log, markers instead of replicator.failed.
- Changed volume attributes (issue 26): a publish whose peerPort, ramSize
  or coordinator differ from the running job mount's is FAILED_PRECONDITION
  while another pod of the job is published (a WARN naming each, old and
  new value; the mount untouched), and between pod generations restarts the
  job's mtcfs with them on the same RAMDIR (the step restores source=local).

The gRPC client runs under the venv python (grpcio + grpcio-tools from
tests/requirements.txt; csi/csi.proto is compiled at test time): skipped
without it, failed when CI=true, like tests/integration/apps/test_real_torch.py,
but run in the sanitizer builds too (it takes seconds).

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin MTCFS_BUILD=build \\
     MTCFS_TEST_PY=/path/to/venv/bin/python /usr/bin/python3 tests/integration/packaging/test_csi.py
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
sys.path.insert(1, os.path.join(INTEG, "security"))  # test_nonroot: the trainer (one test)
sys.path.insert(0, os.path.join(os.path.dirname(INTEG), "clients"))
import harness  # noqa: E402
from harness import wait_until, mount_fstype, admin_ls, force_unmount  # noqa: E402
from cluster import free_ports, shard_files  # noqa: E402
import launch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(INTEG))
PROTO = os.path.join(REPO, "csi", "csi.proto")
CSI_BIN = os.environ.get("MTCFS_CSI") or os.path.join(harness.BUILD, "csi", "mtcfs-csi")
DRIVER = "mtcfs.csi.checkpoint.dev"
TIMEOUT = 60

# The kubelet side: a long-lived venv-python process that reads one JSON
# request per line and answers one JSON line. {"calls": [...]} runs the
# calls concurrently (one thread each) and answers them in order.
KUBELET = r'''
import json, sys, threading
sys.path.insert(0, sys.argv[1])
import grpc
from google.protobuf import json_format
import csi_pb2 as pb, csi_pb2_grpc as rpc

chans = {}
def stub(sock, svc):
    if sock not in chans:
        chans[sock] = grpc.insecure_channel("unix://" + sock)
    return getattr(rpc, svc + "Stub")(chans[sock])

def call(c):
    if c["method"].startswith("/"):     # any path, empty request: unknown methods
        stub(c["sock"], "Identity")
        try:
            chans[c["sock"]].unary_unary(c["method"])(b"", timeout=c.get("timeout", 90))
            return {"code": "OK", "details": "", "resp": None}
        except grpc.RpcError as e:
            return {"code": e.code().name, "details": e.details() or "", "resp": None}
    svc, meth = c["method"].split(".")
    req = getattr(pb, meth + "Request")()
    json_format.ParseDict(c.get("req", {}), req)
    try:
        resp = getattr(stub(c["sock"], svc), meth)(req, timeout=c.get("timeout", 90))
        return {"code": "OK", "details": "",
                "resp": json_format.MessageToDict(resp, preserving_proto_field_name=True)}
    except grpc.RpcError as e:
        return {"code": e.code().name, "details": e.details() or "", "resp": None}

for line in sys.stdin:
    msg = json.loads(line)
    calls = msg["calls"]
    out = [None] * len(calls)
    def one(i):
        out[i] = call(calls[i])
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in ts: t.start()
    for t in ts: t.join()
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
'''

MOUNT_CAP = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}


def pod_ctx(pod, ns="default", **attrs):
    """The volume context kubelet sends with podInfoOnMount, plus attrs."""
    ctx = {"csi.storage.k8s.io/pod.name": pod,
           "csi.storage.k8s.io/pod.namespace": ns,
           "csi.storage.k8s.io/pod.uid": "uid-" + pod,
           "csi.storage.k8s.io/serviceAccount.name": "default",
           "csi.storage.k8s.io/ephemeral": "true"}
    ctx.update(attrs)
    return ctx


class Kubelet:
    def __init__(self, tc, py, tmp):
        gen = os.path.join(tmp, "gen")
        os.mkdir(gen)
        r = subprocess.run([py, "-m", "grpc_tools.protoc", "-I", os.path.dirname(PROTO),
                            "--python_out=" + gen, "--grpc_python_out=" + gen, PROTO],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        tc.assertEqual(r.returncode, 0, r.stdout.decode())
        script = os.path.join(tmp, "kubelet.py")
        with open(script, "w") as f:
            f.write(KUBELET)
        # GOAWAY notes at each driver stop are INFO noise of grpc's core
        env = dict(os.environ, GRPC_VERBOSITY="ERROR")
        self.p = subprocess.Popen([py, script, gen], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        self.lock = threading.Lock()

    def calls(self, calls):
        with self.lock:
            self.p.stdin.write(json.dumps({"calls": calls}) + "\n")
            self.p.stdin.flush()
            line = self.p.stdout.readline()
        if not line:
            raise AssertionError("the kubelet client died")
        return json.loads(line)

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class Driver:
    """One mtcfs-csi (one simulated node) in private directories."""

    def __init__(self, tc, kubelet, name, config="", node_address="127.0.0.1", extra=()):
        self.tc, self.k, self.name = tc, kubelet, name
        self.dir = tempfile.mkdtemp(prefix="mtcfs-csi-%s-" % name)
        os.chmod(self.dir, 0o755)     # like /var/lib/kubelet: others may pass
        self.sock = os.path.join(self.dir, "csi.sock")
        self.ram = os.path.join(self.dir, "ram")
        self.state = os.path.join(self.dir, "jobs")
        self.pods = os.path.join(self.dir, "pods")    # kubelet's pods dir
        os.mkdir(self.pods)
        self.cfg = os.path.join(self.dir, "config.yaml")
        with open(self.cfg, "w") as f:
            f.write(config)
        self.log_path = os.path.join(self.dir, "driver.log")
        self.node_address = node_address
        self.extra = list(extra)
        self.proc = None
        self.expected = []
        tc.addCleanup(self.close)

    def argv(self):
        return [CSI_BIN, "--endpoint", "unix://" + self.sock, "--node-id", self.name,
                "--config", self.cfg, "--ram-root", self.ram, "--state-dir", self.state,
                "--node-address", self.node_address, "--mtcfs", harness.MTCFS_BIN,
                "--kubelet-dir", self.dir] + self.extra

    def start(self, umask=None):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT,
                                     preexec_fn=None if umask is None else lambda: os.umask(umask))
        log.close()

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError("mtcfs-csi exited %s:\n%s" % (self.proc.returncode,
                                                                  self.log()))
            if not os.path.exists(self.sock):
                return False
            return self.call("Identity.Probe")["code"] == "OK"
        wait_until(ready, TIMEOUT, "mtcfs-csi %s serving" % self.name)
        return self

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def job_log(self, key):
        with open(os.path.join(self.state, key, "mtcfs.log"), errors="replace") as f:
            return f.read()

    def call(self, method, req=None):
        return self.k.calls([{"sock": self.sock, "method": method, "req": req or {}}])[0]

    def publish_req(self, target, ctx, vol="csi-vol", readonly=False, cap=MOUNT_CAP):
        req = {"volume_id": vol, "target_path": target, "volume_context": ctx}
        if cap is not None:
            req["volume_capability"] = cap
        if readonly:
            req["readonly"] = True
        return req

    def publish(self, target, ctx, **kw):
        return self.call("Node.NodePublishVolume", self.publish_req(target, ctx, **kw))

    def unpublish(self, target, vol="csi-vol"):
        return self.call("Node.NodeUnpublishVolume", {"volume_id": vol, "target_path": target})

    def target(self, pod):
        """kubelet's target path for an inline volume of pod."""
        return os.path.join(self.pods, "uid-" + pod, "volumes",
                            "kubernetes.io~csi", "checkpoint", "mount")

    def job_mnt(self, key):
        return os.path.join(self.state, key, "mnt")

    def starts(self):
        return len(re.findall(r"starting mtcfs", self.log()))

    def status(self):
        """mtcfs-csi --status beside the running driver: {job: [state,
        bytes, pods, since]}."""
        r = subprocess.run(self.argv() + ["--status"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        self.tc.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.tc.assertRegex(lines[0], r"^RAM tier %s: \d+ of \d+ bytes used" % re.escape(self.ram))
        self.tc.assertEqual(lines[1].split(), ["JOB", "STATE", "RAM_BYTES", "PODS", "NO_POD_SINCE"])
        return {ln.split()[0]: ln.split()[1:] for ln in lines[2:]}

    def daemons(self):
        """The mtcfs processes serving this driver's jobs (their RAMDIR
        argument is under its RAM root): {pid: RAMDIR}."""
        out = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            for a in argv:
                if a.startswith(self.ram.encode() + b"/"):
                    out[int(pid)] = a.decode()
        return out

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("mtcfs-csi %s did not stop on SIGTERM" % self.name)

    def job_logs(self):
        """{key: text} of every job mount's log (they are checked too)."""
        out = {}
        try:
            keys = os.listdir(self.state)
        except OSError:
            return out
        for k in keys:
            try:
                out[k] = self.job_log(k)
            except OSError:
                pass
        return out

    def close(self):
        logs = {}
        try:
            self.stop()
        finally:
            logs = self.job_logs()
            # whatever is still mounted under our directories, top first
            mounts = []
            with open("/proc/mounts") as f:
                for line in f:
                    mp = harness._unescape_mount_field(line.split()[1])
                    if mp.startswith(self.dir + "/"):
                        mounts.append(mp)
            for mp in reversed(mounts):
                force_unmount(mp)
            if os.environ.get("MTCFS_KEEP_TMP") != "1":
                shutil.rmtree(self.dir, ignore_errors=True)
        lines = self.log().splitlines()
        for k, text in sorted(logs.items()):
            lines += ["%s: %s" % (k, ln) for ln in text.splitlines()]
        # a job mount that died or exited non-zero on SIGTERM is a WARN line
        died = re.compile(r"WARN csi: job \S+: mtcfs pid \d+ (exited|did not stop)")
        bad = [ln for ln in lines
               if (harness.BAD_LOG.search(ln) or died.search(ln))
               and not any(re.search(r, ln) for r in self.expected)]
        if bad:
            raise AssertionError("mtcfs-csi %s log has unexpected errors:\n%s"
                                 % (self.name, "\n".join(bad)))


def write_yaml(mnt, job, rank, nodes):
    y = os.path.join(mnt, "replicator.yaml")
    wait_until(lambda: not os.path.exists(y), TIMEOUT, "replicator.yaml absent")
    with open(y + ".tmp", "w") as f:
        f.write("job-name: %s\nframework: orbax\nnode-rank: %d\nnodes: %d\n"
                "peers-per-node: 1\nbackup-interval-minutes: 30\n" % (job, rank, nodes))
    os.rename(y + ".tmp", y)
    # consumed: the namespace is clean (old markers gone) from here on
    wait_until(lambda: not os.path.exists(y), TIMEOUT, "replicator.yaml consumed")


def wait_markers(mnt):
    failed = os.path.join(mnt, "replicator.failed")

    def markers():
        if os.path.exists(failed):
            raise AssertionError("replicator.failed: " + open(failed).read())
        return [x for x in os.listdir(mnt) if x.endswith(".restore")] or None
    ms = wait_until(markers, TIMEOUT, "restore markers in " + mnt)
    steps = {int(re.match(r".*-s(\d+)-n\d+-w\d+\.restore$", x).group(1)) for x in ms}
    assert len(steps) == 1, ms
    return steps.pop(), ms


def save_step(mnt, job, step, rank):
    """Orbax's save: a tmp directory, its files, commit_success, rename."""
    tmp = os.path.join(mnt, "%d.orbax-checkpoint-tmp-0" % step)
    for rel, data in shard_files(job, step, rank).items():
        p = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        harness.write_file(p, data)
    harness.write_file(os.path.join(tmp, "commit_success.txt"), b"ok\n")
    os.rename(tmp, os.path.join(mnt, str(step)))


def check_step(tc, root, job, step, rank):
    for rel, data in shard_files(job, step, rank).items():
        with open(os.path.join(root, str(step), rel), "rb") as f:
            tc.assertEqual(f.read(), data, "%s/%d/%s differs" % (root, step, rel))


def committed(ramdir, job, step, rank, holders=1):
    for s in admin_ls(ramdir)["shards"]:
        if (s["job"], s["step"], s["rank"]) == (job, step, rank) and \
                s["state"] in harness.COMMITTED_STATES:
            return True
    return False


class CsiTest(unittest.TestCase):

    def setUp(self):
        # the venv of the real clients, but also in sanitizer builds: this
        # test is quick, and the driver is C worth running under ASan
        self.py = launch.venv_python()
        r = None
        if self.py and os.access(self.py, os.X_OK):
            r = subprocess.run([self.py, "-c", "import grpc, grpc_tools"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r is None or r.returncode != 0:
            msg = ("no venv python with grpcio/grpcio-tools (MTCFS_TEST_PY=%r; "
                   "tests/run builds it from tests/requirements.txt)" % self.py)
            if os.environ.get("CI") == "true":
                self.fail(msg)
            self.skipTest(msg)
        if not os.access(CSI_BIN, os.X_OK):
            msg = "%s not built (cmake -DMTCFS_CSI=ON needs libgrpc-dev, libprotobuf-c-dev)" % CSI_BIN
            if os.environ.get("CI") == "true":
                self.fail(msg)
            self.skipTest(msg)
        self.tmp = tempfile.mkdtemp(prefix="mtcfs-csi-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.k = Kubelet(self, self.py, self.tmp)
        self.addCleanup(self.k.close)

    def driver(self, name="node-a", config="", **kw):
        return Driver(self, self.k, name, config, **kw).start()

    # ---------------------------------------------------------------

    def test_identity_and_node_info(self):
        d = self.driver(config="spec:\n  cloudStorageBucketName: b\n")
        r = d.call("Identity.GetPluginInfo")
        self.assertEqual(r["code"], "OK", r)
        self.assertEqual(r["resp"]["name"], DRIVER)
        self.assertRegex(r["resp"]["vendor_version"], r"^\d+\.\d+\.\d+")
        self.assertEqual(d.call("Identity.GetPluginCapabilities"),
                         {"code": "OK", "details": "", "resp": {}})
        self.assertEqual(d.call("Identity.Probe")["resp"], {"ready": {"value": True}})
        self.assertEqual(d.call("Node.NodeGetCapabilities")["resp"], {})
        self.assertEqual(d.call("Node.NodeGetInfo")["resp"], {"node_id": "node-a"})
        # the RAM tier is the driver's own tmpfs, huge pages on
        self.assertEqual(mount_fstype(d.ram), "tmpfs")
        with open("/proc/mounts") as f:
            line = [ln for ln in f if ln.split()[1] == d.ram][-1]
        self.assertIn("huge=always", line)

    def test_publish_repeat_concurrent_unpublish_republish(self):
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        job, key = "train", "default.train"
        ctx = pod_ctx("train-workers-0-0-abcde", coordinator="127.0.0.1:%d" % port)
        t1, t2 = d.target("p1"), d.target("p2")
        more = [d.target("c%d" % i) for i in range(4)]
        # concurrent first publishes of the job: one job mount comes up
        rs = self.k.calls([{"sock": d.sock, "method": "Node.NodePublishVolume",
                            "req": d.publish_req(t, ctx)} for t in more[:3]])
        self.assertEqual([r["code"] for r in rs], ["OK"] * 3, rs)
        self.assertEqual(d.starts(), 1, d.log())
        self.assertEqual(d.publish(t1, ctx)["code"], "OK")
        self.assertEqual(d.publish(t2, ctx)["code"], "OK")
        # repeated: the same answer, no second bind on top
        self.assertEqual(d.publish(t1, ctx)["code"], "OK")
        with open("/proc/mounts") as f:
            self.assertEqual(sum(1 for ln in f if ln.split()[1] == t1), 1)
        # concurrent: a new target, repeats of t1 and of a concurrent one
        rs = self.k.calls([{"sock": d.sock, "method": "Node.NodePublishVolume",
                            "req": d.publish_req(t, ctx)} for t in [more[3], t1, more[0], t1]])
        self.assertEqual([r["code"] for r in rs], ["OK"] * 4, rs)
        self.assertEqual(d.starts(), 1, d.log())
        with open("/proc/mounts") as f:
            mps = [ln.split()[1] for ln in f]
        for t in [t1] + more:
            self.assertEqual(mps.count(t), 1, t)
        mnt = d.job_mnt(key)
        dev = os.stat(mnt).st_dev
        for t in [t1, t2] + more:
            self.assertEqual(mount_fstype(t), "fuse.mtcfs")
            self.assertEqual(os.stat(t).st_dev, dev, t)

        # an unprivileged trainer (any uid) can write there; entries are its own
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "sh", "-c", "echo hi > %s/by-nobody" % t2],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertEqual(os.stat(os.path.join(t1, "by-nobody")).st_uid, 65534)
        os.unlink(os.path.join(t1, "by-nobody"))

        # the trainer, through its target: start-up handshake, save a step
        write_yaml(t1, job, 0, 1)
        self.assertEqual(wait_markers(t1)[0], 0)
        save_step(t1, job, 3, 0)
        wait_until(lambda: committed(os.path.join(d.ram, key), job, 3, 0), TIMEOUT,
                   "step 3 committed")
        check_step(self, t2, job, 3, 0)
        check_step(self, more[3], job, 3, 0)

        for t in [t1, t2] + more:
            r = d.unpublish(t)
            self.assertEqual(r["code"], "OK", r)
            self.assertIsNone(mount_fstype(t))
            self.assertFalse(os.path.exists(t))
        # idempotent: again, and a path never published
        self.assertEqual(d.unpublish(t1)["code"], "OK")
        self.assertEqual(d.unpublish(d.target("never"))["code"], "OK")
        # the job mount and its RAM stay
        self.assertEqual(mount_fstype(mnt), "fuse.mtcfs")
        t3 = d.target("p3")
        self.assertEqual(d.publish(t3, ctx)["code"], "OK")
        check_step(self, t3, job, 3, 0)
        self.assertEqual(d.starts(), 1)
        # read-only publish: the bind refuses writes
        t4 = d.target("ro")
        self.assertEqual(d.publish(t4, ctx, readonly=True)["code"], "OK")
        with self.assertRaises(OSError) as cm:
            open(os.path.join(t4, "x"), "w")
        self.assertEqual(cm.exception.errno, 30)   # EROFS
        check_step(self, t4, job, 3, 0)
        # the same target again with the other readonly flag: incompatible
        self.assertEqual(d.publish(t4, ctx)["code"], "ALREADY_EXISTS")
        self.assertEqual(d.publish(t3, ctx, readonly=True)["code"], "ALREADY_EXISTS")
        self.assertEqual(d.publish(t4, ctx, readonly=True)["code"], "OK")
        for t in (t3, t4):
            self.assertEqual(d.unpublish(t)["code"], "OK")

    def test_jobset_restart_restores_from_ram(self):
        pa, pb = free_ports(2)
        bucket = os.path.join(self.tmp, "bucket")
        os.mkdir(bucket)
        secret = os.path.join(self.tmp, "secret")
        with open(secret, "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        common = ("apiVersion: checkpointing.gke.io/v1\nkind: CheckpointConfiguration\n"
                  "metadata: {name: mtc}\nspec:\n"
                  "  cloudStorageBucketName: file://%s\n  inMemoryVolumeSize: 1Gi\n"
                  "  nodeSelector: {node.kubernetes.io/instance-type: ct5p-hightpu-4t}\n"
                  "  tolerations: [{key: google.com/tpu, operator: Exists, effect: NoSchedule}]\n"
                  "  gcsFuseMountOptions: [implicit-dirs]\n"
                  "  secretFile: %s\n  restoreTimeout: 20\n" % (bucket, secret))
        a = self.driver("node-a", common + "  peerPort: %d\n" % pa)
        b = self.driver("node-b", common + "  peerPort: %d\n" % pb)
        job, key = "ckpt", "ml.ckpt"

        def run_pods(gen, place=None):
            """Pods of one JobSet generation, rank r on node place[r]; the
            coordinator attribute plays the rank-0 pod's DNS name (no
            cluster DNS here): rank 0's node."""
            place = place or {0: a, 1: b}
            attrs = {"coordinator": "127.0.0.1:%d" % (pa if place[0] is a else pb)}
            pods = {0: "ckpt-workers-0-0-%s" % gen, 1: "ckpt-workers-1-0-%s" % gen}
            ts = {}
            for r, d in place.items():
                ts[r] = d.target(pods[r])
                res = d.publish(ts[r], pod_ctx(pods[r], ns="ml", **attrs))
                self.assertEqual(res["code"], "OK", res)
            out, errs = {}, []

            def start(r):
                try:
                    write_yaml(ts[r], job, r, 2)
                    out[r] = wait_markers(ts[r])
                except Exception as e:
                    errs.append(e)
            th = [threading.Thread(target=start, args=(r,)) for r in (0, 1)]
            for t in th:
                t.start()
            for t in th:
                t.join()
            if errs:
                raise errs[0]
            return ts, out

        ts, out = run_pods("aaaaa")
        self.assertEqual({r: out[r][0] for r in out}, {0: 0, 1: 0})
        for r in (0, 1):
            save_step(ts[r], job, 7, r)

        def replicated():
            held = {}
            for d in (a, b):
                for s in admin_ls(os.path.join(d.ram, key))["shards"]:
                    if s["job"] == job and s["step"] == 7 and \
                            s["state"] in harness.COMMITTED_STATES:
                        held.setdefault(s["rank"], set()).add(d.name)
            return all(len(held.get(r, ())) == 2 for r in (0, 1))
        wait_until(replicated, TIMEOUT, "step 7 on both nodes")

        # the JobSet restarts: every pod goes (its volume unpublished), the
        # node daemons and their job mounts stay; new pods come
        for r, d in ((0, a), (1, b)):
            self.assertEqual(d.unpublish(ts[r])["code"], "OK")
        ts, out = run_pods("bbbbb")
        self.assertEqual({r: out[r][0] for r in out}, {0: 7, 1: 7})
        for r in (0, 1):
            os.replace(os.path.join(ts[r], out[r][1][0]), os.path.join(ts[r], "7"))
            check_step(self, ts[r], job, 7, r)
        for d in (a, b):
            self.assertEqual(d.starts(), 1, d.log())
            log = d.job_log(key)
            self.assertRegex(log, r"restore job=%s step=7 source=local" % job)
            # and in the driver's own output (kubectl logs of the DaemonSet)
            self.assertRegex(d.log(), r"restore job=%s step=7 source=local" % job)
            self.assertNotRegex(log, r"source=bucket|restored job=\S+ step=7 from backup")
        self.assertEqual(os.listdir(bucket), [])
        for r, d in ((0, a), (1, b)):
            self.assertEqual(d.unpublish(ts[r])["code"], "OK")

        # another restart places the ranks the other way round: each node's
        # idle job mount restarts with the new rank on the same RAMDIR, which
        # holds the other rank's replica: still no bucket
        swapped = {0: b, 1: a}
        ts, out = run_pods("ccccc", swapped)
        self.assertEqual({r: out[r][0] for r in out}, {0: 7, 1: 7})
        for r in (0, 1):
            os.replace(os.path.join(ts[r], out[r][1][0]), os.path.join(ts[r], "7"))
            check_step(self, ts[r], job, 7, r)
        for d in (a, b):
            self.assertEqual(d.starts(), 2, d.log())
            self.assertRegex(d.log(), r"job ml.ckpt: rank \d -> \d: restarting")
            log = d.job_log(key)
            self.assertRegex(log, r"restore job=%s step=7 source=(local|peer)" % job)
            self.assertNotRegex(log, r"source=bucket|from backup")
        self.assertEqual(os.listdir(bucket), [])
        for r, d in swapped.items():
            self.assertEqual(d.unpublish(ts[r])["code"], "OK")

    def test_other_rank_restarts_the_idle_job_mount(self):
        # a restarted JobSet may place another rank on this node: the job
        # mount (rank= fixes its identity) is restarted on the same RAMDIR
        # once unpublished, and refused while still in use
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        d.expected.append(r"refused: job default.rk runs as rank 0")
        attrs = {"coordinator": "127.0.0.1:%d" % port}
        t0, t1 = d.target("r0"), d.target("r1")
        self.assertEqual(d.publish(t0, pod_ctx("rk-w-0-0-aaaaa", **attrs))["code"], "OK")
        r = d.publish(t1, pod_ctx("rk-w-1-0-bbbbb", **attrs))
        self.assertEqual(r["code"], "FAILED_PRECONDITION", r)
        self.assertIn("runs as rank 0", r["details"])
        self.assertEqual(d.unpublish(t0)["code"], "OK")
        self.assertEqual(d.publish(t1, pod_ctx("rk-w-1-0-bbbbb", **attrs))["code"], "OK")
        self.assertEqual(d.starts(), 2)
        self.assertRegex(d.log(), r"job default.rk: rank 0 -> 1: restarting")
        self.assertRegex(d.log(), r"starting mtcfs rank=1: .*,rank_hint=1[ ,]")
        # podsPerJob: rank = jobIndex * podsPerJob + podIndex
        self.assertEqual(d.unpublish(t1)["code"], "OK")
        self.assertEqual(d.publish(t1, pod_ctx("rk-w-1-1-ccccc", podsPerJob="4",
                                               **attrs))["code"], "OK")
        self.assertRegex(d.log(), r"starting mtcfs rank=5:")
        self.assertEqual(d.unpublish(t1)["code"], "OK")

    def test_driver_restart_keeps_ram_and_release_frees_it(self):
        port = free_ports(1)[0]
        cfg = "spec:\n  peerPort: %d\n  inMemoryVolumeSize: 256Mi\n" % port
        d = self.driver(config=cfg)
        job, key = "keep", "default.keep"
        ctx = pod_ctx("keep-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % port)
        t = d.target("k1")
        self.assertEqual(d.publish(t, ctx)["code"], "OK")
        write_yaml(t, job, 0, 1)
        self.assertEqual(wait_markers(t)[0], 0)
        save_step(t, job, 4, 0)
        wait_until(lambda: committed(os.path.join(d.ram, key), job, 4, 0), TIMEOUT,
                   "step 4 committed")
        self.assertEqual(d.unpublish(t)["code"], "OK")
        # the driver goes (an upgrade): its job mounts stop, the tmpfs stays
        d.stop()
        self.assertIsNone(mount_fstype(d.job_mnt(key)))
        self.assertEqual(mount_fstype(d.ram), "tmpfs")
        with open("/proc/mounts") as f:
            self.assertIn("size=262144k", [ln for ln in f if ln.split()[1] == d.ram][-1])
        d.start()
        self.assertRegex(d.log(), r"tmpfs already mounted, kept")
        t = d.target("k2")
        self.assertEqual(d.publish(t, ctx)["code"], "OK")
        write_yaml(t, job, 0, 1)
        step, ms = wait_markers(t)
        self.assertEqual(step, 4)
        os.replace(os.path.join(t, ms[0]), os.path.join(t, "4"))
        check_step(self, t, job, 4, 0)
        self.assertRegex(d.job_log(key), r"restore job=keep step=4 source=local")
        self.assertEqual(d.unpublish(t)["code"], "OK")
        d.stop()
        # the configuration is deleted: --release frees the RAM
        r = subprocess.run(d.argv() + ["--release"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("released the RAM tier", r.stdout.decode())
        self.assertIsNone(mount_fstype(d.ram))
        self.assertEqual(os.listdir(d.ram), [])

    def test_nonroot_trainer_restores_through_the_driver(self):
        """Issue 26: a trainer pod running as uid 1000 (fsGroup 2000 as a
        supplementary group) saves a step through its volume and reads
        it back after a JobSet restart (new pod, same job mount) and after
        a node-pod restart (the driver and its job mount again): exact
        bytes through the .restore marker, its own owners and modes, and
        nothing for a uid outside the job."""
        import test_nonroot as nr
        port = free_ports(1)[0]
        d = self.driver(config="spec:\n  peerPort: %d\n  inMemoryVolumeSize: 256Mi\n" % port)
        job, key = "nonroot", "default.nonroot"
        ctx = pod_ctx("nonroot-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % port)
        yaml = ("job-name: %s\nframework: orbax\nnode-rank: 0\nnodes: 1\n"
                "peers-per-node: 1\nbackup-interval-minutes: 30\n" % job)

        def pod(name):
            t = d.target(name)
            self.assertEqual(d.publish(t, ctx)["code"], "OK")
            return t

        def restored(t):
            self.assertEqual(nr.run_as(nr.AS_TRAINER, "start", t, yaml)["step"], 4)
            self.assertEqual(nr.run_as(nr.AS_TRAINER, "read", t, job, 4, 0), {"ok": True})
            top = os.path.join(t, "4")
            # the root is 0777 root's (no fsGroup walk): the trainer's own gid
            self.assertEqual(nr.owner(top), (nr.UID, nr.GID, 0o750))
            self.assertEqual(nr.owner(os.path.join(top, "state/secret.bin")),
                             (nr.UID, nr.GID, 0o600))
            self.assertEqual(nr.owner(os.path.join(top, "state/params/0.0")),
                             (nr.UID, nr.GID, 0o640))
            secret = os.path.join(top, "state/secret.bin")
            self.assertEqual(nr.run_as(nr.AS_OTHER, "try", secret), {secret: "EACCES"})
            self.assertEqual(nr.owner(os.path.join(t, ".mtcfs")), (0, 0, 0o711))

        t = pod("nr1")
        self.assertEqual(nr.run_as(nr.AS_TRAINER, "start", t, yaml)["step"], 0)
        self.assertEqual(nr.run_as(nr.AS_TRAINER, "save", t, job, 4, 0), {"ok": True})
        wait_until(lambda: committed(os.path.join(d.ram, key), job, 4, 0), TIMEOUT,
                   "step 4 committed")
        self.assertEqual(d.unpublish(t)["code"], "OK")
        # a JobSet restart: a new pod on the same job mount
        t = pod("nr2")
        restored(t)
        self.assertRegex(d.job_log(key), r"restore job=nonroot step=4 source=local")
        self.assertEqual(d.unpublish(t)["code"], "OK")
        # a node-pod restart: the driver and the job's mtcfs again
        d.stop()
        d.start()
        t = pod("nr3")
        restored(t)
        self.assertEqual(len(re.findall(r"restore job=nonroot step=4 source=local",
                                        d.job_log(key))), 2)
        self.assertEqual(d.unpublish(t)["code"], "OK")

    def test_adopts_a_serving_mount_it_did_not_start(self):
        # an mtcfs already serving the job's mount (it outlived an earlier
        # driver) is used, not unmounted under its feet
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        d.expected.append(r"adopting the mount")
        key = "default.adopt"
        ram, mnt = os.path.join(d.ram, key), d.job_mnt(key)
        os.makedirs(ram)
        os.makedirs(mnt)
        m = harness.Daemon(ramdir=ram, mnt=mnt, opts="ram_size=64M", name="adopted")
        self.addCleanup(m.close)
        m.start()
        # what the earlier driver started it with (issue 26: compared too)
        with open(os.path.join(d.state, key, "attrs"), "w") as f:
            f.write("peerPort=%d\nramSize=\nsubdomain=\ncoordinator=127.0.0.1:%d\n" % (port, port))
        t = d.target("ad")
        r = d.publish(t, pod_ctx("adopt-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % port))
        self.assertEqual(r["code"], "OK", r)
        d.expected.append(r"refused: job default.adopt: volume attributes differ")
        r = d.publish(d.target("ad2"), pod_ctx("adopt-w-0-0-bbbbb", ramSize="64Mi",
                                               coordinator="127.0.0.1:%d" % port))
        self.assertEqual(r["code"], "FAILED_PRECONDITION", r)
        self.assertIn("volume attributes differ from the adopted mount's at %s (ramSize (none) "
                      "-> 64Mi), which is not ours to restart" % mnt, r["details"])
        self.assertEqual(d.starts(), 0, d.log())
        self.assertRegex(d.log(), r"job default.adopt: adopting the mount already at")
        self.assertEqual(os.stat(t).st_dev, os.stat(mnt).st_dev)
        self.assertTrue(m.running())
        harness.write_file(os.path.join(t, "via-target"), b"adopted")
        with open(os.path.join(mnt, "via-target"), "rb") as f:
            self.assertEqual(f.read(), b"adopted")
        os.unlink(os.path.join(mnt, "via-target"))
        self.assertEqual(d.unpublish(t)["code"], "OK")
        m.stop()

    def test_nofile_reaches_the_job_mounts(self):
        # Kubernetes sets no open-file limit for a container: --nofile is
        # the driver's (the DaemonSet passes 1048576), and the job mounts
        # inherit it; rank 0's coordinator logs how many nodes that gives
        pa, = free_ports(1)
        # below the hard limit: a container here cannot raise that
        # (no CAP_SYS_RESOURCE), a privileged node pod can
        d = self.driver(config="peerPort: %d\n" % pa, extra=["--nofile", "8192"])
        with open("/proc/%d/limits" % d.proc.pid) as f:
            self.assertRegex(f.read(), r"Max open files\s+8192\s+8192")
        t = d.target("nf")
        r = d.publish(t, pod_ctx("nf-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % pa))
        self.assertEqual(r["code"], "OK", r)
        key = "default.nf"
        log = wait_until(lambda: (lambda t: t if "takes a job of up to" in t else None)(
            d.job_log(key)), TIMEOUT, "the job mount's coordinator capacity line")
        # the limit less FUSE's eighth and the reserve, less the data room
        self.assertRegex(log, r"as the coordinator this node takes a job of up to 6081 nodes "
                              r"\(bound by RLIMIT_NOFILE")
        self.assertEqual(d.unpublish(t)["code"], "OK")

    def test_two_jobs_on_one_node(self):
        # peer ports must agree across a job's nodes: a clash is refused
        # with the fix named; metrics ports are per node: the next free one
        pa, pb, mp = free_ports(3)
        d = self.driver(config="peerPort: %d\nmetricsPort: %d\n" % (pa, mp))
        d.expected.append(r"refused: job default.jb: peer port")
        ta, tb = d.target("ja"), d.target("jb")
        self.assertEqual(d.publish(ta, pod_ctx("ja-w-0-0-aaaaa",
                                               coordinator="127.0.0.1:%d" % pa))["code"], "OK")
        r = d.publish(tb, pod_ctx("jb-w-0-0-bbbbb", coordinator="127.0.0.1:%d" % pa))
        self.assertEqual(r["code"], "FAILED_PRECONDITION", r)
        self.assertIn("peer port %d is used by job default.ja" % pa, r["details"])
        r = d.publish(tb, pod_ctx("jb-w-0-0-bbbbb", peerPort=str(pb),
                                  coordinator="127.0.0.1:%d" % pb))
        self.assertEqual(r["code"], "OK", r)
        self.assertRegex(d.log(), r"default.ja: starting mtcfs .*metrics=127.0.0.1:%d[ ,]" % mp)
        self.assertRegex(d.log(), r"default.jb: starting mtcfs .*metrics=127.0.0.1:%d[ ,]"
                         % (mp + 1))
        import urllib.request
        for port in (mp, mp + 1):
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as u:
                self.assertIn(b"mtcfs_", u.read())
        self.assertNotEqual(os.stat(ta).st_dev, os.stat(tb).st_dev)
        for t in (ta, tb):
            self.assertEqual(d.unpublish(t)["code"], "OK")

    def test_unpublish_busy_target(self):
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        d.expected.append(r"busy, detached lazily")
        ctx = pod_ctx("busy-w-0-0-xyz12", coordinator="127.0.0.1:%d" % port)
        t = d.target("busy")
        self.assertEqual(d.publish(t, ctx)["code"], "OK")
        f = open(os.path.join(t, "open-file"), "wb")
        try:
            r = d.unpublish(t)
            self.assertEqual(r["code"], "OK", r)
            self.assertIsNone(mount_fstype(t))
            self.assertRegex(d.log(), r"unpublish %s: busy, detached lazily" % re.escape(t))
            # the detached mount still serves the open file
            f.write(b"still here")
            f.flush()
        finally:
            f.close()
        mnt = d.job_mnt("default.busy")
        self.assertEqual(mount_fstype(mnt), "fuse.mtcfs")
        with open(os.path.join(mnt, "open-file"), "rb") as g:
            self.assertEqual(g.read(), b"still here")

    def test_bad_requests(self):
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        ctx = pod_ctx("bad-w-0-0-abcde", coordinator="127.0.0.1:%d" % port)
        t = d.target("bad")

        def code(r):
            return r["code"], r["details"]
        self.assertEqual(code(d.call("Node.NodePublishVolume", {
            "volume_id": "v", "volume_capability": MOUNT_CAP, "volume_context": ctx})),
            ("INVALID_ARGUMENT", "target_path missing"))
        self.assertEqual(code(d.call("Node.NodePublishVolume", {
            "target_path": t, "volume_capability": MOUNT_CAP, "volume_context": ctx})),
            ("INVALID_ARGUMENT", "volume_id missing"))
        self.assertEqual(code(d.publish(t, ctx, cap=None)),
                         ("INVALID_ARGUMENT", "volume_capability missing"))
        self.assertEqual(d.publish(t, ctx, cap={"block": {}})["code"], "INVALID_ARGUMENT")
        self.assertEqual(code(d.publish(t, dict(ctx, jobname="x"))),
                         ("INVALID_ARGUMENT", "unknown volume attribute jobname"))
        r = d.publish(t, dict(ctx, podsPerJob="zero"))
        self.assertEqual(r["code"], "INVALID_ARGUMENT")
        self.assertIn("podsPerJob", r["details"])
        r = d.publish(t, pod_ctx("standalone", coordinator="127.0.0.1:1"))
        self.assertEqual(r["code"], "INVALID_ARGUMENT")
        self.assertIn("jobName and rank", r["details"])
        self.assertEqual(d.publish("relative/path", ctx)["code"], "INVALID_ARGUMENT")
        r = d.publish(t, dict(ctx, jobName="../escape", rank="0"))
        self.assertEqual(r["code"], "INVALID_ARGUMENT")
        # nothing was started for any of them
        self.assertEqual(d.starts(), 0)
        self.assertFalse(os.path.exists(t))
        # a target that holds some other mount
        os.makedirs(t)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "other", t], check=True)
        r = d.publish(t, ctx)
        self.assertEqual(r["code"], "ALREADY_EXISTS", r)
        self.assertEqual(mount_fstype(t), "tmpfs")
        subprocess.run(["umount", t], check=True)
        self.assertEqual(d.unpublish("")["code"], "INVALID_ARGUMENT")
        self.assertEqual(code(d.call("Node.NodeUnpublishVolume", {"target_path": t})),
                         ("INVALID_ARGUMENT", "volume_id missing"))
        self.assertEqual(d.call("Node.NodeStageVolume", {"volume_id": "v"})["code"],
                         "UNIMPLEMENTED")
        # a method of no service served here (kubelet's controller probing,
        # a newer spec): answered at once, not left to its deadline
        m = "/csi.v1.Controller/ControllerGetCapabilities"
        self.assertEqual(code(self.k.calls([{"sock": d.sock, "method": m, "timeout": 10}])[0]),
                         ("UNIMPLEMENTED", "unknown method " + m))
        # and it still serves good ones
        self.assertEqual(d.publish(t, ctx)["code"], "OK")
        self.assertEqual(d.unpublish(t)["code"], "OK")

    # --- issue 22.8: what a caller of the socket can reach -------------------

    def test_socket_is_0600_whatever_the_umask(self):
        # bind(2) gives a socket 0777 & ~umask: under umask 000 anyone could
        # publish a volume (bind mounts made as root)
        d = Driver(self, self.k, "node-a").start(umask=0)
        self.assertEqual(os.stat(d.sock).st_mode & 0o777, 0o600)
        os.chmod(d.dir, 0o755)
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            sys.executable, "-c",
                            "import socket; s = socket.socket(socket.AF_UNIX); "
                            "s.connect(%r)" % d.sock],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"PermissionError", r.stdout)
        self.assertEqual(d.call("Identity.Probe")["code"], "OK")   # root still may

    def test_targets_only_under_kubelets_pods_directory(self):
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        ctx = pod_ctx("conf-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % port)
        outside = os.path.join(d.dir, "outside")
        os.mkdir(outside)
        sym = os.path.join(d.pods, "uid-sym")
        os.makedirs(sym)
        os.symlink(outside, os.path.join(sym, "volumes"))
        bad = [d.ram,                                                   # the RAM tier
               outside,                                                 # any directory
               d.pods + "/uid-x/volumes/../../../outside",              # "/.." included
               d.pods + "/uid-x/volumes/./kubernetes.io~csi/c/mount",
               d.pods + "/uid-x//volumes/kubernetes.io~csi/c/mount",
               d.pods + "/uid-x/etc/mount",                             # not volumes/
               d.pods + "/uid-x/volumes",
               sym + "/volumes/kubernetes.io~csi/c/mount"]              # a symlink on the way
        for t in bad:
            r = d.publish(t, ctx)
            self.assertEqual(r["code"], "INVALID_ARGUMENT", (t, r))
        self.assertEqual(d.starts(), 0)
        self.assertEqual(os.listdir(outside), [])
        self.assertFalse(os.path.exists(d.pods + "/uid-x"))
        # and unpublish: not the RAM tier, not through the symlink
        for t in (d.ram, d.pods + "/uid-x/volumes/../../../ram", bad[-1]):
            r = d.unpublish(t)
            self.assertEqual(r["code"], "INVALID_ARGUMENT", (t, r))
        self.assertEqual(mount_fstype(d.ram), "tmpfs")
        # kubelet's own form works
        t = d.target("ok")
        self.assertEqual(d.publish(t, ctx)["code"], "OK")
        self.assertEqual(mount_fstype(t), "fuse.mtcfs")
        self.assertEqual(d.unpublish(t)["code"], "OK")

    def test_unpublish_only_what_it_published(self):
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        d.expected.append(r"did not publish: left alone")
        # some other mount in a pod's volume directory: not the driver's
        other = d.target("other")
        os.makedirs(other)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "other", other], check=True)
        self.addCleanup(force_unmount, other)
        r = d.unpublish(other)
        self.assertEqual(r["code"], "PERMISSION_DENIED", r)
        self.assertIn("holds a tmpfs mount this driver did not publish", r["details"])
        self.assertEqual(mount_fstype(other), "tmpfs")
        subprocess.run(["umount", other], check=True)
        # its own publishes survive a driver restart (the record in the state dir)
        ctx = pod_ctx("rec-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % port)
        t = d.target("rec")
        self.assertEqual(d.publish(t, ctx)["code"], "OK")
        with open(os.path.join(d.state, "default.rec", "published")) as f:
            self.assertEqual(f.read(), t + "\n")
        d.stop()                  # its mtcfs goes: the bind at t is a dead FUSE mount
        d.start()
        self.assertRegex(d.log(), r"job default.rec: 1 target\(s\) published by an earlier driver")
        self.assertEqual(d.unpublish(t)["code"], "OK")
        self.assertIsNone(mount_fstype(t))
        self.assertFalse(os.path.exists(t))
        self.assertNotIn("has no record of", d.log())
        with open(os.path.join(d.state, "default.rec", "published")) as f:
            self.assertEqual(f.read(), "")

    def test_idle_job_mounts_give_their_port_and_stop(self):
        # one JobSet name in five namespaces, one after the other on the
        # node, all on the default peer port: each new one takes the port of
        # the idle one before it (that one's mtcfs stops, its RAMDIR stays)
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        for i in range(5):
            ns = "team%d" % i
            t = d.target("js-%d" % i)
            r = d.publish(t, pod_ctx("js-w-0-0-aaaa%d" % i, ns=ns,
                                     coordinator="127.0.0.1:%d" % port))
            self.assertEqual(r["code"], "OK", r)
            self.assertEqual(list(d.daemons().values()), [os.path.join(d.ram, ns + ".js")])
            harness.write_file(os.path.join(t, "mark"), ns.encode())
            self.assertEqual(d.unpublish(t)["code"], "OK")
        self.assertEqual(len(re.findall(r"no pod, stopping its mtcfs \(its RAMDIR stays\): "
                                        r"job team\d.js needs peer port", d.log())), 4)
        for i in range(4):
            self.assertEqual(sorted(os.listdir(os.path.join(d.ram, "team%d.js" % i))) != [], True)
        st = d.status()
        self.assertEqual({k: v[0] for k, v in st.items()},
                         dict({"team%d.js" % i: "stopped" for i in range(4)}, **{"team4.js": "idle"}))
        d.stop()
        # with distinct ports: the last pod's unpublish starts the idle
        # clock, --idle-timeout later the mtcfs is gone
        pa, pb = free_ports(2)
        d = self.driver("node-b", config="peerPort: %d\n" % pa, extra=["--idle-timeout", "1"])
        ta, tb = d.target("a"), d.target("b")
        self.assertEqual(d.publish(ta, pod_ctx("ia-w-0-0-aaaaa",
                                               coordinator="127.0.0.1:%d" % pa))["code"], "OK")
        self.assertEqual(d.publish(tb, pod_ctx("ib-w-0-0-aaaaa", peerPort=str(pb),
                                               coordinator="127.0.0.1:%d" % pb))["code"], "OK")
        self.assertEqual(len(d.daemons()), 2)
        harness.write_file(os.path.join(ta, "kept"), b"in RAM")
        self.assertEqual(d.unpublish(ta)["code"], "OK")
        wait_until(lambda: len(d.daemons()) == 1, TIMEOUT, "job ia's mtcfs stopped")
        self.assertRegex(d.log(), r"job default.ia: no pod for 1 s: stopping its mtcfs")
        self.assertIsNone(mount_fstype(d.job_mnt("default.ia")))
        self.assertEqual(list(d.daemons().values()), [os.path.join(d.ram, "default.ib")])
        # a pod of it again: the same RAMDIR under a new mtcfs
        ta = d.target("a2")
        self.assertEqual(d.publish(ta, pod_ctx("ia-w-0-0-bbbbb",
                                               coordinator="127.0.0.1:%d" % pa))["code"], "OK")
        with open(os.path.join(ta, "kept"), "rb") as f:
            self.assertEqual(f.read(), b"in RAM")
        for t in (ta, tb):
            self.assertEqual(d.unpublish(t)["code"], "OK")
        wait_until(lambda: not d.daemons(), TIMEOUT, "every idle mtcfs stopped")

    def test_hostile_values(self):
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        t = d.target("hv")
        ctx = pod_ctx("hv-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % port)
        # a trailing '\\' would escape the comma before rank_hint=
        r = d.publish(t, dict(ctx, coordinator="127.0.0.1:%d\\" % port))
        self.assertEqual(r["code"], "INVALID_ARGUMENT", r)
        self.assertIn("coordinator", r["details"])
        # a newline in an id or a value would forge a log line
        r = d.publish(t, ctx, vol="v1\n2026-01-01 ERROR forged line")
        self.assertEqual((r["code"], r["details"]),
                         ("INVALID_ARGUMENT", "volume_id: a control character in it"))
        r = d.unpublish(t, vol="v1\nforged")
        self.assertEqual(r["code"], "INVALID_ARGUMENT", r)
        r = d.publish(t, dict(ctx, **{"csi.storage.k8s.io/pod.name": "a\nERROR forged"}))
        self.assertEqual(r["code"], "INVALID_ARGUMENT", r)
        r = d.publish(t + "\nforged", ctx)
        self.assertEqual(r["code"], "INVALID_ARGUMENT", r)
        self.assertNotIn("forged", d.log())
        # namespace "a.b" + job "c" and namespace "a" + job "b.c" would share
        # the key a.b.c: a namespace has no '.' in Kubernetes
        r = d.publish(t, pod_ctx("x", ns="a.b", jobName="c", rank="0",
                                 coordinator="127.0.0.1:%d" % port))
        self.assertEqual(r["code"], "INVALID_ARGUMENT", r)
        self.assertIn("namespace a.b", r["details"])
        self.assertEqual(d.starts(), 0)

    # --- issue 24.4: the yaml's node-rank wins, as in GKE ---------------------

    def test_yaml_node_rank_wins_over_the_pods_index(self):
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        # pod index 1, but the application (Orbax: jax.process_index())
        # says node-rank 0 of a 1-node job
        t = d.target("yr")
        r = d.publish(t, pod_ctx("yr-w-1-0-aaaaa", coordinator="127.0.0.1:%d" % port))
        self.assertEqual(r["code"], "OK", r)
        with open(os.path.join(t, "jax-init-info.txt")) as f:
            self.assertEqual(f.read().split("\n")[0], "1")     # until a yaml says
        write_yaml(t, "yr", 0, 1)
        self.assertEqual(wait_markers(t)[0], 0)                # not replicator.failed
        self.assertRegex(d.log(), r"starting mtcfs rank=1: .*,rank_hint=1[ ,]")
        self.assertFalse(os.path.exists(os.path.join(t, "replicator.failed")))
        self.assertRegex(d.job_log("default.yr"),
                         r"WARN ctl: replicator.yaml's node-rank 0 differs from rank_hint=1 "
                         r"\(the pod's index\): node-rank 0 is used")
        with open(os.path.join(t, "jax-init-info.txt")) as f:
            self.assertEqual(f.read().split("\n")[0], "0")
        save_step(t, "yr", 2, 0)
        wait_until(lambda: committed(os.path.join(d.ram, "default.yr"), "yr", 2, 0), TIMEOUT,
                   "step 2 committed as rank 0")
        self.assertEqual(d.unpublish(t)["code"], "OK")

    # --- issue 26: changed volume attributes are applied or refused ----------

    def test_changed_attributes_refused_while_the_job_is_published(self):
        # pod 0-0 runs; pod 0-1 of the same job comes with another peerPort
        # and ramSize: refused, naming each attribute with its old and new
        # value, and the running mount is untouched
        p1, p2 = free_ports(2)
        d = self.driver(config="peerPort: %d\n" % p1)
        d.expected.append(r"refused: job default.ca: volume attributes differ")
        t0, t1 = d.target("ca0"), d.target("ca1")
        ok = d.publish(t0, pod_ctx("ca-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % p1))
        self.assertEqual(ok["code"], "OK", ok)
        harness.write_file(os.path.join(t0, "x"), b"gen1")
        r = d.publish(t1, pod_ctx("ca-w-0-0-bbbbb", coordinator="127.0.0.1:%d" % p2,
                                  peerPort=str(p2), ramSize="64Mi"))
        self.assertEqual(r["code"], "FAILED_PRECONDITION", r)
        want = ("peerPort %d -> %d; ramSize (none) -> 64Mi; coordinator 127.0.0.1:%d -> "
                "127.0.0.1:%d" % (p1, p2, p1, p2))
        self.assertIn(want, r["details"])
        self.assertRegex(d.log(), r"WARN csi: publish of volume csi-vol at %s refused: job "
                         r"default.ca: volume attributes differ from the running job mount's "
                         r"\(%s\) while pod\(s\) of the job still use it"
                         % (re.escape(t1), re.escape(want)))
        self.assertEqual(d.starts(), 1)
        self.assertFalse(os.path.ismount(t1))
        with open(os.path.join(t0, "x"), "rb") as f:
            self.assertEqual(f.read(), b"gen1")
        # the same attributes as the running mount's: fine
        same = d.publish(t1, pod_ctx("ca-w-0-0-bbbbb", coordinator="127.0.0.1:%d" % p1))
        self.assertEqual(same["code"], "OK", same)
        self.assertEqual(d.starts(), 1)
        for t in (t0, t1):
            self.assertEqual(d.unpublish(t)["code"], "OK")

    def test_changed_attributes_apply_at_a_jobset_restart(self):
        # between two pod generations (no pod published) a new coordinator,
        # peerPort and ramSize restart the job's mtcfs with them, on the
        # same RAMDIR: the step of the first generation restores from RAM
        p1, p2 = free_ports(2)
        d = self.driver(config="peerPort: %d\n" % p1)
        job, key = "cb", "default.cb"
        t = d.target("cb0")
        ok = d.publish(t, pod_ctx("cb-w-0-0-aaaaa", coordinator="127.0.0.1:%d" % p1))
        self.assertEqual(ok["code"], "OK", ok)
        write_yaml(t, job, 0, 1)
        self.assertEqual(wait_markers(t)[0], 0)
        save_step(t, job, 3, 0)
        wait_until(lambda: committed(os.path.join(d.ram, key), job, 3, 0), TIMEOUT,
                   "step 3 committed")
        self.assertEqual(d.unpublish(t)["code"], "OK")
        t = d.target("cb1")
        ok = d.publish(t, pod_ctx("cb-w-0-0-bbbbb", coordinator="127.0.0.1:%d" % p2,
                                  peerPort=str(p2), ramSize="64Mi"))
        self.assertEqual(ok["code"], "OK", ok)
        self.assertEqual(d.starts(), 2, d.log())
        self.assertRegex(d.log(), r"job default.cb: volume attributes changed \(peerPort %d -> "
                         r"%d; ramSize \(none\) -> 64Mi; coordinator 127.0.0.1:%d -> "
                         r"127.0.0.1:%d\) and no pod uses its mount: restarting" % (p1, p2, p1, p2))
        self.assertRegex(d.log().split("volume attributes changed")[1],
                         r"starting mtcfs rank=0: \S+ -f -o listen=127.0.0.1:%d,"
                         r"coordinator=127.0.0.1:%d,rank_hint=0,ram_size=64Mi[ ,]" % (p2, p2))
        write_yaml(t, job, 0, 1)
        step, ms = wait_markers(t)
        self.assertEqual(step, 3)
        os.replace(os.path.join(t, ms[0]), os.path.join(t, "3"))
        check_step(self, t, job, 3, 0)
        self.assertRegex(d.job_log(key), r"restore job=%s step=3 source=local" % job)
        self.assertEqual(d.unpublish(t)["code"], "OK")

    def test_no_pods_per_job_and_no_api_leaves_the_rank_to_the_yaml(self):
        # GKE's JobSet has no podsPerJob; outside a cluster (no API to read
        # the Job's parallelism) pod 1-1 cannot know its rank: no longer an
        # error, its mtcfs starts without rank_hint= and the yaml says
        port = free_ports(1)[0]
        d = self.driver(config="peerPort: %d\n" % port)
        t = d.target("nr")
        r = d.publish(t, pod_ctx("nr-w-1-1-aaaaa", coordinator="127.0.0.1:%d" % port))
        self.assertEqual(r["code"], "OK", r)
        self.assertRegex(d.log(), r"starting mtcfs rank=\?: \S+ -f -o listen=127.0.0.1:%d,"
                         r"coordinator=127.0.0.1:%d \S+ \S+\n" % (port, port))
        self.assertRegex(d.log(), r"published volume csi-vol of job default.nr \(pod "
                         r"nr-w-1-1-aaaaa, rank \?\)")
        write_yaml(t, "nr", 0, 1)
        self.assertEqual(wait_markers(t)[0], 0)
        with open(os.path.join(t, "jax-init-info.txt")) as f:
            self.assertEqual(f.read().split("\n")[0], "0")
        self.assertEqual(d.unpublish(t)["code"], "OK")

    # --- issue 24.5: RAM of jobs that no longer run is given back --------------

    def test_ram_of_stopped_jobs_is_freed_under_pressure(self):
        pa, pb = free_ports(2)
        d = self.driver(config="spec:\n  peerPort: %d\n  inMemoryVolumeSize: 64Mi\n" % pa,
                        extra=["--idle-timeout", "1", "--free-above", "50"])
        big = os.urandom(1 << 20) * 40              # 40 MiB of the 64
        ta = d.target("fa")
        self.assertEqual(d.publish(ta, pod_ctx("fa-w-0-0-aaaaa",
                                               coordinator="127.0.0.1:%d" % pa))["code"], "OK")
        harness.write_file(os.path.join(ta, "big"), big)
        self.assertEqual(d.unpublish(ta)["code"], "OK")
        wait_until(lambda: not d.daemons(), TIMEOUT, "job fa's mtcfs stopped")
        # alone on the node, a stopped job keeps its RAM however full (its
        # JobSet may be between two generations of pods)
        ra = os.path.join(d.ram, "default.fa")
        self.assertTrue(os.listdir(ra))
        self.assertNotIn("freed its RAMDIR", d.log())
        st = d.status()
        self.assertEqual(st["default.fa"][0], "stopped")
        self.assertGreaterEqual(int(st["default.fa"][1]), 40 << 20)
        self.assertEqual(st["default.fa"][2], "0")
        self.assertRegex(st["default.fa"][3], r"^\d{4}-\d\d-\d\dT")
        # another job starts: the tier is 62% full, over 50%: fa's RAM goes
        tb = d.target("fb")
        self.assertEqual(d.publish(tb, pod_ctx("fb-w-0-0-aaaaa", peerPort=str(pb),
                                               coordinator="127.0.0.1:%d" % pb))["code"], "OK")
        self.assertRegex(d.log(), r"job default.fa: no pod since \S+ and the RAM tier \d+%% full "
                                  r"while another job runs: freed its RAMDIR %s \(\d+ bytes\)"
                                  % re.escape(ra))
        self.assertFalse(os.path.exists(ra))
        st = d.status()
        self.assertNotIn("default.fa", st)
        self.assertEqual((st["default.fb"][0], st["default.fb"][2:]), ("published", ["1", "-"]))
        # the running job has the room: 40 MiB more fit, and stay while it
        # runs, over the mark as it is
        harness.write_file(os.path.join(tb, "big"), big)
        with open(os.path.join(tb, "big"), "rb") as f:
            self.assertEqual(f.read(), big)
        self.assertEqual(d.unpublish(tb)["code"], "OK")
        wait_until(lambda: not d.daemons(), TIMEOUT, "job fb's mtcfs stopped")
        self.assertTrue(os.listdir(os.path.join(d.ram, "default.fb")))
        self.assertEqual(len(re.findall("freed its RAMDIR", d.log())), 1)

    def test_gkes_configuration_applies(self):
        # issue 24.6: GKE's documented CheckpointConfiguration as it is
        # (its own group, its csiEphemeralLimit and enableExternalJaxProcessIds)
        gke = ("apiVersion: checkpointing.gke.io/v1\nkind: CheckpointConfiguration\n"
               "metadata:\n  name: my-checkpointconfiguration\nspec:\n"
               "  cloudStorageBucketName: file://%s\n"
               "  nodeSelector:\n    node.kubernetes.io/instance-type: ct5p-hightpu-4t\n"
               "  tolerations:\n  - key: google.com/tpu\n    operator: Exists\n"
               "    effect: NoSchedule\n"
               "  inMemoryVolumeSize: 64Mi\n  csiEphemeralLimit: 50Mi\n"
               "  enableExternalJaxProcessIds: true\n  replicationOptions: [verbose-logs]\n"
               "  gcsFuseMountOptions: [implicit-dirs]\n" % self.tmp)
        d = self.driver(config=gke)
        self.assertIn("csiEphemeralLimit/replicationOptions accepted and ignored", d.log())
        self.assertIn("enableExternalJaxProcessIds: mtcfs writes jax-init-info.txt", d.log())

    def test_bad_config_refused(self):
        cfg = os.path.join(self.tmp, "bad.yaml")
        for text, want in (("spec:\n  inMemoryVolumeSize: lots\n", "inMemoryVolumeSize"),
                           ("spec:\n  cloudStorageBucket: b\n", "unknown key cloudStorageBucket"),
                           ("- a\n- b\n", "expected a mapping")):
            with open(cfg, "w") as f:
                f.write(text)
            r = subprocess.run([CSI_BIN, "--endpoint", "unix://" + os.path.join(self.tmp, "s"),
                                "--node-id", "n", "--config", cfg, "--no-tmpfs",
                                "--ram-root", os.path.join(self.tmp, "r"),
                                "--state-dir", os.path.join(self.tmp, "j")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertIn(want, r.stdout.decode())


if __name__ == "__main__":
    harness.main()
