"""CUDA versions of the Count-Sketch kernels, bit for bit equal to ``sketch_ref``.

Encode: the reference's int64 fixed-point sums do not depend on the order of the
additions, so one thread per (row, element) hashes it and adds its signed fixed-point
value to its cell with an integer atomic; one thread per cell converts the sums (the
shift from the maximum magnitude, a CuPy reduction). Decode is independent per element:
one thread hashes it into every row and takes the median with the same branch-free sorting
network as the Numba kernel.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64, int64, uint64

from ringcomp.kernels.arrays import array_module
from ringcomp.kernels.cuda_launch import launch, usable  # noqa: F401 - usable
from ringcomp.kernels.rng_cuda import mix
from ringcomp.kernels.sketch_ref import fixed_point_shift

_MAX_ROWS = 64  # countsketch's limit on rows (the decode's per-thread scratch)


@cuda.jit(device=True, inline=True)
def _hash(key, g, cols):
    z = mix(key, uint64(g))
    col = ((z >> uint64(32)) * uint64(cols)) >> uint64(32)
    return int64(col), float64(int64(z & uint64(1)) * 2 - 1)


@cuda.jit
def _add_cells(x, keys, cols, offset, up, up2, sums):
    t = cuda.grid(1)
    n = x.size
    if t >= keys.size * n:
        return
    j, i = t // n, t % n
    col, sign = _hash(keys[j], offset + i, cols)
    q = int64(float64(x[i]) * up * up2)  # toward zero, as the reference's trunc
    cuda.atomic.add(sums, j * cols + col, q if sign > 0 else -q)


@cuda.jit
def _to_float(sums, down, down2, out):
    c = cuda.grid(1)
    if c < sums.size:
        out[c] = float64(sums[c]) * down * down2


def _halves(shift: int) -> tuple[float, float]:
    """2^shift as two float64 factors applied in turn: the reference's ``ldexp`` where
    one factor would overflow or underflow (|shift| up to ~1135). The first product is
    exact whenever the result is >= 1 in magnitude (encode) or the value is a nonzero
    integer (decode), so the second rounds once, where ``ldexp`` rounds."""
    half = shift // 2
    return math.ldexp(1.0, half), math.ldexp(1.0, shift - half)


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
    if not n:
        out[...] = 0
        return out
    shift = fixed_point_shift(x)
    sums = xp.zeros(rows * cols, np.int64)
    launch(_add_cells, rows * n, x, _on(x, keys), np.int64(cols), np.int64(offset),
           *_halves(shift), sums)
    launch(_to_float, rows * cols, sums, *_halves(-shift), out.reshape(-1))
    return out


def sketch_decode(table, keys, n, offset, out):
    launch(_decode, n, table, _on(table, keys), np.int64(n), np.int64(offset), out)
    return out
