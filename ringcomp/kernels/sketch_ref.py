"""NumPy reference of the Count-Sketch kernels: the specification the other backends match.

Row j of a table with ``cols`` columns uses the stream ``keys[j]``. The element at global
index g = offset + i draws z = mix(keys[j], g) (``rng.mix``) and goes to column
``((z >> 32) * cols) >> 32`` with sign +1 if ``z & 1`` else -1. Encode accumulates
``S[j, col] += sign * x[i]`` in float64 in element order and stores float32; decode
estimates element i as the median over rows of ``sign * S[j, col]`` (for an even number of
rows, the mean of the two middle values), computed in float64; a zero estimate is +0.0
(the order of -0.0 and +0.0 among equal values is no backend's to decide).
"""

from __future__ import annotations

import numpy as np

from ringcomp.kernels.rng import mix


def hashes(key: int, cols: int, offset: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(column, ±1.0) of elements offset .. offset + n - 1 in the row with stream ``key``."""
    z = mix(int(key), np.arange(offset, offset + n, dtype=np.uint64))
    col = ((z >> np.uint64(32)) * np.uint64(cols)) >> np.uint64(32)
    return col.astype(np.int64), np.where(z & np.uint64(1), 1.0, -1.0)


def sketch_encode(x: np.ndarray, keys: np.ndarray, cols: int, offset: int,
                  out: np.ndarray) -> np.ndarray:
    """Write the (rows, cols) float32 Count-Sketch of ``x`` into ``out``."""
    for j, key in enumerate(keys):
        col, sign = hashes(key, cols, offset, x.size)
        out[j] = np.bincount(col, weights=sign * x.astype(np.float64), minlength=cols)
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
