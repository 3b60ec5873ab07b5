#!/usr/bin/python3
"""Unit tests for tools/check-layers: fake trees with one problem each must
fail with the exact line naming it; clean ones (including the forms a real
tree uses) must pass; the same for programs' link lines (--build, a fake
layer-links.tsv). ctest: unit.check_layers (the real tree and build are
check.layers)."""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_tree import FakeTreeCase  # noqa: E402

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(TOP, "tools", "check-layers")
ORDER = "common <- net <- tiers <- cluster <- fs <- tools"


class CheckLayers(FakeTreeCase):
    PREFIX = "check-layers-"

    def setUp(self):
        super().setUp()
        # a clean base: each layer includes the one below it
        self.put("common/log.h", "#pragma once\n")
        self.put("common/log.c", '#include "common/log.h"\n')
        self.put("net/frame.h", '#include "common/log.h"\n')
        self.put("net/frame.c", '#include "net/frame.h"\n#include <stdio.h>\n')
        self.put("tiers/manifest.h", '#include "net/frame.h"\n')
        self.put("cluster/lkg.c", '#include "tiers/manifest.h"\n')
        self.put("fs/fs_i.h", "#pragma once\n")
        self.put("fs/main.c", '#include "fs/fs_i.h"\n#include "common/log.h"\n')
        self.put("tools/main.c", '#include "fs/fs_i.h"\n')
        self.put("tests/unit/test_x.c", '#include "tools/../fs/fs_i.h"\n#include "net/frame.h"\n')

    def run_tool(self):
        p = subprocess.run([sys.executable, TOOL, self.root], capture_output=True,
                           text=True, timeout=60)
        return p.returncode, p.stdout.splitlines()

    def assert_fails_with(self, *lines):
        rc, out = self.run_tool()
        self.assertEqual(rc, 1, out)
        self.assertEqual(out[:-1], list(lines))
        self.assertRegex(out[-1], r"^check-layers: %d problem\(s\) in \d+ files$" % len(lines))

    def test_clean_tree_passes(self):
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)
        self.assertEqual(out, ["check-layers: 10 files, no include against " + ORDER +
                               ", no import of tests/ in tools/"])

    def test_include_of_a_layer_above_fails(self):
        self.put("net/client.c", '#include "net/frame.h"\n\n  #  include "tiers/manifest.h"\n')
        self.assert_fails_with(
            'net/client.c:3: layer net includes "tiers/manifest.h" from tiers/, a layer '
            'above it (order: %s)' % ORDER,
            "cycle between folders: net -> tiers (net/client.c:3), "
            "tiers -> net (tiers/manifest.h:1)")

    def test_upward_include_through_dotdot_fails(self):
        # a path relative to the includer's folder counts where it lands
        self.put("common/util.c", '#include "../fs/fs_i.h"\n')
        rc, out = self.run_tool()
        self.assertEqual(rc, 1, out)
        self.assertIn('common/util.c:1: layer common includes "../fs/fs_i.h" from fs/, '
                      'a layer above it (order: %s)' % ORDER, out)

    def test_same_folder_include_without_folder_passes(self):
        self.put("tiers/bucket.c", '#include "manifest.h"\n')
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)

    def test_layer_including_outside_the_layers_fails(self):
        self.put("tests/srv.h", "#pragma once\n")
        self.put("tiers/bucket.c", '#include "tests/srv.h"\n')
        self.assert_fails_with(
            'tiers/bucket.c:1: layer tiers includes "tests/srv.h" from tests/, which is '
            'outside the layers')

    def test_cycle_between_folders_outside_the_layers_fails(self):
        self.put("csi/node.h", '#include "fs/fs_i.h"\n')
        self.put("csi/node.c", '#include "csi/node.h"\n#include "tests/fake.h"\n')
        self.put("tests/fake.h", '#include "csi/node.h"\n')
        self.assert_fails_with(
            "cycle between folders: csi -> tests (csi/node.c:2), "
            "tests -> csi (tests/fake.h:1)")

    def test_include_of_a_missing_file_fails(self):
        self.put("fs/ctl.c", '#include "fs/nothere.h"\n')
        self.assert_fails_with('fs/ctl.c:1: #include "fs/nothere.h" names no file of the tree')

    def test_generated_protobuf_header_stands_for_its_proto(self):
        # csi/ includes csi/csi.pb-c.h, which protoc-c writes into the build
        # tree: it resolves to csi/csi.proto; without the .proto it is missing
        self.put("csi/main.c", '#include "csi/api.pb-c.h"\n#include "common/log.h"\n')
        self.assert_fails_with('csi/main.c:1: #include "csi/api.pb-c.h" names no file of the tree')
        self.put("csi/api.proto", 'syntax = "proto3";\n')
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)

    def test_build_and_hidden_folders_are_skipped(self):
        self.put("build-asan/gen/x.c", '#include "tools/nothere.h"\n')
        self.put(".git/x.c", '#include "tools/nothere.h"\n')
        self.put("out/CMakeCache.txt", "")
        self.put("out/sub/y.c", '#include "tools/nothere.h"\n')
        self.put("venv/pyvenv.cfg", "")
        self.put("venv/lib/np/z.h", '#include "numpy/nothere.h"\n')
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)

    # tools/'s Python files import nothing of tests/

    def test_tools_importing_a_tests_module_fails(self):
        # the demo on main: tests/integration on sys.path, then its modules
        self.put("tests/integration/harness.py", "")
        self.put("tests/integration/cluster.py", "import harness\n")
        self.put("tools/demo.py", "import os\nimport sys\n\n\ndef main():\n"
                 "    sys.path.insert(0, 'tests/integration')\n"
                 "    import harness as h\n    from cluster import Cluster\n")
        self.assert_fails_with(
            'tools/demo.py:7: imports "harness", which is tests/integration/harness.py: '
            'tools/ does not import from tests/',
            'tools/demo.py:8: imports "cluster", which is tests/integration/cluster.py: '
            'tools/ does not import from tests/')

    def test_tools_script_importing_the_tests_package_fails(self):
        # a script without .py whose #! names python is read too
        self.put("tools/run-it", "#!/usr/bin/env python3\nfrom tests.gke import scenarios\n")
        self.put("tools/bash-it", "#!/bin/bash\nimport harness\n")       # not Python
        self.assert_fails_with(
            'tools/run-it:2: imports "tests.gke", which is tests/: tools/ does not import '
            'from tests/')

    def test_tools_importing_tools_and_stdlib_passes(self):
        # tools/ has its own cluster module; json is the standard library's
        self.put("tests/integration/cluster.py", "")
        self.put("tests/unit/json.py", "")
        self.put("tools/cluster.py", "import json\n")
        self.put("tools/demo.py", "import cluster\nimport json\nfrom . import x\n")
        rc, out = self.run_tool()
        self.assertEqual(rc, 0, out)
        self.assertEqual(out, ["check-layers: 12 files, no include against " + ORDER +
                               ", no import of tests/ in tools/"])

    # --build: the programs' link lines (BUILD/layer-links.tsv, as
    # CMakeLists.txt's mtcfs_write_link_graph writes it)

    def put_links(self, programs, extra=()):
        """A build tree "build" (skipped as a tree folder) whose graph has the
        layer libraries chained like CMakeLists.txt, mtcfs_core over them,
        and programs: [(name, folder, [sources], [link items])]."""
        rows = []
        below = ""
        for layer in ("common", "net", "tiers", "cluster", "fs"):
            deps = ";".join(x for x in (below, "PkgConfig::X") if x)
            rows.append(("STATIC_LIBRARY", "mtcfs_" + layer, self.root,
                         os.path.join(self.root, layer, "a.c"), deps, deps))
            below = "mtcfs_" + layer
        rows.append(("INTERFACE_LIBRARY", "mtcfs_core", self.root, "", "", "mtcfs_fs"))
        rows += list(extra)
        for name, folder, srcs, link in programs:
            rows.append(("EXECUTABLE", name, os.path.join(self.root, folder),
                         ";".join(os.path.join(self.root, x) for x in srcs),
                         ";".join(link), ""))
        self.put("build/layer-links.tsv", "".join("\t".join(r) + "\n" for r in rows))

    def run_build(self):
        p = subprocess.run([sys.executable, TOOL, "--build", os.path.join(self.root, "build"),
                            self.root], capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout.splitlines()

    def test_programs_linking_the_layers_they_use_pass(self):
        self.put("csi/node.h", '#include "net/frame.h"\n')       # through csi/'s header
        self.put("csi/main.c", '#include "csi/node.h"\n')
        self.put("tests/bench/b.c", "#include <stdio.h>\n")
        self.put_links([
            ("mtcfs", ".", ["tools/main.c"], ["mtcfs_fs"]),
            ("test_x", ".", ["tests/unit/test_x.c"], ["mtcfs_fs", "PkgConfig::CMOCKA"]),
            ("mtcfs-csi", "csi", ["csi/main.c", "build/csi/gen/api.pb-c.c"],
             ["mtcfs_net", "PkgConfig::GRPC"]),
            ("bench", ".", ["tests/bench/b.c"], ["Threads::Threads"])])
        rc, out = self.run_build()
        self.assertEqual(rc, 0, out)
        self.assertEqual(out, ["check-layers: 13 files, no include against %s, no import of "
                               "tests/ in tools/; 4 programs, none links a layer above what it "
                               "includes" % ORDER])

    def test_program_linking_above_its_includes_fails(self):
        # mtcfs-csi on main: csi/ includes common/ only and linked mtcfs_core
        self.put("csi/main.c", '#include "csi/node.h"\n#include "common/log.h"\n')
        self.put("csi/node.h", "#pragma once\n")
        self.put_links([("mtcfs-csi", "csi", ["csi/main.c"], ["mtcfs_core", "PkgConfig::GRPC"]),
                        ("mtcfs", ".", ["tools/main.c"], ["mtcfs_fs"])])
        rc, out = self.run_build()
        self.assertEqual(rc, 1, out)
        self.assertEqual(out, [
            "csi/CMakeLists.txt: program mtcfs-csi links mtcfs_fs (through mtcfs_core), a layer "
            "above what it uses; the highest layer its sources include is common: link "
            "mtcfs_common (mtcfs_top_layer)",
            "check-layers: 1 problem(s) in 12 files"])

    def test_layer_reached_through_another_library_fails(self):
        # a helper library that passes mtcfs_tiers on (a static library's
        # private link shows as $<LINK_ONLY:...> in its interface)
        self.put("tests/bench/b.c", '#include "net/frame.h"\n')
        helper = ("STATIC_LIBRARY", "helper", self.root, os.path.join(self.root, "tests/h.c"),
                  "mtcfs_tiers", "$<LINK_ONLY:mtcfs_tiers>")
        self.put_links([("bench", ".", ["tests/bench/b.c"], ["helper"])], extra=[helper])
        rc, out = self.run_build()
        self.assertEqual(rc, 1, out)
        self.assertEqual(out[0], "CMakeLists.txt: program bench links mtcfs_tiers (through "
                         "helper), a layer above what it uses; the highest layer its sources "
                         "include is net: link mtcfs_net (mtcfs_top_layer)")

    def test_program_of_no_layer_linking_one_fails(self):
        self.put("tests/bench/b.c", "#include <stdio.h>\n")
        self.put_links([("bench", ".", ["tests/bench/b.c"], ["mtcfs_common"])])
        rc, out = self.run_build()
        self.assertEqual(rc, 1, out)
        self.assertEqual(out[0], "CMakeLists.txt: program bench links mtcfs_common, a layer "
                         "above what it uses; its sources include no layer: link none "
                         "(mtcfs_top_layer)")

    def test_build_without_link_graph_is_an_error(self):
        os.makedirs(os.path.join(self.root, "build"))
        p = subprocess.run([sys.executable, TOOL, "--build", os.path.join(self.root, "build"),
                            self.root], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("layer-links.tsv: no such file", p.stderr)

    def test_bad_arguments(self):
        p = subprocess.run([sys.executable, TOOL, os.path.join(self.root, "none")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("not a directory", p.stderr)


if __name__ == "__main__":
    unittest.main()
