"""mtcfs-admin's bucket commands end to end: `backups`, `restore-version`,
`prune`, against the project's Cloud Storage test server
(tests/gcs_server/gcs_server.py, gs://) and a file:// bucket.

Every test builds its own synthetic job in its own prefix with
mtcfs-bucket-cli upload-shard (the real upload path: data, manifest, .meta
last) for 2 nodes, then breaks some backups on purpose:

  2026-12-30_10-00  step 10  complete
  2026-12-31_09-00  step 20  complete
  2026-12-31_23-30  step 30  complete
  2027-01-01_00-10  step 40  complete
  2027-01-01_00-10-2 step 41 complete
  2027-01-02_08-00  step 50  node 1's shard never uploaded (no .meta)
  2027-01-02_09-00  step 55  both .meta, a data file of node 1 deleted
  2027-01-03_12-00  step 60  complete (the newest complete one)
  2027-01-03_13-00  step 70  only node 0 so far (an upload in progress)

and asserts the human and --json outputs, which backup a restore would use,
restore-version's refusals and --force, prune's dry run and --delete (exactly
which backups remain, the protected ones among them, the .meta files deleted
first, node 0 first), progress only on a terminal, --help of every command,
and the exit codes (0 ok, 1 refused, 2 usage, 3 cannot read the bucket).

Environment: MTCFS_ADMIN, MTCFS_BUILD (for mtcfs-bucket-cli). Standard
library only: /usr/bin/python3.
"""

import json
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
from gcs import GcsServer  # noqa: E402
import harness  # noqa: E402

REPO = os.path.dirname(os.path.dirname(INTEG))
BUILD = os.environ.get("MTCFS_BUILD") or os.path.join(REPO, "build")
ADMIN = os.environ.get("MTCFS_ADMIN") or os.path.join(BUILD, "mtcfs-admin")
CLI = os.path.join(BUILD, "mtcfs-bucket-cli")
JOB = "job-a"
SANITIZER = re.compile(r"AddressSanitizer|LeakSanitizer|runtime error:|ThreadSanitizer")

COMPLETE = ["2026-12-30_10-00", "2026-12-31_09-00", "2026-12-31_23-30", "2027-01-01_00-10",
            "2027-01-01_00-10-2", "2027-01-03_12-00"]
NO_META = "2027-01-02_08-00"        # node 1 never uploaded
NO_DATA = "2027-01-02_09-00"        # a data file of node 1 is gone
IN_PROGRESS = "2027-01-03_13-00"    # only node 0, newer than every complete one
STEPS = {"2026-12-30_10-00": 10, "2026-12-31_09-00": 20, "2026-12-31_23-30": 30,
         "2027-01-01_00-10": 40, "2027-01-01_00-10-2": 41, NO_META: 50, NO_DATA: 55,
         "2027-01-03_12-00": 60, IN_PROGRESS: 70}
NEWEST_FIRST = sorted(STEPS, key=lambda n: STEPS[n], reverse=True)
ALL_COMMANDS = ["ls", "steps", "status", "verify", "backups", "restore-version", "prune"]


# the Cloud Storage test server: the suite's one launcher
Server = GcsServer


class AdminBucketTests:
    """Mixed into one TestCase per bucket kind; subclasses set up cls.env and
    define url(tag) (a fresh bucket location) and objects(url, prefix)."""

    @classmethod
    def make_shards(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mtcfs-admin-")
        cls.shard = []
        for node in range(2):
            d = os.path.join(cls.tmp, "shard%d" % node)
            os.makedirs(os.path.join(d, "state"))
            with open(os.path.join(d, "_METADATA"), "wb") as f:
                f.write(b"node %d metadata\n" % node)
            with open(os.path.join(d, "state", "arr.bin"), "wb") as f:
                f.write(os.urandom(40000 + node))
            cls.shard.append(d)

    # -- running things ---------------------------------------------------

    def cli(self, url, *args):
        p = subprocess.run([CLI, url] + list(args), env=self.env, capture_output=True, timeout=120)
        if p.returncode != 0:
            self.fail("mtcfs-bucket-cli %s: rc %d: %s" % (" ".join(args), p.returncode,
                                                          p.stderr.decode()))
        return p.stdout.decode()

    def admin(self, *args, rc=0, env=None):
        p = subprocess.run([ADMIN] + list(args), env=env or self.env, capture_output=True,
                           timeout=120)
        out, err = p.stdout.decode(), p.stderr.decode()
        self.assertNotRegex(err, SANITIZER)
        if rc is not None and p.returncode != rc:
            self.fail("mtcfs-admin %s: rc %d, want %d\nstdout:\n%s\nstderr:\n%s"
                      % (" ".join(args), p.returncode, rc, out, err))
        return out, err

    def ajson(self, *args, rc=0):
        out, _ = self.admin(*(list(args) + ["--json"]), rc=rc)
        return json.loads(out)

    def b(self, url):
        return ["--bucket", url, "--job", JOB]

    # -- the synthetic job ------------------------------------------------

    def build_job(self, url):
        for name in NEWEST_FIRST[::-1]:
            step = str(STEPS[name])
            self.cli(url, "upload-shard", JOB, name, step, "0", "0", self.shard[0])
            if name not in (NO_META, IN_PROGRESS):
                self.cli(url, "upload-shard", JOB, name, step, "1", "0", self.shard[1])
        # the data file of node 1's shard in NO_DATA goes away
        listing = self.cli(url, "ls", "%s/%s/" % (JOB, NO_DATA)).split("\n")
        hashes = sorted({ln.split()[0].split("/")[2][:64] for ln in listing
                         if ".data/state/arr.bin" in ln})
        self.assertEqual(len(hashes), 2, listing)
        meta1 = self.cli(url, "cat", "%s/%s/%s-s55-n1-w0.meta" % (JOB, NO_DATA, JOB)).strip()
        self.cli(url, "rm", "%s/%s/%s.data/state/arr.bin" % (JOB, NO_DATA, meta1))

    def names_left(self, url):
        """The backups (JOB/NAME/ prefixes holding objects) left in the bucket."""
        out = self.cli(url, "ls", JOB + "/", "/")
        return sorted(ln[len(JOB) + 1:-1] for ln in out.split("\n") if ln.endswith("/"))

    # -- backups ----------------------------------------------------------

    def test_backups(self):
        url = self.url("backups")
        self.build_job(url)
        for nodes in ([], ["--nodes", "2"]):
            out, _ = self.admin("backups", *(self.b(url) + nodes))
            lines = out.split("\n")
            self.assertIn("job %s: 9 backups, judged for 2 nodes" % JOB, lines[0])
            self.assertEqual(lines[1], "restore.version: none")
            rows = {ln.split()[0]: ln for ln in lines if re.match(r"^20\d\d-", ln)}
            self.assertEqual(list(rows), NEWEST_FIRST)
            for name in COMPLETE:
                self.assertRegex(rows[name], r"^%s +%d +2/2 +[0-9.]+ KiB +complete"
                                 % (re.escape(name), STEPS[name]))
            self.assertTrue(rows["2027-01-03_12-00"].endswith("complete  <- restore"), rows)
            for name in (NO_META, NO_DATA, IN_PROGRESS):
                self.assertRegex(rows[name], r" 1/2 .* incomplete$")
            # why, per node
            i = lines.index(rows[NO_META])
            self.assertIn("    node 1 worker 0: no .meta", lines[i + 1:i + 3])
            i = lines.index(rows[NO_DATA])
            self.assertEqual(lines[i + 1], "    node 1 worker 0: missing data file state/arr.bin")
            self.assertTrue(lines[-2].startswith("a restore from the bucket would use 2027-01-03_12-00 "
                                                 "(step 60), the newest complete backup"), lines[-2])
        # without --nodes, a backup complete for its own (1) node is said so
        out, _ = self.admin("backups", *self.b(url))
        self.assertIn("no .meta for node 1: its .meta names show 1 node, other backups 2", out)

        js = self.ajson("backups", *self.b(url))
        self.assertEqual([x["name"] for x in js["backups"]], NEWEST_FIRST)
        self.assertEqual(js["restore"], {"name": "2027-01-03_12-00", "step": 60})
        self.assertIsNone(js["restore_version"])
        self.assertEqual(js["nodes"], 2)
        self.assertFalse(js["nodes_given"])
        by = {x["name"]: x for x in js["backups"]}
        for name in COMPLETE:
            self.assertTrue(by[name]["complete"], by[name])
            self.assertIsNone(by[name]["why"])
            self.assertEqual(by[name]["step"], STEPS[name])
            self.assertEqual(by[name]["nodes_complete"], 2)
            self.assertEqual(by[name]["bytes"], 2 * 40000 + 1 + 2 * len(b"node 0 metadata\n"))
            self.assertEqual([(s["node"], s["complete"]) for s in by[name]["shards"]],
                             [(0, True), (1, True)])
            self.assertRegex(by[name]["shards"][0]["hash"], "^[0-9a-f]{64}$")
        self.assertEqual(by["2027-01-03_12-00"]["restore"], True)
        self.assertEqual(sum(x["restore"] for x in js["backups"]), 1)
        for name in (NO_META, IN_PROGRESS):
            self.assertFalse(by[name]["complete"])
            self.assertEqual(by[name]["complete_for_fewer_nodes"], 1)
            self.assertEqual(by[name]["shards"][1], {"node": 1, "worker": 0, "step": 0, "hash": None,
                                                     "complete": False, "why": "no .meta"})
        self.assertFalse(by[NO_DATA]["complete"])
        self.assertIsNone(by[NO_DATA]["complete_for_fewer_nodes"])
        self.assertEqual(by[NO_DATA]["why"], "node 1 worker 0: missing data file state/arr.bin")
        self.assertEqual([s["complete"] for s in by[NO_DATA]["shards"]], [True, False])
        js = self.ajson("backups", *(self.b(url) + ["--nodes", "2"]))
        self.assertTrue(js["nodes_given"])
        by = {x["name"]: x for x in js["backups"]}
        self.assertEqual(by[NO_META]["why"], "node 1 worker 0: no .meta")
        # --nodes 1: the two-node backups have a node outside the job
        js = self.ajson("backups", *(self.b(url) + ["--nodes", "1"]))
        by = {x["name"]: x for x in js["backups"]}
        self.assertEqual(js["restore"]["name"], IN_PROGRESS)
        self.assertIn("outside the job", by["2027-01-03_12-00"]["why"])
        # an empty job
        js = self.ajson("backups", "--bucket", url, "--job", "nothing-here")
        self.assertEqual(js["backups"], [])
        self.assertIsNone(js["restore"])
        self.assertEqual(js["restore_note"], "no complete backup: nothing would be restored")

    # -- restore-version --------------------------------------------------

    def test_restore_version(self):
        url = self.url("rv")
        self.build_job(url)
        b = self.b(url)
        out, _ = self.admin("restore-version", "show", *b)
        self.assertEqual(out.split("\n")[0], "none")
        js = self.ajson("restore-version", "show", *b)
        self.assertIsNone(js["restore_version"])
        self.assertFalse(js["exists"])

        # refused: incomplete, missing (exit 1, the reason on stderr); nothing written
        _, err = self.admin("restore-version", "set", NO_DATA, *b, rc=1)
        self.assertIn("refused: backup %s is incomplete: node 1 worker 0: missing data file" % NO_DATA, err)
        self.assertIn("--force", err)
        _, err = self.admin("restore-version", "set", "2020-01-01_00-00", *b, rc=1)
        self.assertIn("has no backup 2020-01-01_00-00", err)
        js = self.ajson("restore-version", "set", NO_META, *(b + ["--nodes", "2"]), rc=1)
        self.assertTrue(js["refused"])
        self.assertIn("no .meta", js["reason"])
        # complete only for its own node count: refused without --nodes too
        self.admin("restore-version", "set", IN_PROGRESS, *b, rc=1)
        out, _ = self.admin("restore-version", "show", *b)
        self.assertEqual(out.split("\n")[0], "none")

        out, _ = self.admin("restore-version", "set", "2026-12-31_09-00", *b)
        self.assertEqual(out, "restore.version = 2026-12-31_09-00 (was none)\n")
        self.assertEqual(self.cli(url, "cat", JOB + "/restore.version"), "2026-12-31_09-00")
        out, _ = self.admin("restore-version", "show", *b)
        self.assertEqual(out, "2026-12-31_09-00\ncomplete (step 20): a restore from the bucket "
                         "would use it\n")
        js = self.ajson("backups", *b)
        self.assertEqual(js["restore"], {"name": "2026-12-31_09-00", "step": 20})
        self.assertEqual(js["restore_version"], "2026-12-31_09-00")
        out, _ = self.admin("backups", *b)
        self.assertIn("restore.version: 2026-12-31_09-00 (complete)\n", out)
        self.assertRegex(out, r"\n2026-12-31_09-00 .* complete  <- restore  \(restore.version\)\n")
        self.assertTrue(out.endswith("restore.version names 2026-12-31_09-00 (complete, step 20): "
                                     "a restore from the bucket would use it\n"), out)

        # --force: an incomplete one; then nothing would be restored
        js = self.ajson("restore-version", "set", NO_DATA, "--force", *b)
        self.assertEqual(js["restore_version"], NO_DATA)
        self.assertEqual(js["previous"], "2026-12-31_09-00")
        self.assertTrue(js["forced"])
        self.assertFalse(js["complete"])
        out, _ = self.admin("backups", *b)
        self.assertIn("restore.version names %s (incomplete): nothing would be restored\n" % NO_DATA, out)
        self.assertNotIn("<- restore", out)
        js = self.ajson("backups", *b)
        self.assertIsNone(js["restore"])
        out, _ = self.admin("restore-version", "show", *b)
        self.assertEqual(out.split("\n")[:2], [NO_DATA, "incomplete: node 1 worker 0: missing data "
                                               "file state/arr.bin"])
        js = self.ajson("restore-version", "show", *b)
        self.assertEqual((js["restore_version"], js["exists"], js["complete"]), (NO_DATA, True, False))
        self.admin("restore-version", "set", "2030-01-01_00-00", "--force", *b)
        js = self.ajson("restore-version", "show", *b)
        self.assertEqual((js["exists"], js["complete"], js["restore"]), (False, False, None))
        out, _ = self.admin("backups", *b)
        self.assertIn("restore.version names 2030-01-01_00-00 (no such backup): nothing would be "
                      "restored", out)

        out, _ = self.admin("restore-version", "clear", *b)
        self.assertEqual(out, "restore.version cleared (was 2030-01-01_00-00)\n")
        out, _ = self.admin("restore-version", "clear", *b)
        self.assertEqual(out, "restore.version was not set\n")
        js = self.ajson("restore-version", "show", *b)
        self.assertIsNone(js["restore_version"])
        self.assertEqual(js["restore"]["name"], "2027-01-03_12-00")

        # a restore.version that names no backup
        self.cli(url, "putbuf", JOB + "/restore.version", "../../etc")
        out, _ = self.admin("restore-version", "show", *b, rc=1)
        self.assertEqual(out.split("\n")[0], "invalid")
        js = self.ajson("backups", *b)
        self.assertTrue(js["restore_version_invalid"])
        self.assertIsNone(js["restore"])
        self.admin("restore-version", "clear", *b)

        # usage
        self.admin("restore-version", "set", "../x", *b, rc=2)
        self.admin("restore-version", "set", *b, rc=2)
        self.admin("restore-version", "drop", *b, rc=2)
        self.admin("restore-version", "show", "--force", *b, rc=2)
        self.admin("restore-version", "show", "--bucket", url, rc=2)

    # -- prune ------------------------------------------------------------

    def plan_of(self, js):
        return {x["name"]: x["action"] for x in js["backups"]}

    def test_prune(self):
        url = self.url("prune")
        self.build_job(url)
        b = self.b(url)
        self.admin("restore-version", "set", "2026-12-31_09-00", *b)
        before = self.objects(url, JOB + "/")
        self.assertEqual(self.names_left(url), sorted(STEPS))

        # dry run: oldest backup of each of the 2 newest days with a complete backup
        out, err = self.admin("prune", "--keep-daily", "2", "--nodes", "2", *b)
        self.assertEqual(err, "")
        rows = {ln.split()[1]: ln for ln in out.split("\n") if re.match(r"^(keep|delete) ", ln)}
        self.assertEqual(sorted(rows), sorted(STEPS))
        want_keep = {"2027-01-03_12-00", "2027-01-01_00-10", "2026-12-31_09-00", IN_PROGRESS}
        for name, ln in rows.items():
            self.assertEqual(ln.split()[0], "keep" if name in want_keep else "delete", ln)
        self.assertTrue(rows["2027-01-03_12-00"].endswith(
            "daily 2027-01-03, newest complete"), rows["2027-01-03_12-00"])
        self.assertTrue(rows["2027-01-01_00-10"].endswith("daily 2027-01-01"))
        self.assertTrue(rows["2026-12-31_09-00"].endswith("restore pick, named by restore.version"))
        self.assertIn("incomplete but newer than the newest complete (may be in progress)",
                      rows[IN_PROGRESS])
        self.assertTrue(rows["2027-01-01_00-10-2"].endswith("not kept by the policy"))
        self.assertTrue(rows[NO_DATA].endswith(
            "incomplete, older than the newest complete backup (node 1 worker 0: missing data file "
            "state/arr.bin)"), rows[NO_DATA])
        self.assertIn("policy: keep-daily 2; a period keeps its oldest backup\n", out)
        self.assertIn("dry run: would delete 5 of 9 backups", out)
        self.assertEqual(self.objects(url, JOB + "/"), before)   # a dry run deletes nothing

        js = self.ajson("prune", "--keep-daily", "2", "--nodes", "2", *b)
        self.assertTrue(js["dry_run"])
        self.assertEqual((js["keep"], js["delete"]), (4, 5))
        self.assertEqual(self.plan_of(js), {n: "keep" if n in want_keep else "delete" for n in STEPS})
        by = {x["name"]: x for x in js["backups"]}
        self.assertEqual(by["2027-01-03_12-00"]["reasons"], ["daily 2027-01-03", "newest-complete"])
        self.assertEqual(by["2026-12-31_09-00"]["reasons"], ["restore-pick", "restore-version"])
        self.assertEqual(by[IN_PROGRESS]["reasons"], ["in-progress"])
        self.assertEqual(by[NO_META]["reasons"], [])
        self.assertNotIn("deleted", js)

        # --prefer-recent: the newest of each day instead
        js = self.ajson("prune", "--keep-daily", "2", "--nodes", "2", "--prefer-recent", *b)
        self.assertEqual({n for n, a in self.plan_of(js).items() if a == "keep"},
                         {"2027-01-03_12-00", "2027-01-01_00-10-2", "2026-12-31_09-00", IN_PROGRESS})
        # keep-last with keep-weekly: 2027-01-01 is in 2026-W53 like 2026-12-30/31
        js = self.ajson("prune", "--keep-last", "2", "--keep-weekly", "2", "--nodes", "2", *b)
        self.assertEqual({n for n, a in self.plan_of(js).items() if a == "keep"},
                         {"2027-01-03_12-00", "2027-01-01_00-10-2", "2026-12-30_10-00",
                          "2026-12-31_09-00", IN_PROGRESS})
        by = {x["name"]: x for x in js["backups"]}
        self.assertEqual(by["2026-12-30_10-00"]["reasons"], ["weekly 2026-W53"])
        self.assertEqual(by["2027-01-01_00-10-2"]["reasons"], ["last #2"])
        # without --nodes, backups complete only for 1 node are held, whatever the policy
        js = self.ajson("prune", "--keep-last", "1", *b)
        by = {x["name"]: x for x in js["backups"]}
        self.assertEqual(by[NO_META]["action"], "keep")
        self.assertIn("complete-for-fewer-nodes", by[NO_META]["reasons"])
        self.assertEqual(by[NO_DATA]["action"], "delete")

        # --delete, not on a terminal: quiet on stderr
        self.reset_log()
        out, err = self.admin("prune", "--keep-daily", "2", "--nodes", "2", "--delete", *b)
        self.assertEqual(err, "")
        self.assertIn("deleted 5 of 5 backups:", out)
        self.assertEqual(self.names_left(url), sorted(want_keep))
        after = self.objects(url, JOB + "/")
        for name, size in before.items():
            bk = name.split("/")[1]
            if bk in want_keep or name == JOB + "/restore.version":
                self.assertEqual(after.get(name), size, name)
            else:
                self.assertNotIn(name, after)
        self.assertEqual(set(after), {n for n in before if n.split("/")[1] in want_keep or
                                      n == JOB + "/restore.version"})
        self.check_delete_order(before, want_keep)

        # the survivors are unchanged: the restore pick is still complete
        js = self.ajson("backups", *b)
        self.assertEqual(js["restore"]["name"], "2026-12-31_09-00")
        self.assertEqual(sorted(x["name"] for x in js["backups"]), sorted(want_keep))
        # again: nothing more to delete
        js = self.ajson("prune", "--keep-daily", "2", "--nodes", "2", "--delete", *b)
        self.assertEqual(js["delete"], 0)
        self.assertEqual(js["deleted"]["backups"], [])
        self.assertEqual(self.names_left(url), sorted(want_keep))

        # clear restore.version: keep-last 1 leaves the newest complete and the in-progress one
        self.admin("restore-version", "clear", *b)
        js = self.ajson("prune", "--keep-last", "1", "--nodes", "2", "--delete", *b)
        self.assertEqual(sorted(x["name"] for x in js["deleted"]["backups"]),
                         ["2026-12-31_09-00", "2027-01-01_00-10"])
        self.assertTrue(js["deleted"]["ok"])
        self.assertEqual(js["deleted"]["objects"],
                         sum(x["objects"] for x in js["deleted"]["backups"]))
        self.assertEqual(js["deleted"]["objects"], 2 * 8)   # 2 x (2 .meta, 2 manifests, 2 x 2 data files)
        self.assertEqual(self.names_left(url), ["2027-01-03_12-00", IN_PROGRESS])

    def test_prune_incomplete_older_than(self):
        """Failed attempts newer than the newest complete backup were kept
        for ever ("may be in progress"). --incomplete-older-than 2h deletes
        those that started more than 2 h ago, never the newest attempt nor a
        complete backup; alone, it keeps every complete backup."""
        url = self.url("stale")
        b = self.b(url)
        now = int(time.time()) // 60 * 60

        def name(ago_s):
            return time.strftime("%Y-%m-%d_%H-%M", time.gmtime(now - ago_s))
        complete = [name(9 * 3600), name(6 * 3600)]
        failed = [name(5 * 3600), name(3 * 3600), name(2 * 3600 + 300)]
        young_attempt = name(5400)                                      # 1 h 30 min ago
        recent = name(600)                                               # 10 min ago
        for step, n in enumerate(complete, 1):
            for node in (0, 1):
                self.cli(url, "upload-shard", JOB, n, str(step), str(node), "0", self.shard[node])
        for step, n in enumerate(failed + [young_attempt, recent], 10):
            self.cli(url, "upload-shard", JOB, n, str(step), "0", "0", self.shard[0])
        # without the option: every attempt newer than the newest complete stays
        js = self.ajson("prune", "--keep-last", "1", "--nodes", "2", *b)
        self.assertEqual({n for n, a in self.plan_of(js).items() if a == "delete"}, {complete[0]})
        # with it, a dry run: the three failed attempts go, the two newest stay
        js = self.ajson("prune", "--incomplete-older-than", "2h", "--nodes", "2", *b)
        self.assertEqual(js["policy"]["incomplete_older_than_s"], 7200)
        self.assertEqual({n for n, a in self.plan_of(js).items() if a == "delete"}, set(failed))
        self.assertEqual((js["keep"], js["delete"]), (4, 3))
        by = {x["name"]: x for x in js["backups"]}
        self.assertIn("started before the age limit", by[failed[0]]["why"])
        self.assertEqual(by[recent]["reasons"], ["in-progress"])
        self.assertEqual(by[young_attempt]["reasons"], ["in-progress"])
        out, _ = self.admin("prune", "--incomplete-older-than", "2h", "--nodes", "2", *b)
        self.assertIn("policy: every complete backup; incomplete backups that started more than "
                      "2h ago go, but the newest\n", out)
        # 1 min: even the 1 h 30 min one goes, the newest (10 min) never
        js = self.ajson("prune", "--incomplete-older-than", "1m", "--keep-last", "1",
                        "--nodes", "2", "--delete", *b)
        self.assertEqual(sorted(x["name"] for x in js["deleted"]["backups"]),
                         sorted([complete[0]] + failed + [young_attempt]))
        self.assertEqual(self.names_left(url), sorted([complete[1], recent]))
        # bad ages are refused
        for bad in ("2", "0h", "h", "-1h", "2w", "99999d"):
            _, err = self.admin("prune", "--incomplete-older-than", bad, *b, rc=2)
            self.assertIn("needs a duration like 90s, 30m, 2h or 7d", err)

    def check_delete_order(self, before, kept):
        """Per deleted backup: its .meta files first (node 0, then node 1),
        then its manifests, then its data."""
        order = self.delete_log()
        if order is None:
            return
        seen = {}
        for name in order:
            seen.setdefault(name.split("/")[1], []).append(name.split("/", 2)[2])
        deleted = {n.split("/")[1] for n in before} - set(kept) - {"restore.version"}
        self.assertEqual(set(seen), deleted)
        for bk, objs in seen.items():
            kinds = ["meta" if o.endswith(".meta") else "manifest" if o.endswith(".manifest")
                     else "data" for o in objs]
            nmeta = kinds.count("meta")
            self.assertEqual(kinds, sorted(kinds, key=["meta", "manifest", "data"].index), objs)
            self.assertEqual(objs[:nmeta], sorted(objs[:nmeta], key=lambda o: o.split("-n")[-1]), objs)
            self.assertEqual(len(objs), len([n for n in before if n.split("/")[1] == bk]))

    def run_on_tty(self, *args):
        """Run mtcfs-admin with stderr on a pseudo-terminal: (rc, stdout, what the terminal got)."""
        master, slave = pty.openpty()
        tty = b""
        try:
            p = subprocess.run([ADMIN] + list(args), env=self.env, stdout=subprocess.PIPE,
                               stderr=slave, timeout=120)
            os.close(slave)
            slave = -1
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                tty += chunk
        finally:
            if slave >= 0:
                os.close(slave)
            os.close(master)
        self.assertNotRegex(tty.decode(), SANITIZER)
        return p.returncode, p.stdout.decode(), tty.decode()

    def test_prune_progress_on_a_terminal(self):
        url = self.url("tty")
        self.build_job(url)
        rc, out, tty = self.run_on_tty("prune", "--keep-last", "1", "--nodes", "2", "--delete",
                                       *self.b(url))
        self.assertEqual(rc, 0, tty)
        self.assertRegex(tty, r"\r\S+ +\d+/\d+ objects +[0-9.]+ (B|KiB)/[0-9.]+ KiB +\d+ obj/s +ETA")
        self.assertIn("deleted 7 of 7 backups", out)
        self.assertEqual(self.names_left(url), ["2027-01-03_12-00", IN_PROGRESS])

    # -- usage and failures -----------------------------------------------

    def test_usage_and_help(self):
        url = self.url("usage")
        for cmd in ALL_COMMANDS:
            out, err = self.admin(cmd, "--help")
            self.assertTrue(out.startswith("usage: mtcfs-admin %s" % cmd), out)
            self.assertIn("exit:", out)
            self.assertEqual(err, "")
            out2, _ = self.admin("help", cmd)
            self.assertEqual(out2, out)
        out, _ = self.admin("prune", "--help")
        for opt in ("--keep-last", "--keep-hourly", "--keep-daily", "--keep-weekly",
                    "--keep-monthly", "--keep-yearly", "--prefer-recent", "--delete", "--json",
                    "--bucket", "--job", "--gcs-endpoint", "--key-file", "OLDEST", "NEWEST",
                    "ISO 8601", ".meta files first"):
            self.assertIn(opt, out)
        out, _ = self.admin("--help")
        for cmd in ALL_COMMANDS:
            self.assertIn("  " + cmd, out)
        self.admin(rc=2)
        self.admin("frobnicate", rc=2)
        self.admin("backups", "--job", JOB, rc=2)                       # no --bucket
        self.admin("backups", "--bucket", url, rc=2)                    # no --job
        self.admin("backups", "--bucket", url, "--job", "a/b", rc=2)    # not a job name
        self.admin("backups", "--bucket", "s3://x", "--job", JOB, rc=2)
        self.admin("backups", "--bucket", url, "--job", JOB, "--delete", rc=2)
        self.admin("backups", "--bucket", url, "--job", JOB, "--nodes", "x", rc=2)
        self.admin("backups", "--bucket", url, "--job", JOB, "extra", rc=2)
        self.admin("prune", "--bucket", url, "--job", JOB, rc=2)        # no policy
        self.admin("prune", "--bucket", url, "--job", JOB, "--keep-last", "0", rc=2)
        self.admin("prune", "--bucket", url, "--job", JOB, "--keep-daily", "-1", rc=2)
        self.admin("prune", "--bucket", url, "--job", JOB, "--keep-daily", rc=2)
        self.admin("prune", "--bucket", url, "--job", JOB, "--force", "--keep-last", "1", rc=2)
        self.admin("ls", "/nonexistent", "--keep-last", "1", rc=2)
        # --opt=value works too
        js = self.ajson("prune", "--bucket=" + url, "--job=" + JOB, "--keep-last=3")
        self.assertEqual(js["policy"]["keep_last"], 3)

    def test_unreadable_bucket(self):
        for args in self.unreadable():
            for cmd in (["backups"], ["restore-version", "show"], ["restore-version", "clear"],
                        ["restore-version", "set", "2026-01-01_00-00"],
                        ["prune", "--keep-last", "1"]):
                _, err = self.admin(*(cmd + args + ["--job", JOB]), rc=3)
                self.assertIn("mtcfs-admin: cannot ", err)


class GcsAdminTest(AdminBucketTests, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for exe in (CLI, ADMIN):
            if not os.access(exe, os.X_OK):
                raise unittest.SkipTest("no %s" % exe)
        cls.make_shards()
        cls.srv = Server()
        cls.env = dict(os.environ)
        cls.env["STORAGE_EMULATOR_HOST"] = "127.0.0.1:%d" % cls.srv.port
        cls.env["MTCFS_GCS_RETRY"] = "1,20,3"

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def url(self, tag):
        return "gs://adm/%s" % tag

    def objects(self, url, prefix):
        pfx = url[len("gs://adm/"):] + "/" + prefix
        return {o["name"][len(url) - len("gs://adm/") + 1:]: int(o["size"])
                for o in self.srv.call("/_objects") if o.get("bucket") == "adm" and
                o["name"].startswith(pfx)}

    def reset_log(self):
        self.srv.call("/_reset", {"log": True, "faults": True, "data": False})

    def delete_log(self):
        return [e["name"].split("/", 1)[1] for e in self.srv.call("/_log")
                if e["class"] == "delete" and e.get("status") in (200, 204)]

    def unreadable(self):
        # a server that fails every listing and read; and nothing listening at all
        self.srv.call("/_fault", [{"match": "list", "kind": "503", "count": 1000},
                                  {"match": "download", "kind": "503", "count": 1000},
                                  {"match": "meta", "kind": "503", "count": 1000},
                                  {"match": "delete", "kind": "503", "count": 1000}])
        self.addCleanup(self.reset_log)
        dead = socket_free_port()
        return [["--bucket", self.url("unreadable")],
                ["--bucket", "gs://adm/x", "--gcs-endpoint", "http://127.0.0.1:%d" % dead]]

    def test_prune_delete_fails_midway(self):
        # the first delete (node 0's .meta of the oldest pruned backup) passes, the
        # next ones fail: exit 3; what is left of that backup is incomplete, no
        # other object of it went, and the next prune deletes it
        url = self.url("fail")
        self.build_job(url)
        b = self.b(url)
        before = self.objects(url, JOB + "/")
        self.srv.call("/_fault", [{"match": "delete", "kind": "503", "count": 1000, "skip": 1}])
        self.addCleanup(self.reset_log)
        rc, out, tty = self.run_on_tty("prune", "--keep-last", "1", "--nodes", "2", "--delete", *b)
        self.assertEqual(rc, 3, out + tty)
        self.assertIn("deleting backup 2026-12-30_10-00 failed", tty)
        self.assertIn("deleted 0 of 7 backups", out)
        after = self.objects(url, JOB + "/")
        self.assertEqual(set(before) - set(after), {"%s/2026-12-30_10-00/%s-s10-n0-w0.meta" % (JOB, JOB)})
        js = self.ajson("backups", *b)
        by = {x["name"]: x for x in js["backups"]}
        self.assertFalse(by["2026-12-30_10-00"]["complete"])
        self.assertEqual(by["2026-12-30_10-00"]["why"], "node 0 worker 0: no .meta")
        # judged by its own .meta names too (node 1 only): still incomplete
        js = self.ajson("backups", *(b + ["--nodes", "0"]))
        self.assertFalse({x["name"]: x for x in js["backups"]}["2026-12-30_10-00"]["complete"])
        self.reset_log()
        js = self.ajson("prune", "--keep-last", "1", "--delete", *b)
        self.assertIn("2026-12-30_10-00", [x["name"] for x in js["deleted"]["backups"]])
        self.assertEqual(self.names_left(url), sorted(["2027-01-03_12-00", IN_PROGRESS, NO_META]))

    def test_gs_endpoint_option(self):
        # --gcs-endpoint instead of STORAGE_EMULATOR_HOST; the token comes from
        # the test server's metadata endpoint (GCE_METADATA_HOST)
        url = self.url("endpoint")
        self.cli(url, "upload-shard", JOB, "2026-01-01_00-00", "5", "0", "0", self.shard[0])
        env = dict(self.env)
        del env["STORAGE_EMULATOR_HOST"]
        env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
        env["GCE_METADATA_HOST"] = "127.0.0.1:%d" % self.srv.port
        js = json.loads(self.admin("backups", "--bucket", url, "--job", JOB, "--json",
                                   "--gcs-endpoint", self.srv.base, env=env)[0])
        self.assertEqual(js["restore"]["name"], "2026-01-01_00-00")


def socket_free_port():
    return harness.free_ports(1)[0]


class FileAdminTest(AdminBucketTests, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for exe in (CLI, ADMIN):
            if not os.access(exe, os.X_OK):
                raise unittest.SkipTest("no %s" % exe)
        cls.make_shards()
        cls.env = dict(os.environ)
        cls.env.pop("STORAGE_EMULATOR_HOST", None)
        cls.root = os.path.join(cls.tmp, "buckets")
        os.makedirs(cls.root)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def url(self, tag):
        d = os.path.join(self.root, tag)
        os.makedirs(d, exist_ok=True)
        return "file://" + d

    def objects(self, url, prefix):
        root = url[len("file://"):]
        out = {}
        for dp, _, files in os.walk(os.path.join(root, prefix)):
            for f in files:
                p = os.path.join(dp, f)
                out[os.path.relpath(p, root)] = os.path.getsize(p)
        return out

    def reset_log(self):
        pass

    def delete_log(self):
        return None      # file:// keeps no log; the gs run checks the order

    def unreadable(self):
        f = os.path.join(self.tmp, "a-file")
        with open(f, "w") as fh:
            fh.write("x")
        return [["--bucket", "file://" + os.path.join(self.tmp, "missing")],
                ["--bucket", "file://" + f],
                ["--bucket", "file://" + os.path.join(f, "below")]]

    def test_verify_finds_data_changed_in_place(self):
        """file:// lists sizes only: a byte changed in a data file of the
        newest complete backup leaves it complete by its listing, and the
        prediction says its data was not read. --verify reads it, shows it
        corrupt, and names the backup the daemon would fall back to (it
        asks for another backup when a fetch fails its CRC32C)."""
        url = self.url("verify")
        self.build_job(url)
        root = url[len("file://"):]
        bad = [os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(root, JOB, "2027-01-03_12-00"))
               for f in fs if f == "arr.bin"]
        self.assertEqual(len(bad), 2, bad)
        with open(bad[0], "r+b") as f:
            b = f.read(1)
            f.seek(0)
            f.write(bytes([b[0] ^ 0xff]))
        out, _ = self.admin("backups", "--nodes", "2", *self.b(url))
        self.assertIn("would use 2027-01-03_12-00 (step 60), the newest complete backup; file:// "
                      "lists no checksums, so its data was not read (--verify reads it)", out)
        out, _ = self.admin("backups", "--nodes", "2", "--verify", *self.b(url))
        rows = {ln.split()[0]: ln for ln in out.split("\n") if re.match(r"^20\d\d-", ln)}
        self.assertRegex(rows["2027-01-03_12-00"], r" incomplete$")
        self.assertIn("corrupt: ", out)
        self.assertIn("would use 2027-01-01_00-10-2 (step 41), the newest complete backup "
                      "(data verified)", out)
        js = self.ajson("backups", "--nodes", "2", "--verify", *self.b(url))
        self.assertEqual(js["restore"], {"name": "2027-01-01_00-10-2", "step": 41})
        by = {x["name"]: x for x in js["backups"]}
        self.assertFalse(by["2027-01-03_12-00"]["complete"])
        self.assertTrue(by["2027-01-03_12-00"]["why"].startswith("corrupt: "), by["2027-01-03_12-00"])
        # restore.version naming it: no fallback, nothing restored
        self.admin("restore-version", "set", "2027-01-03_12-00", "--nodes", "2", *self.b(url))
        js = self.ajson("backups", "--nodes", "2", "--verify", *self.b(url))
        self.assertIsNone(js["restore"])
        self.assertIn("incomplete", js["restore_note"])

    def test_deleted_directories_are_gone(self):
        url = self.url("dirs")
        self.build_job(url)
        self.admin("prune", "--keep-last", "1", "--nodes", "2", "--delete", *self.b(url))
        root = url[len("file://"):]
        self.assertEqual(sorted(os.listdir(os.path.join(root, JOB))),
                         ["2027-01-03_12-00", IN_PROGRESS])


class RamdirConfiguration(unittest.TestCase):
    """Bucket commands with --ramdir RAMDIR and no --bucket/--job: the
    bucket is the one that node's daemon was mounted with (bucket=, recorded
    in RAMDIR's catalog at mount), the job is the job-name of the last
    replicator.yaml it accepted. What the command line gives wins."""

    def run_admin(self, *args, rc=0):
        p = subprocess.run([ADMIN] + list(args), capture_output=True, timeout=120)
        self.assertNotRegex(p.stderr.decode(), SANITIZER)
        self.assertEqual(p.returncode, rc, (args, p.stdout, p.stderr))
        return p.stdout.decode(), p.stderr.decode()

    def test_bucket_and_job_from_ramdir(self):
        import harness
        from cluster import Cluster
        tmp = tempfile.mkdtemp(prefix="mtcfs-admin-rd-")
        self.addCleanup(shutil.rmtree, tmp, True)
        bucket = os.path.join(tmp, "bucket")
        os.mkdir(bucket)
        c = Cluster(1, ram_size="256M", extra="bucket=file://" + bucket)
        c.interval = "backup-interval-steps: 1"
        self.addCleanup(c.close)
        c.start()
        ram = c.nodes[0].ramdir
        # no job configured yet: the bucket is known, the job is not
        _, err = self.run_admin("backups", "--ramdir", ram, rc=2)
        self.assertIn("no replicator.yaml configured a job yet; give --job NAME", err)
        c.job_start("rdjob")
        c.save("rdjob", 3, size=64 * 1024)

        def backed_up():
            out, _ = self.run_admin("backups", "--ramdir", ram, "--json")
            js = json.loads(out)
            return js if [b for b in js["backups"] if b["complete"]] else None
        js = harness.wait_until(backed_up, 60, "a complete backup listed through --ramdir")
        self.assertEqual((js["bucket"], js["job"]), ("file://" + bucket, "rdjob"))
        self.assertEqual([b["step"] for b in js["backups"]], [3])
        name = js["backups"][0]["name"]
        # the same answer as with the options spelled out
        out, _ = self.run_admin("backups", "--bucket", "file://" + bucket, "--job", "rdjob", "--json")
        self.assertEqual(json.loads(out)["backups"], js["backups"])
        # restore-version and prune too; human output names bucket and job
        out, _ = self.run_admin("restore-version", "show", "--ramdir", ram)
        self.assertTrue(out.startswith("none\n"), out)
        out, _ = self.run_admin("prune", "--keep-last", "1", "--ramdir", ram)
        self.assertIn("bucket file://%s, job rdjob: 1 backup" % bucket, out)
        self.assertRegex(out, r"(?m)^keep\s+%s\s+3\s" % re.escape(name))
        # the command line wins: another job, another bucket
        out, _ = self.run_admin("backups", "--ramdir", ram, "--job", "other", "--json")
        self.assertEqual((json.loads(out)["job"], json.loads(out)["backups"]), ("other", []))
        other = os.path.join(tmp, "other")
        os.mkdir(other)
        out, _ = self.run_admin("backups", "--ramdir", ram, "--bucket", "file://" + other, "--json")
        self.assertEqual((json.loads(out)["bucket"], json.loads(out)["job"]),
                         ("file://" + other, "rdjob"))
        # a node mounted without bucket=: said so, exit 2
        d = harness.Daemon(opts="ram_size=64M")
        self.addCleanup(d.close)
        d.start()
        _, err = self.run_admin("backups", "--ramdir", d.ramdir, "--job", "x", rc=2)
        self.assertIn("the node was mounted without bucket=; give --bucket URL", err)
        # not a RAMDIR at all
        self.run_admin("backups", "--ramdir", os.path.join(tmp, "nothing"), rc=3)
        # a node command does not take it
        _, err = self.run_admin("ls", ram, "--ramdir", ram, rc=2)
        self.assertIn("is not an option of this command", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
