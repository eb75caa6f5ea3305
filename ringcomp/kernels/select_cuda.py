"""CUDA top-k selection by radix select on the magnitudes' bits (as PyTorch's ``topk``),
equal to ``select_ref``: no sort of the whole array.

Non-negative floats order as their bit patterns read as unsigned integers, so the k-th
largest value is found one 8-bit digit at a time from the top: 1. a histogram of the
current digit over the values whose higher digits equal the prefix found so far (each block
counts a grid-stride share into 256 bins of its own shared memory, then adds them to the
global bins: one global atomic per bin and block instead of one per value, which all
collide on a few bins when the values are alike); 2. from the highest bin down, the bin
where the running count reaches the ``remaining`` rank gives the next digit, and the
counts above it leave ``remaining``;
3. after the lowest digit the prefix is the k-th largest value's bits. Then the reference's
rule on the bits: every index above it, the first ties in index order, sorted (CuPy sorts
only the ``k`` chosen indices). A pass costs one read of the bits and a 1 KB copy to the
host.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint32

from ringcomp.kernels.arrays import array_module, to_numpy
from ringcomp.kernels.cuda_launch import BLOCK, SIMULATED, launch, usable  # noqa: F401 - usable
from ringcomp.kernels.select_ref import at_threshold

_DIGIT = 8
_BINS = 1 << _DIGIT
#: the unsigned integer type whose bits a float's magnitude is read as
_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}
#: blocks of a histogram pass, each striding over its share: enough to fill a GPU (the
#: simulator runs every thread in Python, so two blocks there still cover the stride
#: logic); a block's share stays far below 2**32, its counters' range
HIST_BLOCKS = 2 if SIMULATED else 2048


@cuda.jit
def _histogram(bits, shift, prefix, mask, hist):
    local = cuda.shared.array(_BINS, uint32)
    t = cuda.threadIdx.x
    for b in range(t, _BINS, cuda.blockDim.x):
        local[b] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), bits.size, cuda.gridsize(1)):
        v = bits[i]
        if (v & mask) == prefix:
            cuda.atomic.add(local, (v >> shift) & (_BINS - 1), 1)
    cuda.syncthreads()
    for b in range(t, _BINS, cuda.blockDim.x):
        if local[b]:
            cuda.atomic.add(hist, b, int64(local[b]))


def kth_largest_bits(bits, k: int) -> int:
    """The bits of the k-th largest (1-based) of the non-negative floats whose bit
    patterns ``bits`` holds (steps 1-3)."""
    xp, kind = array_module(bits), bits.dtype.type
    hist = xp.zeros(_BINS, np.int64)
    threads = min(bits.size, HIST_BLOCKS * BLOCK)
    prefix, mask, remaining = 0, 0, k
    for shift in range(8 * bits.itemsize - _DIGIT, -1, -_DIGIT):
        hist[...] = 0
        launch(_histogram, threads, bits, kind(shift), kind(prefix), kind(mask), hist)
        counts = to_numpy(hist)
        digit = _BINS - 1
        while counts[digit] < remaining:  # the bins above the k-th value's
            remaining -= int(counts[digit])
            digit -= 1
        prefix |= digit << shift
        mask |= (_BINS - 1) << shift
    return prefix


def topk_indices(magnitude, k: int):
    """See ``select_ref.topk_indices``."""
    if k == 0:
        return array_module(magnitude).empty(0, np.int64)
    bits = magnitude.view(_BITS[magnitude.itemsize])
    return at_threshold(bits, bits.dtype.type(kth_largest_bits(bits, k)), k)
