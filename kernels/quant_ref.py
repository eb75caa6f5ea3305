"""NumPy reference of the stochastic quantization kernels (QSGD, TernGrad): the spec.

Element i (global index offset + i) with y = |x| / scale * levels (float64) gets the level
l = floor(y) + [u < y - floor(y)], u = uniform32(key, offset + i) / 2^32, capped at
``levels``; its code is l with the sign bit (x < 0) at bit ``bits - 1``. Codes are packed
``bits`` each, least significant bit first, into a byte stream (code i at bit i·bits).
Decode gives ±l · (scale / levels) in float64, stored in the output dtype.
"""

from __future__ import annotations

import numpy as np
from ringcomp.kernels.rng import uniform32


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack small unsigned codes, ``bits`` each, little-endian bit order, into bytes."""
    planes = np.unpackbits(codes.astype(np.uint8)[:, None], axis=1, bitorder="little")
    return np.packbits(planes[:, :bits].reshape(-1), bitorder="little")


def unpack_codes(packed: np.ndarray, n: int, bits: int) -> np.ndarray:
    """Inverse of ``pack_codes`` for ``n`` codes."""
    planes = np.unpackbits(packed, bitorder="little")[: n * bits].reshape(n, bits)
    return np.packbits(planes, axis=1, bitorder="little")[:, 0]


def quantize(x: np.ndarray, scale: float, levels: int, bits: int, key: int, offset: int,
             out: np.ndarray) -> np.ndarray:
    """Write the packed codes of ``x`` (``(x.size * bits + 7) // 8`` bytes) into ``out``."""
    if scale > 0:
        y = np.abs(x.astype(np.float64)) / float(scale) * levels
    else:
        y = np.zeros(x.size)
    low = np.floor(y)
    u = uniform32(key, np.arange(offset, offset + x.size)) / 2.0**32
    level = np.minimum(low + (u < y - low), levels).astype(np.uint8)
    codes = level | ((x < 0).astype(np.uint8) << np.uint8(bits - 1))
    out[...] = pack_codes(codes, bits)
    return out


def dequantize(packed: np.ndarray, n: int, scale: float, levels: int, bits: int,
               out: np.ndarray) -> np.ndarray:
    """Write the ``n`` values the packed codes stand for into ``out``."""
    codes = unpack_codes(packed, n, bits)
    sign_bit = np.uint8(1 << (bits - 1))
    level = (codes & ~sign_bit).astype(np.float64)
    out[...] = np.where(codes & sign_bit, -level, level) * (scale / levels)
    return out
