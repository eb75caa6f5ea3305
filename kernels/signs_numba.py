"""Numba CPU versions of the sign kernels (``parallel=True``, one word per iteration).

Each output word depends only on its own 32 inputs and, for the merge, on the counter-based
stream, so ``prange`` over words gives results identical to the NumPy reference whatever the
thread count. Compiled on first use and cached on disk.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange
from ringcomp.kernels.rng import threshold
from ringcomp.kernels.rng_numba import uniform32 as _uniform32


@numba.njit(parallel=True, cache=True, nogil=True)
def _pack(x, out):
    n = x.size
    for w in prange(out.size):
        base = w * 32
        m = min(32, n - base)
        word = np.uint32(0)
        for j in range(m):
            if x[base + j] >= 0:
                word |= np.uint32(1) << np.uint32(j)
        out[w] = word


@numba.njit(parallel=True, cache=True, nogil=True)
def _unpack(words, n, out, scale):
    plus = out.dtype.type(scale)
    minus = out.dtype.type(-scale)
    for w in prange(words.size):
        base = w * 32
        m = min(32, n - base)
        word = words[w]
        for j in range(m):
            out[base + j] = plus if (word >> np.uint32(j)) & np.uint32(1) else minus


@numba.njit(parallel=True, cache=True, nogil=True)
def _merge(inc, own, n, thr, key, offset, out):
    for w in prange(inc.size):
        base = w * 32
        m = min(32, n - base)
        diff = inc[w] ^ own[w]
        mask = np.uint32(0)
        if diff != 0:  # where the bits agree, the choice does not matter
            for j in range(m):
                u = _uniform32(key, np.uint64(offset + base + j))
                if u < thr:
                    mask |= np.uint32(1) << np.uint32(j)
        out[w] = (inc[w] & ~mask) | (own[w] & mask)


def pack_signs(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    if out is None:
        out = np.empty((x.size + 31) // 32, np.uint32)
    _pack(x, out)
    return out


def unpack_signs(words: np.ndarray, n: int, out: np.ndarray, scale: float = 1.0) -> np.ndarray:
    _unpack(words, n, out, scale)
    return out


def marsit_merge(inc, own, n, take, of, key, offset, out=None):
    if out is None:
        out = np.empty_like(inc)
    _merge(inc, own, n, np.uint64(threshold(take, of)), np.uint64(key), np.int64(offset), out)
    return out
