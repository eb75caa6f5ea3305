"""``qsgd`` and ``terngrad``: unbiased stochastic quantization with bit-packed levels."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Compressor, Key, register
from ringcomp.kernels import backends


class StochasticQuantizer(Compressor):
    """Unbiased stochastic quantization to ``levels`` magnitude steps of a per-segment scale.

    Element x becomes sign(x) * scale * l / levels with l = floor(y) + Bernoulli(y - floor(y))
    and y = |x| / scale * levels, so E[decode] = x. Randomness comes from the counter-based
    stream of the key (hop included: a cascade re-encode draws afresh). Payload: the float32
    scale, then one sign bit and bit_length(levels) level bits per element, packed.
    """

    aggregation = "cascade"
    unbiased = True
    norm = "l2"

    def __init__(self, levels: int):
        if not 1 <= int(levels) <= 127:
            raise ValueError(f"{self.name}: levels must be in 1..127, got {levels}")
        self.levels = int(levels)
        self.bits = 1 + self.levels.bit_length()

    def nbytes(self, n: int) -> int:
        return 4 + (n * self.bits + 7) // 8

    def _scale(self, x: np.ndarray) -> float:
        if not x.size:
            return 0.0
        a = np.abs(x.astype(np.float64))
        return float(np.sqrt(a @ a)) if self.norm == "l2" else float(a.max())

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        scale = np.float32(self._scale(x))
        payload = np.empty(self.nbytes(x.size), np.uint8)
        payload[:4].view(np.float32)[0] = scale
        backends.backend("quant").quantize(x, float(scale), self.levels, self.bits,
                                           key.stream(), key.offset, payload[4:])
        return payload

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        scale = float(payload[:4].view(np.float32)[0])
        return backends.backend("quant").dequantize(payload[4:], n, scale, self.levels,
                                                    self.bits, out)


@register
class QSGD(StochasticQuantizer):
    """QSGD (Alistarh et al.): the scale is the segment's L2 norm; ``levels`` default 16."""

    name = "qsgd"
    norm = "l2"

    def __init__(self, levels: int = 16):
        super().__init__(levels)
        self.params = {"levels": self.levels}


@register
class TernGrad(StochasticQuantizer):
    """TernGrad (Wen et al.): values in {-1, 0, +1} times the segment's max magnitude."""

    name = "terngrad"
    norm = "max"

    def __init__(self):
        super().__init__(1)
