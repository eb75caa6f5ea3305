"""Numba CPU versions of the Count-Sketch kernels (equal to ``sketch_ref`` bit for bit).

Encode: the fixed-point values once (parallel over elements), then one row per parallel
iteration adding them into int64 sums (integer sums: any order gives the reference's).
Decode is independent per element (parallel over blocks of elements).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ringcomp.kernels.rng_numba import mix
from ringcomp.kernels.sketch_ref import fixed_point_shift

_BLOCK = 4096


@numba.njit(inline="always")
def _hash(key, g, cols):
    z = mix(key, np.uint64(g))
    col = ((z >> np.uint64(32)) * np.uint64(cols)) >> np.uint64(32)
    # branch-free sign: the low bit is random, a branch on it mispredicts half the time
    return np.int64(col), np.float64(np.int64(z & np.uint64(1)) * 2 - 1)


@numba.njit(parallel=True, cache=True, nogil=True)
def _encode(x, keys, cols, offset, shift, out):
    q = np.empty(x.size, np.int64)
    for i in prange(x.size):  # trunc toward zero, as the reference's np.trunc
        q[i] = np.int64(np.ldexp(np.float64(x[i]), shift))
    for j in prange(keys.size):
        acc = np.zeros(cols, np.int64)
        for i in range(x.size):
            col, sign = _hash(keys[j], offset + i, cols)
            acc[col] += q[i] if sign > 0 else -q[i]
        for c in range(cols):
            out[j, c] = np.float32(np.ldexp(np.float64(acc[c]), -shift))


@numba.njit(parallel=True, cache=True, nogil=True)
def _decode(table, keys, n, offset, out):
    rows, cols = table.shape
    mid = rows // 2
    for block in prange((n + _BLOCK - 1) // _BLOCK):
        est = np.empty(rows)
        for i in range(block * _BLOCK, min(n, (block + 1) * _BLOCK)):
            for j in range(rows):
                col, sign = _hash(keys[j], offset + i, cols)
                est[j] = sign * np.float64(table[j, col])
            # odd-even transposition sort: min/max without data-dependent branches
            for step in range(rows):
                for k in range(step % 2, rows - 1, 2):
                    a, b = est[k], est[k + 1]
                    est[k], est[k + 1] = min(a, b), max(a, b)
            out[i] = (est[mid] if rows % 2 else (est[mid - 1] + est[mid]) * 0.5) + 0.0  # -0 -> +0


def sketch_encode(x, keys, cols, offset, out):
    if not x.size:
        out[...] = 0
        return out
    _encode(x, keys, np.int64(cols), np.int64(offset), np.int32(fixed_point_shift(x)), out)
    return out


def sketch_decode(table, keys, n, offset, out):
    _decode(table, keys, np.int64(n), np.int64(offset), out)
    return out
