"""The hop codecs a compiled compressed-ring walk calls: Marsit's signs, the scaled sign,
stochastic quantization (QSGD, TernGrad) and top-k, each the compressor's own bits through
its serial block kernels (``compressed_ring_native``)."""

from __future__ import annotations

from functools import lru_cache

import numba
import numpy as np
from numba.extending import overload

from ringcomp.compression.marsit import MarsitSigns
from ringcomp.compression.quantize import StochasticQuantizer
from ringcomp.compression.sign import ScaledSign
from ringcomp.compression.topk import TopK
from ringcomp.kernels import quant_numba as quant
from ringcomp.kernels import signs_numba as signs

#: the hop rules compiled here
MARSIT, SIGN, QUANT, TOPK = range(4)
#: the elements a chunk may hold for a rule's walk on a process whose kernels run on
#: several threads: what its Python walk runs as one serial block kernel too
ONE_BLOCK = {MARSIT: 32 * signs.BLOCK, SIGN: signs.BLOCK // 8 * signs.TREE,
             QUANT: quant.BLOCK, TOPK: 32 * signs.BLOCK}


@lru_cache(maxsize=64)
def rule_of(comp) -> tuple[int, np.ndarray] | None:
    """(the rule, its constants) of a compressor whose hops are compiled here, else None;
    by exact class, as a subclass may change its codec. Constants: QSGD's and TernGrad's
    levels, bucket (0: the whole segment), bits per element and whether the scale is an L2
    norm; none for the others."""
    kind = type(comp)
    if kind is MarsitSigns:
        return MARSIT, np.zeros(0, np.int64)
    if kind is ScaledSign:
        return SIGN, np.zeros(0, np.int64)
    if kind is TopK:
        return TOPK, np.zeros(0, np.int64)
    if isinstance(comp, StochasticQuantizer) and kind.__module__ == StochasticQuantizer.__module__:
        return QUANT, np.array([comp.levels, comp.bucket, comp.bits, comp.norm == "l2"],
                               np.int64)
    return None


def _as_bits(a):
    """``a`` (float32 or float64) viewed as unsigned integers of its width (compiled only)."""


@overload(_as_bits)
def _as_bits_typed(a):
    width = np.uint32 if a.dtype.bitwidth == 32 else np.uint64
    return lambda a: a.view(width)


@numba.njit(inline="always")
def _words(n):
    return (n + 31) // 32


@numba.njit(nogil=True, cache=True)
def _tree_mean_abs(x):
    """``signs_numba.mean_abs`` of a non-empty ``x`` serially: the same rows, the same
    tree, the same bits."""
    a = np.empty((x.size + signs.TREE - 1) // signs.TREE)
    signs._row_sums(x, a)
    return _tree_of_rows(a) / x.size


@numba.njit(nogil=True, cache=True)
def _tree_of_rows(a):
    """The rest of ``signs_ref.tree_sum`` from its first level of row sums ``a``."""
    while a.size > 1:
        sums = np.empty((a.size + signs.TREE - 1) // signs.TREE)
        signs._row_sums(a, sums)
        a = sums
    return a[0]


@numba.njit(nogil=True, cache=True)
def encode(rule, spec, x, payload, key, offset):
    """``x``'s payload into ``payload`` (bytes), as the compressor's ``encode`` with stream
    ``key`` at element ``offset``."""
    n = x.size
    if rule == MARSIT:
        signs._pack_block(x, payload.view(np.uint32)[:_words(n)])
    elif rule == SIGN:
        payload[:4].view(np.float32)[0] = _tree_mean_abs(x)
        signs._pack_block(x, payload[4:4 + 4 * _words(n)].view(np.uint32))
    elif rule == QUANT:
        _quantize(spec, x, payload, key, offset)
    else:
        _select(x, payload)


@numba.njit(nogil=True, cache=True)
def join(rule, spec, incoming, x, out, scratch, take, key, offset):
    """``x`` joins ``incoming`` into ``out``, as the compressor's ``join``: Marsit's bits
    merged (its own taken with probability ``take`` / 2^32, stream ``key`` at element
    ``offset``), the scaled sign's fused decode-add-encode, and for the other cascades
    decode into ``scratch`` (the output's dtype), add, encode with ``key``. Returns
    ``decode``'s verdict on ``incoming`` (1: it cannot be of ``x``'s size), else 0."""
    n = x.size
    bad = 0
    if rule == MARSIT:
        w = _words(n)
        tail = n - 32 * (w - 1)
        last = signs._ALL if tail >= 32 else (np.uint32(1) << np.uint32(tail)) - np.uint32(1)
        signs._marsit_join_block(incoming.view(np.uint32)[:w], x, take, key,
                                 np.uint64(offset), last, out.view(np.uint32)[:w])
    elif rule == SIGN:
        w = _words(n)
        one = np.empty(1, x.dtype)
        one[0] = incoming[:4].view(np.float32)[0]
        rows = np.empty((n + signs.TREE - 1) // signs.TREE)
        signs._sign_join_rows(incoming[4:4 + 4 * w].view(np.uint32), one[0], -one[0], x,
                              out[4:4 + 4 * w].view(np.uint32), rows)
        out[:4].view(np.float32)[0] = _tree_of_rows(rows) / n
    else:
        partial = scratch[:n]
        bad = decode(rule, spec, incoming, partial)
        if bad:
            return bad
        for i in range(n):
            partial[i] += x[i]
        encode(rule, spec, partial, out, key, offset)
    return bad


@numba.njit(nogil=True, cache=True)
def decode(rule, spec, payload, out):
    """The values a payload stands for into ``out``, as the compressor's ``decode``;
    returns 1 for a payload that cannot be of ``out``'s size (top-k indices past its end:
    a peer's call of another length, no agreement), having written nothing past it,
    else 0."""
    n = out.size
    if rule <= SIGN:  # MARSIT or SIGN: sign bits
        head = 4 if rule == SIGN else 0
        scale = np.ones(1, out.dtype)
        if rule == SIGN:
            scale[0] = payload[:4].view(np.float32)[0]
        bits = _as_bits(out)
        signs._unpack_bits_block(payload[head:head + 4 * _words(n)].view(np.uint32), n,
                                 bits, scale.view(bits.dtype)[0])
    elif rule == QUANT:
        levels, bucket, bits, count = _quant_shape(spec, n)
        scales = payload[:4 * count].view(np.float32)
        packed = payload[4 * count:]
        for lo in range(0, n, quant.BLOCK):
            hi = min(n, lo + quant.BLOCK)
            quant._dequantize_block(packed[lo // 8 * bits:(hi * bits + 7) // 8], scales,
                                    bucket, levels, bits, lo, out[lo:hi])
    else:
        k = payload.size // 8
        out[:] = 0
        index, values = payload[:4 * k].view(np.uint32), payload[4 * k:8 * k].view(np.float32)
        for j in range(k):
            if index[j] >= n:  # compiled code checks no bounds: it would write anywhere
                return 1
            out[index[j]] = values[j]
    return 0


@numba.njit(inline="always")
def _quant_shape(spec, n):
    """(levels, elements per bucket, bits per element, buckets) of a segment of ``n``."""
    bucket = spec[1] if spec[1] else max(n, 1)
    return spec[0], bucket, spec[2], max(1, (n + bucket - 1) // bucket)


@numba.njit(nogil=True, cache=True)
def _quantize(spec, x, payload, key, offset):
    """``StochasticQuantizer.encode``: each bucket's scale, then the codes block by block
    (``quant_numba``'s parallel kernels' blocks, in order)."""
    n = x.size
    levels, bucket, bits, count = _quant_shape(spec, n)
    scales = payload[:4 * count].view(np.float32)
    quant._scales_of(x, bucket, spec[3] != 0, scales, 0, count)
    packed = payload[4 * count:]
    for lo in range(0, n, quant.BLOCK):
        hi = min(n, lo + quant.BLOCK)
        quant._quantize_block(x[lo:hi], scales, bucket, levels, bits, key, lo, offset,
                              packed[lo // 8 * bits:(hi * bits + 7) // 8])


@numba.njit(nogil=True, cache=True)
def _select(x, payload):
    """``TopK.encode`` (``payload.size // 8`` coordinates): the k-th largest magnitude, then
    in index order every larger one and the equal ones until k are taken - the set
    ``select_ref.topk_indices`` specifies - written as k indices then k float32 values.
    Magnitudes are compared as the bits of ``|x|`` (non-negative floats order as their
    bits do; no NaN reaches a codec)."""
    k = payload.size // 8
    bits = _as_bits(x)
    clear = ~(np.uint64(1) << np.uint64(8 * x.itemsize - 1))  # the sign bit off
    threshold, ties = _kth_largest(bits, clear, k, 8 * x.itemsize - 1)
    index, values = payload[:4 * k].view(np.uint32), payload[4 * k:8 * k].view(np.float32)
    j = 0
    for i in range(x.size):
        m = np.uint64(bits[i]) & clear
        if m > threshold or (m == threshold and ties > 0):
            ties -= m == threshold
            index[j] = i
            values[j] = x[i]
            j += 1


@numba.njit(inline="always")
def _digit_of(counts, top, need):
    """(the digit holding the ``need``-th largest, counting down from ``top``; how many
    values with that digit the k largest still take)."""
    digit = top
    while counts[digit] < need:
        need -= counts[digit]
        digit -= 1
    return digit, need


#: bits of a radix select's digit: three passes for float32's 31 magnitude bits
_DIGIT = 11


@numba.njit(nogil=True, cache=True)
def _kth_largest(bits, clear, k, width):
    """(the k-th largest of ``bits & clear`` over ``width`` significant bits, how many
    values equal to it the k largest take) for 1 <= k <= bits.size, by radix select:
    from the top, ``_DIGIT`` bits at a time, count the candidates' digits, keep the digit
    where the k-th largest lies and only the candidates that have it (after the first
    pass, usually a few percent of them). O(n): two passes over ``bits``, then passes over
    the few candidates (3x NumPy's ``partition`` at 64K elements)."""
    counts = np.zeros(1 << _DIGIT, np.int64)
    need = k
    hi = width
    lo = max(0, hi - _DIGIT)
    at, mask = np.uint64(lo), np.uint64((1 << (hi - lo)) - 1)
    for i in range(bits.size):  # the first digit, read from the bits themselves
        counts[((np.uint64(bits[i]) & clear) >> at) & mask] += 1
    digit, need = _digit_of(counts, np.int64(mask), need)
    prefix = np.uint64(digit) << at
    candidates = np.empty(counts[digit], np.uint64)
    j = 0
    for i in range(bits.size):
        m = np.uint64(bits[i]) & clear
        if (m >> at) & mask == np.uint64(digit):
            candidates[j] = m
            j += 1
    while lo > 0:  # the next digits, over the candidates left
        hi = lo
        lo = max(0, hi - _DIGIT)
        at, mask = np.uint64(lo), np.uint64((1 << (hi - lo)) - 1)
        counts[:] = 0
        for m in candidates:
            counts[(m >> at) & mask] += 1
        digit, need = _digit_of(counts, np.int64(mask), need)
        prefix |= np.uint64(digit) << at
        if lo:
            candidates = candidates[(candidates >> at) & mask == np.uint64(digit)]
    return prefix, need
