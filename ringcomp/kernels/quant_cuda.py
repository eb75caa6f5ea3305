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

from ringcomp.kernels.arrays import array_module
from ringcomp.kernels.cuda_launch import launch, mul_f64, usable  # noqa: F401 - usable
from ringcomp.kernels.rng_cuda import uniform32
from ringcomp.kernels.signs_ref import TREE

_LANES = 32  # threads summing one tree row
_PER = TREE // _LANES  # elements per thread (TREE and LANES are powers of two)

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
def _segment_rows(a, segment, square, out):
    # Block b (one warp) sums row r of segment s (b = s·rows + r; segments of ``segment``
    # values of ``a``, rows of TREE, zeros past a segment's or a's end) as the reference
    # halves a row: 1. lane j loads values j + LANES·m (m < PER; coalesced), squared
    # (float64, rounded) when ``square``; 2. the halvings with h >= LANES pair values of
    # one lane, in registers; 3. the last log2(LANES) halvings go through shared memory.
    b, j = cuda.blockIdx.x, cuda.threadIdx.x
    rows = (segment + TREE - 1) // TREE
    s, r = b // rows, b % rows
    end = min(a.size, (s + 1) * segment)
    v = cuda.local.array(_PER, float64)
    for m in range(_PER):
        i = s * segment + r * TREE + j + _LANES * m
        e = abs(float64(a[i])) if i < end else 0.0
        v[m] = mul_f64(e, e) if square else e
    count = _PER
    while count > 1:
        count //= 2
        for m in range(count):
            v[m] = v[m] + v[m + count]
    row = cuda.shared.array(_LANES, float64)
    row[j] = v[0]
    cuda.syncthreads()
    h = _LANES // 2
    while h > 0:
        if j < h:
            row[j] = row[j] + row[j + h]
        cuda.syncthreads()
        h //= 2
    if j == 0:
        out[b] = row[0]


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
    """See ``quant_ref.bucket_scales``. L2: the tree level by level - each bucket's rows of
    squares, then its row sums as segments of their own, until one sum per bucket is left.
    Rows past a short last bucket's end sum to zeros, which the next level adds exactly
    where the reference pads with zeros."""
    if norm != "l2":
        launch(_max_abs, out.size, x, np.int64(bucket), out)
        return out
    xp = array_module(x)
    a, segment, square = x, bucket, True
    while True:
        rows = -(-segment // TREE)
        sums = xp.zeros(out.size * rows, np.float64)
        launch(_segment_rows, sums.size * _LANES, a, np.int64(segment), square, sums,
               threads=_LANES)  # a warp per row
        if rows == 1:
            break
        a, segment, square = sums, rows, False
    launch(_sqrt_into, out.size, sums, out)
    return out


def quantize(x, scales, bucket, levels, bits, key, offset, out):
    launch(_quantize, (x.size + 7) // 8, x, scales, np.int64(bucket), np.int64(levels),
           np.int64(bits), np.uint64(key), np.int64(offset), out)
    return out


def dequantize(packed, n, scales, bucket, levels, bits, out):
    launch(_dequantize, (n + 7) // 8, packed, np.int64(n), scales, np.int64(bucket),
           np.int64(levels), np.int64(bits), out)
    return out
