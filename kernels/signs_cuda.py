"""CUDA versions of the sign kernels, bit for bit equal to ``signs_ref``.

Pack: a block's threads load consecutive floats (coalesced) into shared sign flags, then
one thread per word gathers 32 of them (one thread per word reading its own 32 floats ran
at 0.67 of a copy on an H100). Unpack: one thread per element. Merge: one thread per word,
the bit-sliced stream drawn as the Numba kernel does; Marsit's join packs its word in
registers and merges it in the same thread (one launch per ring hop). The scaled sign's
join decodes, adds, packs and sums the first level of its scale's tree in one launch, a
warp per tree row and ``tree_cuda.WARPS`` rows to a block (``_join_rows``), then the
tree's upper levels. Mean magnitude: one warp per row of ``signs_ref.tree_sum``'s tree,
halving the row exactly as the reference does (coalesced loads; the same additions in the
same pairing): ``tree_cuda.segment_sums``, one segment; the division by n in a one-thread
launch (``_mean_into``) instead of three CuPy operations. A payload's scale in device
memory is read by the kernels themselves (``_unpack_scaled``, ``_join_rows_scaled``): the
host never waits for it.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import cuda, float64, uint8, uint32

from ringcomp.kernels.arrays import array_module
from ringcomp.kernels.cuda_launch import THREADS, launch, usable  # noqa: F401 - usable
from ringcomp.kernels.rng import threshold
from ringcomp.kernels.rng_cuda import mix
from ringcomp.kernels.signs_ref import TREE, encode_with
from ringcomp.kernels.tree_cuda import (
    LANES,
    PER,
    WARPS,
    row_position,
    row_sum,
    row_threads,
    segment_sums,
)

_SPAN = 8  # the sign pack's elements per thread
#: a pack block's sign flags (a shared array's size must be one constant: NVVM refuses an
#: expression, which Numba's simulator accepts)
_FLAGS = THREADS * _SPAN
#: the sign join's shared sign flags, a row of TREE per warp
FLAGS_SHAPE = (WARPS, TREE)


@cuda.jit(device=True, inline=True)
def _signs_word(x, n, w):
    """Word ``w`` of ``x``'s sign bits (bit j: element 32w + j is >= 0)."""
    base = 32 * w
    word = uint32(0)
    for j in range(min(32, n - base)):
        if x[base + j] >= 0:
            word |= uint32(1) << uint32(j)
    return word


@cuda.jit
def _pack(x, out):
    # Block b of T threads packs elements [b·T·SPAN, (b+1)·T·SPAN): 1. thread t loads
    # elements t + T·m (m < SPAN: a warp reads consecutive floats, coalesced) and keeps
    # their signs as shared flags (0 past the end); 2. thread t < T·SPAN/32 gathers word t
    # of the block from 32 flags (the last word's spare bits zero).
    t, width = cuda.threadIdx.x, cuda.blockDim.x
    base = cuda.blockIdx.x * width * _SPAN
    flags = cuda.shared.array(_FLAGS, uint8)
    for m in range(_SPAN):  # 1.
        i = base + t + width * m
        flags[t + width * m] = 1 if i < x.size and x[i] >= 0 else 0
    cuda.syncthreads()
    w = base // 32 + t
    if t < width * _SPAN // 32 and w < out.size:  # 2.
        word = uint32(0)
        for j in range(32):
            word |= uint32(flags[32 * t + j]) << uint32(j)
        out[w] = word


@cuda.jit
def _unpack(words, n, out, plus, minus):
    i = cuda.grid(1)
    if i < n:
        out[i] = plus if (words[i // 32] >> uint32(i % 32)) & uint32(1) else minus


@cuda.jit
def _unpack_scaled(words, n, scale, out):
    # ``_unpack`` with the scale read on the device (a sign payload's float32 ``scale[0]``)
    i = cuda.grid(1)
    if i < n:
        s = scale[0]
        out[i] = s if (words[i // 32] >> uint32(i % 32)) & uint32(1) else -s


@cuda.jit(device=True, inline=True)
def _settle(z, q, thr, undecided, mask):
    """See ``signs_blocks._settle``: planes 2q + 1 then 2q against the threshold's bits."""
    for h in (1, 0):
        plane = uint32(z >> np.uint64(32 * h))
        ones = uint32(0) - uint32((thr >> np.uint64(2 * q + h)) & np.uint64(1))
        mask |= undecided & ~plane & ones
        undecided &= ~(plane ^ ones)
    return undecided, mask


@cuda.jit(device=True, inline=True)
def _merged_word(incoming, own, w, n, thr, key, offset):
    """Word ``w`` of the merge: where the two words differ, the own bit with the
    threshold's probability, drawn from the bit-sliced stream at element offset + 32w."""
    full = thr >> np.uint64(32) != 0  # take == of: always the own bit
    base = offset + 32 * w
    m = min(32, n - 32 * w)
    undecided = incoming ^ own
    if m < 32:
        undecided &= (uint32(1) << uint32(m)) - uint32(1)
    mask = undecided if full else uint32(0)
    q = 15
    while not full and undecided != 0 and q >= 0:  # a warp runs until its last lane settles
        undecided, mask = _settle(mix(key, np.uint64(base + q)), q, thr, undecided, mask)
        q -= 1
    return (incoming & ~mask) | (own & mask)


@cuda.jit
def _merge(inc, own, n, thr, key, offset, out):
    w = cuda.grid(1)
    if w < inc.size:
        out[w] = _merged_word(inc[w], own[w], w, n, thr, key, offset)


@cuda.jit
def _join(inc, x, n, thr, key, offset, out):
    """Marsit's ring hop in one pass: ``x``'s sign word made in registers and merged into
    the incoming one (pack then merge without the packed words in memory or a launch)."""
    w = cuda.grid(1)
    if w < inc.size:
        out[w] = _merged_word(inc[w], _signs_word(x, n, w), w, n, thr, key, offset)


@cuda.jit(device=True)
def _join_row(inc, plus, minus, x, words, sums, joined=True):
    # Warp b (``row_position``) takes row b of TREE elements (``row_sum``'s layout: lane j
    # has elements j + LANES·m, m < PER, which are bit j of the row's word m):
    # 1. v = (plus if the incoming bit is set else minus) + x, in x's dtype (unpack, then
    #    add, as the reference rounds it; v = x when not ``joined``: an encode); its sign
    #    into the warp's shared flags (0 past the end, and for a last block's warps past
    #    the rows);
    # 2. lane m < PER gathers word m from the flags (spare bits of a last word zero);
    # 3. the row's float64 sum of |v|, halved as the reference does (``row_sum``).
    b, w, j = row_position()
    n = x.size
    flags = cuda.shared.array(FLAGS_SHAPE, uint8)
    e = cuda.local.array(PER, float64)
    for m in range(PER):  # 1.
        i = b * TREE + j + LANES * m
        e[m] = 0.0
        flags[w, LANES * m + j] = 0
        if i < n:
            v = x[i]
            if joined:
                v = (plus if (inc[i // 32] >> uint32(i % 32)) & uint32(1) else minus) + v
            e[m] = abs(float64(v))
            if v >= 0:
                flags[w, LANES * m + j] = 1
    cuda.syncthreads()
    k = b * PER + j
    if j < PER and k < words.size:  # 2.
        word = uint32(0)
        for t in range(32):
            word |= uint32(flags[w, 32 * j + t]) << uint32(t)
        words[k] = word
    total = row_sum(e, w, j)  # 3.
    if j == 0 and b < sums.size:
        sums[b] = total


@cuda.jit
def _join_rows(inc, plus, minus, x, words, sums):
    _join_row(inc, plus, minus, x, words, sums)


@cuda.jit
def _join_rows_scaled(inc, scale, x, words, sums):
    # ``_join_rows`` with the scale read on the device: float32 ``scale[0]`` added to x of
    # float32 or float64 gives the bits of the scale converted to x's dtype first
    s = scale[0]
    _join_row(inc, s, -s, x, words, sums)


@cuda.jit
def _encode_rows(x, words, sums):
    # the scaled sign's encode in one pass over x: its sign words and the first level of
    # its scale's tree (``_join_row`` with nothing joined; ``x[0]`` only types the unused
    # plus and minus)
    _join_row(words, x[0], x[0], x, words, sums, False)


@cuda.jit
def _mean_into(total, n, out):
    # ``(total / n).astype(out.dtype)``: the float64 quotient, rounded once to out's dtype
    if cuda.grid(1) == 0:
        out[0] = total[0] / n


def _is_number(scale) -> bool:
    """A scale given as a number (else a sign payload's float32 in device memory)."""
    return isinstance(scale, (int, float, np.floating))


def pack_signs(x, out=None):
    if out is None:
        out = array_module(x).empty((x.size + 31) // 32, np.uint32)
    launch(_pack, -(-x.size // _SPAN), x, out)  # one thread per SPAN elements
    return out


def unpack_signs(words, n: int, out, scale=1.0):
    """``scale``: a float, or a one-element float32 device array (read by the kernel)."""
    if _is_number(scale):
        launch(_unpack, n, words, n, out, float(scale), -float(scale))
    else:
        launch(_unpack_scaled, n, words, n, scale, out)
    return out


def marsit_merge(inc, own, n, take, of, key, offset, out=None):
    if out is None:
        out = array_module(inc).empty_like(inc)
    launch(_merge, inc.size, inc, own, n, np.uint64(threshold(take, of)), np.uint64(key),
           np.int64(offset), out)
    return out


def mean_abs(x, out):
    """See ``signs_ref.mean_abs``: the tree on the device, the result written in place."""
    if not x.size:
        out[:1] = 0
        return out
    total = segment_sums(x, x.size, 1, square=False)  # the whole array, one segment
    launch(_mean_into, 1, total, np.int64(x.size), out)
    return out


def sign_encode(x, words, scale_out):
    """See ``signs_ref.encode_with``: the signs and the first level of the scale's tree in
    one pass over ``x`` (``_encode_rows``), then the tree's upper levels."""
    n = x.size
    if not n:
        return encode_with(sys.modules[__name__], x, words, scale_out)
    rows = -(-n // TREE)
    sums = array_module(x).empty(rows, np.float64)  # (every block writes its own)
    launch(_encode_rows, rows * LANES, x, words, sums, threads=row_threads(rows))
    _scale_from_rows(sums, rows, n, scale_out)
    return words


def _scale_from_rows(sums, rows: int, n: int, scale_out) -> None:
    """``scale_out[0]``: the tree's upper levels over the first level's row sums, / n."""
    total = sums if rows == 1 else segment_sums(sums, rows, 1, square=False)
    launch(_mean_into, 1, total, np.int64(n), scale_out)


def sign_join(inc, scale, x, words, scale_out):
    """See ``signs_ref.join_with``: decode, add, the signs and the first level of the
    scale's tree in one launch (``_join_rows``), then the tree's upper levels."""
    n = x.size
    if not n:
        scale_out[:1] = 0
        return words
    if not _is_number(scale) and x.dtype not in (np.float32, np.float64):
        scale = float(scale[0])  # float16: the scale rounded to x's dtype before the add
    rows = -(-n // TREE)
    sums = array_module(x).empty(rows, np.float64)  # (every block writes its own)
    if _is_number(scale):
        launch(_join_rows, rows * LANES, inc, x.dtype.type(scale), x.dtype.type(-scale), x,
               words, sums, threads=row_threads(rows))
    else:
        launch(_join_rows_scaled, rows * LANES, inc, scale, x, words, sums,
               threads=row_threads(rows))
    _scale_from_rows(sums, rows, n, scale_out)
    return words


def marsit_join(inc, x, take, of, key, offset, out=None):
    """See ``signs_ref.marsit_join``: one launch (``_join``)."""
    if out is None:
        out = array_module(inc).empty_like(inc)
    launch(_join, inc.size, inc, x, x.size, np.uint64(threshold(take, of)), np.uint64(key),
           np.int64(offset), out)
    return out
