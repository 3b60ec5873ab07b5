#!/usr/bin/python3
"""Unit tests for tools/check-functions: fake trees with a function over the
limit must fail with the exact line naming it; what is not a function body
(initialisers, struct bodies, braces in comments, strings and directives)
and tests/ must not count. ctest: unit.check_functions (the real tree is
check.functions)."""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_tree import FakeTreeCase  # noqa: E402

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(TOP, "tools", "check-functions")


def body(n):
    """A function body of exactly n lines, counted from the name's line to
    the closing brace (n >= 3)."""
    return "{\n" + "\tx++;\n" * (n - 3) + "}\n"


class CheckFunctions(FakeTreeCase):
    PREFIX = "check-functions-"

    def setUp(self):
        super().setUp()
        self.put("common/a.c", "static int x;\n\nstatic void small(void)\n{\n\tx++;\n}\n")

    def run_tool(self, *args):
        p = subprocess.run([sys.executable, TOOL] + list(args) + [self.root],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout.splitlines()

    def assert_fails_with(self, *lines):
        rc, out = self.run_tool()
        self.assertEqual(rc, 1, out)
        self.assertEqual(out[:-1], list(lines))
        self.assertRegex(out[-1], r"^check-functions: %d function\(s\) over 150 lines in \d+ "
                         r"files; split them by responsibility$" % len(lines))

    def test_clean_tree_passes(self):
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)
        self.assertEqual(out, ["check-functions: 1 functions in 1 files, none over 150 lines "
                               "(longest: small in common/a.c, 4)"])

    def test_150_lines_pass_151_fail(self):
        self.put("fs/ok.c", "int fits(int a,\n\t int b)\n" + body(149))
        self.assertEqual(self.run_tool()[0], 0)
        self.put("fs/long.c", "\n\nstatic int\ntoo_long(void)\n" + body(151))
        self.assert_fails_with("fs/long.c:4: too_long is 151 lines (limit 150)")

    def test_max_option(self):
        self.put("fs/ok.c", "int f(void)\n" + body(20))
        rc, out = self.run_tool("--max", "19")
        self.assertEqual(rc, 1)
        self.assertEqual(out[0], "fs/ok.c:1: f is 20 lines (limit 19)")

    def test_braces_in_comments_strings_and_directives_do_not_count(self):
        self.put("net/b.c",
                 '#define OPEN {\n'
                 '#define LONG_MACRO(x) do { \\\n'
                 '\t\tx; } \\\n'
                 '\twhile (0)\n'
                 'static const char *s = "}{";\n'
                 "static char c = '{';\n"
                 "/* } { */\n"
                 "int g(void)\n{\n\t// }\n\treturn '}' + \"\\\"{\"[0];\n}\n"
                 + "int h(void)\n" + body(151))
        self.assert_fails_with("net/b.c:13: h is 151 lines (limit 150)")

    def test_initialisers_and_struct_bodies_are_not_functions(self):
        rows = "".join("\t{ %d, f(%d) },\n" % (i, i) for i in range(200))
        self.put("tiers/t.c", "static const struct row t[] = {\n" + rows + "};\n"
                 "struct big {\n" + "\tint a;\n" * 200 + "};\n"
                 "static int (*fp)(int) = (int (*)(int))0;\n"
                 "static void tail(void) __attribute__((unused));\n"
                 "static void tail(void) __attribute__((unused))\n" + body(151))
        self.assert_fails_with("tiers/t.c:407: tail is 151 lines (limit 150)")

    def test_tests_and_build_trees_are_skipped(self):
        self.put("tests/unit/test_x.c", "int main(void)\n" + body(400))
        self.put("build/gen.c", "int gen(void)\n" + body(400))
        self.put("csi/main.c", "int main(int argc, char **argv)\n" + body(160))
        self.assert_fails_with("csi/main.c:1: main is 160 lines (limit 150)")


if __name__ == "__main__":
    unittest.main()
