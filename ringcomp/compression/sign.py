"""``sign``: scaled sign (1 bit per element plus one float32 scale per segment)."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Key, register
from ringcomp.compression.rules import Cascade
from ringcomp.kernels import signs
from ringcomp.kernels.arrays import array_module, on_device


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
        payload = array_module(x).empty(self.nbytes(x.size), np.uint8)
        # the scale is a fixed-order sum (signs_ref.tree_sum): the same bits on every device
        signs.backend(like=x).sign_encode(x, payload[4:].view(np.uint32),
                                          payload[:4].view(np.float32))
        return payload

    def join(self, incoming, x, have, key, scratch=None):
        """Cascade's decode + add + re-encode, in one pass over ``x`` (the kernels' fused
        ``sign_join``: the same bits). Where the partial sum would live in another dtype
        than ``x`` (a ``scratch`` of the output's dtype), the three steps run apart."""
        if scratch is not None and scratch.dtype != x.dtype:
            return super().join(incoming, x, have, key, scratch)
        payload = array_module(x).empty(self.nbytes(x.size), np.uint8)
        signs.backend(like=x).sign_join(incoming[4:].view(np.uint32), self._scale(incoming), x,
                                        payload[4:].view(np.uint32),
                                        payload[:4].view(np.float32))
        return payload

    @staticmethod
    def _scale(payload):
        """The payload's float32 scale: a float from host memory; from device memory its
        4-byte view, which the CUDA kernels read themselves (reading it here would make
        the host wait for the stream at every hop)."""
        scale = payload[:4].view(np.float32)
        return scale if on_device(payload) else float(scale[0])

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        scale = self._scale(payload)
        return signs.backend(like=out).unpack_signs(payload[4:].view(np.uint32), n, out, scale)
