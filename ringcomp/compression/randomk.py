"""``randomk``: the same k random coordinates on every rank (shared seed), summed linearly."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Key, SparseCompressor, register


@register
class RandomK(SparseCompressor):
    """Keep ``ceil(ratio * n)`` coordinates chosen by a seed every rank shares.

    The coordinates depend on (seed, step, bucket, segment offset) but not on the hop or the
    rank, so payloads add up along a ring or tree in the compressed domain and are decoded
    once: no cascading error. Payload: a 16-byte header (the shared stream key and the
    segment offset, from which the receiver derives the coordinates) then the float32 values
    at those coordinates. Decoding writes the kept values and zeros elsewhere (unscaled, as
    GRACE's RandomK; pair it with error feedback).
    """

    name = "randomk"
    aggregation = "linear"

    def nbytes(self, n: int) -> int:
        return 16 + 4 * self.k(n)

    def indices(self, n: int, stream: int, offset: int) -> np.ndarray:
        """Sorted coordinates kept for a segment of ``n`` elements at ``offset``."""
        rng = np.random.Generator(np.random.PCG64([stream, offset]))
        return np.sort(rng.choice(n, self.k(n), replace=False))

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        stream = key.at(0, key.offset).stream()  # hop-independent: shared by every rank
        payload = np.empty(self.nbytes(x.size), np.uint8)
        payload[:16].view(np.uint64)[:] = (stream, key.offset)
        payload[16:].view(np.float32)[:] = x[self.indices(x.size, stream, key.offset)]
        return payload

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        stream, offset = (int(v) for v in payload[:16].view(np.uint64))
        out[...] = 0
        out[self.indices(n, stream, offset)] = payload[16:].view(np.float32)
        return out

    def add(self, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
        if not np.array_equal(a[:16], b[:16]):
            raise ValueError("randomk: payloads of different coordinates cannot be added")
        total = a.copy()
        np.add(a[16:].view(np.float32), b[16:].view(np.float32),
               out=total[16:].view(np.float32))
        return total
