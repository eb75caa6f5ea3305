"""Numba CPU versions of the sign kernels (``parallel=True``, one word per iteration).

Each output word depends only on its own 32 inputs and, for the merge, on the counter-based
stream, so ``prange`` over words gives results identical to the NumPy reference whatever the
thread count. Compiled on first use and cached on disk.
"""

from __future__ import annotations

import sys

import numba
import numpy as np
from numba import prange

from ringcomp.kernels.rng import threshold
from ringcomp.kernels.rng_numba import mix as _mix
from ringcomp.kernels.signs_ref import TREE

LITTLE_ENDIAN = sys.byteorder == "little"


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
def _unpack_bits(words, n, out, pattern, top):
    # ``out`` is the float output viewed as same-width unsigned integers; ``pattern`` the
    # bits of +scale: -scale is the same bits with the sign bit (bit ``top``) set. Plain
    # integer stores with constant-trip inner loops, which LLVM vectorises (the float
    # select of ``_unpack`` it does not): 2.6x faster, at the speed of a fill
    full = n // 32
    for w in prange(full):
        base = w * 32
        inv = ~words[w]
        for j in range(32):
            out[base + j] = pattern | (out.dtype.type((inv >> np.uint32(j)) & np.uint32(1))
                                       << top)
    if full < words.size:
        base = full * 32
        inv = ~words[full]
        for j in range(n - base):
            out[base + j] = pattern | (out.dtype.type((inv >> np.uint32(j)) & np.uint32(1))
                                       << top)


@numba.njit(inline="always")
def _settle(z, q, thr, undecided, mask):
    """Compare planes 2q + 1 and 2q (the halves of draw ``z``) with the threshold's bits:
    where a value bit is below the threshold bit the own bit is taken, where above the
    incoming one is kept; equal bits leave the element undecided. Branch-free."""
    for h in (1, 0):
        plane = np.uint32(z >> np.uint64(32 * h))
        ones = np.uint32(0) - np.uint32((thr >> np.uint64(2 * q + h)) & np.uint64(1))
        mask |= undecided & ~plane & ones
        undecided &= ~(plane ^ ones)
    return undecided, mask


@numba.njit(parallel=True, cache=True, nogil=True)
def _merge(inc, own, n, thr, key, offset, out):
    # the 32 bit-sliced values of a word (signs_ref.sliced_uniform32) against ``thr``, most
    # significant plane first; only elements where the inputs differ matter. Four draws
    # (8 planes) always, without branches - they settle all but 1/256 of the elements -
    # then a loop for the rare rest; a data-dependent exit after every plane costs more
    # in mispredicted branches than it saves.
    full = thr >> np.uint64(32) != 0  # take == of: always the own bit
    for w in prange(inc.size):
        base = offset + 32 * w
        m = min(32, n - 32 * w)
        undecided = inc[w] ^ own[w]
        if m < 32:
            undecided &= (np.uint32(1) << np.uint32(m)) - np.uint32(1)
        mask = undecided if full else np.uint32(0)
        if not full:
            for q in range(15, 11, -1):
                undecided, mask = _settle(_mix(key, np.uint64(base + q)), q, thr, undecided,
                                          mask)
            q = 11
            while undecided != 0 and q >= 0:
                undecided, mask = _settle(_mix(key, np.uint64(base + q)), q, thr, undecided,
                                          mask)
                q -= 1
        out[w] = (inc[w] & ~mask) | (own[w] & mask)


@numba.njit(parallel=True, cache=True, nogil=True)
def _tree_rows(a, out):
    # signs_ref.tree_sum's step 2 on every row of TREE values (missing ones are zeros)
    for r in prange(out.size):
        row = np.zeros(TREE)
        for j in range(min(TREE, a.size - r * TREE)):
            row[j] = abs(np.float64(a[r * TREE + j]))
        h = TREE // 2
        while h:
            for j in range(h):
                row[j] = row[j] + row[j + h]
            h //= 2
        out[r] = row[0]


def mean_abs(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """See ``signs_ref.mean_abs`` (the same tree, rows in parallel)."""
    if not x.size:
        out[0] = 0.0
        return out
    a = x
    while a is x or a.size > 1:  # at least one pass: it takes the magnitudes
        sums = np.empty(-(-a.size // TREE))
        _tree_rows(a, sums)
        a = sums
    out[0] = a[0] / x.size
    return out


def pack_signs(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``x >= 0`` packed 32 to a word. On a little-endian host through NumPy's ``packbits``
    (SIMD: 3.6 ms for 64 MB on one thread here, against 17 ms for the word loop of
    ``_pack`` on one thread and 13.5 ms on two, which LLVM does not vectorise): with
    ``bitorder="little"`` its bytes, viewed as little-endian uint32, are exactly the words
    (bit j of word w is element 32w + j; the last word's spare bits zero)."""
    words = (x.size + 31) // 32
    if out is None:
        out = np.empty(words, np.uint32)
    if not LITTLE_ENDIAN or x.ndim != 1 or not out.flags.c_contiguous:
        _pack(x, out)
        return out
    packed = np.packbits(np.greater_equal(x, 0), bitorder="little")
    as_bytes = out.view(np.uint8)
    as_bytes[:packed.size] = packed
    as_bytes[packed.size:] = 0
    return out


#: float output dtype -> the unsigned integer type of its bits
_BITS = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def unpack_signs(words: np.ndarray, n: int, out: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """``+scale`` where the bit is set, ``-scale`` elsewhere; for float32/64 outputs as bit
    patterns (``_unpack_bits``), the same bits as the float select."""
    bits = _BITS.get(out.dtype)
    plus = out.dtype.type(scale)
    if bits is None or out.ndim != 1 or not out.flags.c_contiguous or np.signbit(plus):
        _unpack(words, n, out, scale)
        return out
    width = 8 * out.dtype.itemsize
    _unpack_bits(words, n, out.view(bits), plus.view(bits), bits(width - 1))
    return out


def marsit_merge(inc, own, n, take, of, key, offset, out=None):
    if out is None:
        out = np.empty_like(inc)
    _merge(inc, own, n, np.uint64(threshold(take, of)), np.uint64(key), np.int64(offset), out)
    return out
