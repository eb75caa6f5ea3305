"""CUDA versions of the Count-Sketch kernels, bit for bit equal to ``sketch_ref``.

Encode must add each column's elements in index order (float64), which atomics would not:
1. one thread per (row, element) hashes it to a cell ``row * cols + col`` and its signed
   value;
2. a stable sort of the cell ids (CuPy's radix sort) groups each cell's elements, still in
   index order, and a binary search finds where each cell's run starts;
3. one thread per cell adds its run in order.
Decode is independent per element: one thread hashes it into every row and takes the
median with the same branch-free sorting network as the Numba kernel.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float64, int64, uint64

from ringcomp.kernels.arrays import array_module
from ringcomp.kernels.cuda_launch import launch, usable  # noqa: F401 - usable
from ringcomp.kernels.rng_cuda import mix

_MAX_ROWS = 64  # countsketch's limit on rows (the decode's per-thread scratch)


@cuda.jit(device=True, inline=True)
def _hash(key, g, cols):
    z = mix(key, uint64(g))
    col = ((z >> uint64(32)) * uint64(cols)) >> uint64(32)
    return int64(col), float64(int64(z & uint64(1)) * 2 - 1)


@cuda.jit
def _cells(x, keys, cols, offset, cell, value):
    t = cuda.grid(1)
    n = x.size
    if t >= keys.size * n:
        return
    j, i = t // n, t % n
    col, sign = _hash(keys[j], offset + i, cols)
    cell[t] = j * cols + col
    value[t] = sign * float64(x[i])


@cuda.jit
def _sum_runs(value, starts, out):
    c = cuda.grid(1)
    if c >= out.size:
        return
    acc = 0.0
    for s in range(starts[c], starts[c + 1]):
        acc += value[s]
    out[c] = acc


@cuda.jit
def _decode(table, keys, n, offset, out):
    i = cuda.grid(1)
    if i >= n:
        return
    rows, cols = table.shape
    est = cuda.local.array(_MAX_ROWS, float64)
    for j in range(rows):
        col, sign = _hash(keys[j], offset + i, cols)
        est[j] = sign * float64(table[j, col])
    for step in range(rows):
        for k in range(step % 2, rows - 1, 2):
            a, b = est[k], est[k + 1]
            est[k], est[k + 1] = min(a, b), max(a, b)
    mid = rows // 2
    out[i] = (est[mid] if rows % 2 else (est[mid - 1] + est[mid]) * 0.5) + 0.0  # -0 -> +0


def _on(like, keys):
    """``keys`` (host uint64) in the memory of ``like``."""
    return array_module(like).asarray(keys)


def sketch_encode(x, keys, cols, offset, out):
    xp = array_module(x)
    rows, n = len(keys), x.size
    cell, value = xp.empty(rows * n, np.int64), xp.empty(rows * n, np.float64)
    launch(_cells, rows * n, x, _on(x, keys), np.int64(cols), np.int64(offset), cell, value)
    order = xp.argsort(cell, kind="stable")
    starts = xp.searchsorted(cell[order], xp.arange(rows * cols + 1, dtype=np.int64))
    sums = xp.empty(rows * cols, np.float64)
    launch(_sum_runs, rows * cols, value[order], starts, sums)
    out[...] = sums.reshape(rows, cols)
    return out


def sketch_decode(table, keys, n, offset, out):
    launch(_decode, n, table, _on(table, keys), np.int64(n), np.int64(offset), out)
    return out
