"""``topk``: the k largest-magnitude coordinates with their indices (cascade aggregation)."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Key, SparseCompressor, register
from ringcomp.compression.rules import Cascade
from ringcomp.kernels import backends
from ringcomp.kernels.arrays import array_module


@register
class TopK(Cascade, SparseCompressor):
    """Keep the ``ceil(ratio * n)`` coordinates of largest magnitude.

    Payload: k uint32 indices then k float32 values. Ranks keep different coordinates, so a
    hop must decode the partial aggregate, add its own values and select again (cascading
    compression); the collective re-selects at every hop. Ties are broken by the lower index,
    so every backend and rank selects the same set.
    """

    name = "topk"

    def nbytes(self, n: int) -> int:
        return 8 * self.k(n)

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        xp, k = array_module(x), self.k(x.size)
        chosen = self.select_abs(x, k)
        payload = xp.empty(8 * k, np.uint8)
        payload[:4 * k].view(np.uint32)[:] = chosen
        payload[4 * k:].view(np.float32)[:] = x[chosen]
        return payload

    @staticmethod
    def select(magnitude: np.ndarray, k: int) -> np.ndarray:
        """Sorted indices of the k largest values, ties at the threshold to the lower index
        (``kernels/select_ref.py`` is the specification; a device runs a radix select)."""
        return backends.backend("select", like=magnitude).topk_indices(magnitude, k)

    @staticmethod
    def select_abs(x: np.ndarray, k: int) -> np.ndarray:
        """``select(abs(x), k)``; a device reads the magnitudes from ``x``'s bits instead of
        writing them out first."""
        return backends.backend("select", like=x).topk_abs_indices(x, k)

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        k = self.k(n)
        out[...] = 0
        out[payload[:4 * k].view(np.uint32)] = payload[4 * k:].view(np.float32)
        return out
