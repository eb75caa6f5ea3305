"""``topk``: the k largest-magnitude coordinates with their indices (cascade aggregation)."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Key, SparseCompressor, register
from ringcomp.compression.rules import Cascade


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
        k = self.k(x.size)
        chosen = self.select(np.abs(x), k)
        payload = np.empty(8 * k, np.uint8)
        payload[:4 * k].view(np.uint32)[:] = chosen
        payload[4 * k:].view(np.float32)[:] = x[chosen]
        return payload

    @staticmethod
    def select(magnitude: np.ndarray, k: int) -> np.ndarray:
        """Sorted indices of the k largest values, ties at the threshold to the lower index.

        O(n): one partition finds the k-th largest value, then everything above it and the
        first ties in index order are kept.
        """
        if k == 0:
            return np.empty(0, np.int64)
        n = magnitude.size
        threshold = np.partition(magnitude, n - k)[n - k]
        above = np.flatnonzero(magnitude > threshold)
        ties = np.flatnonzero(magnitude == threshold)[: k - above.size]
        return np.sort(np.concatenate([above, ties]))

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        k = self.k(n)
        out[...] = 0
        out[payload[:4 * k].view(np.uint32)] = payload[4 * k:].view(np.float32)
        return out
