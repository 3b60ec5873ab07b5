"""Orbax's own MTC backup converter on a bucket mtcfs wrote (venv python).

orbax.checkpoint.experimental.emergency.multi_tier_checkpointing.
mtc_checkpoint_converter turns a backup (.meta files naming <hash>.data
directories, one per node) into a standard Orbax checkpoint. It is in
Orbax's source tree but in no released orbax-checkpoint yet (0.12.8, the
pin, lacks it): without it this script exits 77 and the test skips.

--check: print nothing, exit 0 if the converter imports, 77 if not.
Otherwise: convert --input-dir (a job's directory in a file:// bucket)
into --output-dir, open the result with a standard CheckpointManager and
restore each converted step's `state` as numpy arrays (one process, no
sharding), and compare every leaf's bytes with ckpt_data's global array
of that step. JSON report in --out; exit 0 if every leaf is equal.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_data  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", "cpu")

CONVERTER = ("orbax.checkpoint.experimental.emergency.multi_tier_checkpointing."
             "mtc_checkpoint_converter")


def flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + k + "/"))
        else:
            out[prefix + k] = v
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--input-dir")
    ap.add_argument("--output-dir")
    ap.add_argument("--out")
    a = ap.parse_args()
    import importlib
    try:
        conv = importlib.import_module(CONVERTER)
    except ImportError as e:
        print("no converter: %s" % e, file=sys.stderr)
        sys.exit(77)
    if a.check:
        sys.exit(0)

    import jax
    import ml_dtypes
    import numpy as np
    import orbax.checkpoint as ocp

    paths = conv.convert_mtc_backup(input_dir=a.input_dir, output_dir=a.output_dir)
    report = {"converted": sorted(os.path.basename(str(p)) for p in paths)}
    mngr = ocp.CheckpointManager(a.output_dir, item_names=("state",))
    report["manager_steps"] = sorted(mngr.all_steps())
    ok = True
    report["leaves"] = {}
    for step in report["manager_steps"]:
        d = os.path.join(a.output_dir, str(step), "state")
        ckptr = ocp.PyTreeCheckpointer()
        meta = ckptr.metadata(d)
        tree = getattr(getattr(meta, "item_metadata", None), "tree", None) or meta
        restore_args = jax.tree.map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        flat = flatten(ckptr.restore(d, restore_args=restore_args))
        got = {}
        for name in ckpt_data.ORBAX_TREE:
            arr = flat.get(name)
            if arr is None:
                got[name] = "missing"
                ok = False
                continue
            if arr.dtype == ml_dtypes.bfloat16:
                arr = arr.view(np.uint16)
            eq = arr.tobytes() == ckpt_data.orbax_leaf(name, step)
            got[name] = "equal" if eq else "different"
            ok = ok and eq
        report["leaves"][str(step)] = got
    mngr.close()
    report["equal"] = ok
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
