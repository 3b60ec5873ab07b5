"""Observability on a real cluster: /metrics counters move through a
save -> replicate -> backup -> restore cycle, and mtcfs-admin status,
steps, ls and verify report it, human and --json."""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import wait_until, admin_ls  # noqa: E402
from cluster import Cluster, free_ports  # noqa: E402

JOB = "obs"


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
        assert r.headers.get("Content-Type", "").startswith("text/plain")
        text = r.read().decode()
    vals = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-z_]+)(\{[^}]*\})?\s+(\S+)$', line)
        assert m, "not Prometheus text: %r" % line
        vals[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return text, vals


def admin(*args):
    return subprocess.run([harness.MTCFS_ADMIN] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=60)


class Observability(unittest.TestCase):
    def setUp(self):
        self.bucket = tempfile.mkdtemp(prefix="mtcfs-obs-bucket-")
        self.mports = free_ports(2)
        self.c = Cluster(2, ram_size="512M", extra="bucket=file://%s" % self.bucket)
        self.c.interval = "backup-interval-steps: 1"
        for i, d in enumerate(self.c.nodes):
            d.opts += ",metrics=127.0.0.1:%d" % self.mports[i]
        self.addCleanup(self.c.close)
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", self.bucket]))
        self.c.start()

    def test_metrics_move_through_a_cycle(self):
        c = self.c
        text, before = scrape(self.mports[0])
        # every family is declared with HELP and TYPE
        for fam in ("mtcfs_commits_total", "mtcfs_replication_shards_total",
                    "mtcfs_restore_seconds", "mtcfs_ram_used_bytes"):
            self.assertIn("# TYPE %s " % fam, text)
        self.assertEqual(before["mtcfs_commits_total"], 0)
        self.assertEqual(c.job_start(JOB), {0: 0, 1: 0})
        _, v = scrape(self.mports[0])
        self.assertEqual(v["mtcfs_restores_nothing_total"], 1)
        self.assertEqual(v['mtcfs_restore_seconds_bucket{le="+Inf"}'], 1)
        c.save(JOB, 10, size=1 << 20)
        c.wait_replicated(JOB, 10)

        def backed_up():
            d = os.path.join(self.bucket, JOB)
            return os.path.isdir(d) and any(
                len([m for m in os.listdir(os.path.join(d, b)) if m.endswith(".meta")]) == 2
                for b in os.listdir(d))
        wait_until(backed_up, 60, "step 10 backed up")

        def moved():
            _, v = scrape(self.mports[0])
            return v if (v["mtcfs_backups_total"] >= 1 and v["mtcfs_replication_shards_total"] >= 1
                         and v["mtcfs_replicas_received_total"] >= 1) else None
        v = wait_until(moved, 30, "counters after save/replicate/backup")
        self.assertEqual(v["mtcfs_commits_total"], 1)
        self.assertGreaterEqual(v["mtcfs_app_written_bytes_total"], (1 << 20))
        self.assertGreaterEqual(v["mtcfs_replication_sent_bytes_total"], (1 << 20))
        self.assertGreaterEqual(v["mtcfs_backup_uploaded_bytes_total"], (1 << 20))
        self.assertEqual(v["mtcfs_commit_seal_seconds_count"], 1)
        self.assertGreater(v["mtcfs_ram_used_bytes"], 1 << 20)
        self.assertEqual(v["mtcfs_ram_size_bytes"], 512 << 20)
        self.assertEqual(v["mtcfs_last_commit_step"], 10)
        wait_until(lambda: scrape(self.mports[0])[1]["mtcfs_lkg_step"] == 10, 30, "LKG gauge")
        self.assertEqual(v["mtcfs_peers"], 2)
        self.assertEqual(v["mtcfs_coordinator_reachable"], 1)
        # node 1 loses its RAM: its restore comes from the peer
        c.nodes[1].kill9()
        c.nodes[1].wipe_ramdir()
        c.nodes[1].start()
        self.assertEqual(c.job_start(JOB), {0: 10, 1: 10})
        _, v1 = scrape(self.mports[1])
        self.assertEqual(v1["mtcfs_restores_peer_total"], 1)
        self.assertGreaterEqual(v1["mtcfs_restore_fetched_bytes_total"], 1 << 20)
        _, v0 = scrape(self.mports[0])
        self.assertEqual(v0["mtcfs_restores_local_total"], 1)
        # not found and wrong methods
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen("http://127.0.0.1:%d/nope" % self.mports[0], timeout=5)
        self.assertEqual(cm.exception.code, 404)

    def test_admin_commands_on_a_cluster(self):
        c = self.c
        c.job_start(JOB)
        c.save(JOB, 20, size=256 * 1024)
        c.wait_replicated(JOB, 20)
        r0 = c.nodes[0].ramdir
        # status, human and json
        wait_until(lambda: json.loads(admin("status", r0, "--json").stdout).get("lkg") == 20,
                   30, "status shows the LKG")
        # step 20 is replicated both ways: GC may let older steps go
        wait_until(lambda: json.loads(admin("status", r0, "--json").stdout)
                   .get("replicated_lkg") == 20, 30, "status shows the replicated LKG")
        st = json.loads(admin("status", r0, "--json").stdout)
        self.assertTrue(st["daemon_running"])
        self.assertEqual(st["phase"], "ready")
        self.assertEqual((st["job"], st["rank"], st["nodes"]), (JOB, 0, 2))
        self.assertEqual(st["last_commit_step"], 20)
        self.assertTrue(st["coordinator_reachable"])
        self.assertEqual([p["connected"] for p in st["peers"]], [True, True])
        self.assertEqual(st["ram_size"], 512 << 20)
        h = admin("status", r0)
        self.assertEqual(h.returncode, 0)
        self.assertRegex(h.stdout.decode(), r"phase\s+ready")
        # steps: both nodes' shards held on both nodes, step 20 is the LKG
        s = json.loads(admin("steps", r0, "--json").stdout)
        self.assertEqual(s["lkg"], 20)
        self.assertTrue(s["coordinator_reachable"])
        row = [x for x in s["steps"] if x["step"] == 20][0]
        self.assertTrue(row["complete"] and row["lkg"])
        self.assertEqual({k: sorted(v) for k, v in row["holders"].items()}, {"0": [0, 1], "1": [0, 1]})
        self.assertRegex(admin("steps", r0).stdout.decode(), r"20\s+0,1\s+[01],[01]\s+complete\s+<- LKG")
        # ls and verify
        ls = admin_ls(r0)
        self.assertEqual(sorted((x["rank"], x["own"]) for x in ls["shards"] if x["job"] == JOB),
                         [(0, True), (1, False)])
        v = admin("verify", r0, "--json")
        self.assertEqual(v.returncode, 0, v.stdout)
        self.assertEqual(json.loads(v.stdout)["bad"], 0)
        # a flipped byte in node 0's replica of rank 1: verify fails, names it
        victim = os.path.join(harness.shard_dir(r0, 20, JOB, rank=1), "state", "params", "0.0")
        with open(victim, "r+b") as f:
            b = f.read(1)
            f.seek(0)
            f.write(bytes([b[0] ^ 0xff]))
        v = admin("verify", r0)
        self.assertEqual(v.returncode, 1)
        self.assertRegex(v.stdout.decode(), r"bad\s+obs\s+step 20\s+node 1\s+replica: state/params/0.0: crc32c")
        # a stopped node: status says so, exit 1
        c.nodes[1].stop()
        st = admin("status", c.nodes[1].ramdir, "--json")
        self.assertEqual(st.returncode, 1)
        self.assertFalse(json.loads(st.stdout)["daemon_running"])
        self.assertEqual(admin("status", "/nonexistent").returncode, 3)


if __name__ == "__main__":
    harness.main()
