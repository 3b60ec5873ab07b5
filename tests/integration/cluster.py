"""Multi-node clusters for integration tests: N mtcfs processes on loopback,
each with its own RAMDIR and mount, a static peers= table, a shared secret,
and helpers that play the training job on every node the way Orbax does.

The cluster itself is tools/mtcfs_local.py's (the demo's too); this module
adds the tests' shard contents and checks.

Everything started here is registered with the harness, so it is unmounted
and reaped even when a test fails.
"""
import os
import re

import harness
import mtcfs_local  # tools/, on sys.path through harness
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


class Cluster(mtcfs_local.Cluster):
    """tools/mtcfs_local.py's Cluster (the nodes, their lifecycle, the job's
    start on every node, waiting for replication) and what only tests do
    with it: save and read back each rank's shard_files, wait for the
    coordinator's and the backup's log lines."""

    def save(self, job, step, ranks=None, size=256 * 1024):
        ranks = list(range(self.n)) if ranks is None else ranks
        for r in ranks:
            save_step(self.nodes[r].mnt, job, step, r, size)

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
