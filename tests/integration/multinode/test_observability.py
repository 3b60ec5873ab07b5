"""Observability on a real cluster: /metrics counters move through a
save -> replicate -> backup -> restore cycle (and the scrape passes
promtool check metrics), the INFO lifecycle lines are there by default, in
text and in -o log_format=json, and mtcfs-admin status, steps, ls and
verify report it, human and --json. On one node: metrics=[::1]:PORT,
--version of both binaries, a bad log_format refused."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
sys.path.insert(1, os.path.join(INTEG, "bucket"))  # test_backup_restore: the gs:// server (one test)
import harness  # noqa: E402
from harness import wait_until, admin_ls  # noqa: E402
from cluster import Cluster, free_ports  # noqa: E402

JOB = "obs"


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def project_version():
    with open(os.path.join(harness.REPO, "CMakeLists.txt")) as f:
        return re.search(r"project\(mtcfs VERSION (\S+)", f.read()).group(1)


def _open_metrics(url, timeout=30):
    """The endpoint starts after the mount shows in /proc/mounts (the
    harness's readiness) and before FUSE INIT (READY=1 for systemd): a
    refused connection is retried until the deadline, nothing else."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return urllib.request.urlopen(url, timeout=5)
        except urllib.error.URLError as e:
            if (not isinstance(e.reason, ConnectionRefusedError)
                    or time.monotonic() >= deadline):
                raise
        time.sleep(0.05)


def scrape(port, host="127.0.0.1"):
    with _open_metrics("http://%s:%d/metrics" % (host, port)) as r:
        ctype = r.headers.get("Content-Type", "")
        assert ctype == CONTENT_TYPE, ctype
        text = r.read().decode()
    vals = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-z_]+)(\{[^}]*\})?\s+(\S+)$', line)
        assert m, "not Prometheus text: %r" % line
        vals[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return text, vals


def check_exposition(test, text):
    """promtool check metrics (Debian: prometheus; install-deps.sh brings
    it, so its absence fails), and a strict check of the text format: every
    sample belongs to a family declared once with HELP and TYPE before its
    samples, histogram buckets are cumulative and end in +Inf equal to
    _count."""
    test.assertTrue(shutil.which("promtool"), "promtool is missing (apt-get install "
                    "prometheus; packaging/install-deps.sh lists it)")
    r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    test.assertEqual(r.returncode, 0, r.stdout.decode())
    test.assertEqual(r.stdout.decode().strip(), "", "promtool lint findings")
    test.assertTrue(text.endswith("\n"))
    types, helps, hist = {}, set(), {}
    for line in text.split("\n")[:-1]:
        m = re.fullmatch(r"# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)", line)
        if m:
            kind, fam, rest = m.groups()
            if kind == "HELP":
                test.assertNotIn(fam, helps, "HELP twice: " + fam)
                helps.add(fam)
            else:
                test.assertNotIn(fam, types, "TYPE twice: " + fam)
                test.assertIn(rest, ("counter", "gauge", "histogram"), line)
                types[fam] = rest
            continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_]\w*="[^"\\\n]*"'
                         r'(?:,[a-zA-Z_]\w*="[^"\\\n]*")*)?\})? (-?[0-9.e+]+|\+Inf)', line)
        test.assertTrue(m, "not a sample line: %r" % line)
        name, labels, val = m.group(1), m.group(2) or "", m.group(3)
        fam = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
        test.assertIn(fam, types, "sample before its TYPE: " + line)
        test.assertIn(fam, helps, "sample without HELP: " + line)
        if types[fam] == "counter":
            test.assertTrue(name.endswith("_total"), name)
        if types[fam] == "histogram":
            h = hist.setdefault(fam, {"b": [], "count": None})
            if name.endswith("_bucket"):
                le = re.fullmatch(r'\{le="([^"]+)"\}', labels).group(1)
                h["b"].append((float(le), float(val)))
            elif name.endswith("_count"):
                h["count"] = float(val)
    for fam, h in hist.items():
        les = [b[0] for b in h["b"]]
        test.assertEqual(les, sorted(les), fam)
        test.assertEqual(les[-1], float("inf"), fam)
        test.assertEqual([b[1] for b in h["b"]], sorted(b[1] for b in h["b"]), fam + ": cumulative")
        test.assertEqual(h["b"][-1][1], h["count"], fam)
        test.assertIn(3600.0, les, fam + ": buckets past 300 s")


def log_lines(d):
    """The daemon's own lines (the harness adds '=== ... start' headers)."""
    return [ln for ln in d.log_text().splitlines() if ln and not ln.startswith("===")]


def json_log(test, d):
    out = []
    for ln in log_lines(d):
        try:
            j = json.loads(ln)
        except ValueError:
            test.fail("not a JSON line: %r" % ln)
        test.assertIsInstance(j, dict)
        test.assertRegex(j["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        test.assertIn(j["severity"], ("DEBUG", "INFO", "WARNING", "ERROR"))
        test.assertTrue(j["component"] and isinstance(j["message"], str))
        out.append(j)
    return out


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
        self.c.nodes[1].opts += ",log_format=json"     # node 0 keeps the text default
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
        self.assertEqual(before['mtcfs_build_info{version="%s"}' % project_version()], 1)
        self.assertEqual(before["mtcfs_last_backup_success_timestamp_seconds"], 0)
        self.assertEqual(before["mtcfs_replicated_lkg_step"], -1)
        check_exposition(self, text)
        self.assertEqual(c.job_start(JOB), {0: 0, 1: 0})
        _, v = scrape(self.mports[0])
        self.assertEqual(v['mtcfs_restores_total{source="none"}'], 1)
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
        # both nodes replicated step 10 to each other: GKE's "replicated-step"
        for port in self.mports:
            wait_until(lambda: scrape(port)[1]["mtcfs_replicated_lkg_step"] == 10, 30,
                       "replicated LKG gauge on :%d" % port)
        self.assertEqual(v["mtcfs_peers"], 2)
        self.assertEqual(v["mtcfs_coordinator_reachable"], 1)
        self.assertLessEqual(abs(v["mtcfs_last_backup_success_timestamp_seconds"] - time.time()), 120)
        # node 1 loses its RAM: its restore comes from the peer
        c.nodes[1].kill9()
        c.nodes[1].wipe_ramdir()
        c.nodes[1].start()
        self.assertEqual(c.job_start(JOB), {0: 10, 1: 10})
        _, v1 = scrape(self.mports[1])
        self.assertEqual(v1['mtcfs_restores_total{source="peer"}'], 1)
        self.assertEqual(v1['mtcfs_restores_total{source="bucket"}'], 0)
        self.assertGreaterEqual(v1["mtcfs_restore_fetched_bytes_total"], 1 << 20)
        t0, v0 = scrape(self.mports[0])
        self.assertEqual(v0['mtcfs_restores_total{source="local"}'], 1)
        self.assertEqual(v0['mtcfs_restores_total{source="none"}'], 1)
        check_exposition(self, t0)
        self.check_lifecycle_logs()
        # not found and wrong methods
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen("http://127.0.0.1:%d/nope" % self.mports[0], timeout=5)
        self.assertEqual(cm.exception.code, 404)

    def check_lifecycle_logs(self):
        """Without -d: one INFO line per lifecycle event, node 0 in text,
        node 1 in JSON with the key=value words as fields."""
        text = log_lines(self.c.nodes[0])
        want = [r" INFO main: serving ramdir=", r" INFO ctl: configured job=obs ",
                r" INFO coord: plan job=obs ", r" INFO ctl: restore job=obs step=0 source=",
                r" INFO commit: committed job=obs step=10 ",
                r" INFO engine: replicated job=obs step=10 ",
                r" INFO coord: backup job=obs name=\S+ step=10 started",
                r" INFO coord: backup job=obs name=\S+ step=10 complete",
                r" INFO ctl: restore job=obs step=10 source=local"]
        for w in want:
            self.assertTrue(any(re.search(w, ln) for ln in text), "no line %r in\n%s"
                            % (w, "\n".join(text)))
        # one line per event, never per file: the shard's files are not named
        self.assertFalse([ln for ln in text if "params/" in ln or "commit_success" in ln])
        self.assertFalse([ln for ln in text if " DEBUG " in ln])
        js = json_log(self, self.c.nodes[1])
        self.assertFalse([j for j in js if j["severity"] == "DEBUG"])
        commit = [j for j in js if j["component"] == "commit"
                  and j["message"].startswith("committed job=obs step=10 ")]
        self.assertEqual(len(commit), 1, js)
        self.assertEqual((commit[0]["severity"], commit[0]["job"], commit[0]["step"],
                          commit[0]["rank"]), ("INFO", "obs", "10", "1"))
        restore = [j for j in js if j["component"] == "ctl" and j["message"].startswith("restore ")]
        self.assertEqual([(j["step"], j["source"]) for j in restore][-1], ("10", "peer"))

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
        ht = h.stdout.decode()
        self.assertRegex(ht, r"phase\s+ready")
        # for people: sizes in binary units, times as UTC dates with their
        # age, peers up/down; --json above keeps the raw numbers
        self.assertRegex(ht, r"(?m)^ram_size\s+512\.0 MiB$")
        self.assertRegex(ht, r"(?m)^ram_used\s+\d+\.\d (KiB|MiB)$")
        self.assertRegex(ht, r"(?m)^last_commit_time\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC "
                             r"\(\d+ s ago\)$")
        self.assertRegex(ht, r"(?m)^started\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(")
        self.assertRegex(ht, r"(?m)^peers\s+0 up, 1 up$")
        self.assertRegex(ht, r"(?m)^daemon_running\s+yes$")
        self.assertIsInstance(st["last_commit_time"], int)
        self.assertLessEqual(abs(st["last_commit_time"] - time.time()), 300)
        self.assertIsInstance(st["started"], int)
        ts = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(st["last_commit_time"]))
        self.assertIn("last_commit_time         " + ts, ht)
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


class OneNode(unittest.TestCase):
    def test_versions(self):
        want = project_version()
        for binary, name in ((harness.MTCFS_BIN, "mtcfs"), (harness.MTCFS_ADMIN, "mtcfs-admin")):
            for flag in ("--version", "-V"):
                r = subprocess.run([binary, flag], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, timeout=30)
                self.assertEqual(r.returncode, 0, (binary, flag, r.stderr))
                self.assertRegex(r.stdout.decode(), r"^%s %s( |\n)" % (name, re.escape(want)))

    def test_bad_log_format_is_refused(self):
        d = harness.Daemon(opts="ram_size=64M,log_format=xml")
        self.addCleanup(d.close)
        r = subprocess.run(d.argv(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"log_format=xml: give text or json", r.stderr)
        self.assertIsNone(harness.mount_fstype(d.mnt))

    def test_metrics_on_ipv6_loopback(self):
        s = socket.socket(socket.AF_INET6)
        try:
            s.bind(("::1", 0))
        except OSError:
            self.skipTest("no IPv6 loopback")
        port = s.getsockname()[1]
        s.close()
        d = harness.Daemon(opts="ram_size=64M,metrics=[::1]:%d,log_format=json" % port)
        self.addCleanup(d.close)
        d.start()
        text, v = scrape(port, host="[::1]")
        self.assertEqual(v['mtcfs_build_info{version="%s"}' % project_version()], 1)
        check_exposition(self, text)
        # served on ::1 only, not on the IPv4 loopback
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        js = json_log(self, d)
        self.assertTrue([j for j in js if j["severity"] == "INFO" and j["component"] == "main"
                         and j["message"].startswith("serving ramdir=")], js)
        self.assertTrue([j for j in js if j["component"] == "metrics"
                         and "http://[::1]:%d/metrics" % port in j["message"]], js)

    def detached(self, opts):
        """mtcfs as mount(8) starts it for an fstab line or a mount unit: no
        -f (it detaches), stdin/stdout/stderr closed. Returns (ramdir, mnt,
        daemon pid); cleanup unmounts and reaps it."""
        ram = tempfile.mkdtemp(prefix="mtcfs-det-ram-", dir="/dev/shm")
        tmp = tempfile.mkdtemp(prefix="mtcfs-det-")
        mnt = os.path.join(tmp, "mnt")
        os.mkdir(mnt)
        self.addCleanup(shutil.rmtree, ram, True)
        self.addCleanup(shutil.rmtree, tmp, True)
        pids = []

        def reap():
            harness.force_unmount(mnt)
            for p in pids:
                try:
                    os.kill(p, 9)
                except ProcessLookupError:
                    pass
            wait_until(lambda: not any(os.path.exists("/proc/%d" % p) for p in pids), 10,
                       "detached mtcfs gone")
        self.addCleanup(reap)
        r = subprocess.run(["/bin/sh", "-c", 'exec "$0" -o "$1" "$2" "$3" <&- >&- 2>&-',
                            harness.MTCFS_BIN, opts, ram, mnt], timeout=60)
        self.assertEqual(r.returncode, 0)
        wait_until(lambda: harness.mount_fstype(mnt) == "fuse.mtcfs", harness.READY_TIMEOUT,
                   "detached mtcfs mounted")

        def pid():
            with open(os.path.join(ram, "mtcfs.lock")) as f:
                t = f.read().strip()
            return int(t) if t else None
        pids.append(wait_until(pid, 10, "the daemon's PID in mtcfs.lock"))
        return ram, mnt, pids[0], tmp

    def test_detached_daemon_keeps_its_log_and_its_ramdir_lock(self):
        """Started with stdio closed, the first files mtcfs opened took fds
        0-2 and fuse_daemonize() put /dev/null over them: the log file and
        the RAMDIR lock were gone (a second daemon got in). log_file= keeps
        the log of a detached daemon (without it: syslog)."""
        tmp0 = tempfile.mkdtemp(prefix="mtcfs-det-log-")
        self.addCleanup(shutil.rmtree, tmp0, True)
        log = os.path.join(tmp0, "mtcfs.log")
        ram, mnt, pid, tmp = self.detached("ram_size=64M,log_file=" + log)
        self.assertTrue(os.path.exists("/proc/%d" % pid))
        with open(log) as f:
            text = f.read()
        self.assertRegex(text, r"INFO main: serving ramdir=%s mount=%s " % (
            re.escape(os.path.realpath(ram)), re.escape(os.path.realpath(mnt))))
        # the lock holds: a second daemon on the same RAMDIR is refused
        mnt2 = os.path.join(tmp, "mnt2")
        os.mkdir(mnt2)
        self.addCleanup(harness.force_unmount, mnt2)
        r = subprocess.run([harness.MTCFS_BIN, "-f", "-o", "ram_size=64M", ram, mnt2],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(("in use by another mtcfs (pid %d" % pid).encode(), r.stderr)
        self.assertIsNone(harness.mount_fstype(mnt2))
        # unmount: the daemon exits and its last lines are in the file too
        subprocess.run(["fusermount3", "-u", mnt], check=True, timeout=30)
        wait_until(lambda: not os.path.exists("/proc/%d" % pid), harness.EXIT_TIMEOUT,
                   "detached mtcfs exited after the unmount")
        with open(log) as f:
            text = f.read()
        self.assertNotRegex(text, harness.BAD_LOG)
        self.assertGreater(len(text.splitlines()), 1)

    def test_detached_daemon_logs_to_syslog(self):
        """Without log_file= a detached daemon logs to syslog: run in a
        private mount namespace whose /dev/log is this test's datagram
        socket (the machine's /dev is left alone), mtcfs sends its lines
        there as "mtcfs[PID]", facility daemon."""
        if not shutil.which("unshare"):
            self.skipTest("unshare (util-linux) missing")
        tmp = tempfile.mkdtemp(prefix="mtcfs-syslog-")
        self.addCleanup(shutil.rmtree, tmp, True)
        sock_path = os.path.join(tmp, "log")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(sock.close)
        sock.bind(sock_path)
        ram = tempfile.mkdtemp(prefix="mtcfs-syslog-ram-", dir="/dev/shm")
        self.addCleanup(shutil.rmtree, ram, True)
        mnt = os.path.join(tmp, "mnt")
        hostdev = os.path.join(tmp, "hostdev")
        os.mkdir(mnt)
        os.mkdir(hostdev)
        # inside the namespace: a tmpfs /dev with the host's null, zero,
        # urandom, fuse and shm (RAMDIR) bound in, and log -> the test's socket
        script = ('set -e; mount --make-rprivate /; mount --rbind /dev "$1"; '
                  'mount -t tmpfs -o mode=755 tmpfs /dev; '
                  'for n in null zero urandom fuse; do touch /dev/$n; '
                  'mount --bind "$1/$n" /dev/$n; done; mkdir /dev/shm; '
                  'mount --bind "$1/shm" /dev/shm; ln -s "$2" /dev/log; '
                  'exec "$3" -o ram_size=64M "$4" "$5" <&- >&- 2>&-')
        pids = []

        def reap():
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            wait_until(lambda: not any(os.path.exists("/proc/%d" % p) for p in pids), 10,
                       "mtcfs in its namespace gone")
        self.addCleanup(reap)
        r = subprocess.run(["unshare", "-m", "/bin/sh", "-c", script, "sh", hostdev, sock_path,
                            os.path.abspath(harness.MTCFS_BIN), ram, mnt],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout.decode(errors="replace"))

        def pid():
            with open(os.path.join(ram, "mtcfs.lock")) as f:
                t = f.read().strip()
            return int(t) if t else None
        pids.append(wait_until(pid, harness.READY_TIMEOUT, "the daemon's PID in mtcfs.lock"))
        sock.settimeout(harness.READY_TIMEOUT)
        lines = []

        def serving():
            lines.append(sock.recv(8192).decode(errors="replace"))
            return [ln for ln in lines if "main: serving ramdir=" in ln] or None
        ln = wait_until(serving, harness.READY_TIMEOUT, "the serving line on syslog")[0]
        self.assertRegex(ln, r"^<30>.*mtcfs\[%d\]: main: serving ramdir=%s mount=%s " % (
            pids[0], re.escape(os.path.realpath(ram)), re.escape(mnt)))   # daemon.info
        self.assertFalse([x for x in lines if harness.BAD_LOG.search(x)], lines)
        os.kill(pids[0], signal.SIGTERM)     # ends it as an unmount does
        wait_until(lambda: not os.path.exists("/proc/%d" % pids[0]), harness.EXIT_TIMEOUT,
                   "mtcfs exited on SIGTERM")

    def test_bad_log_file_is_refused(self):
        d = harness.Daemon(opts="ram_size=64M,log_file=/nonexistent/dir/mtcfs.log")
        self.addCleanup(d.close)
        r = subprocess.run(d.argv(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"log_file=/nonexistent/dir/mtcfs.log: No such file or directory", r.stderr)
        self.assertIsNone(harness.mount_fstype(d.mnt))


class OneErrorPerFailure(unittest.TestCase):
    def test_failed_backup_is_one_error(self):
        """A backup upload that fails logged an ERROR in the engine of the
        node where it failed and another in the coordinator that abandons
        it (both on rank 0 here). Now: one ERROR with the reason; the
        coordinator's decision (retry in N s) is a WARN."""
        tmp = tempfile.mkdtemp(prefix="mtcfs-onerr-")
        self.addCleanup(shutil.rmtree, tmp, True)
        bucket = os.path.join(tmp, "b")
        os.mkdir(bucket)
        c = Cluster(1, ram_size="256M", extra="bucket=file://" + bucket)
        c.interval = "backup-interval-steps: 1"
        self.addCleanup(c.close)
        d = c.nodes[0]
        d.expect_log(r"ERROR engine: backup \S+ of job onerr step 1 failed: ")
        c.start()
        c.job_start("onerr")
        # an object named like the job's folder: a file:// bucket cannot
        # hold it and the backup's objects below it, so the upload fails
        open(os.path.join(bucket, "onerr"), "w").close()
        c.save("onerr", 1, size=64 * 1024)

        def abandoned():
            ls = [ln for ln in log_lines(d) if "abandoned" in ln]
            return ls or None
        ab = wait_until(abandoned, 60, "the backup abandoned")
        errors = [ln for ln in log_lines(d) if " ERROR " in ln]
        self.assertEqual(len(errors), 1, "\n".join(errors))
        self.assertRegex(errors[0], r"ERROR engine: backup \S+ of job onerr step 1 failed: file://")
        self.assertRegex(ab[0], r"WARN coord: job onerr: backup \S+ of step 1 abandoned: node 0: "
                         r".*; next attempt in 10 s$")

    def test_restore_without_coordinator_is_one_error(self):
        """A node whose coordinator (rank 0) is down retries the restore
        for about 20 s, and logged an ERROR per attempt (21) plus the final
        one. Now each attempt is a WARN ("retrying in 1 s", then "giving
        up") and the failed restore the one ERROR."""
        c = Cluster(2, ram_size="256M", restore_timeout=3)
        self.addCleanup(c.close)
        c.start()
        c.nodes[0].kill9()
        d = c.nodes[1]
        d.expect_log(r"ERROR ctl: replicator.yaml rejected: restore failed")
        yaml = os.path.join(d.mnt, "replicator.yaml")
        with open(yaml + ".tmp", "w") as f:
            f.write(c.yaml("nocoord", 1))
        os.rename(yaml + ".tmp", yaml)
        wait_until(lambda: os.path.exists(os.path.join(d.mnt, "replicator.failed")), 60,
                   "replicator.failed on node 1")
        lines = log_lines(d)
        errors = [ln for ln in lines if " ERROR " in ln]
        self.assertEqual(len(errors), 1, "\n".join(errors))
        self.assertRegex(errors[0], r"ERROR ctl: replicator.yaml rejected: restore failed: ")
        tries = [ln for ln in lines if "restore: the coordinator at %s did not answer" % c.addrs[0]
                 in ln]
        self.assertGreater(len(tries), 1)
        self.assertTrue(all(" WARN engine: " in ln for ln in tries), tries)
        self.assertTrue(tries[0].endswith("; retrying in 1 s"), tries[0])
        self.assertTrue(tries[-1].endswith("; giving up"), tries[-1])

    def test_denied_backup_is_one_error(self):
        """Cloud Storage answers 403 to the uploads: the GCS client logged
        the refusal as an ERROR and the engine the failed backup with the
        same text as another. Now one ERROR (the engine's, with the 403 and
        the permission); the client's line is a WARN."""
        from test_backup_restore import GcsServer, GS_BUCKET, GCS_RETRY
        srv = GcsServer()
        self.addCleanup(srv.stop)
        srv.call("/_reset", {"log": True, "faults": True, "data": True, "config": True})
        c = Cluster(1, ram_size="256M", extra="bucket=gs://%s/onerr,gcs_endpoint=%s"
                    % (GS_BUCKET, srv.base))
        c.interval = "backup-interval-steps: 1"
        self.addCleanup(c.close)
        d = c.nodes[0]
        for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS"):
            d.env.pop(k, None)
        d.env["GCE_METADATA_HOST"] = srv.host
        d.env["MTCFS_GCS_RETRY"] = GCS_RETRY
        d.expect_log(r"ERROR engine: backup \S+ of job denied step 1 failed: .*403 Forbidden")
        srv.call("/_config", {"auth": "bearer", "deny": ["storage.objects.create"]})
        c.start()
        c.job_start("denied")
        c.save("denied", 1, size=64 * 1024)
        wait_until(lambda: [ln for ln in log_lines(d) if "abandoned" in ln] or None, 60,
                   "the backup abandoned")
        errors = [ln for ln in log_lines(d) if " ERROR " in ln]
        self.assertEqual(len(errors), 1, "\n".join(errors))
        self.assertRegex(errors[0], r"ERROR engine: backup \S+ of job denied step 1 failed: "
                         r".*403 Forbidden: the caller lacks storage\.objects\.create")
        self.assertTrue([ln for ln in log_lines(d)
                         if re.search(r" WARN gcs: .*403 Forbidden", ln)], log_lines(d))


if __name__ == "__main__":
    harness.main()
