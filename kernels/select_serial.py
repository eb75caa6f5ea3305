"""Top-k selection compiled for the CPU, serially, in the caller's thread: what a compiled
compressed-ring walk encodes top-k's payload with (``collectives/native_codecs``).
``select_ref.topk_indices`` is the specification; the GPU's is ``select_cuda``."""

from __future__ import annotations

import numba
import numpy as np
from numba.extending import overload


def as_bits(a):
    """``a`` (float32 or float64) viewed as unsigned integers of its width (compiled only)."""


@overload(as_bits)
def _as_bits_typed(a):
    width = np.uint32 if a.dtype.bitwidth == 32 else np.uint64
    return lambda a: a.view(width)


@numba.njit(nogil=True, cache=True)
def topk_pack(x, payload):
    """``TopK.encode`` (``payload.size // 8`` coordinates): the k-th largest magnitude, then
    in index order every larger one and the equal ones until k are taken - the set
    ``select_ref.topk_indices`` specifies - written as k indices then k float32 values.
    Magnitudes are compared as the bits of ``|x|`` (non-negative floats order as their
    bits do; no NaN reaches a codec)."""
    k = payload.size // 8
    bits = as_bits(x)
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
