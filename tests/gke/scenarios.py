"""The same multi-node scenarios on GKE's replicator and on mtcfs, side by
side (issue 24). Started by tests/gke/run, inside a private network and
mount namespace (only lo; the bind mounts and FUSE mounts die with it).

Each backend runs up to 4 "nodes" on this machine. The application side is
played the way Orbax plays it: replicator.yaml written (tmp + rename),
waited until it disappears, then the *.restore markers; the newest marker
is renamed to <step> and its files read; a save is
<step>.orbax-checkpoint-tmp-<rank> + files + rename to <step>.

GKE: checkpoint-replicator's repl.py per node (tests/gke/gke_node.py, its
VM_TEST platform), node dir NODE/local (the application's dir), NODE/repl
(peer mounts: bind mounts of the peers' local dirs, tests/gke/shim/sudo),
the backup volume BUCKET/JOB (a plain directory; VM_TEST mounts nothing).
mtcfs: one mtcfs per node (tests/integration/harness.py), registered with
rank 0's coordinator (the rank comes from the yaml, as in GKE), bucket
file://BUCKET (so backups are BUCKET/JOB/NAME on both).

Output: a side-by-side table on stdout and a JSON of every observation
(--json FILE). Scenarios: replication, wipe1, wipeall, restore_version,
dp2, shrink, grow (--only NAME,...).
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
import harness  # noqa: E402
from cluster import shard_files  # noqa: E402
from harness import read_tree, wait_until  # noqa: E402

SCENARIOS = ["replication", "wipe1", "wipeall", "restore_version", "dp2",
             "shrink", "grow", "restore_version_size"]
TIMEOUT = 120
SIZE = 64 * 1024
MARKER_RE = re.compile(r"^(.+)-s(\d+)-n(\d+)-w(\d+)\.restore$")
META_RE = re.compile(r"^(.+)-s(\d+)-n(\d+)-w(\d+)\.meta$")
BACKUP_RE = re.compile(r"^\d{4}-\d{2}-\d{2}_\d{2}-\d{2}(?:-\d+)?$")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_yaml(job, rank, nodes, dp=None, minutes=30, port=4242):
    """The same text for both: the keys Orbax and NeMo write, plus VM_TEST's
    master (mtcfs accepts and ignores master/master-port)."""
    t = ("job-name: %s\nframework: orbax\nnode-rank: %d\nnodes: %d\n"
         "peers-per-node: 1\n" % (job, rank, nodes))
    if dp is not None:
        t += "assume-data-parallelism: %d\n" % dp
    t += ("backup-interval-minutes: %d\nmaster: tcp://127.0.0.1:%d\n"
          "master-port: %d\n" % (minutes, port, port))
    return t


def read_text(p):
    try:
        with open(p, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def save_step(d, job, step, col, rank):
    """Orbax's save into app dir d; the content is column col's (data
    parallel replicas save the same bytes)."""
    tmp = os.path.join(d, "%d.orbax-checkpoint-tmp-%d" % (step, rank))
    for rel, data in shard_files(job, step, col, SIZE).items():
        p = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        harness.write_file(p, data)
    harness.write_file(os.path.join(tmp, "commit_success.txt"), b"ok\n")
    os.rename(tmp, os.path.join(d, str(step)))


def identify(job, tree, steps, cols):
    """Which (step, col) a restored tree holds, or 'differs'."""
    tree = {k: v for k, v in tree.items() if k != "commit_success.txt"}
    for s in steps:
        for c in cols:
            if tree == shard_files(job, s, c, SIZE):
                return "s%d/c%d" % (s, c)
    return "differs (%d files)" % len(tree)


def bucket_listing(root, job):
    """{backup name: sorted 's<S>-n<R>' of its .meta files} and whether
    restore.version is there."""
    d = os.path.join(root, job)
    out = {}
    if not os.path.isdir(d):
        return out
    for n in sorted(os.listdir(d)):
        p = os.path.join(d, n)
        if not (os.path.isdir(p) and BACKUP_RE.match(n)):
            continue
        metas = []
        for x in os.listdir(p):
            m = META_RE.match(x)
            if m and m.group(1) == job:
                metas.append("s%s-n%s" % (m.group(2), m.group(3)))
        out[n] = sorted(metas)
    return out


# =============================================================================
# GKE's replicator
# =============================================================================

LIVE_GKE = set()


def _on_signal(signum, frame):
    """GKE's nodes run in their own sessions: stop them before the harness
    unmounts mtcfs and exits (harness._on_signal)."""
    for nd in list(LIVE_GKE):
        try:
            nd.stop()
        except Exception:
            pass
    harness._on_signal(signum, frame)


class GkeNode:
    def __init__(self, be, i):
        self.be, self.i = be, i
        self.dir = os.path.join(be.dir, "node%d" % i)
        self.local = os.path.join(self.dir, "local")
        self.ip = "127.0.0.%d" % (10 + i)
        self.proc = None
        self.log = os.path.join(self.dir, "log.txt")
        for sub in ("local", "repl", "prom"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)

    def start(self):
        env = dict(os.environ)
        env.update({
            "PLATFORM_API": "VM_TEST",
            "LOCAL_VOLUME": "local", "REPL_VOLUME": "repl",
            "BACKUP_VOLUME": os.path.join(self.be.bucket, self.be.job),
            "PROMETHEUS_MULTIPROC_DIR": os.path.join(self.dir, "prom"),
            "PROMETHEUS_PORT": str(free_port()),
            "MTCFS_GKE_NODE_IP": self.ip,
            "MTCFS_GKE_PEER_DIRS": " ".join("%s=%s" % (n.ip, n.local) for n in self.be.nodes),
            "PATH": os.path.join(HERE, "shim") + ":" + env.get("PATH", "/usr/bin:/bin"),
        })
        os.makedirs(env["BACKUP_VOLUME"], exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.be.py, os.path.join(HERE, "gke_node.py"), "loop", self.be.src, self.dir],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True)
        LIVE_GKE.add(self)

    def stop(self):
        LIVE_GKE.discard(self)
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc = None

    def log_count(self, text):
        return (read_text(self.log) or "").count(text)


class Gke:
    name = "gke"

    def __init__(self, src, py, n, job, workdir):
        self.src, self.py, self.n, self.job = src, py, n, job
        self.dir = tempfile.mkdtemp(prefix="gke-%s-" % job, dir=workdir)
        self.bucket = os.path.join(self.dir, "bucket")
        os.makedirs(self.bucket)
        self.port = free_port()
        self.nodes = []
        for i in range(n):
            self.nodes.append(GkeNode(self, i))

    def start(self):
        for nd in self.nodes:
            nd.start()

    def close(self):
        for nd in self.nodes:
            nd.stop()

    def app_dir(self, i):
        return self.nodes[i].local

    def before_start(self, i):
        """A mark taken before the yaml is written: the count of watcher
        starts in node i's log."""
        return self.nodes[i].log_count("Watching for dirs matching")

    def after_markers(self, i, mark):
        """GKE starts its save watcher only after the markers and the
        clean-up (a step renamed earlier is missed, GkeSideBySide): wait
        for it, as a real job's first save comes much later."""
        wait_until(lambda: self.nodes[i].log_count("Watching for dirs matching") > mark,
                   TIMEOUT, "gke node %d save watcher" % i)

    def coord_mark(self):
        return self.nodes[0].log_count("Collecting 'restore' requests")

    def wait_coord(self, mark):
        """Rank 0's new coordinator is listening. Written at once, a node
        can reach the port while the last incarnation's coordinator is being
        killed: its ZMQ REQ then waits forever for the answer (seen in the
        wipe1 run, 2026-12-02). A real job has that race; here rank 0 goes
        first so the scenarios are repeatable."""
        wait_until(lambda: self.coord_mark() > mark, TIMEOUT, "gke rank 0's coordinator")

    def wipe(self, i):
        nd = self.nodes[i]
        nd.stop()
        for x in os.listdir(nd.local):
            p = os.path.join(nd.local, x)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
        nd.start()

    def holdings(self, i):
        """What node i keeps: 's<S>-n<R>' (+ ' meta only' when the .data the
        .meta names is not on the node)."""
        d = self.nodes[i].local
        out = []
        for x in os.listdir(d):
            m = META_RE.match(x)
            if not m or m.group(1) != self.job:
                continue
            h = read_text(os.path.join(d, x)) or ""
            tag = "s%s-n%s" % (m.group(2), m.group(3))
            if not os.path.exists(os.path.join(d, h + ".data")):
                tag += " meta only"
            out.append(tag)
        return sorted(out)

    def settled(self, step, ranks):
        """Every node of ranks has its own .meta of step (older steps may
        stay: GKE keeps the step of a backup still running)."""
        for r in ranks:
            h = self.holdings(r)
            if not any(x.startswith("s%d-n%d" % (step, r)) for x in h):
                return False
        return True


# =============================================================================
# mtcfs
# =============================================================================

class Mtcfs:
    name = "mtcfs"

    def __init__(self, n, job, workdir):
        self.n, self.job = n, job
        self.dir = tempfile.mkdtemp(prefix="mtcfs-%s-" % job, dir=workdir)
        self.bucket = os.path.join(self.dir, "bucket")
        os.makedirs(self.bucket)
        ports = harness.free_ports(n)
        self.addrs = ["127.0.0.1:%d" % p for p in ports]
        secret = os.path.join(self.dir, "secret")
        with open(secret, "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        self.port = 4242
        self.nodes = []
        for i in range(n):
            opts = ("ram_size=256M,listen=%s,coordinator=%s,restore_timeout=15,"
                    "secret_file=%s,bucket=file://%s" % (
                        self.addrs[i], self.addrs[0], secret, self.bucket))
            self.nodes.append(harness.Daemon(opts=opts, name="node%d" % i))

    def start(self):
        for d in self.nodes:
            d.start()

    def close(self, strict=False):
        """strict (the tests): a node's log finding fails; else printed."""
        errs = []
        for d in self.nodes:
            try:
                d.close()
            except Exception as e:
                errs.append(e)
                print("mtcfs node %s close: %s" % (d.name, str(e)[:2000]))
        shutil.rmtree(self.dir, ignore_errors=True)
        if strict and errs:
            raise errs[0]

    def app_dir(self, i):
        return self.nodes[i].mnt

    def before_start(self, i):
        return None

    def coord_mark(self):
        return None

    def wait_coord(self, mark):
        pass

    def after_markers(self, i, mark):
        pass

    def wipe(self, i):
        d = self.nodes[i]
        d.kill9()
        d.wipe_ramdir()
        d.start()

    def holdings(self, i):
        out = []
        for s in harness.admin_ls(self.nodes[i].ramdir)["shards"]:
            if s["job"] == self.job and s["state"] in harness.COMMITTED_STATES:
                out.append("s%d-n%d" % (s["step"], s["rank"]))
        return sorted(set(out))

    def settled(self, step, ranks):
        for r in ranks:
            h = self.holdings(r)
            if "s%d-n%d" % (step, r) not in h:
                return False
        return True


# =============================================================================
# the application, as Orbax plays it
# =============================================================================

class App:
    def __init__(self, be, facts):
        self.be, self.facts = be, facts
        self.job = be.job

    def record(self, scenario, key, value):
        self.facts.setdefault(scenario, {}).setdefault(key, {})[self.be.name] = value

    def start_job(self, scenario, ranks, nodes, dp=None, minutes=30, read=True,
                  steps=(), cols=()):
        """Every node of ranks (node i = rank i) writes the yaml; waits for
        the yaml to go and for this job's markers; records per node what
        the application sees; renames the newest marker to <step> and
        reads it (read=True). Returns {rank: step restored}."""
        obs, errs = {}, []
        cmark = self.be.coord_mark()

        def one(r):
            try:
                if r != 0:
                    self.be.wait_coord(cmark)
                obs[r] = self.node_start(r, nodes, dp, minutes, read, steps, cols)
            except Exception as e:
                errs.append("node %d: %s" % (r, e))
        ts = [threading.Thread(target=one, args=(r,)) for r in ranks]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for r in sorted(obs):
            self.record(scenario, "start n%d" % r, obs[r])
        if errs:
            self.record(scenario, "start errors", errs)
            raise AssertionError("; ".join(errs))
        return {r: obs[r]["step"] for r in obs}

    def node_start(self, r, nodes, dp, minutes, read, steps, cols):
        d = self.be.app_dir(r)
        y = os.path.join(d, "replicator.yaml")
        wait_until(lambda: not os.path.exists(y), TIMEOUT, "yaml absent on node %d" % r)
        mark = self.be.before_start(r)
        with open(y + ".tmp", "w") as f:
            f.write(job_yaml(self.job, r, nodes, dp, minutes, self.be.port))
        t0 = time.monotonic()
        os.rename(y + ".tmp", y)
        wait_until(lambda: not os.path.exists(y), TIMEOUT, "yaml consumed on node %d" % r)
        t_yaml = time.monotonic() - t0
        failed = os.path.join(d, "replicator.failed")

        def markers():
            if os.path.exists(failed):
                raise AssertionError("replicator.failed: %s" % read_text(failed))
            m = sorted(x for x in os.listdir(d) if MARKER_RE.match(x)
                       and MARKER_RE.match(x).group(1) == self.job)
            return m or None
        ms = wait_until(markers, TIMEOUT, "markers on node %d" % r)
        t_markers = time.monotonic() - t0
        # what the application sees once the replicator is done with the
        # start (GKE deletes and collects after the markers)
        self.be.after_markers(r, mark)
        time.sleep(1.0)
        ms = markers()
        o = {"yaml_gone_s": round(t_yaml, 1), "markers_s": round(t_markers, 1),
             "markers": ms, "prerestore": read_text(os.path.join(d, "replicator.prerestore")),
             "errors": read_text(os.path.join(d, "replicator.errors")),
             "failed": read_text(failed)}
        kinds = []
        for x in ms:
            p = os.path.join(d, x)
            if os.path.islink(p):
                kinds.append("symlink -> " + os.readlink(p))
            else:
                kinds.append("file of %d bytes" % os.path.getsize(p))
        o["marker_kinds"] = kinds
        o["top"] = sorted(os.listdir(d))
        step = max(int(MARKER_RE.match(x).group(2)) for x in ms)
        o["step"] = step
        if read and step > 0:
            newest = [x for x in ms if int(MARKER_RE.match(x).group(2)) == step][0]
            os.rename(os.path.join(d, newest), os.path.join(d, str(step)))
            try:
                o["read"] = identify(self.job, read_tree(os.path.join(d, str(step))),
                                     steps or [step], cols or range(4))
            except OSError as e:
                o["read"] = "error: %s" % e
        return o

    def save(self, step, ranks, col_of):
        for r in ranks:
            save_step(self.be.app_dir(r), self.job, step, col_of(r), r)

    def settle(self, scenario, step, ranks, timeout=TIMEOUT):
        t0 = time.monotonic()
        wait_until(lambda: self.be.settled(step, ranks), timeout,
                   "%s: step %d settled on %s" % (self.be.name, step, ranks))
        # replicas land after the owner's commit: give them a moment, then
        # record what every node holds
        prev = None
        for _ in range(40):
            cur = {r: self.be.holdings(r) for r in ranks}
            if cur == prev:
                break
            prev = cur
            time.sleep(0.5)
        self.record(scenario, "save s%d settled_s" % step, round(time.monotonic() - t0, 1))
        self.record(scenario, "holds after s%d" % step,
                    {"n%d" % r: cur[r] for r in ranks})

    def wait_backup(self, scenario, step, ranks, timeout=TIMEOUT):
        """A backup in BUCKET/JOB holding step's .meta of every rank;
        returns its name."""
        want = ["s%d-n%d" % (step, r) for r in ranks]
        t0 = time.monotonic()

        def ok():
            for name, metas in bucket_listing(self.be.bucket, self.job).items():
                if all(w in metas for w in want):
                    return name
            return None
        try:
            name = wait_until(ok, timeout, "backup of step %d" % step)
        except AssertionError:
            self.record(scenario, "backup of s%d" % step, "none within %d s" % timeout)
            self.record(scenario, "bucket", bucket_listing(self.be.bucket, self.job))
            raise
        self.record(scenario, "backup of s%d" % step,
                    {"after_s": round(time.monotonic() - t0, 1), "name_form": "YYYY-MM-DD_HH-MM"
                     if re.match(r"^\d{4}-\d{2}-\d{2}_\d{2}-\d{2}$", name) else name})
        return name


# =============================================================================
# the scenarios
# =============================================================================

def next_minute(name):
    """Wait until the UTC minute is past the backup name's."""
    wait_until(lambda: datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d_%H-%M") != name, 70, "the next UTC minute", max_interval=1)


def col_identity(r):
    return r


def sc_cluster_2(app, facts, only):
    """replication, wipe1, wipeall, restore_version on one 2-node job."""
    be = app.be
    ranks = [0, 1]
    steps = [1, 2, 3, 4]
    # backups every step (GKE: minutes 0 is every sync round)
    mins = 0
    s = "replication"
    app.start_job(s, ranks, 2, minutes=mins)
    app.save(1, ranks, col_identity)
    app.settle(s, 1, ranks)
    app.save(2, ranks, col_identity)
    app.settle(s, 2, ranks)
    app.start_job(s + " restart", ranks, 2, minutes=mins, steps=steps, cols=ranks)
    if "wipe1" in only:
        s = "wipe1"
        be.wipe(1)
        app.start_job(s, ranks, 2, minutes=mins, steps=steps, cols=ranks)
    if "wipeall" in only or "restore_version" in only:
        s = "wipeall"
        app.save(3, ranks, col_identity)
        app.settle(s, 3, ranks)
        name3 = app.wait_backup(s, 3, ranks)
        app.record(s, "bucket before wipe", bucket_listing(be.bucket, be.job))
        for r in ranks:
            be.wipe(r)
        got = app.start_job(s, ranks, 2, minutes=mins, steps=steps, cols=ranks)
        app.record(s, "prerestore names the backup",
                   all("restore-backup: %s" % name3 in (facts[s]["start n%d" % r][be.name]["prerestore"] or "")
                       for r in ranks))
        if "restore_version" in only:
            s = "restore_version"
            # a second backup in a later minute (names are per minute)
            next_minute(name3)
            app.save(4, ranks, col_identity)
            app.settle(s, 4, ranks)
            name4 = app.wait_backup(s, 4, ranks)
            app.record(s, "second backup is another name", name4 != name3)
            rv = os.path.join(be.bucket, be.job, "restore.version")
            with open(rv, "w") as f:
                f.write(name3 + "\n")
            app.start_job(s, ranks, 2, minutes=mins, steps=steps, cols=ranks)
            app.record(s, "prerestore names the forced backup",
                       all("restore-backup: %s" % name3 in (facts[s]["start n%d" % r][be.name]["prerestore"] or "")
                           for r in ranks))
            app.record(s, "restore.version after start", os.path.exists(rv))
            app.save(5, ranks, col_identity)
            app.settle(s, 5, ranks)
            try:
                wait_until(lambda: not os.path.exists(rv), 30, "restore.version deleted")
            except AssertionError:
                pass
            app.record(s, "restore.version after next step", os.path.exists(rv))
        del got


def sc_cluster_4(app, facts, only):
    """dp2, shrink, grow on one 4-node job."""
    be = app.be
    all4 = [0, 1, 2, 3]

    def col2(r):
        return r % 2
    s = "dp2"
    app.start_job(s, all4, 4, dp=2)
    app.save(1, all4, col2)
    app.settle(s, 1, all4)
    app.save(2, all4, col2)
    app.settle(s, 2, all4)
    app.start_job(s + " restart", all4, 4, dp=2, steps=[1, 2], cols=[0, 1])
    be.wipe(3)
    app.start_job(s + " node 3 wiped", all4, 4, dp=2, steps=[1, 2], cols=[0, 1])
    if "shrink" in only:
        s = "shrink"
        # the same job on two nodes (ranks 0, 1), no data parallelism
        app.start_job(s, [0, 1], 2, steps=[2], cols=[0, 1])
        app.save(3, [0, 1], col_identity)
        app.settle(s, 3, [0, 1])
    if "grow" in only:
        s = "grow"
        if "shrink" not in only:
            app.start_job(s + " on 2", [0, 1], 2, steps=[2], cols=[0, 1])
            app.save(3, [0, 1], col_identity)
            app.settle(s, 3, [0, 1])
        # two new machines join: the job on four nodes, D = 2
        be.wipe(2)
        be.wipe(3)
        app.start_job(s, all4, 4, dp=2, steps=[2, 3], cols=[0, 1])


def sc_rv_size(app, facts, only):
    """restore.version naming a backup of a 4-node job, restarted on 2."""
    be = app.be
    all4 = [0, 1, 2, 3]
    s = "restore_version_size"
    app.start_job(s + " on 4", all4, 4, minutes=0)
    app.save(1, all4, col_identity)
    app.settle(s, 1, all4)
    name1 = app.wait_backup(s, 1, all4)
    # step 2 in a later minute: GKE puts every backup of one UTC minute
    # into that minute's directory (seen in wipeall: s1 and s3 in one)
    next_minute(name1)
    app.save(2, all4, col_identity)
    app.settle(s, 2, all4)
    with open(os.path.join(be.bucket, be.job, "restore.version"), "w") as f:
        f.write(name1 + "\n")
    app.start_job(s, [0, 1], 2, minutes=0, steps=[1, 2], cols=[0, 1])
    app.record(s, "prerestore names the forced backup",
               all("restore-backup: %s" % name1 in (facts[s]["start n%d" % r][be.name]["prerestore"] or "")
                   for r in (0, 1)))


def table(facts, out):
    lines = []
    for sc in facts:
        lines.append("== %s" % sc)
        for key, per in facts[sc].items():
            for be in ("gke", "mtcfs"):
                v = per.get(be, "(not run)")
                lines.append("  %-28s %-5s %s" % (key, be, json.dumps(v, sort_keys=True)))
    out.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gke", required=True, help="checkpoint-replicator checkout")
    ap.add_argument("--py", required=True, help="python of the GKE venv")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--backends", default="gke,mtcfs")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    only = set(a.only.split(","))
    src = os.path.join(os.path.abspath(a.gke), "src", "replicator")
    commit = subprocess.run(["git", "-C", a.gke, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or \
        (read_text(os.path.join(a.gke, ".mtcfs-gke-commit")) or "unknown").strip()
    workdir = tempfile.mkdtemp(prefix="mtcfs-gke-run-")
    facts = {}
    ran = {}
    for bname in a.backends.split(","):
        groups = []
        if only & {"replication", "wipe1", "wipeall", "restore_version"}:
            groups.append(("two", 2, sc_cluster_2))
        if only & {"dp2", "shrink", "grow"}:
            groups.append(("four", 4, sc_cluster_4))
        if "restore_version_size" in only:
            groups.append(("rv", 4, sc_rv_size))
        for gname, n, fn in groups:
            job = "job%s" % gname
            be = Gke(src, a.py, n, job, workdir) if bname == "gke" else Mtcfs(n, job, workdir)
            app = App(be, facts)
            t0 = time.monotonic()
            be.start()
            try:
                fn(app, facts, only)
                ran.setdefault(bname, []).append(gname)
            except Exception as e:
                facts.setdefault("failures", {}).setdefault(gname, {})[bname] = str(e)[:2000]
                print("%s %s: FAILED: %s" % (bname, gname, e), flush=True)
            finally:
                be.close()
            print("%s %s: %.0f s" % (bname, gname, time.monotonic() - t0), flush=True)
    table(facts, sys.stdout)
    groups_of = {"two": ["replication", "wipe1", "wipeall", "restore_version"],
                 "four": ["dp2", "shrink", "grow"], "rv": ["restore_version_size"]}
    for bname in a.backends.split(","):
        done = [x for g in ran.get(bname, []) for x in groups_of[g] if x in only]
        print("gke: scenarios run on %s: %s" % (
            "GKE's replicator %s" % commit if bname == "gke" else bname,
            " ".join(done) or "none"))
    if a.json:
        print("gke: facts in %s" % a.json)
    doc = {"gke_commit": commit, "date": datetime.date.today().isoformat(),
           "scenarios": sorted(only), "ran": ran, "facts": facts}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
    if not a.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if "failures" in facts else 0


if __name__ == "__main__":
    sys.exit(main())
