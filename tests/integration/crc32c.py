"""CRC32C (Castagnoli) in pure Python, standard library only.

The checksum mtcfs records per file in a shard manifest: reflected polynomial
0x82F63B78, initial value and final xor 0xFFFFFFFF (the same function as
iSCSI / ext4 / Cloud Storage's crc32c).

Two ways to compute it, which the self-test checks against each other:
- slice-by-8 over 8-byte words (a few MB/s): small inputs and tails;
- "lanes" for large inputs (~100 MB/s): the buffer is cut into K equal
  segments that are run through the byte-wise CRC recurrence side by side,
  one byte column at a time, with bytes.translate() doing the table look-ups
  for all K lanes at C speed; the K partial CRCs are then joined with the
  CRC shift operator (the idea of zlib's crc32_combine).

Use crc32c(data[, crc]) (chainable: crc32c(b, crc32c(a)) == crc32c(a + b)),
crc32c_hex(data) for the manifest's 8-lowercase-hex form, crc32c_combine()
to join CRCs of adjacent pieces without rereading them.
Run this file to self-test.
"""

import struct

POLY = 0x82F63B78
_MASK = 0xFFFFFFFF


def _make_tables():
    t0 = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ POLY if c & 1 else c >> 1
        t0.append(c)
    tables = [t0]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(prev[n] >> 8) ^ t0[prev[n] & 0xFF] for n in range(256)])
    return tables


_T = _make_tables()
_T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7 = (tuple(t) for t in _T)


def _raw_bytewise(state, data):
    """Raw recurrence (no pre/post inversion), one byte at a time."""
    t0 = _T0
    for b in data:
        state = t0[(state ^ b) & 0xFF] ^ (state >> 8)
    return state


def _raw_slice8(state, data):
    """Raw recurrence, slice-by-8 over little-endian 64-bit words."""
    n8 = len(data) & ~7
    if n8:
        t0, t1, t2, t3, t4, t5, t6, t7 = _T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7
        for (w,) in struct.iter_unpack("<Q", memoryview(data)[:n8]):
            lo = (w & 0xFFFFFFFF) ^ state
            hi = w >> 32
            state = (t7[lo & 0xFF] ^ t6[(lo >> 8) & 0xFF] ^
                     t5[(lo >> 16) & 0xFF] ^ t4[lo >> 24] ^
                     t3[hi & 0xFF] ^ t2[(hi >> 8) & 0xFF] ^
                     t1[(hi >> 16) & 0xFF] ^ t0[hi >> 24])
    if n8 != len(data):
        state = _raw_bytewise(state, bytes(memoryview(data)[n8:]))
    return state


# --- the shift operator: state -> state after n more zero bytes ----------

def _multmodp(a, b):
    """a * b mod P in the reflected representation (zlib's multmodp)."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1
    return p


_X2N = [1 << 30]                       # x^(2^k) mod P, k = 0..31
for _k in range(1, 32):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def _x8nmodp(n):
    """x^(8n) mod P: the multiplier that appends n zero bytes."""
    p = 1 << 31                        # x^0
    k = 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def _shift_tables(nbytes):
    """Four 256-entry tables: shift(s) = T0[s&255]^T1[s>>8&255]^...."""
    c = _x8nmodp(nbytes)
    return tuple(tuple(_multmodp(c, b << (8 * i)) for b in range(256))
                 for i in range(4))


def crc32c_combine(crc1, crc2, len2):
    """CRC32C of A+B from crc1 = crc32c(A), crc2 = crc32c(B), len2 = len(B)."""
    return _multmodp(_x8nmodp(len2), crc1) ^ crc2


# --- lanes ---------------------------------------------------------------

def _byte_tables():
    """T0 split by output byte, as bytes.translate tables."""
    return tuple(bytes((_T0[n] >> (8 * i)) & 0xFF for n in range(256))
                 for i in range(4))


_TB = _byte_tables()
_LANES_MIN = 1 << 20                    # below this, slice-by-8 is as good


def _raw_lanes(state, data):
    n = len(data)
    lanes = 1 << 16 if n >= (64 << 20) else 1 << 12
    seg = n // lanes
    main = lanes * seg
    mv = memoryview(data)
    tb0, tb1, tb2, tb3 = _TB
    frm = int.from_bytes
    c0 = c1 = c2 = c3 = 0             # byte i of every lane's state
    for i in range(seg):
        col = frm(mv[i:main:seg], "little")
        idx = (c0 ^ col).to_bytes(lanes, "little")
        c0 = frm(idx.translate(tb0), "little") ^ c1
        c1 = frm(idx.translate(tb1), "little") ^ c2
        c2 = frm(idx.translate(tb2), "little") ^ c3
        c3 = frm(idx.translate(tb3), "little")
    b0 = c0.to_bytes(lanes, "little")
    b1 = c1.to_bytes(lanes, "little")
    b2 = c2.to_bytes(lanes, "little")
    b3 = c3.to_bytes(lanes, "little")
    s0, s1, s2, s3 = _shift_tables(seg)
    for j in range(lanes):             # Horner: state = shift(state) ^ lane
        state = (s0[state & 0xFF] ^ s1[(state >> 8) & 0xFF] ^
                 s2[(state >> 16) & 0xFF] ^ s3[state >> 24] ^
                 b0[j] ^ (b1[j] << 8) ^ (b2[j] << 16) ^ (b3[j] << 24))
    if main != n:
        state = _raw_slice8(state, mv[main:])
    return state


def crc32c(data, crc=0):
    """CRC32C of data (bytes-like); pass crc to continue a previous value."""
    if not isinstance(data, (bytes, bytearray)):
        data = memoryview(data).cast("B")
    state = (crc ^ _MASK) & _MASK
    if len(data) >= _LANES_MIN:
        state = _raw_lanes(state, data)
    else:
        state = _raw_slice8(state, data)
    return state ^ _MASK


def crc32c_slow(data, crc=0):
    """Reference: plain byte-at-a-time table CRC (for the self-test)."""
    return _raw_bytewise((crc ^ _MASK) & _MASK, bytes(data)) ^ _MASK


def crc32c_hex(data):
    """The manifest's form: 8 lowercase hex digits."""
    return "%08x" % crc32c(data)


def crc32c_file(path, chunk=64 << 20):
    crc = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                return crc
            crc = crc32c(b, crc)


# Published check values: the CRC catalogue's check ("123456789") and the
# RFC 3720 (iSCSI) B.4 vectors.
CHECK_VECTORS = [
    (b"123456789", 0xE3069283),
    (b"", 0x00000000),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
]


def selftest(verbose=False):
    """Raise AssertionError unless every implementation agrees."""
    import os
    import time
    for data, want in CHECK_VECTORS:
        for fn in (crc32c, crc32c_slow):
            got = fn(data)
            assert got == want, "%s(%r) = %08x, want %08x" % (
                fn.__name__, data[:12], got, want)
    rnd = os.urandom(3 << 20)
    for n in (1, 7, 8, 9, 63, 4095, 65536 + 3):
        assert crc32c(rnd[:n]) == crc32c_slow(rnd[:n]), n
    small = rnd[:200000]
    want = crc32c_slow(small)
    assert crc32c(small[:1234], 0) is not None
    assert crc32c(small[1234:], crc32c(small[:1234])) == want
    assert crc32c_combine(crc32c(small[:777]), crc32c(small[777:]),
                          len(small) - 777) == want
    # lanes vs slice-by-8 on sizes around the lane boundaries
    for n in (_LANES_MIN, _LANES_MIN + 1, (3 << 20) - 5, 3 << 20):
        assert _raw_lanes(0x12345678, rnd[:n]) == _raw_slice8(0x12345678,
                                                              rnd[:n]), n
    big = rnd * 24                     # 72 MiB: the 65536-lane path
    t = time.perf_counter()
    c = crc32c(big)
    dt = time.perf_counter() - t
    assert c == crc32c_combine(crc32c(big[:5 << 20]), crc32c(big[5 << 20:]),
                               len(big) - (5 << 20))
    assert crc32c(big[:3 << 20]) == crc32c_slow(rnd)
    if verbose:
        print("crc32c: %.0f MB/s on %d MiB" % (len(big) / dt / 1e6,
                                               len(big) >> 20))


if __name__ == "__main__":
    selftest(verbose=True)
    print("crc32c self-test: 1 passed, 0 failed")
