"""Linear compressors whose random choices every rank shares: a header, then float32 values."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Key
from ringcomp.compression.rules import Linear
from ringcomp.kernels.arrays import array_module, to_numpy


class SharedSeedCompressor(Linear):
    """A linear compressor whose random choices every rank shares (hop-independent).

    The payload starts with a 16-byte header - the shared stream key and the segment's
    offset, from which the receiver re-derives the choices - followed by float32 values
    that add element-wise along a ring or tree (``add``), so nothing cascades.
    """

    HEADER = 16

    @staticmethod
    def shared_stream(key: Key) -> int:
        """The stream of ``key`` with hop 0: the same on every rank and every hop."""
        return key.at(0, key.offset).stream()

    def new_payload(self, n: int, key: Key, like) -> tuple[np.ndarray, int]:
        """An ``nbytes(n)`` payload in the memory of ``like``, its header written; returns
        (payload, stream)."""
        xp = array_module(like)
        payload = xp.empty(self.nbytes(n), np.uint8)
        stream = self.shared_stream(key)
        payload[:self.HEADER].view(np.uint64)[:] = xp.asarray(np.array([stream, key.offset],
                                                                        np.uint64))
        return payload, stream

    def header(self, payload: np.ndarray) -> tuple[int, int]:
        """(stream, offset) of a payload."""
        stream, offset = to_numpy(payload[:self.HEADER]).view(np.uint64)
        return int(stream), int(offset)

    @staticmethod
    def body(payload: np.ndarray) -> np.ndarray:
        return payload[SharedSeedCompressor.HEADER:].view(np.float32)

    def add(self, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
        if not array_module(a).array_equal(a[:self.HEADER], b[:self.HEADER]):
            raise ValueError(f"{self.name}: payloads of different seeds or segments cannot "
                             f"be added")
        total = a.copy()
        np.add(self.body(a), self.body(b), out=self.body(total))
        return total
