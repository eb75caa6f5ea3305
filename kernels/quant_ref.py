"""NumPy reference of the stochastic quantization kernels (QSGD, TernGrad): the spec.

Scales are per bucket of ``bucket`` elements (element i uses ``scales[i // bucket]``), the
bucket's L2 norm (the float64 squares summed by ``signs_ref.tree_sum``'s fixed tree, then
sqrt: an order a GPU block reproduces, where a sequential sum ties a bucket to one thread)
or max magnitude, stored as float32. Element i (global index offset + i) with
y = |x| / scale * levels (float64) gets the level
l = floor(y) + [u < y - floor(y)], u = uniform32(key, offset + i) / 2^32, capped at
``levels``; its code is l with the sign bit (x < 0) at bit ``bits - 1``. Codes are packed
``bits`` each, least significant bit first, into a byte stream (code i at bit i·bits).
Decode gives ±l · (scale / levels) in float64, stored in the output dtype.
"""

from __future__ import annotations

import numpy as np

from ringcomp.kernels.rng import uniform32
from ringcomp.kernels.signs_ref import tree_sum


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack small unsigned codes, ``bits`` each, little-endian bit order, into bytes."""
    planes = np.unpackbits(codes.astype(np.uint8)[:, None], axis=1, bitorder="little")
    return np.packbits(planes[:, :bits].reshape(-1), bitorder="little")


def unpack_codes(packed: np.ndarray, n: int, bits: int) -> np.ndarray:
    """Inverse of ``pack_codes`` for ``n`` codes."""
    planes = np.unpackbits(packed, bitorder="little")[: n * bits].reshape(n, bits)
    return np.packbits(planes, axis=1, bitorder="little")[:, 0]


def bucket_scales(x: np.ndarray, bucket: int, norm: str, out: np.ndarray) -> np.ndarray:
    """Per-bucket scale of ``x`` (``norm`` "l2" or "max") into ``out`` (float32)."""
    a = np.abs(x.astype(np.float64))
    for j in range(out.size):
        part = a[j * bucket:(j + 1) * bucket]
        if not part.size:
            out[j] = 0.0
        elif norm == "l2":
            out[j] = np.sqrt(tree_sum(part * part))
        else:
            out[j] = part.max()
    return out


def _per_element(scales: np.ndarray, bucket: int, n: int) -> np.ndarray:
    return np.repeat(scales.astype(np.float64), bucket)[:n]


def quantize(x: np.ndarray, scales: np.ndarray, bucket: int, levels: int, bits: int,
             key: int, offset: int, out: np.ndarray) -> np.ndarray:
    """Write the packed codes of ``x`` (``(x.size * bits + 7) // 8`` bytes) into ``out``."""
    scale = _per_element(scales, bucket, x.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(scale > 0, np.abs(x.astype(np.float64)) / scale * levels, 0.0)
    low = np.floor(y)
    u = uniform32(key, np.arange(offset, offset + x.size)) / 2.0**32
    level = np.minimum(low + (u < y - low), levels).astype(np.uint8)
    codes = level | ((x < 0).astype(np.uint8) << np.uint8(bits - 1))
    out[...] = pack_codes(codes, bits)
    return out


def dequantize(packed: np.ndarray, n: int, scales: np.ndarray, bucket: int, levels: int,
               bits: int, out: np.ndarray) -> np.ndarray:
    """Write the ``n`` values the packed codes stand for into ``out``."""
    codes = unpack_codes(packed, n, bits)
    sign_bit = np.uint8(1 << (bits - 1))
    level = (codes & ~sign_bit).astype(np.float64)
    out[...] = np.where(codes & sign_bit, -level, level) * (_per_element(scales, bucket, n)
                                                            / levels)
    return out
