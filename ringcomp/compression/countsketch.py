"""``countsketch``: a Count-Sketch of shared seeded hashes, summed linearly, median decode."""

from __future__ import annotations

import math

import numpy as np

from ringcomp.compression.base import Key, register
from ringcomp.compression.shared_seed import SharedSeedCompressor
from ringcomp.compression.topk import TopK
from ringcomp.kernels import backends
from ringcomp.kernels.rng import substream


@register
class CountSketch(SharedSeedCompressor):
    """Count-Sketch (Charikar et al.; as used by SketchedSGD, FetchSGD and Sketch-fusion).

    A segment of n elements becomes a ``rows`` x ``cols`` float32 table with
    ``cols = ceil(ratio * n / rows)`` (so the table holds about ``ratio * n`` values):
    element i is added, with a ±1 sign, to one column of every row, both drawn from hashes
    every rank shares (seed, step, bucket, segment offset; see ``kernels/sketch_ref.py``).
    Tables of the same hashes add, so a ring or tree sums them in the compressed domain and
    decodes once - no cascading error, and the size does not grow with p. Decode estimates
    every element as the median over rows; ``keep < 1`` then keeps only the
    ``ceil(keep * n)`` largest estimates (heavy-hitter recovery) and zeros the rest.

    Worker-side error feedback does not pair with it at useful ratios: a kept estimate
    carries the collision noise of every other element, so ``x - decode(encode(x))`` is
    larger than ``x`` (1.5x at the defaults on a Gaussian vector) and the residual grows
    every step (``training.combination.contraction``; the trainer warns). Making it pair
    needs the exact values at the chosen coordinates (a second, small all-reduce), which
    this compressor does not do.
    """

    name = "countsketch"

    def __init__(self, ratio: float = 0.1, rows: int = 5, keep: float = 0.01):
        if not 0 < ratio <= 10:
            raise ValueError(f"countsketch: ratio must be in (0, 10], got {ratio}")
        if not 1 <= int(rows) <= 64:
            raise ValueError(f"countsketch: rows must be in 1..64, got {rows}")
        if not 0 < keep <= 1:
            raise ValueError(f"countsketch: keep must be in (0, 1], got {keep}")
        self.ratio, self.rows, self.keep = float(ratio), int(rows), float(keep)
        self.params = {"ratio": self.ratio, "rows": self.rows, "keep": self.keep}

    def cols(self, n: int) -> int:
        return max(1, math.ceil(self.ratio * n / self.rows))

    def nbytes(self, n: int) -> int:
        return self.HEADER + 4 * self.rows * self.cols(n)

    def _keys(self, stream: int) -> np.ndarray:
        return np.array([substream(stream, j) for j in range(self.rows)], np.uint64)

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        payload, stream = self.new_payload(x.size, key, x)
        table = self.body(payload).reshape(self.rows, self.cols(x.size))
        backends.backend("sketch", like=x).sketch_encode(x, self._keys(stream), table.shape[1],
                                                 key.offset, table)
        return payload

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        stream, offset = self.header(payload)
        table = self.body(payload).reshape(self.rows, self.cols(n))
        kernels = backends.backend("sketch", like=out)
        kernels.sketch_decode(table, self._keys(stream), n, offset, out)
        if self.keep < 1 and n:
            kept = TopK.select_abs(out, math.ceil(self.keep * n))
            values = out[kept]
            out[...] = 0
            out[kept] = values
        return out
