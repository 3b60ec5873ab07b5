"""A fake source tree in a temporary directory, for the unit tests of the
tree checkers (tools/check-layers, tools/check-functions): a TestCase whose
self.root is a fresh directory per test, removed after it, and put() writes
a file under it (folders made as needed)."""
import os
import tempfile
import unittest


class FakeTreeCase(unittest.TestCase):
    PREFIX = "fake-tree-"

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix=self.PREFIX)
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def put(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
