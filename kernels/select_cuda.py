"""CUDA top-k selection by radix select on the magnitudes' bits (as PyTorch's ``topk``),
equal to ``select_ref``: no sort of the whole array, and no wait of the host for the GPU.

Non-negative floats order as their bit patterns read as unsigned integers, and a float's
magnitude is its bits with the sign bit cleared, so ``topk_abs_indices`` reads ``x``
itself (no array of magnitudes is written). The k-th largest magnitude is found one digit
of up to 11 bits at a time from the top (3 passes for float32), its state on the device
(``found``: the bits found so far; ``left``: the rank still to find among the values
that share them): 1. a histogram of the current digit over the values whose higher
digits equal ``found`` (each block counts a grid-stride share into 2048 bins of its own
shared memory, then adds them to the global bins: one global atomic per bin and block
instead of one per value, which all collide on a few bins when the values are alike);
2. one block finds, from the highest bin down, the bin where the running count reaches
``left`` (a block-wide scan of the bins' counts): its digit joins ``found`` and the counts
above it leave ``left``; 3. after the lowest digit ``found`` is the k-th largest value's
bits and ``left`` the number of values equal to it to take. Then the reference's rule
(``select_ref.at_threshold``) as an ordered compaction in two passes over tiles of the
array: 4. each tile counts its values above the threshold and equal to it; 5. a scan of
those counts gives each tile its output position, and each tile writes its indices in
order: every value above, and a value equal to the threshold while fewer than ``left``
equal ones precede it - already sorted, exactly k, so nothing is sorted and the output's
size needs no count read back to the host.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint32

from ringcomp.kernels.arrays import array_module
from ringcomp.kernels.cuda_launch import (  # noqa: F401 - usable
    BLOCK,
    SIMULATED,
    device_table,
    launch,
    usable,
)

#: bits of a digit: 3 passes for float32 (11 + 11 + 10), 2 for float16, 6 for float64
_DIGIT = 11
_BINS = 1 << _DIGIT
#: the unsigned integer type whose bits a float's magnitude is read as
_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}
#: blocks of a histogram pass, each striding over its share: enough to fill a GPU (the
#: simulator runs every thread in Python, so two blocks there still cover the stride
#: logic); a block's share stays far below 2**32, its counters' range
HIST_BLOCKS = 2 if SIMULATED else 2048
#: threads of a scanning block (compaction tiles, choosing a digit), at most BLOCK: one
#: under the simulator, whose every thread is a Python thread and every barrier a poll of
#: them all (tests/cuda/test_cuda_kernels.py runs them at several threads too)
_SCAN_THREADS = 1 if SIMULATED else BLOCK
#: consecutive values each thread of a compaction tile classifies (at least; a kernel
#: argument): under the simulator, whose every block costs its threads' start and
#: barriers, as many as make about ``_SIM_TILES`` tiles - still several, so its small
#: test arrays cross tile boundaries
_ITEMS = 16
_SIM_TILES = 2
#: a tile's counts travel packed in one int64: values above the threshold in the high 32
#: bits, values equal to it in the low 32 (sums stay in their halves below 2**31 values)
_HIGH = 32
_LOW = (1 << _HIGH) - 1
#: the most values one selection takes: above it the high half's sums would overflow
MAX_VALUES = (1 << 31) - 1


@cuda.jit
def _histogram(bits, magnitude, shift, digit, found, mask, hist):
    # ``magnitude``: the mask that clears the sign bit (all ones for magnitudes already)
    local = cuda.shared.array(_BINS, uint32)
    t = cuda.threadIdx.x
    prefix = found[0]
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


@cuda.jit(device=True, inline=True)
def _exclusive_scan(shared, t, value):
    """The sum of ``value`` over the block's threads before ``t`` (Hillis-Steele in
    ``shared``, one int64 per thread; every thread of the block must call it)."""
    shared[t] = value
    cuda.syncthreads()
    offset = 1
    while offset < cuda.blockDim.x:
        add = shared[t - offset] if t >= offset else int64(0)
        cuda.syncthreads()
        shared[t] += add
        cuda.syncthreads()
        offset *= 2
    return shared[t] - value


@cuda.jit
def _choose_digit(hist, top, digit_bits, found, left):
    # step 2, one block: thread t sums bins top - t*per ... downwards, a scan gives the
    # count above its bins, and the thread whose bins hold the ``left``-th value from the
    # top writes the digit (``digit_bits[b]``: b shifted into place, in the bits' type)
    scan = cuda.shared.array(BLOCK, int64)
    t = cuda.threadIdx.x
    need = left[0]  # read by every thread before the scan's first barrier
    per = (top + cuda.blockDim.x) // cuda.blockDim.x
    first, last = t * per, min(t * per + per, top + 1)
    mine = int64(0)
    for j in range(first, last):
        mine += hist[top - j]
    before = _exclusive_scan(scan, t, mine)
    if before < need and need <= before + mine:  # the one thread whose bins hold it
        for j in range(first, last):
            count = hist[top - j]
            if before < need and need <= before + count:
                found[0] = found[0] | digit_bits[top - j]
                left[0] = need - before
            before += count


def _items_per_thread(n: int, threads: int) -> int:
    """Values each of a compaction tile's ``threads`` classifies, for ``n`` values."""
    if SIMULATED:
        return max(2, -(-n // (threads * _SIM_TILES)))
    return _ITEMS


@cuda.jit(device=True, inline=True)
def _tile_counts(bits, magnitude, threshold, start, items):
    """Values above ``threshold`` (high half) and equal to it (low half) among this
    thread's ``items`` values from ``start``."""
    packed = int64(0)
    for i in range(start, min(start + items, bits.size)):
        v = bits[i] & magnitude
        if v > threshold:
            packed += int64(1) << _HIGH
        elif v == threshold:
            packed += int64(1)
    return packed


@cuda.jit
def _count_tiles(bits, magnitude, found, items, counts):
    # step 4: a tile's packed counts, the block total of its threads'
    scan = cuda.shared.array(BLOCK, int64)
    t = cuda.threadIdx.x
    start = (cuda.blockIdx.x * cuda.blockDim.x + t) * items
    mine = _tile_counts(bits, magnitude, found[0], start, items)
    before = _exclusive_scan(scan, t, mine)
    if t == cuda.blockDim.x - 1:
        counts[cuda.blockIdx.x] = before + mine


@cuda.jit
def _write_tiles(bits, magnitude, found, left, items, offsets, out):
    # step 5: ``offsets[tile]``: the packed counts of the tiles before it
    scan = cuda.shared.array(BLOCK, int64)
    t = cuda.threadIdx.x
    threshold, take = found[0], left[0]
    start = (cuda.blockIdx.x * cuda.blockDim.x + t) * items
    before = _exclusive_scan(scan, t, _tile_counts(bits, magnitude, threshold, start, items))
    before += offsets[cuda.blockIdx.x]
    above, ties = before >> _HIGH, before & _LOW
    for i in range(start, min(start + items, bits.size)):
        v = bits[i] & magnitude
        if v > threshold:
            out[above + min(ties, take)] = i
            above += 1
        elif v == threshold:
            if ties < take:
                out[above + ties] = i
            ties += 1


def digits(width: int) -> list[tuple[int, int]]:
    """(shift, bits) of each digit of a ``width``-bit pattern, from the top."""
    out = []
    while width > 0:
        bits = min(_DIGIT, width)
        width -= bits
        out.append((width, bits))
    return out


def _digit_bits(like, kind, shift: int):
    """Every bin's digit shifted into place, in the bits' type, in ``like``'s memory (the
    kernel cannot type ``b << shift`` for every unsigned width)."""
    return device_table(like, ("digit-bits", np.dtype(kind).str, shift),
                        lambda: np.arange(_BINS, dtype=kind) << kind(shift))


def kth_largest_bits(bits, k: int, magnitude: int, threads: int = _SCAN_THREADS):
    """Device arrays (the bits of the k-th largest (1-based) of the magnitudes ``bits &
    magnitude``, how many values equal to it are among the k largest) - steps 1-3;
    ``threads``: of the block choosing each digit."""
    xp, kind = array_module(bits), bits.dtype.type
    hist = xp.empty(_BINS, np.int64)
    found, left = xp.zeros(1, kind), xp.full(1, k, np.int64)
    counting = min(bits.size, HIST_BLOCKS * BLOCK)  # the histogram's threads
    mask = 0
    for shift, width in digits(8 * bits.itemsize):
        top = (1 << width) - 1
        hist[...] = 0
        launch(_histogram, counting, bits, kind(magnitude), kind(shift), kind(top), found,
               kind(mask), hist)
        launch(_choose_digit, threads, hist, top, _digit_bits(bits, kind, shift), found, left,
               threads=threads)
        mask |= top << shift
    return found, left


def _selected(bits, k: int, magnitude: int, threads: int = _SCAN_THREADS):
    """``select_ref.at_threshold`` of the magnitudes ``bits & magnitude`` - steps 4-5, on
    scanning blocks of ``threads`` (at most BLOCK)."""
    if bits.size > MAX_VALUES:
        raise ValueError(f"CUDA top-k selects among at most {MAX_VALUES} values, got "
                         f"{bits.size}: select per segment (segment_bytes)")
    xp, kind = array_module(bits), bits.dtype.type
    found, left = kth_largest_bits(bits, k, magnitude, threads)
    items = _items_per_thread(bits.size, threads)
    tiles = -(-bits.size // (threads * items))
    counts = xp.empty(tiles, np.int64)
    launch(_count_tiles, tiles * threads, bits, kind(magnitude), found, items, counts,
           threads=threads)
    offsets = xp.cumsum(counts) - counts
    out = xp.empty(k, np.int64)
    launch(_write_tiles, tiles * threads, bits, kind(magnitude), found, left, items, offsets,
           out, threads=threads)
    return out


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
