"""One node of GKE's replicator for the tests/gke harness, run with the
venv's python (tests/gke/setup-venv):

  gke_node.py loop SRC NODEDIR   what GKE's docker-entrypoint.sh does: run
                                 repl.py, and run it again when it exits
                                 (a new replicator.yaml makes it exit), up
                                 to 10 times; on SIGTERM the peer mounts
                                 under NODEDIR/repl are unmounted
  gke_node.py once SRC NODEDIR   one run of SRC/repl.py in NODEDIR

SRC is checkpoint-replicator's src/replicator. NODEDIR holds local/ (the
node's volume, what the application sees), repl/ (its peer mounts) and
prom/; the backup volume is $BACKUP_VOLUME (a plain directory: VM_TEST's
mount_gcs_bucket does nothing). PLATFORM_API=VM_TEST.

The one thing changed in GKE's code, in memory only: VM_TEST's get_my_ip()
takes the UDP source address toward `master`, which is 127.0.0.1 for every
node on one machine; here it returns $MTCFS_GKE_NODE_IP (127.0.0.1N), so
the coordinator tells the nodes apart and names distinct peers. The peer
NFS mounts go through tests/gke/shim/sudo (bind mounts).
"""
import os
import signal
import subprocess
import sys
import time


def once(src, nodedir):
    os.chdir(nodedir)
    sys.path.insert(0, src)
    import platform_api  # noqa: E402 (needs sys.path)
    import platform_api.vm_test as vm_test  # noqa: E402
    ip = os.environ["MTCFS_GKE_NODE_IP"]

    def get_my_ip():
        return ip
    # platform_api re-exports vm_test's functions (from .vm_test import *)
    vm_test.get_my_ip = platform_api.get_my_ip = get_my_ip
    import runpy
    sys.argv = [os.path.join(src, "repl.py")]
    runpy.run_path(sys.argv[0], run_name="__main__")


def kill_group(pgid):
    for sig, pause in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(pause)


def unmount_peers(nodedir):
    repl = os.path.join(nodedir, "repl")
    mine = os.path.realpath(repl) + "/"
    with open("/proc/self/mountinfo") as f:
        points = [ln.split()[4] for ln in f]
    for p in sorted((p for p in points if p.startswith(mine)), reverse=True):
        subprocess.run(["umount", "-l", p], check=False)
    for n in os.listdir(repl):
        try:
            os.rmdir(os.path.join(repl, n))
        except OSError:
            pass


def loop(src, nodedir):
    child = [None]

    def stop(signum, frame):
        if child[0] is not None:
            kill_group(child[0].pid)
        unmount_peers(nodedir)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for i in range(10):
        print("=== gke node start %d" % i, flush=True)
        child[0] = subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                     "once", src, nodedir], start_new_session=True)
        rc = child[0].wait()
        print("=== gke node exited rc=%d" % rc, flush=True)
        # the entrypoint's pkill: the coordinator and forkserver children
        kill_group(child[0].pid)
        child[0] = None
    print("=== gke node: exhausted local restarts", flush=True)
    unmount_peers(nodedir)


if __name__ == "__main__":
    mode, src, nodedir = sys.argv[1:4]
    if mode == "once":
        once(src, nodedir)
    else:
        loop(src, nodedir)
