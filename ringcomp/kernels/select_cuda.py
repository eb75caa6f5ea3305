"""CUDA top-k selection by radix select on the magnitudes' bits (as PyTorch's ``topk``),
equal to ``select_ref``: no sort of the whole array.

Non-negative floats order as their bit patterns read as unsigned integers, and a float's
magnitude is its bits with the sign bit cleared, so ``topk_abs_indices`` reads ``x``
itself (no array of magnitudes is written). The k-th largest magnitude is found one digit
of up to 11 bits at a time from the top (3 passes for float32): 1. a histogram of the
current digit over the values whose higher digits equal the prefix found so far (each
block counts a grid-stride share into 2048 bins of its own shared memory, then adds them
to the global bins: one global atomic per bin and block instead of one per value, which
all collide on a few bins when the values are alike); 2. from the highest bin down, the
bin where the running count reaches the ``remaining`` rank gives the next digit, and the
counts above it leave ``remaining``; 3. after the lowest digit the prefix is the k-th
largest value's bits and ``remaining`` the number of values equal to it to take. Then the
reference's rule (``select_ref.at_threshold``) in one pass: the indices of every value at
or above the threshold, in increasing order (one kernel flags them, CuPy lists them),
keeping the first ``remaining`` of those equal to it - already sorted, so nothing is
sorted. A histogram pass costs one read of the bits and a 16 KB copy to the host.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint32

from ringcomp.kernels.arrays import array_module, to_numpy
from ringcomp.kernels.cuda_launch import BLOCK, SIMULATED, launch, usable  # noqa: F401 - usable

#: bits of a digit: 3 passes for float32 (11 + 11 + 10), 2 for float16, 6 for float64
_DIGIT = 11
_BINS = 1 << _DIGIT
#: the unsigned integer type whose bits a float's magnitude is read as
_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}
#: blocks of a histogram pass, each striding over its share: enough to fill a GPU (the
#: simulator runs every thread in Python, so two blocks there still cover the stride
#: logic); a block's share stays far below 2**32, its counters' range
HIST_BLOCKS = 2 if SIMULATED else 2048


@cuda.jit
def _histogram(bits, magnitude, shift, digit, prefix, mask, hist):
    # ``magnitude``: the mask that clears the sign bit (all ones for magnitudes already)
    local = cuda.shared.array(_BINS, uint32)
    t = cuda.threadIdx.x
    for b in range(t, _BINS, cuda.blockDim.x):
        local[b] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), bits.size, cuda.gridsize(1)):
        v = bits[i] & magnitude
        if (v & mask) == prefix:
            cuda.atomic.add(local, (v >> shift) & digit, 1)
    cuda.syncthreads()
    for b in range(t, _BINS, cuda.blockDim.x):
        if local[b]:
            cuda.atomic.add(hist, b, int64(local[b]))


@cuda.jit
def _at_least(bits, magnitude, threshold, out):
    i = cuda.grid(1)
    if i < bits.size:
        out[i] = (bits[i] & magnitude) >= threshold


def digits(width: int) -> list[tuple[int, int]]:
    """(shift, bits) of each digit of a ``width``-bit pattern, from the top."""
    out = []
    while width > 0:
        bits = min(_DIGIT, width)
        width -= bits
        out.append((width, bits))
    return out


def kth_largest_bits(bits, k: int, magnitude: int) -> tuple[int, int]:
    """(the bits of the k-th largest (1-based) of the magnitudes ``bits & magnitude``, how
    many values equal to it are among the k largest) - steps 1-3."""
    xp, kind = array_module(bits), bits.dtype.type
    hist = xp.zeros(_BINS, np.int64)
    threads = min(bits.size, HIST_BLOCKS * BLOCK)
    prefix, mask, remaining = 0, 0, k
    for shift, width in digits(8 * bits.itemsize):
        top = (1 << width) - 1
        hist[...] = 0
        launch(_histogram, threads, bits, kind(magnitude), kind(shift), kind(top),
               kind(prefix), kind(mask), hist)
        counts = to_numpy(hist)
        digit = top
        while counts[digit] < remaining:  # the bins above the k-th value's
            remaining -= int(counts[digit])
            digit -= 1
        prefix |= digit << shift
        mask |= top << shift
    return prefix, remaining


def _selected(bits, k: int, magnitude: int):
    """``select_ref.at_threshold`` of the magnitudes ``bits & magnitude`` in one pass."""
    xp, kind = array_module(bits), bits.dtype.type
    threshold, ties = kth_largest_bits(bits, k, magnitude)
    flags = xp.empty(bits.size, np.bool_)
    launch(_at_least, bits.size, bits, kind(magnitude), kind(threshold), flags)
    chosen = xp.flatnonzero(flags)  # increasing: above the threshold, and every tie
    if chosen.size == k:
        return chosen
    tie = (bits[chosen] & kind(magnitude)) == kind(threshold)
    return chosen[~tie | (xp.cumsum(tie) <= ties)]  # the first ``ties`` ties only


def topk_indices(magnitude, k: int):
    """See ``select_ref.topk_indices``."""
    if k == 0:
        return array_module(magnitude).empty(0, np.int64)
    bits = magnitude.view(_BITS[magnitude.itemsize])
    return _selected(bits, k, (1 << 8 * magnitude.itemsize) - 1)


def topk_abs_indices(x, k: int):
    """See ``select_ref.topk_abs_indices``: the magnitudes read from ``x``'s bits."""
    if k == 0:
        return array_module(x).empty(0, np.int64)
    bits = x.view(_BITS[x.itemsize])
    return _selected(bits, k, (1 << 8 * x.itemsize - 1) - 1)
