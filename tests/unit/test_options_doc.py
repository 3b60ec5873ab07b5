#!/usr/bin/python3
"""The mount options have one list, docs/options.tsv; this test holds every
other place to it (docs/options.md says how to add an option):

- tools/daemon_opts.c's opt_spec parses exactly the options the table names;
- the numeric defaults in the table are the ones tools/daemon_opts.c starts with;
- `mtcfs --help` (usage()) names every option, and nothing else;
- mtcfs(8)'s MOUNT OPTIONS has an entry for every option, and nothing else;
- README.md's options table is exactly the table printed by
  `tests/unit/test_options_doc.py --markdown`.

MTCFS_BIN names the built mtcfs (ctest sets it); without it the usage text
is read from tools/daemon_opts.c's source.
"""
import glob
import os
import re
import subprocess
import sys
import unittest

SRC = os.environ.get("MTCFS_SRC") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))
TSV = os.path.join(SRC, "docs", "options.tsv")
MAIN_C = os.path.join(SRC, "tools", "daemon_opts.c")
MAN = os.path.join(SRC, "packaging", "man", "mtcfs.8")
README = os.path.join(SRC, "README.md")
README_HEADER = "| option | default | meaning |"


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def table():
    """The rows of docs/options.tsv: dicts of name, arg, default, meaning."""
    rows = []
    for n, line in enumerate(read(TSV).splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if len(cells) != 4 or not all(c.strip() for c in cells):
            raise ValueError("docs/options.tsv:%d: want 4 non-empty tab-separated cells, got %r"
                             % (n, cells))
        rows.append(dict(zip(("name", "arg", "default", "meaning"), cells)))
    return rows


def markdown(rows):
    """README's options table, as it must read."""
    out = [README_HEADER, "|---|---|---|"]
    for r in rows:
        opt = r["name"] if r["arg"] == "-" else "%s=%s" % (r["name"], r["arg"])
        cell = "`%s`" % opt.replace("|", "\\|")
        out.append("| %s | %s | %s |" % (cell, r["default"].replace("|", "\\|"),
                                        r["meaning"].replace("|", "\\|")))
    return out


def parsed_names():
    """Option names tools/daemon_opts.c's opt_spec accepts (FUSE's own and -f etc. left out)."""
    src = read(MAIN_C)
    m = re.search(r"opt_spec\[\]\s*=\s*\{(.*?)FUSE_OPT_END", src, re.S)
    if not m:
        raise AssertionError("tools/daemon_opts.c: no opt_spec table found")
    names = set()
    for templ in re.findall(r'(?:OPT\(\s*|\{\s*)"([^"]+)"', m.group(1)):
        if not templ.startswith("-"):
            names.add(templ.split("=", 1)[0])
    return names


def code_defaults():
    """The `.name = N` initialisers of the options of the struct cmdline the
    parser starts from."""
    src = read(MAIN_C)
    m = re.search(r"struct cmdline \w+ = \{ \.o = \{([^}]*)\}", src)
    if not m:
        raise AssertionError("tools/daemon_opts.c: no `struct cmdline NAME = { .o = {...} }` found")
    # a default may be a macro of a header below tools/ (ENG_RESTORE_TIMEOUT_S)
    macros = {}
    for h in glob.glob(os.path.join(SRC, "*", "*.h")):
        macros.update(re.findall(r"^#define\s+([A-Z][A-Z0-9_]*)\s+(-?\d+)\b", read(h), re.M))
    out = {}
    for k, v in re.findall(r"\.(\w+)\s*=\s*(-?\d+|[A-Z][A-Z0-9_]*)", m.group(1)):
        if v in macros:
            v = macros[v]
        if re.fullmatch(r"-?\d+", v):
            out[k] = int(v)
    return out


def usage_text():
    binary = os.environ.get("MTCFS_BIN")
    if binary:
        return subprocess.run([binary, "--help"], check=True,
                              stdout=subprocess.PIPE).stdout.decode()
    src = read(MAIN_C)
    m = re.search(r"void cmdline_usage\(.*?\n\}", src, re.S)
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(0))).replace("\\n", "\n")


def man_entries():
    """The tag lines of mtcfs(8)'s MOUNT OPTIONS section, roff removed."""
    page = read(MAN)
    m = re.search(r"^\.SH MOUNT OPTIONS\n(.*?)^\.SH ", page, re.S | re.M)
    if not m:
        raise AssertionError("mtcfs.8 has no MOUNT OPTIONS section")
    tags = re.findall(r"^\.TP\n(.*)$", m.group(1), re.M)
    out = []
    for t in tags:
        t = re.sub(r"^\.[A-Z]+ ?", "", t).replace("\\-", "-").replace('"', "")
        out.append(t.replace(" ", ""))
    return out


def word(name):
    return re.compile(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" % re.escape(name))


class OptionsTable(unittest.TestCase):
    def setUp(self):
        self.rows = table()
        self.names = [r["name"] for r in self.rows]

    def test_names_are_unique(self):
        self.assertEqual(len(self.names), len(set(self.names)), self.names)

    def test_table_is_what_main_c_parses(self):
        parsed = parsed_names()
        self.assertEqual(sorted(parsed - set(self.names)), [],
                         "tools/daemon_opts.c parses options docs/options.tsv does not list")
        self.assertEqual(sorted(set(self.names) - parsed), [],
                         "docs/options.tsv lists options tools/daemon_opts.c does not parse")

    def test_numeric_defaults_are_the_code_s(self):
        code = code_defaults()
        checked = 0
        for r in self.rows:
            if re.fullmatch(r"-?\d+", r["default"]):
                self.assertIn(r["name"], code,
                              "%s: a numeric default in the table, none in tools/daemon_opts.c" % r["name"])
                self.assertEqual(code[r["name"]], int(r["default"]),
                                 "%s: default %s in docs/options.tsv, %d in tools/daemon_opts.c"
                                 % (r["name"], r["default"], code[r["name"]]))
                checked += 1
        self.assertGreaterEqual(checked, 2)

    def test_usage_names_every_option(self):
        text = usage_text()
        for n in self.names:
            self.assertRegex(text, word(n), "mtcfs --help does not name -o %s" % n)
        for n in re.findall(r"^\s+-o\s+([a-z_]+)", text, re.M):
            self.assertIn(n, self.names, "mtcfs --help names -o %s, the table does not" % n)

    def test_man_page_documents_every_option(self):
        tags = man_entries()
        for n in self.names:
            self.assertTrue(any(word(n).search(t) for t in tags),
                            "mtcfs.8 MOUNT OPTIONS has no entry for %s" % n)
        for t in tags:
            for n in re.findall(r"(?<![A-Za-z0-9_])([a-z][a-z_]*)=", t) or [t]:
                self.assertIn(n, self.names,
                              "mtcfs.8 documents %r, which docs/options.tsv does not list" % n)

    def test_man_page_gives_the_numeric_defaults(self):
        page = read(MAN).replace("\\-", "-")
        for r in self.rows:
            if re.fullmatch(r"-?\d+", r["default"]):
                m = re.search(r"^\.TP\n\.BI? %s=.*?(?=^\.TP|^\.SH)" % re.escape(r["name"]),
                              page, re.S | re.M)
                self.assertIsNotNone(m, r["name"])
                self.assertIn("default %s" % r["default"], m.group(0).replace("\n", " "),
                              "mtcfs.8's %s entry does not say its default" % r["name"])

    def test_readme_table_is_the_table(self):
        lines = read(README).splitlines()
        want = markdown(self.rows)
        self.assertTrue(README_HEADER in lines, "README.md has no options table (%s)" % README_HEADER)
        i = lines.index(README_HEADER)
        got = []
        for line in lines[i:]:
            if not line.startswith("|"):
                break
            got.append(line)
        self.assertEqual(got, want, "README.md's options table differs from docs/options.tsv;"
                         " print it with: tests/unit/test_options_doc.py --markdown")


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        print("\n".join(markdown(table())))
        sys.exit(0)
    unittest.main()
