"""The trainer's side of tests/integration/security/test_nonroot.py, run as a
non-root uid (setpriv): what Orbax and GKE's framework: pytorch mode do on a
node, with a umask of 027 so that what it writes is its own and its group's
(the Kubernetes fsGroup's, through the set-gid mount root) and nobody
else's. Standard library only; every command prints one JSON line.

    start MNT YAML_TEXT         write replicator.yaml, wait for the markers:
                                {"step": restored step, "markers": [...]}
    save MNT JOB STEP RANK      an Orbax save (tmp dir, files, commit rename)
    save_pt MNT JOB STEP RANK   a framework: pytorch .save file
    read MNT JOB STEP RANK      Orbax's restore: rename the marker to <STEP>,
                                read every file back: {"ok": true} or the
                                first difference
    read_pt MNT JOB STEP RANK   GKE pytorch's: read the file the marker names
    try PATH...                 open and read each path, list a directory (a
                                trailing /), or create a file (a leading +):
                                {"PATH": "ok" | errno name}
"""
import errno
import hashlib
import json
import os
import re
import sys
import time


def data(job, step, rank, what, size):
    seed = hashlib.sha256(("%s/%d/%d/%s" % (job, step, rank, what)).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def step_files(job, step, rank):
    """{relative path: (bytes, mode or None for the umask's)}"""
    return {
        "state/params/0.0": (data(job, step, rank, "params", 300 * 1024 + 7), None),
        "state/secret.bin": (data(job, step, rank, "secret", 4099), 0o600),
        "_CHECKPOINT_METADATA": (b'{"step": %d, "rank": %d}' % (step, rank), 0o644),
    }


def save_name(job, step, rank):
    return "%s-s%d-n%d-w0.save" % (job, step, rank)


def write(path, content, mode):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, content)
        if mode is not None:
            os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


def wait(cond, timeout, what):
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for " + what)
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def start(mnt, text):
    yaml = os.path.join(mnt, "replicator.yaml")
    wait(lambda: not os.path.exists(yaml), 60, "replicator.yaml absent")
    with open(yaml + ".tmp", "w") as f:
        f.write(text)
    os.rename(yaml + ".tmp", yaml)
    # gone once the namespace is clean: an earlier job's markers too
    wait(lambda: not os.path.exists(yaml), 60, "replicator.yaml consumed")
    failed = os.path.join(mnt, "replicator.failed")

    def markers():
        if os.path.exists(failed):
            raise SystemExit("replicator.failed: " + open(failed).read())
        return [x for x in os.listdir(mnt) if x.endswith(".restore")] or None
    ms = wait(markers, 90, "the .restore markers")
    step = int(re.match(r".*-s(\d+)-n\d+-w\d+\.restore$", ms[0]).group(1))
    return {"step": step, "markers": sorted(ms)}


def save(mnt, job, step, rank):
    tmp = os.path.join(mnt, "%d.orbax-checkpoint-tmp-%d" % (step, rank))
    for rel, (content, mode) in step_files(job, step, rank).items():
        p = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        write(p, content, mode)
    write(os.path.join(tmp, "commit_success.txt"), b"ok\n", None)
    os.rename(tmp, os.path.join(mnt, str(step)))
    return {"ok": True}


def save_pt(mnt, job, step, rank):
    write(os.path.join(mnt, save_name(job, step, rank)), data(job, step, rank, "pt", 70000),
          0o600)
    return {"ok": True}


def marker(mnt, step):
    ms = [x for x in os.listdir(mnt) if x.endswith(".restore") and "-s%d-" % step in x]
    if not ms:
        raise SystemExit("no marker of step %d in %s" % (step, sorted(os.listdir(mnt))))
    return os.path.join(mnt, ms[0])


def read(mnt, job, step, rank):
    os.replace(marker(mnt, step), os.path.join(mnt, str(step)))
    for rel, (content, _) in step_files(job, step, rank).items():
        with open(os.path.join(mnt, str(step), rel), "rb") as f:
            got = f.read()
        if got != content:
            return {"ok": False, "differs": rel}
    return {"ok": True}


def read_pt(mnt, job, step, rank):
    with open(marker(mnt, step), "rb") as f:
        got = f.read()
    return {"ok": got == data(job, step, rank, "pt", 70000)}


def try_paths(paths):
    out = {}
    for p in paths:
        try:
            if p.startswith("+"):
                os.close(os.open(p[1:], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            elif p.endswith("/"):
                os.listdir(p)
            else:
                with open(p, "rb") as f:
                    f.read()
            out[p] = "ok"
        except OSError as e:
            out[p] = errno.errorcode.get(e.errno, str(e.errno))
    return out


def main(argv):
    os.umask(0o027)
    cmd, args = argv[1], argv[2:]
    if cmd == "start":
        r = start(args[0], args[1])
    elif cmd in ("save", "save_pt", "read", "read_pt"):
        fn = {"save": save, "save_pt": save_pt, "read": read, "read_pt": read_pt}[cmd]
        r = fn(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "try":
        r = try_paths(args)
    else:
        raise SystemExit("unknown command " + cmd)
    print(json.dumps(r))


if __name__ == "__main__":
    main(sys.argv)
