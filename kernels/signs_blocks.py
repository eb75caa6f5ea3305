"""The sign kernels' serial blocks, compiled for the CPU: each a function over one block of
words (or tree rows) that LLVM vectorises. ``signs_numba`` runs them over the blocks in a
``prange``; a compiled walk (``collectives/native_codecs``) calls them on a chunk in its
own thread. Bit for bit ``signs_ref``'s."""

from __future__ import annotations

import sys

import numba
import numpy as np

from ringcomp.kernels.rng_numba import mix as _mix
from ringcomp.kernels.signs_ref import TREE

LITTLE_ENDIAN = sys.byteorder == "little"

#: words (or tree rows) per parallel task: large enough that a task's start-up is noise,
#: small enough that two threads share a 1 MB segment
BLOCK = 2048
ALL_BITS = np.uint32(0xFFFFFFFF)
#: multiplying eight 0/1 bytes (a little-endian uint64) by this gathers byte k's bit into
#: bit 56 + k, with no carries between them: eight signs packed in one multiply
_GATHER = np.uint64(0x0102040810204080)

assert TREE == 256, "_row_sum below spells out the halvings of a 256-wide tree"




@numba.njit(nogil=True, cache=True)
def _blocks(size):
    return (size + BLOCK - 1) // BLOCK


@numba.njit(inline="always")
def _byte_bits(v):
    return np.uint32((v * _GATHER) >> np.uint64(56))


@numba.njit(inline="always")
def _word(t64, k):
    """Word k of the signs held as 0/1 bytes (``t64``: the bytes as uint64, 32 a word)."""
    return (_byte_bits(t64[4 * k]) | _byte_bits(t64[4 * k + 1]) << np.uint32(8)
            | _byte_bits(t64[4 * k + 2]) << np.uint32(16)
            | _byte_bits(t64[4 * k + 3]) << np.uint32(24))


@numba.njit(nogil=True, cache=True)
def pack_block(x, out):
    """``x >= 0`` into words ``out`` (``ceil(x.size / 32)`` of them), little-endian hosts.

    Whole rows of 256: the comparisons into 256 bytes (vectorised), then eight bytes to a
    byte of bits with one multiply (``_GATHER``), four of them to a word: faster than
    NumPy's ``packbits`` and no temporary outside L1. The rest: bit by bit, spare bits zero.
    """
    tmp = np.empty(TREE, np.uint8)
    t64 = tmp.view(np.uint64)
    rows = x.size // TREE
    for r in range(rows):
        for i in range(TREE):
            tmp[i] = x[r * TREE + i] >= 0
        for k in range(TREE // 32):
            out[r * 8 + k] = _word(t64, k)
    for w in range(rows * 8, out.size):
        word = np.uint32(0)
        for j in range(min(32, x.size - 32 * w)):
            word |= np.uint32(x[32 * w + j] >= 0) << np.uint32(j)
        out[w] = word


@numba.njit(nogil=True, cache=True)
def _unpack_block(words, n, out, plus, minus):
    for w in range(words.size):
        base = w * 32
        word = words[w]
        for j in range(min(32, n - base)):
            out[base + j] = plus if (word >> np.uint32(j)) & np.uint32(1) else minus


#: elements decoded at a time through a buffer of bytes that stays in L1
ROW = 2048
_REPLICATE = np.uint64(0x0101010101010101)
_BIT_OF_BYTE = np.uint64(0x8040201008040201)  # byte k keeps bit k
_CARRY = np.uint64(0x7F7F7F7F7F7F7F7F)


@numba.njit(nogil=True, cache=True)
def _spread(words, bits):
    """Bit j of byte k of ``words`` into byte 8k + j of ``bits`` (0 or 1), eight at a time:
    replicate the byte, keep bit k in byte k, carry it to the byte's top bit and shift it
    down (little-endian hosts). Vectorised, where a shift per element is not."""
    src = words.view(np.uint8)
    dst = bits.view(np.uint64)
    for i in range(src.size):
        kept = (np.uint64(src[i]) * _REPLICATE) & _BIT_OF_BYTE
        dst[i] = ((kept + _CARRY) >> np.uint64(7)) & _REPLICATE


@numba.njit(nogil=True, cache=True)
def unpack_bits_block(words, n, out, pattern):
    # ``out`` is the float output viewed as same-width unsigned integers; ``pattern`` the
    # bits of +scale: -scale is the same bits with the sign bit set. Rows of ROW elements:
    # the bits spread to bytes, then one or-and-shift per element (2x the speed of a shift
    # by the bit's position per element, which LLVM left scalar)
    bits = np.empty(ROW, np.uint8)
    top = out.dtype.type(8 * out.itemsize - 1)
    for r in range((n + ROW - 1) // ROW):
        lo = r * ROW
        count = min(ROW, n - lo)
        _spread(words[r * (ROW // 32):r * (ROW // 32) + (count + 31) // 32], bits)
        for i in range(count):
            out[lo + i] = pattern | (out.dtype.type(1 - bits[i]) << top)


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


@numba.njit(nogil=True, cache=True)
def _merge_block(inc, own, thr, key, base0, last, out):
    """The merge of one block of words (``last``: the valid bits of its last word).

    1. Every word: the elements where the inputs differ are undecided; four draws (the 8
       most significant planes) settle all but 1/256 of them. Fixed work, no branches:
       LLVM vectorises it (AVX-512's 64-bit multiplies draw 8 values at once).
    2. The rare words still undecided draw on, plane pair by plane pair, until settled.
    3. Every word takes ``own``'s bits where the mask is set and ``inc``'s elsewhere.
    """
    undecided = np.empty(inc.size, np.uint32)
    for w in range(inc.size):  # 1.
        base = base0 + np.uint64(32 * w)
        u = inc[w] ^ own[w]
        mask = np.uint32(0)
        for q in range(15, 11, -1):
            u, mask = _settle(_mix(key, base + np.uint64(q)), q, thr, u, mask)
        undecided[w] = u
        out[w] = mask
    undecided[-1] &= last  # lanes are independent: dropping the bits past n afterwards
    out[-1] &= last        # is the same as never having drawn for them
    for w in range(inc.size):
        u, mask = undecided[w], out[w]
        q = 11
        while u != 0 and q >= 0:  # 2.
            u, mask = _settle(_mix(key, base0 + np.uint64(32 * w + q)), q, thr, u, mask)
            q -= 1
        out[w] = (inc[w] & ~mask) | (own[w] & mask)  # 3.


@numba.njit(nogil=True, cache=True)
def marsit_join_block(inc, x, thr, key, base0, last, out):
    """``_merge_block`` of the own bits packed from ``x`` into a block-sized buffer that
    stays in cache, so a ring hop reads its input once and writes no own words."""
    own = np.empty(inc.size, np.uint32)
    pack_block(x, own)
    _merge_block(inc, own, thr, key, base0, last, out)


@numba.njit(inline="always")
def _mag(values, i):
    return abs(np.float64(values[i]))


@numba.njit(inline="always")
def _row_sum(values, base, row):
    """The float64 sum of ``|values[base:base + TREE]|`` halved as ``signs_ref.tree_sum``
    does (``row``: 16 float64 of scratch).

    The first four halvings (256 -> 16) leave lane j (< 16) with the sum of the 16 values
    j + 16m, paired (m, m + 8), then (m, m + 4), (m, m + 2), (0, 1): written out per lane
    they are one expression over contiguous loads that LLVM evaluates 8 lanes at a time in
    registers, where level-by-level loops through memory stalled on every level. The last
    four halvings run on the 16 lane sums. The same additions in the same order as the
    reference, so the same bits."""
    for j in range(16):
        b = base + j
        row[j] = ((((_mag(values, b) + _mag(values, b + 128))
                    + (_mag(values, b + 64) + _mag(values, b + 192)))
                   + ((_mag(values, b + 32) + _mag(values, b + 160))
                      + (_mag(values, b + 96) + _mag(values, b + 224))))
                  + (((_mag(values, b + 16) + _mag(values, b + 144))
                      + (_mag(values, b + 80) + _mag(values, b + 208)))
                     + ((_mag(values, b + 48) + _mag(values, b + 176))
                        + (_mag(values, b + 112) + _mag(values, b + 240)))))
    for j in range(8):
        row[j] = row[j] + row[j + 8]
    for j in range(4):
        row[j] = row[j] + row[j + 4]
    for j in range(2):
        row[j] = row[j] + row[j + 2]
    return row[0] + row[1]


@numba.njit(nogil=True, cache=True)
def sign_join_rows(inc, plus, minus, x, words, sums):
    """Rows of TREE elements: ``v = (plus or minus) + x`` (the decoded partial aggregate
    plus this rank's values, in ``x``'s dtype), its sign bits into ``words`` and the float64
    sum of ``|v|`` of each row, halved as ``signs_ref.tree_sum`` does, into ``sums``.
    ``inc``: the incoming sign words of these rows; a last partial row counts zeros past
    the end, as the reference pads.

    1. The incoming bits spread to bytes; ``v`` and its signs (as bytes) in one loop.
    2. The sign bytes gathered into words (as ``pack_block``).
    3. The row's magnitude sum from ``v``, which stays in L1.
    """
    row = np.zeros(TREE)
    v = np.zeros(TREE, x.dtype)
    per = TREE // 32
    bits = np.empty(TREE, np.uint8)
    signs = np.zeros(TREE, np.uint8)
    t64 = signs.view(np.uint64)
    for r in range(sums.size):
        count = min(TREE, x.size - r * TREE)
        xs = x[r * TREE:r * TREE + count]
        _spread(inc[r * per:r * per + (count + 31) // 32], bits)  # 1.
        if count == TREE:
            for j in range(TREE):
                total = (plus if bits[j] else minus) + xs[j]
                v[j] = total
                signs[j] = total >= 0
            for k in range(per):  # 2.
                words[r * per + k] = _word(t64, k)
        else:
            v[:] = 0
            signs[:] = 0  # no bits past the end
            for j in range(count):
                v[j] = (plus if bits[j] else minus) + xs[j]
                signs[j] = v[j] >= 0
            for k in range((count + 31) // 32):
                words[r * per + k] = _word(t64, k)
        sums[r] = _row_sum(v, 0, row)  # 3.


@numba.njit(nogil=True, cache=True)
def row_sums(a, out):
    """signs_ref.tree_sum's step 2 on the first ``out.size`` rows of TREE values of ``a``
    (the missing values of a last partial row are zeros), into ``out``. Indices the
    compiler knows to be non-negative matter: a row offset passed in would make every
    load check for a negative index (8x slower)."""
    row = np.zeros(TREE)
    padded = np.zeros(TREE)  # a last partial row, zeros past the end
    for r in range(out.size):
        base = r * TREE
        if base + TREE <= a.size:
            out[r] = _row_sum(a, base, row)
        else:
            for j in range(a.size - base):
                padded[j] = a[base + j]
            out[r] = _row_sum(padded, 0, row)


@numba.njit(nogil=True, cache=True)
def serial_mean_abs(x):
    """``mean_abs`` of a non-empty ``x`` serially, in the caller's thread (a compiled
    walk's): the same rows, the same tree, the same bits."""
    a = np.empty((x.size + TREE - 1) // TREE)
    row_sums(x, a)
    return tree_of_rows(a) / x.size


@numba.njit(nogil=True, cache=True)
def tree_of_rows(a):
    """The rest of ``signs_ref.tree_sum`` from its first level of row sums ``a``."""
    while a.size > 1:
        sums = np.empty((a.size + TREE - 1) // TREE)
        row_sums(a, sums)
        a = sums
    return a[0]
