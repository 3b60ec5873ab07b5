#!/usr/bin/python3
"""tests/tsan/triage.py: which ThreadSanitizer reports are set aside as
ordered by the kernel's FUSE request sequence, and which are findings.

Synthetic reports in TSan's own layout (the frames' file names are made
under the tree's top, as in a real build)."""

import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "tests", "tsan"))
import triage  # noqa: E402


def report(read_fn, write_fns, writer="T5", allocator="T5", alloc_fns=None):
    f = TOP + "/fs/fs_ll.c"
    fd = TOP + "/fs/fs_ll_dir.c"
    wr = "\n".join("    #%d %s %s:%d (mtcfs+0x1)" % (i, fn, f, 300 + i)
                   for i, fn in enumerate(write_fns))
    al = "\n".join("    #%d %s %s:%d (mtcfs+0x1)" % (i + 1, fn, f, 340 + i)
                   for i, fn in enumerate(alloc_fns or write_fns))
    return ("WARNING: ThreadSanitizer: data race (pid=1)\n"
            "  Read of size 1 at 0x7b28 by thread T9:\n"
            "    #0 %s %s:175 (mtcfs+0x1)\n"
            "    #1 ll_opendir %s:378 (mtcfs+0x1)\n"
            "\n"
            "  Previous write of size 1 at 0x7b28 by thread %s (mutexes: write M2):\n"
            "%s\n"
            "\n"
            "  Location is heap block of size 160 at 0x7b28 allocated by thread %s:\n"
            "    #0 calloc tsan_interceptors_posix.cpp:667 (libtsan.so.2+0x1)\n"
            "%s\n"
            "\n"
            "SUMMARY: ThreadSanitizer: data race %s:175 in %s\n"
            % (read_fn, f, fd, writer, wr, allocator, al, f, read_fn))


class Triage(unittest.TestCase):
    def findings(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".tsan", delete=False) as t:
            t.write(text)
        try:
            devnull = open(os.devnull, "w")
            old, sys.stdout = sys.stdout, devnull
            try:
                return triage.main([t.name])
            finally:
                sys.stdout = old
                devnull.close()
        finally:
            os.unlink(t.name)

    def test_creator_filling_in_its_new_node_is_kernel_ordered(self):
        # node_get writes a field of the node it has just allocated, in
        # LOOKUP; OPENDIR on that inode reads it later (after the reply)
        self.assertEqual(self.findings(report(
            "fs_immutable", ["node_get", "fs_do_lookup", "ll_lookup"])), 0)

    def test_write_by_another_thread_than_the_allocator_is_a_finding(self):
        self.assertEqual(self.findings(report(
            "fs_immutable", ["node_get", "fs_do_lookup", "ll_lookup"],
            writer="T5", allocator="T7")), 1)

    def test_write_outside_the_creator_is_a_finding(self):
        # the same node written later by another handler: not ordered
        self.assertEqual(self.findings(report(
            "fs_immutable", ["fs_commit_rename", "ll_rename"],
            alloc_fns=["node_get", "fs_do_lookup", "ll_lookup"])), 1)


if __name__ == "__main__":
    unittest.main()
