"""The coordinator's typed messages (net/proto) seen from the wire: a Python
node speaking the control protocol to rank 0 of a real 2-node cluster.

- a catalog with a bad holding is refused with NT_ERROR EINVAL whose text
  names the field ("bad catalog: holds[1]: owner is not a rank below 2"),
  and it changes nothing: the job it names stays unknown to the coordinator
  (before the typed decoders, holdings were checked one by one while being
  applied, so a bad one at index 1 had already created the job and started
  a restore round);
- a register without addr, a ready with plan over 2^32-1: EINVAL naming
  the field;
- a request without a string "op": EINVAL "missing op"; an unknown op:
  ENOSYS "unknown op"; the connection keeps serving after each;
- the status reply for a known and an unknown job;
- one address is one rank's: a rank registering an address clears it from
  the rank that had it, the table's generation bumps, and a registered
  node hears the new generation (peers event) (issue 22).

Run: MTCFS_BIN=build/mtcfs MTCFS_ADMIN=build/mtcfs-admin \
     /usr/bin/python3 tests/integration/multinode/test_proto_wire.py [-k NAME]
"""

import errno
import os
import sys
import unittest

INTEG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
sys.path.insert(0, INTEG)
sys.path.insert(1, os.path.join(INTEG, "security"))  # test_peer_security: the Python peer
import harness  # noqa: E402
import test_peer_security as ps  # noqa: E402
from cluster import Cluster  # noqa: E402

JOB = "protojob"
H = "ab" * 32


class CoordinatorWire(unittest.TestCase):
    def setUp(self):
        self.c = Cluster(2, ram_size="256M", restore_timeout=10)
        self.addCleanup(self.c.close)
        self.c.start()
        self.secret = ps.read_secret(self.c.secret)
        self.req_id = 100

    def control(self, rank=1):
        """An authenticated control connection to the coordinator (rank 0)."""
        w = ps.Wire(self.c.addrs[0])
        self.addCleanup(w.close)
        w.handshake(self.secret, rank=rank, purpose="control", server_rank=0)
        return w

    def call(self, w, req):
        """(reply object) or raises ps.Refused; checks the reply's req_id.
        A "peers" event the coordinator's tick sends meanwhile (to every
        registered control connection) is kept in w.events, not taken for
        the reply."""
        self.req_id += 1
        w.send(ps.frame(ps.NT_REQ, req, req_id=self.req_id))
        while True:
            ftype, rid, o = w.recv_json()
            if ftype == ps.NT_EVENT and isinstance(o, dict) and o.get("op") == "peers":
                w.__dict__.setdefault("events", []).append(o)
                continue
            break
        self.assertEqual((ftype, rid), (ps.NT_RESP, self.req_id), o)
        return o

    def refused(self, w, req, err, text):
        with self.assertRaises(ps.Refused) as cm:
            self.call(w, req)
        self.assertEqual((cm.exception.errno, cm.exception.text), (err, text))

    def status(self, w, job):
        return self.call(w, {"op": "status", "job": job})

    def test_bad_catalog_names_field_and_changes_nothing(self):
        w = self.control(rank=1)
        self.assertFalse(self.status(w, JOB)["known"])
        self.refused(w, {"op": "catalog", "job": JOB, "nodes": 2, "dp": 1,
                         "holds": [[0, 5, H], [2, 5, H]]},
                     errno.EINVAL,
                     "bad catalog: holds[1]: owner is not a rank below 2")
        st = self.status(w, JOB)
        self.assertFalse(st["known"], "a refused catalog made the job: %r" % st)
        self.refused(w, {"op": "catalog", "job": JOB, "nodes": 2,
                         "holds": [[0, 5, "abcd"]]}, errno.EINVAL,
                     "bad catalog: holds[0]: hash is not 64 hex digits")
        self.refused(w, {"op": "catalog", "job": JOB, "nodes": 3, "dp": 2,
                         "holds": []}, errno.EINVAL,
                     "bad catalog: dp 2 does not divide nodes 3")
        self.assertFalse(self.status(w, JOB)["known"])

    def test_bad_requests_name_the_field(self):
        w = self.control(rank=1)
        self.refused(w, {"op": "register", "job": JOB}, errno.EINVAL,
                     "bad register: missing addr")
        self.refused(w, {"op": "ready", "job": JOB, "plan": 1 << 32},
                     errno.EINVAL,
                     "bad ready: plan is not an integer in 0..4294967295")
        self.refused(w, {"op": "fetch_failed", "job": JOB, "owner": 0,
                         "step": 1}, errno.EINVAL,
                     "bad fetch_failed: missing holder")
        self.refused(w, {"job": JOB}, errno.EINVAL, "missing op")
        self.refused(w, {"op": 7}, errno.EINVAL, "missing op")
        self.refused(w, {"op": "nosuchop"}, errno.ENOSYS, "unknown op")
        # an event op is not a request the coordinator answers, and an
        # event with a request's op is dropped: both leave it serving
        w.send(ps.frame(ps.NT_EVENT, {"op": "register", "addr": "x:1"}))
        self.assertIn("addrs", self.call(w, {"op": "table"}))

    def test_one_address_one_rank_and_the_generation_announced(self):
        w5 = self.control(rank=5)
        r = self.call(w5, {"op": "register", "addr": "127.0.0.1:9", "want_table": True})
        self.assertEqual(r["addrs"][5], "127.0.0.1:9")
        g1 = r["gen"]
        self.assertGreaterEqual(g1, 1)
        # the node of rank 5 comes back as rank 6 (a new replicator.yaml)
        w6 = self.control(rank=6)
        r = self.call(w6, {"op": "register", "addr": "127.0.0.1:9", "want_table": True})
        self.assertEqual(r["addrs"][5:7], [None, "127.0.0.1:9"], r)
        self.assertGreater(r["gen"], g1)
        t = self.call(w6, {"op": "table"})
        self.assertEqual((t["addrs"][5:7], t["gen"]), ([None, "127.0.0.1:9"], r["gen"]))
        # the same address again changes nothing
        self.assertEqual(self.call(w6, {"op": "register", "addr": "127.0.0.1:9"}),
                         {"ok": True, "gen": r["gen"]})

        def announced(w, gen):
            # once per tick: an earlier generation may come first (and one
            # may have come while a call waited for its reply)
            for o in w.__dict__.get("events", []):
                self.assertEqual(set(o), {"op", "gen"})
                if o["gen"] == gen:
                    return
            while True:
                ftype, rid, o = w.recv_json()
                if ftype == ps.NT_EVENT and o.get("op") == "peers":
                    self.assertEqual(set(o), {"op", "gen"})
                    self.assertLessEqual(o["gen"], gen)
                    if o["gen"] == gen:
                        return
        for w in (w5, w6):
            announced(w, r["gen"])

    def test_status_of_a_known_job(self):
        self.assertEqual(self.c.job_start(JOB), {0: 0, 1: 0})
        self.c.save(JOB, 10, size=4096)
        w = self.control(rank=1)

        def lkg():
            st = self.status(w, JOB)
            return st if st.get("lkg") == 10 else None
        st = harness.wait_until(lkg, 30, "the coordinator's lkg is step 10")
        self.assertTrue(st["known"])
        self.assertEqual((st["job"], st["nodes_total"]), (JOB, 2))
        self.assertEqual([n["rank"] for n in st["nodes"]], [0, 1])
        self.assertEqual(len(st["addrs"]), 2)


if __name__ == "__main__":
    harness.main()
