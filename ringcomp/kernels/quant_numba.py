"""Numba versions of the stochastic quantization kernels, bit for bit equal to ``quant_ref``.

Eight codes of ``bits`` bits fill exactly ``bits`` bytes, so every group of eight elements
is packed or unpacked independently (``prange`` over groups, any thread count, same bytes).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from ringcomp.kernels.rng_numba import uniform32

_TWO32 = 2.0**32


@numba.njit(parallel=True, cache=True, nogil=True)
def _scales(x, bucket, l2, out):
    for j in prange(out.size):
        acc = 0.0
        for i in range(j * bucket, min(x.size, (j + 1) * bucket)):
            a = abs(np.float64(x[i]))
            acc = acc + a * a if l2 else max(acc, a)
        out[j] = np.float32(math.sqrt(acc) if l2 else acc)


@numba.njit(parallel=True, cache=True, nogil=True)
def _quantize(x, scales, bucket, levels, bits, key, offset, out):
    n = x.size
    sign_shift = bits - 1
    top = np.float64(levels)
    for g in prange((n + 7) // 8):
        word = np.uint64(0)
        first = 8 * g
        # the bucket of each element by stepping over its edges: one integer division per
        # group of eight, not one per element (it was the loop's slowest instruction)
        k = first // bucket
        edge = (k + 1) * bucket
        scale = np.float64(scales[k])
        for j in range(min(8, n - first)):
            i = first + j
            if i >= edge:
                k += 1
                edge += bucket
                scale = np.float64(scales[k])
            v = np.float64(x[i])
            y = abs(v) / scale * levels if scale > 0 else 0.0
            low = math.floor(y)
            u = np.float64(uniform32(key, np.uint64(offset + i))) / _TWO32
            level = min(low + (1.0 if u < y - low else 0.0), top)
            code = np.uint64(level) | (np.uint64(1 if v < 0 else 0) << np.uint64(sign_shift))
            word |= code << np.uint64(j * bits)
        for b in range(min(bits, out.size - g * bits)):
            out[g * bits + b] = np.uint8((word >> np.uint64(8 * b)) & np.uint64(0xFF))


@numba.njit(parallel=True, cache=True, nogil=True)
def _dequantize(packed, n, scales, bucket, levels, bits, out):
    mask = np.uint64((1 << (bits - 1)) - 1)
    sign_bit = np.uint64(1 << (bits - 1))
    for g in prange((n + 7) // 8):
        word = np.uint64(0)
        for b in range(min(bits, packed.size - g * bits)):
            word |= np.uint64(packed[g * bits + b]) << np.uint64(8 * b)
        first = 8 * g
        # a bucket's step (one division) once per bucket met in the group, not per element:
        # 2x faster, the same value
        k = first // bucket
        edge = (k + 1) * bucket
        step = np.float64(scales[k]) / levels
        for j in range(min(8, n - first)):
            i = first + j
            if i >= edge:
                k += 1
                edge += bucket
                step = np.float64(scales[k]) / levels
            code = (word >> np.uint64(j * bits)) & (mask | sign_bit)
            level = np.float64(code & mask)
            out[i] = (-level if code & sign_bit else level) * step


def bucket_scales(x, bucket, norm, out):
    _scales(x, np.int64(bucket), norm == "l2", out)
    return out


def quantize(x, scales, bucket, levels, bits, key, offset, out):
    _quantize(x, scales, np.int64(bucket), np.int64(levels), np.int64(bits), np.uint64(key),
              np.int64(offset), out)
    return out


def dequantize(packed, n, scales, bucket, levels, bits, out):
    _dequantize(packed, np.int64(n), scales, np.int64(bucket), np.int64(levels),
                np.int64(bits), out)
    return out
