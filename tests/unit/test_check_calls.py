#!/usr/bin/python3
"""Unit tests for tools/check-calls: fake trees where two files of a folder
call each other (directly or round three files) must fail with the line
naming the circle; one module's files behind a private header, calls
across folders, calls through a table of function pointers, a static
function of the same name in two files and tests/ must pass. ctest:
unit.check_calls (the real tree is check.calls)."""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_tree import FakeTreeCase  # noqa: E402

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(TOP, "tools", "check-calls")


def fn(name, *calls, static=False):
    body = "".join("\t%s();\n" % c for c in calls)
    return "%svoid %s(void)\n{\n%s}\n" % ("static " if static else "", name, body)


class CheckCalls(FakeTreeCase):
    PREFIX = "check-calls-"

    def run_tool(self):
        p = subprocess.run([sys.executable, TOOL, self.root],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout.splitlines()

    def test_calls_down_pass(self):
        self.put("fs/a.c", fn("a_top", "b_mid"))
        self.put("fs/b.c", fn("b_mid", "c_low"))
        self.put("fs/c.c", fn("c_low"))
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)
        self.assertEqual(out, ["check-calls: 3 files, no call circle between modules of a folder"])

    def test_two_files_in_a_circle_fail(self):
        self.put("fs/a.c", fn("a_top", "b_mid"))
        self.put("fs/b.c", fn("b_mid", "a_back"))
        self.put("fs/a2.c", "")
        with open(os.path.join(self.root, "fs/a.c"), "a") as f:
            f.write(fn("a_back"))
        rc, out = self.run_tool()
        self.assertEqual(rc, 1, out)
        self.assertEqual(out[0], "fs: circle between fs/a.c, fs/b.c: fs/a.c -> fs/b.c (b_mid); "
                                 "fs/b.c -> fs/a.c (a_back)")
        self.assertRegex(out[-1], r"^check-calls: 1 call circle\(s\) between modules of a folder "
                                  r"in 3 files; call down or across through a header$")

    def test_circle_round_three_files_fails(self):
        self.put("net/a.c", fn("fa", "fb"))
        self.put("net/b.c", fn("fb", "fc"))
        self.put("net/c.c", fn("fc", "fa"))
        rc, out = self.run_tool()
        self.assertEqual(rc, 1, out)
        self.assertTrue(out[0].startswith("net: circle between net/a.c, net/b.c, net/c.c: "), out)

    def test_private_split_behind_one_header_passes(self):
        # fs_ll.c and fs_ll_dir.c are one module (fs_ll_i.h); commit.c
        # calls into it and it calls commit.c: a circle between modules
        self.put("fs/fs_ll_i.h", "void ll_a(void);\nvoid ll_b(void);\n")
        self.put("fs/fs_ll.c", '#include "fs/fs_ll_i.h"\n' + fn("ll_a", "ll_b"))
        self.put("fs/fs_ll_dir.c", '#include "fs/fs_ll_i.h"\n' + fn("ll_b", "ll_a"))
        self.put("fs/other.c", fn("other"))
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)
        self.put("fs/commit.c", fn("commit_x", "ll_a"))
        with open(os.path.join(self.root, "fs/fs_ll_dir.c"), "a") as f:
            f.write(fn("ll_c", "commit_x"))
        rc, out = self.run_tool()
        self.assertEqual(rc, 1, out)
        self.assertTrue(out[0].startswith("fs: circle between fs/commit.c, fs/fs_ll_i.h: "), out)

    def test_header_every_file_includes_joins_nothing(self):
        # a folder-wide state header is not a module
        self.put("fs/fs_i.h", "struct fs;\n")
        self.put("fs/a.c", '#include "fs/fs_i.h"\n' + fn("fa", "fb"))
        self.put("fs/b.c", '#include "fs/fs_i.h"\n' + fn("fb", "fa2"))
        with open(os.path.join(self.root, "fs/a.c"), "a") as f:
            f.write(fn("fa2"))
        rc, out = self.run_tool()
        self.assertEqual(rc, 1, out)

    def test_private_header_through_another_header(self):
        self.put("cluster/engine_int.h", "struct eng;\n")
        self.put("cluster/engine_ec.h", '#include "cluster/engine_int.h"\n')
        self.put("cluster/engine.c", '#include "cluster/engine_int.h"\n' + fn("eng_a", "ec_b"))
        self.put("cluster/engine_ec.c", '#include "cluster/engine_ec.h"\n' + fn("ec_b", "eng_a2"))
        with open(os.path.join(self.root, "cluster/engine.c"), "a") as f:
            f.write(fn("eng_a2"))
        self.put("cluster/lkg.c", fn("lkg"))
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)

    def test_pointers_other_folders_statics_and_tests_do_not_count(self):
        self.put("fs/a.c", "struct ops { void (*up)(void); };\n" + fn("fa", "fb") +
                 fn("helper", static=True))
        self.put("fs/b.c", "extern struct ops *o;\n" + fn("fb", "helper", "tiers_x") +
                 fn("helper", static=True) + "void fb2(void)\n{\n\to->up();\n}\n")
        self.put("tiers/x.c", fn("tiers_x", "fa"))
        self.put("tests/t.c", fn("fb", "fa"))
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)

    def test_comment_and_string_do_not_count(self):
        self.put("fs/a.c", fn("fa", "fb"))
        self.put("fs/b.c", "/* fa() */\nconst char *s = \"fa()\";\n" + fn("fb"))
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)


if __name__ == "__main__":
    unittest.main()
