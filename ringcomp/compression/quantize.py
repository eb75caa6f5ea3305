"""``qsgd`` and ``terngrad``: unbiased stochastic quantization with bit-packed levels."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Key, register
from ringcomp.compression.rules import Cascade
from ringcomp.kernels import backends
from ringcomp.kernels.arrays import array_module


class StochasticQuantizer(Cascade):
    """Unbiased stochastic quantization to ``levels`` magnitude steps of a per-bucket scale.

    Element x becomes sign(x) * scale * l / levels with l = floor(y) + Bernoulli(y - floor(y))
    and y = |x| / scale * levels, so E[decode] = x; ``scale`` is the norm of the element's
    bucket of ``bucket`` consecutive elements (0: the whole segment). Randomness comes from
    the counter-based stream of the key (hop included: a cascade re-encode draws afresh).
    Payload: one float32 scale per bucket, then one sign bit and bit_length(levels) level
    bits per element, packed (``kernels/quant_ref.py``).
    """

    unbiased = True
    norm = "l2"

    def __init__(self, levels: int, bucket: int):
        if not 1 <= int(levels) <= 127:
            raise ValueError(f"{self.name}: levels must be in 1..127, got {levels}")
        if int(bucket) < 0:
            raise ValueError(f"{self.name}: bucket must be >= 0 (0: whole segment), got "
                             f"{bucket}")
        self.levels, self.bucket = int(levels), int(bucket)
        self.bits = 1 + self.levels.bit_length()

    def _buckets(self, n: int) -> tuple[int, int]:
        """(elements per bucket, number of buckets) for a segment of ``n``."""
        size = self.bucket if self.bucket else max(n, 1)
        return size, max(1, -(-n // size))

    def nbytes(self, n: int) -> int:
        return 4 * self._buckets(n)[1] + (n * self.bits + 7) // 8

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        kernels = backends.backend("quant", like=x)
        size, count = self._buckets(x.size)
        payload = array_module(x).empty(self.nbytes(x.size), np.uint8)
        scales = payload[:4 * count].view(np.float32)
        kernels.bucket_scales(x, size, self.norm, scales)
        kernels.quantize(x, scales, size, self.levels, self.bits, key.stream(), key.offset,
                         payload[4 * count:])
        return payload

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        size, count = self._buckets(n)
        return backends.backend("quant", like=out).dequantize(
            payload[4 * count:], n, payload[:4 * count].view(np.float32), size, self.levels,
            self.bits, out)


@register
class QSGD(StochasticQuantizer):
    """QSGD (Alistarh et al.): scale = the L2 norm of each bucket of 512 elements (the
    paper's bucket size: with a whole 1 MiB segment as one bucket most elements round to
    zero and the variance explodes); ``levels`` default 16."""

    name = "qsgd"
    norm = "l2"

    def __init__(self, levels: int = 16, bucket: int = 512):
        super().__init__(levels, bucket)
        self.params = {"levels": self.levels, "bucket": self.bucket}


@register
class TernGrad(StochasticQuantizer):
    """TernGrad (Wen et al.): values in {-1, 0, +1} times the max magnitude of the segment
    (``bucket=0``, the paper's per-layer scale) or of each bucket."""

    name = "terngrad"
    norm = "max"

    def __init__(self, bucket: int = 0):
        super().__init__(1, bucket)
        self.params = {"bucket": self.bucket} if self.bucket else {}
