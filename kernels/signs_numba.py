"""Numba CPU versions of the sign kernels, bit for bit equal to ``signs_ref``.

Every kernel is a serial function over a block of words (or tree rows) that LLVM
vectorises (``signs_blocks``), run over the blocks in a ``prange`` here: a loop body
written inside the ``prange`` itself is not vectorised by Numba's parallel lowering
(unpack, merge and the magnitude sum ran 3-5x slower on one thread that way). Each output
word depends only on its own 32 inputs and, for the merge, on the counter-based stream, so
results are identical to the NumPy reference whatever the thread count. Compiled on first
use and cached on disk.
"""

from __future__ import annotations

import math
import sys

import numba
import numpy as np
from numba import prange

from ringcomp.kernels import signs_ref
from ringcomp.kernels.rng import threshold
from ringcomp.kernels.signs_blocks import (
    ALL_BITS,
    BLOCK,
    LITTLE_ENDIAN,
    _blocks,
    _merge_block,
    _unpack_block,
    marsit_join_block,
    pack_block,
    row_sums,
    sign_join_rows,
    unpack_bits_block,
)
from ringcomp.kernels.signs_ref import TREE


@numba.njit(parallel=True, cache=True, nogil=True)
def _pack(x, out):
    for c in prange(_blocks(out.size)):
        lo = c * BLOCK
        pack_block(x[32 * lo:32 * (lo + BLOCK)], out[lo:lo + BLOCK])


@numba.njit(parallel=True, cache=True, nogil=True)
def _pack_words(x, out):
    # the word loop, for big-endian hosts (where ``pack_block``'s byte view reverses)
    for w in prange(out.size):
        word = np.uint32(0)
        for j in range(min(32, x.size - 32 * w)):
            if x[32 * w + j] >= 0:
                word |= np.uint32(1) << np.uint32(j)
        out[w] = word


@numba.njit(parallel=True, cache=True, nogil=True)
def _unpack(words, n, out, scale):
    # the float select, for outputs ``_unpack_bits`` does not cover (float16, -scale)
    plus, minus = out.dtype.type(scale), out.dtype.type(-scale)
    for c in prange(_blocks(words.size)):
        lo = c * BLOCK
        _unpack_block(words[lo:lo + BLOCK], n - 32 * lo, out[32 * lo:], plus, minus)


@numba.njit(parallel=True, cache=True, nogil=True)
def _unpack_bits(words, n, out, pattern):
    for c in prange(_blocks(words.size)):
        lo = c * BLOCK
        unpack_bits_block(words[lo:lo + BLOCK], min(n - 32 * lo, 32 * BLOCK), out[32 * lo:],
                           pattern)


@numba.njit(parallel=True, cache=True, nogil=True)
def _merge(inc, own, n, thr, key, offset, out):
    # the 32 bit-sliced values of a word (signs_ref.sliced_uniform32) against ``thr``, most
    # significant plane first; only elements where the inputs differ matter
    tail = n - 32 * (inc.size - 1)
    last = ALL_BITS if tail >= 32 else (np.uint32(1) << np.uint32(tail)) - np.uint32(1)
    if thr >> np.uint64(32) != 0:  # take == of: always the own bit
        for w in prange(inc.size):
            mask = inc[w] ^ own[w]
            if w == inc.size - 1:
                mask &= last
            out[w] = (inc[w] & ~mask) | (own[w] & mask)
        return
    for c in prange(_blocks(inc.size)):
        lo = c * BLOCK
        hi = min(inc.size, lo + BLOCK)
        _merge_block(inc[lo:hi], own[lo:hi], thr, key, np.uint64(offset + 32 * lo),
                     last if hi == inc.size else ALL_BITS, out[lo:hi])


@numba.njit(parallel=True, cache=True, nogil=True)
def _marsit_join(inc, x, thr, key, offset, out):
    n = x.size
    tail = n - 32 * (inc.size - 1)
    last = ALL_BITS if tail >= 32 else (np.uint32(1) << np.uint32(tail)) - np.uint32(1)
    if thr >> np.uint64(32) != 0:  # take == of: the own bits
        for c in prange(_blocks(inc.size)):
            lo = c * BLOCK
            pack_block(x[32 * lo:32 * (lo + BLOCK)], out[lo:lo + BLOCK])
        for w in range(inc.size - 1, inc.size):
            mask = (inc[w] ^ out[w]) & last
            out[w] = (inc[w] & ~mask) | (out[w] & mask)
        return
    for c in prange(_blocks(inc.size)):
        lo = c * BLOCK
        hi = min(inc.size, lo + BLOCK)
        marsit_join_block(inc[lo:hi], x[32 * lo:32 * hi], thr, key,
                           np.uint64(offset + 32 * lo), last if hi == inc.size else ALL_BITS,
                           out[lo:hi])


@numba.njit(parallel=True, cache=True, nogil=True)
def _sign_join(inc, plus, minus, x, words, sums):
    rows, per = BLOCK // 8, TREE // 32
    for c in prange((sums.size + rows - 1) // rows):
        lo = c * rows
        sign_join_rows(inc[lo * per:(lo + rows) * per], plus, minus,
                        x[lo * TREE:(lo + rows) * TREE], words[lo * per:(lo + rows) * per],
                        sums[lo:lo + rows])

#: tree rows per parallel task of ``_tree_rows`` and ``_sign_join``: 256 rows (256 KB of
#: float32)
_ROWS = BLOCK // 8


@numba.njit(parallel=True, cache=True, nogil=True)
def _tree_rows(a, out):
    rows = _ROWS
    for c in prange((out.size + rows - 1) // rows):
        lo = c * rows
        row_sums(a[lo * TREE:], out[lo:lo + rows])


def _sum_rows(a, out) -> None:
    """``_tree_rows``, or for one task's rows its kernel itself (no parallel region)."""
    (row_sums if out.size <= _ROWS else _tree_rows)(a, out)


def mean_abs(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """See ``signs_ref.mean_abs`` (the same tree, rows in parallel)."""
    if not x.size:
        out[0] = 0.0
        return out
    a = x
    while a is x or a.size > 1:  # at least one pass: it takes the magnitudes
        sums = np.empty(-(-a.size // TREE))
        _sum_rows(a, sums)
        a = sums
    out[0] = a[0] / x.size
    return out


def pack_signs(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``x >= 0`` packed 32 to a word (bit j of word w is element 32w + j; the last word's
    spare bits zero): eight signs to a byte by one multiply (``pack_block``), 1.6x the
    speed of NumPy's SIMD ``packbits`` and 4x the word loop's, which LLVM cannot vectorise
    (the loop stays for big-endian hosts)."""
    if out is None:
        out = np.empty((x.size + 31) // 32, np.uint32)
    if not LITTLE_ENDIAN:
        _pack_words(x, out)
    elif out.size <= BLOCK:  # one block: the block kernel itself, not a parallel region
        pack_block(x, out)
    else:
        _pack(x, out)
    return out


#: float output dtype -> the unsigned integer type of its bits
_BITS = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def unpack_signs(words: np.ndarray, n: int, out: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """``+scale`` where the bit is set, ``-scale`` elsewhere; for float32/64 outputs as bit
    patterns (``_unpack_bits``), the same bits as the float select."""
    bits = _BITS.get(out.dtype)
    plus = out.dtype.type(scale)
    if (bits is None or out.ndim != 1 or out.strides[0] != out.itemsize
            or math.copysign(1.0, scale) < 0 or words.strides[0] != words.itemsize
            or not LITTLE_ENDIAN):
        _unpack(words, n, out, scale)
        return out
    # one block: the block kernel itself, not a parallel region (a few us a call)
    (unpack_bits_block if words.size <= BLOCK else _unpack_bits)(
        words, n, out.view(bits), plus.view(bits))
    return out


def marsit_merge(inc, own, n, take, of, key, offset, out=None):
    if out is None:
        out = np.empty_like(inc)
    _merge(inc, own, n, np.uint64(threshold(take, of)), np.uint64(key), np.int64(offset), out)
    return out


def marsit_join(inc, x, take, of, key, offset, out=None):
    """``marsit_merge(inc, pack_signs(x), x.size, ...)`` in one pass over ``x``."""
    if not LITTLE_ENDIAN:
        return marsit_merge(inc, pack_signs(x), x.size, take, of, key, offset, out)
    if out is None:
        out = np.empty_like(inc)
    thr = threshold(take, of)
    if inc.size <= BLOCK and thr >> 32 == 0:  # one block: its kernel, no parallel region
        tail = x.size - 32 * (inc.size - 1)
        last = ALL_BITS if tail >= 32 else np.uint32((1 << tail) - 1)
        marsit_join_block(inc, x, np.uint64(thr), np.uint64(key), np.uint64(offset), last,
                           out)
    else:
        _marsit_join(inc, x, np.uint64(thr), np.uint64(key), np.int64(offset), out)
    return out


def sign_join(inc, scale, x, words, scale_out):
    """A scaled-sign ring hop in one pass over ``x``: the payload (``scale_out[0]``,
    ``words``) of ``unpack_signs(inc, scale) + x``, as ``signs_ref.sign_join``."""
    if not x.size:
        scale_out[0] = 0.0
        return words
    if not LITTLE_ENDIAN:
        return signs_ref.join_with(sys.modules[__name__], inc, scale, x, words, scale_out)
    sums = np.empty(-(-x.size // TREE))
    # one task's rows: its kernel itself, not a parallel region
    (sign_join_rows if sums.size <= _ROWS else _sign_join)(
        inc, x.dtype.type(scale), x.dtype.type(-scale), x, words, sums)
    a = sums
    while a.size > 1:
        a, sums = np.empty(-(-a.size // TREE)), a
        _sum_rows(sums, a)
    scale_out[0] = a[0] / x.size
    return words


def sign_encode(x, words, scale_out):
    """``mean_abs`` and ``pack_signs`` of ``x``: two passes, each at its own kernel's speed
    (a 1 MB segment stays in cache between them), 1.6x faster than one fused pass -
    ``sign_join`` of no incoming signs - which pays for the join's spread and select."""
    return signs_ref.encode_with(sys.modules[__name__], x, words, scale_out)
