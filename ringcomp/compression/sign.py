"""``sign``: scaled sign (1 bit per element plus one float32 scale per segment)."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Key, register
from ringcomp.compression.rules import Cascade
from ringcomp.kernels import signs


@register
class ScaledSign(Cascade):
    """Encode ``x`` as ``mean(|x|) * sign(x)``: 4 bytes of scale then the packed sign words.

    Not linear: along a ring every hop decodes the partial sum, adds its own gradient and
    re-encodes (cascading compression), so the error compounds with the hops.
    """

    name = "sign"

    def nbytes(self, n: int) -> int:
        return 4 + 4 * signs.words_for(n)

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        payload = np.empty(self.nbytes(x.size), np.uint8)
        payload[:4].view(np.float32)[0] = np.abs(x).mean(dtype=np.float64) if x.size else 0.0
        signs.backend().pack_signs(x, payload[4:].view(np.uint32))
        return payload

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        scale = float(payload[:4].view(np.float32)[0])
        return signs.backend().unpack_signs(payload[4:].view(np.uint32), n, out, scale)
