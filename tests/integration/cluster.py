"""Multi-node clusters for integration tests: N mtcfs processes on loopback,
each with its own RAMDIR and mount, a static peers= table, a shared secret,
and helpers that play the training job on every node the way Orbax does.

Everything started here is registered with the harness, so it is unmounted
and reaped even when a test fails.
"""
import os
import re
import tempfile
import threading
import time

import harness
from harness import Daemon, wait_until, admin_ls, free_ports  # noqa: F401 (re-exported)

MiB = 1 << 20
# a backup's name: the UTC minute it started, -N when one minute has several
BACKUP_NAME_RE = r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}(?:-\d+)?"


def shard_bytes(job, step, rank, size=256 * 1024):
    """Deterministic per-(job, step, rank) content, cheap to regenerate."""
    import hashlib
    seed = hashlib.sha256(("%s/%d/%d" % (job, step, rank)).encode()).digest()
    reps = size // len(seed) + 1
    return (seed * reps)[:size]


def shard_files(job, step, rank, size=256 * 1024):
    return {
        "state/params/0.0": shard_bytes(job, step, rank, size),
        "state/opt/0.0": shard_bytes(job + "-opt", step, rank, size // 4 + 13),
        "_CHECKPOINT_METADATA": b'{"step": %d, "rank": %d}' % (step, rank),
    }


def write_shard(d, job, step, rank, size=256 * 1024):
    """shard_files(job, step, rank, size) under directory d."""
    for rel, data in shard_files(job, step, rank, size).items():
        p = os.path.join(d, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        harness.write_file(p, data)


def save_step(mnt, job, step, rank, size=256 * 1024):
    """Orbax's save of rank's shard_files on mount mnt: a tmp directory,
    the files, commit_success.txt, the rename that commits it."""
    tmp = os.path.join(mnt, "%d.orbax-checkpoint-tmp-%d" % (step, rank))
    write_shard(tmp, job, step, rank, size)
    harness.write_file(os.path.join(tmp, "commit_success.txt"), b"ok\n")
    os.rename(tmp, os.path.join(mnt, str(step)))


def wait_backup(d, job, step, timeout=60):
    """Rank 0's daemon d logs the backup of step complete; returns its
    name. Every node has reported its part by then."""
    m = d.wait_log(r"backup job=%s name=(%s) step=%d complete" % (
        re.escape(job), BACKUP_NAME_RE, step), timeout,
        "backup of %s step %d complete (rank 0's log)" % (job, step), since=0)
    return m.group(1)


class Cluster:
    """n nodes, node i listening on hosts[i] (default 127.0.0.1), each with
    its own RAMDIR, mount and log. ram_sizes: {rank: size} overrides
    ram_size. make_node(rank, opts=, name=) builds a node (a harness Daemon
    or a subclass: a RAMDIR on a given tmpfs, a network namespace ...)."""

    def __init__(self, n, ram_size="1G", secret=True, restore_timeout=15, extra="", k=1,
                 hosts=None, ram_sizes=None, make_node=None):
        self.n = n
        self.k = k
        self.interval = "backup-interval-minutes: 30"
        self.ports = free_ports(n)
        self.addrs = ["%s:%d" % (hosts[i] if hosts else "127.0.0.1", p)
                      for i, p in enumerate(self.ports)]
        self.dir = tempfile.mkdtemp(prefix="mtcfs-cluster-")
        self.secret = None
        if secret:
            self.secret = os.path.join(self.dir, "secret")
            with open(self.secret, "w") as f:
                f.write(os.urandom(24).hex() + "\n")
        self.nodes = []
        self.started = {}       # rank -> (step, marker names, secs) of its last job start
        for i in range(n):
            opts = "ram_size=%s,listen=%s,peers=%s,restore_timeout=%d" % (
                (ram_sizes or {}).get(i, ram_size), self.addrs[i], ",".join(self.addrs),
                restore_timeout)
            if self.secret:
                opts += ",secret_file=" + self.secret
            if extra:
                opts += "," + extra
            name = "node%d" % i
            self.nodes.append(make_node(i, opts=opts, name=name) if make_node
                              else Daemon(opts=opts, name=name))

    # -- lifecycle --
    def start(self):
        for d in self.nodes:
            d.start()
        return self

    def close(self):
        errs = []
        for d in self.nodes:
            try:
                d.close()
            except Exception as e:  # keep closing the others
                errs.append(e)
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)
        if errs:
            raise errs[0]

    def __enter__(self):
        return self.start()

    def __exit__(self, *a):
        self.close()

    def lose_all_ram(self):
        """Every node is killed (-9) and comes back with an empty RAMDIR
        (the job rescheduled on new machines): only the bucket is left."""
        for d in self.nodes:
            d.kill9()
        for d in self.nodes:
            d.wipe_ramdir()
        for d in self.nodes:
            d.start()

    def resize(self, n):
        """The job rescheduled on nodes 0..n-1 (n at most the nodes built):
        every daemon stops; the first n come back on their RAMDIRs with a
        peers= table of only those n (what the node driver gives an n-node
        job: a yaml's nodes must equal its entries); the others stay down,
        their RAMDIRs kept for a later resize."""
        for d in self.nodes:
            d.stop()
        full = "peers=" + ",".join(self.addrs)
        for d in self.nodes[:n]:
            if not hasattr(d, "full_opts"):
                d.full_opts = d.opts
            d.opts = d.full_opts.replace(full, "peers=" + ",".join(self.addrs[:n]))
            d.start()
        self.n = n

    # -- the job, as Orbax plays it on every node --
    def yaml(self, job, rank, extra=""):
        return ("job-name: %s\nframework: orbax\nnode-rank: %d\nnodes: %d\n"
                "peers-per-node: %d\n%s\n%s" % (
                    job, rank, self.n, self.k, self.interval, extra))

    def job_start(self, job, ranks=None, extra="", timeout=60):
        """Every node (in parallel) writes replicator.yaml and waits for its
        markers. Returns {rank: restored step (0 = nothing)}."""
        ranks = list(range(self.n)) if ranks is None else ranks
        out, errs = {}, []

        def one(r):
            try:
                out[r] = self.node_start(r, job, extra, timeout)
            except Exception as e:
                errs.append((r, e))
        ts = [threading.Thread(target=one, args=(r,)) for r in ranks]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errs:
            raise AssertionError("job start failed on %s" % errs)
        return out

    def node_start(self, r, job, extra="", timeout=60):
        mnt = self.nodes[r].mnt
        yaml = os.path.join(mnt, "replicator.yaml")
        wait_until(lambda: not os.path.exists(yaml), timeout, "yaml absent on node %d" % r)
        with open(yaml + ".tmp", "w") as f:
            f.write(self.yaml(job, r, extra))
        os.rename(yaml + ".tmp", yaml)
        t0 = time.monotonic()
        wait_until(lambda: not os.path.exists(yaml), timeout, "yaml consumed on node %d" % r)
        failed = os.path.join(mnt, "replicator.failed")

        def markers():
            if os.path.exists(failed):
                raise AssertionError("node %d: replicator.failed: %s" % (r, open(failed).read()))
            m = [x for x in os.listdir(mnt) if x.endswith(".restore")]
            return m or None
        ms = wait_until(markers, timeout, "markers on node %d" % r)
        steps = {int(re.match(r".*-s(\d+)-n\d+-w\d+\.restore$", x).group(1)) for x in ms}
        assert len(steps) == 1, ms
        step = steps.pop()
        self.started[r] = (step, sorted(ms), time.monotonic() - t0)
        return step

    def save(self, job, step, ranks=None, size=256 * 1024):
        ranks = list(range(self.n)) if ranks is None else ranks
        for r in ranks:
            save_step(self.nodes[r].mnt, job, step, r, size)

    def holds(self, r, job):
        """{(owner, step): state} of node r's catalog for job."""
        return {(s["rank"], s["step"]): s["state"]
                for s in admin_ls(self.nodes[r].ramdir)["shards"] if s["job"] == job}

    def wait_replicated(self, job, step, timeout=60):
        """Every node's shard of step is committed locally and held by at
        least one other node."""
        def ok():
            have = {}
            for r in range(self.n):
                for (owner, st), state in self.holds(r, job).items():
                    if st == step and state in harness.COMMITTED_STATES:
                        have.setdefault(owner, set()).add(r)
            return all(len(have.get(o, ())) >= min(2, self.n) for o in range(self.n))
        wait_until(ok, timeout, "step %d replicated on all nodes" % step)

    def wait_coord(self, op, job, rank, step=None, since=None, timeout=30):
        """The coordinator (node 0, run with -d) has handled the control
        message op (catalog, committed, ...) of job from rank: its state
        includes it. since: a mark of node 0's log_size(). Returns the
        log match."""
        rx = r"DEBUG coord: handled %s job=%s step=%s rank=%d$" % (
            re.escape(op), re.escape(job), r"\d+" if step is None else step, rank)
        return self.nodes[0].wait_log(rx, timeout, "the coordinator to handle %s of job %s "
                                      "step %s from rank %d" % (op, job, step, rank),
                                      since=since)

    def wait_backup(self, job, step, timeout=60):
        """Node 0 logs the backup of step complete: its name."""
        return wait_backup(self.nodes[0], job, step, timeout)

    def restore_and_verify(self, job, r, step, size=256 * 1024):
        """Orbax's restore on node r: rename the marker to <step>, read it."""
        mnt = self.nodes[r].mnt
        ms = [x for x in os.listdir(mnt) if x.endswith(".restore") and "-s%d-" % step in x]
        assert ms, os.listdir(mnt)
        os.replace(os.path.join(mnt, ms[0]), os.path.join(mnt, str(step)))
        for rel, data in shard_files(job, step, r, size).items():
            with open(os.path.join(mnt, str(step), rel), "rb") as f:
                got = f.read()
            assert got == data, "node %d step %d %s differs" % (r, step, rel)
