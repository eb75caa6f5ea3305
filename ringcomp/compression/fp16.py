"""``fp16``: half precision on the wire, summed in half precision along the ring (linear)."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Compressor, Key, register


@register
class Fp16(Compressor):
    """2 bytes per element; hops add payloads in float16 (no decode/re-encode), decode once."""

    name = "fp16"
    aggregation = "linear"

    def nbytes(self, n: int) -> int:
        return 2 * n

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        return x.astype(np.float16).view(np.uint8)

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        out[...] = payload.view(np.float16)
        return out

    def add(self, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
        return np.add(a.view(np.float16), b.view(np.float16)).view(np.uint8)
