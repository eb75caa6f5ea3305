"""NumPy reference of the Count-Sketch kernels: the specification the other backends match.

Row j of a table with ``cols`` columns uses the stream ``keys[j]``. The element at global
index g = offset + i draws z = mix(keys[j], g) (``rng.mix``) and goes to column
``((z >> 32) * cols) >> 32`` with sign +1 if ``z & 1`` else -1. Encode sums in int64 fixed
point, so the sums do not depend on the order of the additions (a GPU adds with atomics):
1. s = 62 - e - ceil(log2 n), where max |x| < 2^e (``frexp``; e = 0 for zeros), so that any
   sum of n values scaled by 2^s stays below 2^62;
2. q_i = trunc(x_i · 2^s) (float64 ``ldexp``, toward zero) as int64;
3. S[j, col] = the int64 sum of sign · q_i, stored as float32(float64(S) · 2^-s).
The fixed point's step is 2^-37 of max |x| or finer for n <= 2^24, far below float32's
rounding of the sums. Decode
estimates element i as the median over rows of ``sign * S[j, col]`` (for an even number of
rows, the mean of the two middle values), computed in float64; a zero estimate is +0.0
(the order of -0.0 and +0.0 among equal values is no backend's to decide).
"""

from __future__ import annotations

import math

import numpy as np

from ringcomp.kernels.rng import mix


def fixed_point_shift(x: np.ndarray) -> int:
    """Step 1: the power of two that scales ``x`` (n > 0 values) into int64 fixed point."""
    e = math.frexp(float(np.max(np.abs(x))))[1]  # a float's maximum: exact in float64
    return 62 - e - (x.size - 1).bit_length()


def hashes(key: int, cols: int, offset: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(column, ±1.0) of elements offset .. offset + n - 1 in the row with stream ``key``."""
    z = mix(int(key), np.arange(offset, offset + n, dtype=np.uint64))
    col = ((z >> np.uint64(32)) * np.uint64(cols)) >> np.uint64(32)
    return col.astype(np.int64), np.where(z & np.uint64(1), 1.0, -1.0)


def sketch_encode(x: np.ndarray, keys: np.ndarray, cols: int, offset: int,
                  out: np.ndarray) -> np.ndarray:
    """Write the (rows, cols) float32 Count-Sketch of ``x`` into ``out`` (steps 1-3)."""
    if not x.size:
        out[...] = 0
        return out
    shift = fixed_point_shift(x)
    q = np.trunc(np.ldexp(x.astype(np.float64), shift)).astype(np.int64)
    for j, key in enumerate(keys):
        col, sign = hashes(key, cols, offset, x.size)
        sums = np.zeros(cols, np.int64)
        np.add.at(sums, col, np.where(sign > 0, q, -q))
        with np.errstate(over="ignore"):  # a sum beyond float32's range is +-inf
            out[j] = np.ldexp(sums.astype(np.float64), -shift)
    return out


def sketch_decode(table: np.ndarray, keys: np.ndarray, n: int, offset: int,
                  out: np.ndarray) -> np.ndarray:
    """Write the median estimate of each of the ``n`` sketched elements into ``out``."""
    rows, cols = table.shape
    est = np.empty((rows, n))
    for j, key in enumerate(keys):
        col, sign = hashes(key, cols, offset, n)
        est[j] = sign * table[j, col].astype(np.float64)
    est.sort(axis=0)
    mid = rows // 2
    out[...] = (est[mid] if rows % 2 else (est[mid - 1] + est[mid]) * 0.5) + 0.0
    return out
