"""Numba versions of the stochastic quantization kernels, bit for bit equal to ``quant_ref``.

Eight codes of ``bits`` bits fill exactly ``bits`` bytes, so every block of whole groups of
eight elements is packed or unpacked independently (``prange`` over blocks, any thread
count, same bytes). As in ``signs_numba``, each block runs serial loops LLVM vectorises.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from ringcomp.kernels.rng_numba import uniform32

_TWO32 = 2.0**32


#: buckets whose sums run side by side: independent dependency chains, so the float64
#: additions of one bucket (sequential, as the reference orders them) overlap the others'
LANES = 8


@numba.njit(nogil=True, cache=True)
def _bucket_norm(x, lo, hi, l2):
    acc = 0.0
    for i in range(lo, hi):
        a = abs(np.float64(x[i]))
        acc = acc + a * a if l2 else max(acc, a)
    return np.float32(math.sqrt(acc) if l2 else acc)


@numba.njit(nogil=True, cache=True)
def _lanes(x, bucket, l2, first, out):
    """Buckets ``first .. first + LANES`` (all whole): element i of every bucket, then
    element i + 1, ... Each bucket's sum keeps its own sequential order."""
    acc = np.zeros(LANES)
    for i in range(bucket):
        for t in range(LANES):
            a = abs(np.float64(x[(first + t) * bucket + i]))
            acc[t] = acc[t] + a * a if l2 else max(acc[t], a)
    for t in range(LANES):
        out[first + t] = np.float32(math.sqrt(acc[t]) if l2 else acc[t])


@numba.njit(parallel=True, cache=True, nogil=True)
def _scales(x, bucket, l2, out):
    whole = min(out.size, x.size // bucket) // LANES  # groups of LANES whole buckets
    for g in prange(whole):
        _lanes(x, bucket, l2, g * LANES, out)
    for j in prange(whole * LANES, out.size):
        out[j] = _bucket_norm(x, j * bucket, min(x.size, (j + 1) * bucket), l2)


#: elements per parallel task (whole groups of eight, whose codes fill whole bytes)
BLOCK = 2048


@numba.njit(nogil=True, cache=True)
def _pack_groups(codes, bits, out):
    """Eight codes (bytes) to ``bits`` bytes per group, the last group part-filled: a group
    read as one uint64."""
    groups = codes.size // 8
    whole = codes[:8 * groups].view(np.uint64)
    for g in range(groups):
        eight = whole[g]
        word = np.uint64(0)
        for j in range(8):
            word |= ((eight >> np.uint64(8 * j)) & np.uint64(0xFF)) << np.uint64(j * bits)
        for b in range(bits):
            out[g * bits + b] = np.uint8((word >> np.uint64(8 * b)) & np.uint64(0xFF))
    if groups * 8 < codes.size:
        word = np.uint64(0)
        for j in range(codes.size - 8 * groups):
            word |= np.uint64(codes[8 * groups + j]) << np.uint64(j * bits)
        for b in range(out.size - groups * bits):
            out[groups * bits + b] = np.uint8((word >> np.uint64(8 * b)) & np.uint64(0xFF))


@numba.njit(nogil=True, cache=True)
def _unpack_groups(packed, bits, codes):
    """The inverse of ``_pack_groups`` for ``codes.size`` codes."""
    mask = np.uint64((1 << bits) - 1)
    for g in range((codes.size + 7) // 8):
        word = np.uint64(0)
        for b in range(min(bits, packed.size - g * bits)):
            word |= np.uint64(packed[g * bits + b]) << np.uint64(8 * b)
        for j in range(min(8, codes.size - 8 * g)):
            codes[8 * g + j] = np.uint8((word >> np.uint64(j * bits)) & mask)


@numba.njit(nogil=True, cache=True)
def _quantize_block(x, scales, bucket, levels, bits, key, first, offset, out):
    """The codes of ``x`` (elements ``first ..`` of the vector, ``offset + first ..`` of
    the stream) packed into ``out`` (``bits`` bytes per group of eight).
    1. Bucket run by bucket run (one integer division per block, not per element), every
       element's code from the counter-based stream: a branch-free loop with the run's
       scale held, which LLVM vectorises (64-bit multiplies, float64 divisions); the
       bucket search and the packing inside it kept it scalar (20x slower).
    2. Eight codes to ``bits`` bytes."""
    codes = np.empty(x.size, np.uint8)
    top = np.float64(levels)
    sign = np.uint8(1 << (bits - 1))
    i, k = 0, first // bucket
    while i < x.size:  # 1.
        run = min(x.size - i, (k + 1) * bucket - (first + i))
        scale = np.float64(scales[k])
        xs, cs, at = x[i:i + run], codes[i:i + run], np.uint64(offset + first + i)
        for j in range(run):  # indices from 0: no negative-index checks, so vectorised
            v = np.float64(xs[j])
            y = abs(v) / scale * levels if scale > 0 else 0.0
            low = math.floor(y)
            u = np.float64(uniform32(key, at + np.uint64(j))) / _TWO32
            level = min(low + (1.0 if u < y - low else 0.0), top)
            cs[j] = np.uint8(level) | (sign if v < 0 else np.uint8(0))
        i += run
        k += 1
    _pack_groups(codes, bits, out)  # 2.


@numba.njit(parallel=True, cache=True, nogil=True)
def _quantize(x, scales, bucket, levels, bits, key, offset, out):
    for c in prange((x.size + BLOCK - 1) // BLOCK):
        lo = c * BLOCK
        hi = min(x.size, lo + BLOCK)
        _quantize_block(x[lo:hi], scales, bucket, levels, bits, key, lo, offset,
                        out[lo // 8 * bits:(hi * bits + 7) // 8])


@numba.njit(nogil=True, cache=True)
def _dequantize_block(packed, scales, bucket, levels, bits, first, out):
    """``out.size`` values (elements ``first ..``) from their packed codes: 1. the codes,
    eight per ``bits`` bytes; 2. ±level * step, bucket run by bucket run (the run's step,
    scale / levels, held)."""
    codes = np.empty(out.size, np.uint8)
    _unpack_groups(packed, bits, codes)  # 1.
    sign = np.uint8(1 << (bits - 1))
    i, k = 0, first // bucket
    while i < out.size:  # 2.
        run = min(out.size - i, (k + 1) * bucket - (first + i))
        step = np.float64(scales[k]) / levels
        cs, os = codes[i:i + run], out[i:i + run]
        for j in range(run):
            level = np.float64(cs[j] & (sign - np.uint8(1)))
            os[j] = (-level if cs[j] & sign else level) * step
        i += run
        k += 1


@numba.njit(parallel=True, cache=True, nogil=True)
def _dequantize(packed, n, scales, bucket, levels, bits, out):
    for c in prange((n + BLOCK - 1) // BLOCK):
        lo = c * BLOCK
        hi = min(n, lo + BLOCK)
        _dequantize_block(packed[lo // 8 * bits:(hi * bits + 7) // 8], scales, bucket, levels,
                          bits, lo, out[lo:hi])


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
