"""The container image, built and run in real containers (Debian's docker.io).

- The image is built the documented way, without a registry
  (packaging/container/build-image: a debootstrap trixie base imported into
  the engine, the classic builder, the repository's files as context). Its
  build stage packs the Debian 13 .deb and its final stage, a stock trixie
  root, installs it with apt: that is the Debian 13 install test. Inside
  it, `mtcfs --version` reports FUSE passthrough and the package is the
  +deb13 build.
- The node driver mtcfs-csi runs in a container of that image (host
  network, /dev/fuse, CAP_SYS_ADMIN, the kubelet directory shared with
  rshared propagation, as the DaemonSet runs it); a kubelet stand-in on the
  host calls its socket (test_csi.Kubelet). A trainer container of the
  same base runs as uid 1000 with a supplementary group 2000 (an fsGroup)
  and the real torch client (tests/clients/torch_gke.py, GKE's pytorch
  mode) through the published volume. Then a JobSet restart (a new pod and
  a new trainer container) and a node-pod restart (a new driver
  container): each time the trainer restores the newest step from RAM and
  reads back exact tensors, and after the node-pod restart the job's mtcfs
  sees no READ while the trainer loads its committed step (passthrough).

A private dockerd (its own data root, socket and pid file; --bridge=none
--iptables=false) is started for the test and stopped after it; the image
stays cached in its data root. Needs root, docker.io, debootstrap and the
network to the Debian archive; the trainer needs the test venv (torch).
Runs in the release build only (the image builds its own binaries).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
sys.path.insert(0, os.path.join(os.path.dirname(INTEG), "clients"))
import harness  # noqa: E402
from harness import wait_until, admin_ls  # noqa: E402
import launch  # noqa: E402
from test_packaging import run, fortified_build  # noqa: E402
from test_csi import Kubelet, pod_ctx, DRIVER  # noqa: E402,F401

REPO = harness.REPO
DOCKER_ROOT = os.environ.get("MTCFS_DOCKER_ROOT", "/var/lib/mtcfs-test-docker")
DOCKER_RUN = "/run/mtcfs-test-docker"
SOCK = DOCKER_RUN + ".sock"
IMAGE = "mtcfs:test"
BASE = "debian:trixie"
TRAINER = "mtcfs-trainer:test"
# a trainer image: the stock base and what the test venv's interpreter
# loads beyond a minbase root (ctypes' libffi); torch comes from the venv,
# bind-mounted with its interpreter (pyenv keeps that under /root: /root is
# made passable, as a trainer image with its Python there would have it)
TRAINER_DOCKERFILE = ("FROM %s\nRUN apt-get update && apt-get install -y "
                      "--no-install-recommends libffi8 && rm -rf /var/lib/apt/lists/* "
                      "&& chmod 0755 /root\n" % BASE)
TRAINER_UID, TRAINER_GID, FS_GROUP = 1000, 1000, 2000
JOB = "ctr"


def docker(*argv, timeout=600, check=True):
    env = dict(os.environ, DOCKER_HOST="unix://" + SOCK)
    r = subprocess.run(["docker"] + list(argv), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise AssertionError("docker %s failed (rc=%d):\n%s" % (
            " ".join(argv), r.returncode, r.stdout.decode(errors="replace")[-4000:]))
    return r


class Dockerd:
    """A dockerd of the test's own: started, waited for, stopped."""

    def __init__(self):
        # a dockerd killed before it could clean up (a ctest timeout)
        # leaves its own mounts behind: take them away first
        self.unmount_leftovers()
        os.makedirs(DOCKER_ROOT, exist_ok=True)
        self.log = open(os.path.join(DOCKER_ROOT, "dockerd.log"), "ab")
        self.p = subprocess.Popen(
            ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false",
             "--data-root", DOCKER_ROOT, "--exec-root", DOCKER_RUN,
             "--pidfile", DOCKER_RUN + ".pid", "-H", "unix://" + SOCK],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            start_new_session=True)
        harness._LIVE.add(self)
        wait_until(lambda: self.p.poll() is not None or
                   docker("info", timeout=30, check=False).returncode == 0,
                   120, "dockerd answering on " + SOCK, interval=0.5)
        if self.p.poll() is not None:
            raise AssertionError("dockerd exited %d (see %s/dockerd.log)"
                                 % (self.p.returncode, DOCKER_ROOT))

    @staticmethod
    def unmount_leftovers():
        mounts = []
        with open("/proc/mounts") as f:
            for line in f:
                mp = harness._unescape_mount_field(line.split()[1])
                if any(mp == d or mp.startswith(d + "/") for d in (DOCKER_ROOT, DOCKER_RUN)):
                    mounts.append(mp)
        for mp in reversed(mounts):
            subprocess.run(["umount", "-l", mp], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self):
        harness._LIVE.discard(self)
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(30)
        self.log.close()
        self.unmount_leftovers()


class Container(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dockerd = None
        # skipped per test (setUp), not here: a class skipped whole runs no
        # test, which the harness counts as a failure
        cls.skip_reason = None
        if os.geteuid() != 0:
            cls.skip_reason = "needs root"
        elif not fortified_build():
            cls.skip_reason = "the image is built once, in the release build's run"
        if cls.skip_reason:
            return
        for tool in ("dockerd", "docker", "debootstrap"):
            if not shutil.which(tool):
                raise AssertionError("%s is missing (packaging/install-deps.sh installs "
                                     "docker.io and debootstrap)" % tool)
        cls.dockerd = Dockerd()
        t0 = time.monotonic()
        env = dict(os.environ, DOCKER_HOST="unix://" + SOCK)
        r = subprocess.run([os.path.join(REPO, "packaging", "container", "build-image"),
                            "--tag", IMAGE], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=2400, env=env)
        if r.returncode != 0:
            cls.dockerd.close()
            raise AssertionError("build-image failed:\n" + r.stdout.decode(errors="replace")[-6000:])
        sys.stdout.write("  build-image: %.0fs\n" % (time.monotonic() - t0))
        r = subprocess.run(["docker", "build", "--network", "host", "-q", "-t", TRAINER, "-"],
                           input=TRAINER_DOCKERFILE.encode(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=600,
                           env=dict(env, DOCKER_BUILDKIT="0"))
        if r.returncode != 0:
            cls.dockerd.close()
            raise AssertionError("trainer image:\n" + r.stdout.decode(errors="replace")[-4000:])

    @classmethod
    def tearDownClass(cls):
        if cls.dockerd:
            cls.dockerd.close()

    def setUp(self):
        if self.skip_reason:
            self.skipTest(self.skip_reason)
        self.names = []
        self.addCleanup(self.remove_containers)

    def remove_containers(self):
        for n in reversed(self.names):
            docker("rm", "-f", n, check=False, timeout=120)

    def name(self, what):
        n = "mtcfs-test-%s-%d" % (what, os.getpid())
        self.names.append(n)
        docker("rm", "-f", n, check=False)
        return n

    # ------------------------------------------------------------------

    def test_image_has_passthrough_and_the_deb13_package(self):
        out = docker("run", "--rm", "--network", "host", IMAGE, "mtcfs", "--version").stdout.decode()
        self.assertIn("FUSE passthrough: available", out)
        v = docker("run", "--rm", "--network", "host", IMAGE, "dpkg-query", "-W",
                   "-f=${Version} ${Depends}", "mtcfs").stdout.decode()
        self.assertRegex(v, r"^\d+\.\d+\.\d+\+deb13 ")
        self.assertIn("ca-certificates", v)
        self.assertIn("libfuse3-4", v)       # the release's own libfuse 3.17
        for b in ("mtcfs-admin", "mtcfs-csi"):
            docker("run", "--rm", "--network", "host", IMAGE, b, "--version")

    def test_node_driver_and_non_root_trainer_across_restarts(self):
        py = launch.check_runnable(self)
        r = subprocess.run([py, "-c", "import grpc, grpc_tools, torch"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        # the interpreter behind the venv, bind-mounted into the trainer
        base = subprocess.check_output([py, "-c", "import sys; print(sys.base_prefix)"]).decode().strip()
        venv = os.path.dirname(os.path.dirname(py))

        top = tempfile.mkdtemp(prefix="mtcfs-ctr-")
        self.addCleanup(shutil.rmtree, top, True)
        os.chmod(top, 0o755)
        # kubelet's directory is a shared mount: the driver container's
        # mounts under it (rshared) reach the host and the trainer
        run(["mount", "--bind", top, top], check=True)
        self.addCleanup(self.unmount_tree, top)
        run(["mount", "--make-rshared", top], check=True)
        sock = os.path.join(top, "csi", "csi.sock")
        pods = os.path.join(top, "pods")
        for d in ("csi", "pods", "jobs", "ram", "out"):
            os.mkdir(os.path.join(top, d))
        os.chmod(os.path.join(top, "out"), 0o777)
        cfg = os.path.join(top, "config.yaml")
        port = harness.free_ports(1)[0]
        with open(cfg, "w") as f:
            f.write("apiVersion: checkpointing.gke.io/v1\nkind: CheckpointConfiguration\n"
                    "metadata: {name: mtc}\nspec:\n  inMemoryVolumeSize: 1Gi\n"
                    "  peerPort: %d\n" % port)

        def driver():
            n = self.name("node")
            docker("run", "-d", "--name", n, "--network", "host", "--cap-add", "SYS_ADMIN",
                   "--device", "/dev/fuse", "--security-opt", "apparmor=unconfined",
                   "-v", "%s:%s:rshared" % (top, top), IMAGE,
                   "mtcfs-csi", "-d", "--endpoint", "unix://" + sock, "--node-id", "node-a",
                   "--config", cfg, "--ram-root", os.path.join(top, "ram"),
                   "--state-dir", os.path.join(top, "jobs"), "--node-address", "127.0.0.1",
                   "--kubelet-dir", top, "--mtcfs", "/usr/bin/mtcfs")
            return n

        k = Kubelet(self, py, tempfile.mkdtemp(dir=top))
        self.addCleanup(k.close)

        def call(method, req):
            return k.calls([{"sock": sock, "method": method, "req": req}])[0]

        def serving():
            return os.path.exists(sock) and call("Identity.Probe", {})["code"] == "OK"

        def publish(pod):
            t = os.path.join(pods, "uid-" + pod, "volumes", "kubernetes.io~csi",
                             "checkpoint", "mount")
            res = call("Node.NodePublishVolume", {
                "volume_id": "csi-" + pod, "target_path": t,
                # rank 0's pod name does not resolve here (no cluster DNS):
                # the coordinator attribute names its node, as in test_csi
                "volume_context": pod_ctx(pod, ns="ml", coordinator="127.0.0.1:%d" % port),
                "volume_capability": {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}})
            self.assertEqual(res["code"], "OK", res)
            return t

        def unpublish(pod, t):
            res = call("Node.NodeUnpublishVolume", {"volume_id": "csi-" + pod, "target_path": t})
            self.assertEqual(res["code"], "OK", res)

        def trainer(t, steps, gen):
            """One trainer pod's container: uid 1000, fsGroup 2000, torch."""
            out = "/out/report-%s.json" % gen
            n = self.name("trainer-" + gen)
            r = docker(*["run", "--name", n, "--network", "host",
                       "--user", "%d:%d" % (TRAINER_UID, TRAINER_GID),
                       "--group-add", str(FS_GROUP),
                       "-v", "%s:/ckpt" % t, "-v", "%s:/out" % os.path.join(top, "out"),
                       "-v", "%s:%s:ro" % (base, base), "-v", "%s:%s:ro" % (venv, venv),
                       "-v", "%s:/clients:ro" % os.path.join(REPO, "tests", "clients"),
                       "-e", "NODE_RANK=0", "-e", "NNODES=1", "-e", "LOCAL_RANK=0",
                       "-e", "LOCAL_WORLD_SIZE=1", "-e", "RANK=0", "-e", "WORLD_SIZE=1",
                       "-e", "MASTER_ADDR=127.0.0.1",
                       "-e", "MASTER_PORT=%d" % harness.free_ports(1)[0],
                       "-e", "HOME=/tmp", TRAINER, py, "/clients/torch_gke.py", "--dir", "/ckpt",
                       "--job", JOB, "--steps", steps, "--out", out],
                       timeout=600, check=False)
            self.assertEqual(r.returncode, 0, "trainer %s:\n%s" % (gen, r.stdout.decode(errors="replace")[-4000:]))
            with open(os.path.join(top, out.lstrip("/"))) as f:
                return json.load(f)

        def ramdir():
            keys = os.listdir(os.path.join(top, "ram"))
            self.assertEqual(len(keys), 1, keys)
            return os.path.join(top, "ram", keys[0])

        def committed(step):
            return wait_until(lambda: harness.find_shard(admin_ls(ramdir()), step, JOB)
                              and harness.find_shard(admin_ls(ramdir()), step, JOB)["state"]
                              in harness.COMMITTED_STATES, 60, "step %d committed" % step)

        # generation 1: a fresh job saves steps 1 and 2 as uid 1000
        d1 = driver()
        wait_until(serving, 60, "mtcfs-csi in its container serving")
        t1 = publish("ctr-workers-0-0-aaaaa")
        rep = trainer(t1, "1,2", "g1")
        self.assertEqual(rep["restored_step"], 0)
        committed(2)
        # the JobSet restarts: the pod goes, a new one comes
        unpublish("ctr-workers-0-0-aaaaa", t1)
        t2 = publish("ctr-workers-0-0-bbbbb")
        rep = trainer(t2, "3", "g2")
        self.assertEqual((rep["restored_step"], rep["equal"]), (2, True), rep)
        committed(3)
        # the node pod restarts: a new driver container on the same node
        unpublish("ctr-workers-0-0-bbbbb", t2)
        docker("stop", "-t", "60", d1)
        d2 = driver()
        wait_until(serving, 60, "the new mtcfs-csi container serving")
        t3 = publish("ctr-workers-0-0-ccccc")
        logs = [os.path.join(top, "jobs", k, "mtcfs.log") for k in os.listdir(os.path.join(top, "jobs"))]
        before = sum(len(open(p, errors="replace").read()) for p in logs)
        rep = trainer(t3, "", "g3")
        self.assertEqual((rep["restored_step"], rep["equal"]), (3, True), rep)
        # the step was loaded through passthrough: no READ reached mtcfs
        after = "".join(open(p, errors="replace").read()[before if len(logs) == 1 else 0:]
                        for p in logs)
        self.assertIn("passthrough reads of committed files: on",
                      "".join(open(p, errors="replace").read() for p in logs))
        self.assertEqual(re.findall(r"opcode: READ \(", after), [])
        unpublish("ctr-workers-0-0-ccccc", t3)
        docker("stop", "-t", "60", d2)

    def unmount_tree(self, top):
        mounts = []
        with open("/proc/mounts") as f:
            for line in f:
                mp = harness._unescape_mount_field(line.split()[1])
                if mp == top or mp.startswith(top + "/"):
                    mounts.append(mp)
        for mp in reversed(mounts):
            harness.force_unmount(mp)


if __name__ == "__main__":
    harness.main()
