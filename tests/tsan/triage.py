#!/usr/bin/python3
"""Sorts ThreadSanitizer reports of mtcfs daemons (files written through
TSAN_OPTIONS=log_path) into the ones TSan cannot judge and the rest.

TSan cannot see the ordering the kernel gives FUSE requests: the reply to
LOOKUP/CREATE/MKDIR/OPEN/OPENDIR goes out on one libfuse worker thread, and
every later request on that inode or handle may arrive on another one; with
splice the request is read through a pipe TSan has no edge for. So it
reports, e.g., "ll_getattr reads what node_get's calloc wrote" or
"ll_releasedir frees what ll_readdir read". A report is filed as
kernel-ordered only when both accesses are in FUSE request handlers and
  - the earlier access is the allocation of the object (calloc/malloc in
    node_get, new_handle, ll_opendir), or a write that fills in the object
    right after its allocation (in the creator, on the thread that
    allocated it, the report's "Location is heap block ... allocated by"
    naming the same creator and thread): later requests on it come after
    the reply that handed it out; or
  - the later access frees/closes the handle in RELEASE/RELEASEDIR: the
    kernel sends it after every request on the handle has been answered; or
  - the later access frees the node in FORGET: sent once no request on the
    inode is in flight; or
  - both are READDIR on the same directory stream (serialized per open file).
Everything else - any access outside a FUSE handler (engine, replication,
control, seal, coordinator, main threads), or two handlers the kernel does
not order (e.g. RENAME vs RELEASE) - is a finding.

Usage: triage.py REPORT_FILE... ; exit 1 when there is a finding.
"""

import collections
import os
import re
import sys

CREATORS = {"node_get", "new_handle", "ll_opendir"}
ALLOC = {"calloc", "malloc", "realloc", "strdup", "opendir", "fdopendir"}
RELEASERS = {"ll_release", "ll_releasedir"}
FREEING = {"free", "close", "closedir", "pthread_mutex_destroy"}   # the end of an object


def frames(section):
    """[(function, file:line or module)] of one access, top first."""
    out = []
    for m in re.finditer(r"^\s+#\d+ (\S+) (\S+)", section, re.M):
        out.append((m.group(1), m.group(2)))
    return out


def handler(fr):
    """The FUSE request handler (ll_* in fs/fs_ll*.c) an access ran in."""
    for fn, loc in fr:
        if fn.startswith("ll_") and "fs/fs_ll" in loc:
            return fn
    return None


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ours(fr):
    """The frames in mtcfs' own sources (not libc, libfuse, the runtime)."""
    return [(fn, loc) for fn, loc in fr if loc.startswith(REPO + "/")]


def kernel_ordered(kind, a, b, init=False):
    """a: the reported (later) access, b: the previous one; init: b is a
    write by the thread that allocated the object, in the same creator
    (see parse)."""
    if kind != "data race" or not a:
        return False
    ha = handler(a)
    if ha is None:
        return False
    top_a = a[0][0]
    top_b = b[0][0] if b else None
    hb = handler(b) if b else None
    names_b = {fn for fn, _ in b}
    # b is the allocation of the object, inside a FUSE handler that creates it
    if top_b in ALLOC and names_b & CREATORS and hb is not None:
        return True
    # b fills in the object its creator has just allocated (before the reply)
    if init and top_b in CREATORS and hb is not None:
        return True
    # a frees/closes the handle in RELEASE(DIR); b used it in a request on it
    # (or inside libc/libfuse on its behalf: readdir buffers, the write path)
    if ha in RELEASERS and top_a in FREEING and (hb is not None or not ours(b)):
        return True
    # FORGET frees the node: the kernel sends it once no request on the
    # inode is in flight any more (an async RELEASE holds an inode reference)
    if top_a in FREEING and {fn for fn, _ in a} & {"ll_forget", "ll_forget_multi"} and \
            (hb is not None or not ours(b)):
        return True
    # READDIR after READDIR (or RELEASEDIR after it) on one stream; the
    # earlier access may be glibc's readdir filling its buffer
    if ha in ("ll_readdir", "ll_releasedir", "ll_fsyncdir") and \
            (hb in ("ll_readdir", "ll_fsyncdir") or (b is not None and not ours(b))):
        return True
    return False


def parse(path):
    try:
        txt = open(path, errors="replace").read()
    except OSError:
        return
    for m in re.finditer(r"WARNING: ThreadSanitizer: (.*?) \(pid=\d+\)\n(.*?)\n"
                         r"SUMMARY: ThreadSanitizer: ([^\n]*)", txt, re.S):
        kind, body, summary = m.group(1), m.group(2), m.group(3)
        secs = [s for s in body.split("\n\n") if s.strip()]
        a = frames(secs[0]) if secs else []
        b = frames(secs[1]) if len(secs) > 1 and "Previous" in secs[1] else None
        yield kind, a, b, summary, m.group(0), init_write(secs, b)


def init_write(secs, b):
    """True when the previous access b ran in a creator (node_get,
    new_handle) on the thread that allocated the object there: the write
    that fills in a new node or handle before the reply hands it out."""
    if not b or len(secs) < 2 or b[0][0] not in CREATORS:
        return False
    wt = re.search(r"by thread (T\d+)", secs[1])
    for sec in secs[2:]:
        if sec.lstrip().startswith("Location is heap block"):
            at = re.search(r"allocated by thread (T\d+)", sec)
            names = {fn for fn, _ in frames(sec)}
            return bool(wt and at and wt.group(1) == at.group(1) and b[0][0] in names)
    return False


def key(fr):
    o = ours(fr or [])
    if not o:
        return (fr[0][0] if fr else "?")
    return "%s (%s)" % (o[0][0], re.sub(r":\d+$", "", o[0][1][len(REPO) + 1:]))


def main(paths):
    noise = collections.Counter()
    found = collections.OrderedDict()
    for p in paths:
        for kind, a, b, summary, text, init in parse(p):
            k = (kind, key(a), key(b))
            if kernel_ordered(kind, a, b, init):
                noise[k] += 1
            else:
                found.setdefault(k, [0, text, p])[0] += 1
    print("tsan: %d kernel-ordered FUSE report(s) set aside (%d kinds)"
          % (sum(noise.values()), len(noise)))
    for (kind, ka, kb), n in noise.most_common():
        print("   %4d  %s: %s  after  %s" % (n, kind, ka, kb))
    if not found:
        print("tsan: no other reports")
        return 0
    print("tsan: %d finding(s):" % len(found))
    for (kind, ka, kb), (n, text, p) in found.items():
        print("\n=== %d x %s: %s  vs  %s  (first in %s)" % (n, kind, ka, kb, p))
        print(text)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
