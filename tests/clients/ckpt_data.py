"""Deterministic checkpoint contents, shared by the client scripts (venv
python, numpy/torch/jax) and the integration tests (/usr/bin/python3):
standard library only.

Every array is raw little-endian bytes derived from (tag, step) with
SHAKE-256, so the test can regenerate exactly what a client must have
restored and compare bytes, without numpy. Floating-point patterns are
forced finite and normal (no NaN, Inf or denormal), so no framework may
legally canonicalise or flush them on the way through.
"""
import array
import hashlib
import sys

assert sys.byteorder == "little"

DTYPE_SIZE = {"float32": 4, "int32": 4, "int64": 8, "bfloat16": 2}


def raw(tag, step, nbytes):
    return hashlib.shake_256(("%s/%d" % (tag, step)).encode()).digest(nbytes)


def gen(tag, step, count, dtype):
    """count elements of dtype as bytes."""
    b = raw(tag, step, count * DTYPE_SIZE[dtype])
    if dtype == "float32":
        a = array.array("I", b)
        for i in range(len(a)):
            # sign 0, exponent in 1..127: finite, normal, |x| < 2
            a[i] = (a[i] & 0x3FFFFFFF) | 0x00800000
        return a.tobytes()
    if dtype == "bfloat16":
        a = array.array("H", b)
        for i in range(len(a)):
            a[i] = (a[i] & 0x3FFF) | 0x0080
        return a.tobytes()
    return b


def rows(data, ncols, dtype, r0, r1):
    """Rows [r0, r1) of a row-major 2-D array given as bytes."""
    w = ncols * DTYPE_SIZE[dtype]
    return data[r0 * w:r1 * w]


# -- the JAX/Orbax job: a pytree, some leaves sharded over the processes --
# name: (shape, dtype, sharded along axis 0 over the processes?)
ORBAX_TREE = {
    "params/dense/kernel": ((64, 2048), "float32", True),
    "params/dense/bias": ((2048,), "float32", False),
    "params/embed": ((16, 512), "bfloat16", True),
    "opt_state/count": ((8,), "int32", True),
}


def orbax_leaf(name, step):
    shape, dtype, _ = ORBAX_TREE[name]
    n = 1
    for d in shape:
        n *= d
    return gen("orbax/" + name, step, n, dtype)


def orbax_local(name, step, process, nprocs, replicated=False):
    """The bytes process `process` holds of leaf `name` at `step`."""
    shape, dtype, sharded = ORBAX_TREE[name]
    data = orbax_leaf(name, step)
    if not sharded or replicated:
        return data
    per = shape[0] // nprocs
    ncols = 1
    for d in shape[1:]:
        ncols *= d
    return rows(data, ncols, dtype, process * per, (process + 1) * per)


# -- the PyTorch job: each rank's own shard of the model and optimizer --
TORCH_TENSORS = {
    "model.layer0.weight": ((256, 1024), "float32"),
    "model.layer0.bias": ((1024,), "bfloat16"),
    "optimizer.exp_avg": ((128, 512), "float32"),
    "optimizer.step_count": ((4,), "int64"),
}


def torch_tensor(name, step, rank):
    shape, dtype = TORCH_TENSORS[name]
    n = 1
    for d in shape:
        n *= d
    return gen("torch/%s/rank%d" % (name, rank), step, n, dtype)
