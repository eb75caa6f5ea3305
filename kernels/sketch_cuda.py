"""CUDA versions of the Count-Sketch kernels, bit for bit equal to ``sketch_ref``.

Encode: the reference's int64 fixed-point sums do not depend on the order of the
additions, so one thread per (row, element) hashes it and adds its signed fixed-point
value to its cell with an integer atomic; one thread per cell converts the sums (the
shift from the maximum magnitude, a CuPy reduction). Decode is independent per element:
one thread hashes it into every row and takes the median with the same branch-free sorting
network as the Numba kernel: up to 8 rows (5 by default) on eight scalars kept in registers
(``_decode_few``), more in a per-thread array in local memory (``_decode``).
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
_FEW = 8  # rows up to which the decode keeps its estimates in registers (``_decode_few``)


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


@cuda.jit(device=True, inline=True)
def _row_estimate(table, keys, j, rows, cols, g):
    """Row j's estimate of element g (+inf past the table's rows: sorted to the end)."""
    if j >= rows:
        return math.inf
    col, sign = _hash(keys[j], g, cols)
    return sign * float64(table[j, col])


@cuda.jit
def _decode(table, keys, n, offset, out):
    i = cuda.grid(1)
    if i >= n:
        return
    rows, cols = table.shape
    est = cuda.local.array(_MAX_ROWS, float64)
    for j in range(rows):
        est[j] = _row_estimate(table, keys, j, rows, cols, offset + i)
    for step in range(rows):
        for k in range(step % 2, rows - 1, 2):
            a, b = est[k], est[k + 1]
            est[k], est[k + 1] = min(a, b), max(a, b)
    mid = rows // 2
    out[i] = (est[mid] if rows % 2 else (est[mid - 1] + est[mid]) * 0.5) + 0.0  # -0 -> +0


@cuda.jit(device=True, inline=True)
def _ordered(a, b):
    return min(a, b), max(a, b)


@cuda.jit(device=True, inline=True)
def _pick(k, e0, e1, e2, e3, e4, e5, e6, e7):
    """The k-th of eight values (0 <= k < 8), without indexing memory."""
    if k < 4:
        return e0 if k == 0 else e1 if k == 1 else e2 if k == 2 else e3
    return e4 if k == 4 else e5 if k == 5 else e6 if k == 6 else e7


@cuda.jit
def _decode_few(table, keys, n, offset, out):
    # ``_decode`` for at most 8 rows with the estimates in eight scalars, so they stay in
    # registers (``_decode``'s array with runtime bounds lives in local memory: a 512-byte
    # stack per thread); rows past the table's are +inf, sorted to the end by the same
    # odd-even transposition network (eight passes); the middle ones picked by index.
    i = cuda.grid(1)
    if i >= n:
        return
    rows, cols = table.shape
    g = offset + i
    e0 = _row_estimate(table, keys, 0, rows, cols, g)
    e1 = _row_estimate(table, keys, 1, rows, cols, g)
    e2 = _row_estimate(table, keys, 2, rows, cols, g)
    e3 = _row_estimate(table, keys, 3, rows, cols, g)
    e4 = _row_estimate(table, keys, 4, rows, cols, g)
    e5 = _row_estimate(table, keys, 5, rows, cols, g)
    e6 = _row_estimate(table, keys, 6, rows, cols, g)
    e7 = _row_estimate(table, keys, 7, rows, cols, g)
    for _ in range(4):  # an even pass, then an odd one
        e0, e1 = _ordered(e0, e1)
        e2, e3 = _ordered(e2, e3)
        e4, e5 = _ordered(e4, e5)
        e6, e7 = _ordered(e6, e7)
        e1, e2 = _ordered(e1, e2)
        e3, e4 = _ordered(e3, e4)
        e5, e6 = _ordered(e5, e6)
    mid = rows // 2
    high = _pick(mid, e0, e1, e2, e3, e4, e5, e6, e7)
    if rows % 2:
        out[i] = high + 0.0  # -0 -> +0
    else:
        out[i] = (_pick(mid - 1, e0, e1, e2, e3, e4, e5, e6, e7) + high) * 0.5 + 0.0


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
    kernel = _decode_few if table.shape[0] <= _FEW else _decode
    launch(kernel, n, table, _on(table, keys), np.int64(n), np.int64(offset), out)
    return out
