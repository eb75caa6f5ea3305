"""CUDA versions of the stochastic quantization kernels, bit for bit equal to ``quant_ref``.

Scales: L2 norms by ``signs_ref.tree_sum``'s tree, one warp per row of TREE squares of a
bucket (products rounded before the add, as NumPy does - see ``cuda_launch.mul_f64``), then
the row sums of each bucket likewise; max magnitudes one thread per bucket (any order gives
the same maximum). Quantize and
dequantize: one thread per group of eight codes, which fill exactly ``bits`` bytes.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64, uint8, uint64

from ringcomp.kernels.cuda_launch import launch, usable  # noqa: F401 - usable
from ringcomp.kernels.rng_cuda import uniform32
from ringcomp.kernels.tree_cuda import segment_sums

_TWO32 = 2.0**32


@cuda.jit
def _max_abs(x, bucket, out):
    j = cuda.grid(1)
    if j >= out.size:
        return
    acc = 0.0
    for i in range(j * bucket, min(x.size, (j + 1) * bucket)):
        acc = max(acc, abs(float64(x[i])))
    out[j] = acc


@cuda.jit
def _sqrt_into(sums, out):
    j = cuda.grid(1)
    if j < out.size:
        out[j] = math.sqrt(sums[j])


@cuda.jit
def _quantize(x, scales, bucket, levels, bits, key, offset, out):
    g = cuda.grid(1)
    n = x.size
    if g >= (n + 7) // 8:
        return
    word = uint64(0)
    for j in range(min(8, n - 8 * g)):
        i = 8 * g + j
        scale = float64(scales[i // bucket])
        v = float64(x[i])
        y = abs(v) / scale * levels if scale > 0 else 0.0
        low = math.floor(y)
        u = float64(uniform32(key, uint64(offset + i))) / _TWO32
        level = min(low + (1.0 if u < y - low else 0.0), float64(levels))
        code = uint64(level) | (uint64(1 if v < 0 else 0) << uint64(bits - 1))
        word |= code << uint64(j * bits)
    for b in range(min(bits, out.size - g * bits)):
        out[g * bits + b] = uint8((word >> uint64(8 * b)) & uint64(0xFF))


@cuda.jit
def _dequantize(packed, n, scales, bucket, levels, bits, out):
    g = cuda.grid(1)
    if g >= (n + 7) // 8:
        return
    mask = uint64((1 << (bits - 1)) - 1)
    sign_bit = uint64(1 << (bits - 1))
    word = uint64(0)
    for b in range(min(bits, packed.size - g * bits)):
        word |= uint64(packed[g * bits + b]) << uint64(8 * b)
    for j in range(min(8, n - 8 * g)):
        code = (word >> uint64(j * bits)) & (mask | sign_bit)
        level = float64(code & mask)
        i = 8 * g + j
        step = float64(scales[i // bucket]) / levels
        out[i] = (-level if code & sign_bit else level) * step


def bucket_scales(x, bucket, norm, out):
    """See ``quant_ref.bucket_scales``. L2: the sqrt of each bucket's tree sum of squares
    (``tree_cuda.segment_sums``)."""
    if norm != "l2":
        launch(_max_abs, out.size, x, np.int64(bucket), out)
        return out
    launch(_sqrt_into, out.size, segment_sums(x, bucket, out.size, square=True), out)
    return out


def quantize(x, scales, bucket, levels, bits, key, offset, out):
    launch(_quantize, (x.size + 7) // 8, x, scales, np.int64(bucket), np.int64(levels),
           np.int64(bits), np.uint64(key), np.int64(offset), out)
    return out


def dequantize(packed, n, scales, bucket, levels, bits, out):
    launch(_dequantize, (n + 7) // 8, packed, np.int64(n), scales, np.int64(bucket),
           np.int64(levels), np.int64(bits), out)
    return out
