"""``randomk``: the same k random coordinates on every rank (shared seed), summed linearly."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Key, SparseCompressor, register
from ringcomp.compression.shared_seed import SharedSeedCompressor
from ringcomp.kernels.arrays import array_module


@register
class RandomK(SharedSeedCompressor, SparseCompressor):
    """Keep ``ceil(ratio * n)`` coordinates chosen by a seed every rank shares.

    The coordinates depend on (seed, step, bucket, segment offset) but not on the hop or the
    rank, so payloads add up along a ring or tree in the compressed domain and are decoded
    once: no cascading error. Payload: the shared-seed header, then the float32 values at
    those coordinates. Decoding writes the kept values and zeros elsewhere (unscaled, as
    GRACE's RandomK; pair it with error feedback).
    """

    name = "randomk"

    def nbytes(self, n: int) -> int:
        return self.HEADER + 4 * self.k(n)

    def indices(self, n: int, stream: int, offset: int, like=None) -> np.ndarray:
        """Sorted coordinates kept for a segment of ``n`` elements at ``offset`` (drawn on
        the host, the one generator every rank and device shares; in ``like``'s memory)."""
        rng = np.random.Generator(np.random.PCG64([stream, offset]))
        chosen = np.sort(rng.choice(n, self.k(n), replace=False))
        return chosen if like is None else array_module(like).asarray(chosen)

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        payload, stream = self.new_payload(x.size, key, x)
        self.body(payload)[:] = x[self.indices(x.size, stream, key.offset, x)]
        return payload

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        out[...] = 0
        out[self.indices(n, *self.header(payload), out)] = self.body(payload)
        return out
