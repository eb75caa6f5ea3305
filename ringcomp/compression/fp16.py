"""``fp16`` and ``bf16``: half precision on the wire, summed in half precision (linear)."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Key, register
from ringcomp.compression.rules import Linear
from ringcomp.kernels import backends
from ringcomp.kernels.arrays import array_module


class HalfPrecision(Linear):
    """2 bytes per element; hops add payloads (in float32, rounded once), decode once.

    The casts are the ``cast`` kernels (``kernels/cast_ref.py`` is the specification:
    round to nearest even of ``float32(x)``).
    """

    fmt = ""

    def nbytes(self, n: int) -> int:
        return 2 * n

    def _kernel(self, what: str, like):
        return getattr(backends.backend("cast", like=like), f"{what}_{self.fmt}")

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        return self._kernel("to", x)(x, array_module(x).empty(x.size, np.uint16)).view(np.uint8)

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        bits = payload.view(np.uint16)
        if out.dtype == np.float32:
            return self._kernel("from", out)(bits, out)
        out[...] = self._kernel("from", out)(bits, array_module(out).empty(n, np.float32))
        return out

    def add(self, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
        return self._kernel("add", a)(a.view(np.uint16), b.view(np.uint16),
                                      array_module(a).empty(n, np.uint16)).view(np.uint8)


@register
class Fp16(HalfPrecision):
    """IEEE binary16 (as NumPy's float16 and Horovod's/DDP's fp16 compression)."""

    name = "fp16"
    fmt = "fp16"
    #: the smallest magnitude that rounds to Inf (the largest finite half is 65504)
    overflows_at = 65520.0


@register
class Bf16(HalfPrecision):
    """bfloat16: float32's exponent range with 8 significant bits (DDP's bf16 hook)."""

    name = "bf16"
    fmt = "bf16"
