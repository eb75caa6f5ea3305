"""NumPy reference of top-k selection: the specification the other backends match.

``topk_indices(magnitude, k)``: the indices, in increasing order, of the ``k`` largest of
``magnitude`` (non-negative, no NaN: the magnitudes of finite gradients), the values equal
to the k-th largest taken in index order until ``k`` are chosen (ties to the lower index),
so every backend and rank selects the same set.
"""

from __future__ import annotations

import numpy as np

from ringcomp.kernels.arrays import array_module


def topk_indices(magnitude: np.ndarray, k: int) -> np.ndarray:
    """Sorted int64 indices of the k largest values, ties at the threshold to the lower index.

    1. One partition finds the k-th largest value, the threshold (O(n)).
    2. Every index above it is kept, then the first ``k - above`` indices equal to it.
    3. The union, sorted.
    """
    if k == 0:
        return array_module(magnitude).empty(0, np.int64)
    n = magnitude.size
    return at_threshold(magnitude, array_module(magnitude).partition(magnitude, n - k)[n - k],
                        k)


def topk_abs_indices(x: np.ndarray, k: int) -> np.ndarray:
    """``topk_indices`` of the magnitudes of ``x`` (finite: no NaN)."""
    return topk_indices(np.abs(x), k)


def at_threshold(values, threshold, k: int):
    """Steps 2-3 for ``threshold``, the k-th largest of ``values`` (magnitudes, or their
    bit patterns, which order alike): every backend's selection rule."""
    xp = array_module(values)
    above = xp.flatnonzero(values > threshold)
    ties = xp.flatnonzero(values == threshold)[: k - above.size]
    return xp.sort(xp.concatenate([above, ties]))
