"""``signs_ref.tree_sum``'s fixed summation tree on the device, one sum per segment: what the
sign scale (one segment, the whole array) and QSGD's bucket norms (a segment per bucket,
of squares) share."""

from __future__ import annotations

import numpy as np
from numba import cuda, float64

from ringcomp.kernels.arrays import array_module
from ringcomp.kernels.cuda_launch import SIMULATED, THREADS, launch, mul_f64
from ringcomp.kernels.signs_ref import TREE

LANES = 32  # threads summing one tree row: a warp
PER = TREE // LANES  # values per thread (TREE and LANES are powers of two)
#: tree rows (warps) per block: with one, an H100 keeps only half its threads resident (at
#: most 32 blocks an SM); under the simulator 2, so the tests cover the per-warp indexing
#: with few Python threads (how rows are grouped into blocks changes no sum)
WARPS = 2 if SIMULATED else THREADS // LANES
#: a block's shared rows, one per warp (a shared array's shape must be one constant)
ROWS_SHAPE = (WARPS, LANES)


def row_threads(rows: int) -> int:
    """Threads per block for ``rows`` tree rows: up to WARPS warps, no idle ones."""
    return LANES * max(1, min(WARPS, rows))


@cuda.jit(device=True)
def row_position():
    """(the tree row this thread's warp sums, its warp in the block, its lane), for blocks
    of ``row_threads`` threads."""
    t = cuda.threadIdx.x
    w = t // LANES
    return cuda.blockIdx.x * (cuda.blockDim.x // LANES) + w, w, t % LANES


@cuda.jit(device=True)
def row_sum(v, w, j):
    """One tree row's sum as ``signs_ref.tree_sum`` halves it, from lane ``j`` of warp
    ``w``'s ``PER`` values ``v`` (the row's values j + LANES·m, m < PER): 1. the halvings
    with h >= LANES pair values of one lane, in registers; 2. the last log2(LANES) go
    through the warp's row of shared memory. The sum is lane 0's; every thread of the
    block must call it (it synchronises the block)."""
    count = PER
    while count > 1:
        count //= 2
        for m in range(count):
            v[m] = v[m] + v[m + count]
    row = cuda.shared.array(ROWS_SHAPE, float64)
    row[w, j] = v[0]
    cuda.syncthreads()
    h = LANES // 2
    while h > 0:
        if j < h:
            row[w, j] = row[w, j] + row[w, j + h]
        cuda.syncthreads()
        h //= 2
    return row[w, 0]


@cuda.jit
def _segment_rows(a, segment, square, out):
    # Warp b (``row_position``) sums row r of segment s (b = s·rows + r; segments of
    # ``segment`` values of ``a``, rows of TREE, zeros past a segment's or a's end, and
    # for a last block's warps past the rows) as the reference halves a row: lane j loads
    # |values| j + LANES·m (m < PER; coalesced), squared (float64, rounded before any add)
    # when ``square``; then ``row_sum``.
    b, w, j = row_position()
    rows = (segment + TREE - 1) // TREE
    s, r = b // rows, b % rows
    end = min(a.size, (s + 1) * segment)
    v = cuda.local.array(PER, float64)
    for m in range(PER):
        i = s * segment + r * TREE + j + LANES * m
        e = abs(float64(a[i])) if i < end else 0.0
        v[m] = mul_f64(e, e) if square else e
    total = row_sum(v, w, j)
    if j == 0 and b < out.size:
        out[b] = total


def segment_sums(a, segment: int, segments: int, square: bool):
    """float64 device array of ``segments`` sums: ``tree_sum`` of |a| (or of its squares)
    over each run of ``segment`` values (the last may be short; segments past the end sum
    to 0). Level by level: each segment's rows, then its row sums as segments of their own,
    until one sum per segment is left. Rows past a short segment's end sum to zeros, which
    the next level adds exactly where the reference pads with zeros."""
    xp = array_module(a)
    while True:
        rows = -(-segment // TREE)
        sums = xp.empty(segments * rows, np.float64)  # (every block writes its own)
        launch(_segment_rows, sums.size * LANES, a, np.int64(segment), square, sums,
               threads=row_threads(sums.size))
        if rows == 1:
            return sums
        a, segment, square = sums, rows, False
