"""Numba versions of the stochastic quantization kernels, bit for bit equal to ``quant_ref``.

Eight codes of ``bits`` bits fill exactly ``bits`` bytes, so every block of whole groups of
eight elements is packed or unpacked independently (``prange`` over blocks, any thread
count, same bytes). As in ``signs_numba``, each block runs serial loops LLVM vectorises.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ringcomp.kernels.rng_numba import uniform32
from ringcomp.kernels.signs_ref import TREE

_TWO32 = 2.0**32


#: buckets per parallel task (each task owns one row of scratch)
CHUNK = 64


@numba.njit(inline="always")
def _halve(row):
    """``signs_ref.tree_sum``'s step 2 on one row of TREE float64: ``row[:h] + row[h:]``
    for h = TREE/2, ..., 1 (each level one loop LLVM vectorises)."""
    h = TREE // 2
    while h:
        for j in range(h):
            row[j] = row[j] + row[j + h]
        h //= 2
    return row[0]


@numba.njit(nogil=True, cache=True)
def _tree_norm(x, lo, hi, row, sums):
    """sqrt of ``signs_ref.tree_sum`` of the float64 squares of ``x[lo:hi]``, as
    ``quant_ref``: 1. rows of TREE squares (zeros past ``hi``) halved into ``sums``; 2. the
    row sums likewise, in place, until one is left. ``row``: TREE float64 of scratch;
    ``sums``: one per row."""
    if hi <= lo:
        return 0.0
    m = 0
    for base in range(lo, hi, TREE):
        count = min(TREE, hi - base)
        for j in range(count):
            a = abs(np.float64(x[base + j]))
            row[j] = a * a
        row[count:] = 0.0
        sums[m] = _halve(row)
        m += 1
    while m > 1:  # row r of this level overwrites sums[r], already read by rows <= r
        k = 0
        for base in range(0, m, TREE):
            count = min(TREE, m - base)
            row[:count] = sums[base:base + count]
            row[count:] = 0.0
            sums[k] = _halve(row)
            k += 1
        m = k
    return math.sqrt(sums[0])


@numba.njit(nogil=True, cache=True)
def _max_abs(x, lo, hi):
    acc = 0.0
    for i in range(lo, hi):
        acc = max(acc, abs(np.float64(x[i])))
    return acc


@numba.njit(nogil=True, cache=True)
def scales_of(x, bucket, l2, out, first, last):
    """The scales of buckets ``first`` to ``last`` (one parallel task's)."""
    row = np.empty(TREE)
    sums = np.empty((bucket + TREE - 1) // TREE)
    for j in range(first, last):
        lo, hi = j * bucket, min(x.size, (j + 1) * bucket)
        out[j] = np.float32(_tree_norm(x, lo, hi, row, sums) if l2 else _max_abs(x, lo, hi))


@numba.njit(parallel=True, cache=True, nogil=True)
def _scales(x, bucket, l2, out):
    for c in prange((out.size + CHUNK - 1) // CHUNK):
        scales_of(x, bucket, l2, out, c * CHUNK, min(out.size, (c + 1) * CHUNK))


#: elements per parallel task (whole groups of eight, whose codes fill whole bytes)
BLOCK = 2048


@numba.njit(inline="always")
def _squeeze(eight, bits):
    """Eight codes (the bytes of uint64 ``eight``, each < 2**bits) side by side, ``bits``
    each, in the low ``8 * bits`` bits: neighbours joined in 16-, 32-, then 64-bit lanes."""
    b = np.uint64(bits)
    w = ((eight & np.uint64(0x00FF00FF00FF00FF))
         | ((eight & np.uint64(0xFF00FF00FF00FF00)) >> (np.uint64(8) - b)))
    w = ((w & np.uint64(0x0000FFFF0000FFFF))
         | ((w & np.uint64(0xFFFF0000FFFF0000)) >> (np.uint64(16) - np.uint64(2) * b)))
    return (w & np.uint64(0xFFFFFFFF)) | ((w >> np.uint64(32)) << (np.uint64(4) * b))


@numba.njit(inline="always")
def _spread(w, bits):
    """The inverse of ``_squeeze``: eight ``bits``-bit codes back to one byte each."""
    b = np.uint64(bits)
    m4 = (np.uint64(1) << (np.uint64(4) * b)) - np.uint64(1)
    w = (w & m4) | (((w >> (np.uint64(4) * b)) & m4) << np.uint64(32))
    m2 = ((np.uint64(1) << (np.uint64(2) * b)) - np.uint64(1)) * np.uint64(0x0000000100000001)
    w = (w & m2) | (((w >> (np.uint64(2) * b)) & m2) << np.uint64(16))
    m1 = ((np.uint64(1) << b) - np.uint64(1)) * np.uint64(0x0001000100010001)
    return (w & m1) | (((w >> b) & m1) << np.uint64(8))


@numba.njit(inline="always")
def _tail_word(codes, start, bits):
    """Codes ``start ..`` (fewer than eight) side by side, ``bits`` each."""
    word = np.uint64(0)
    for j in range(codes.size - start):
        word |= np.uint64(codes[start + j]) << np.uint64(j * bits)
    return word


@numba.njit(nogil=True, cache=True)
def _pack_groups(codes, bits, out):
    """The codes, ``bits`` each, as one little-endian bit stream in ``out``
    (``ceil(codes.size * bits / 8)`` bytes).
    1. Every group of eight codes squeezed into ``8 * bits`` bits (``_squeeze``) and
       appended to a 64-bit accumulator, stored a whole word at a time: 2.6x the speed of
       storing each group's bytes.
    2. The last, partial group appended; the accumulator's remaining bytes stored."""
    groups = codes.size // 8
    whole = codes[:8 * groups].view(np.uint64)
    words = out[:out.size // 8 * 8].view(np.uint64)
    nb = np.uint64(8 * bits)
    acc, have, wi = np.uint64(0), np.uint64(0), 0
    for g in range(groups):  # 1.
        w = _squeeze(whole[g], bits)
        acc |= w << have
        have += nb
        if have >= np.uint64(64):
            words[wi] = acc
            wi += 1
            have -= np.uint64(64)
            acc = (w >> (nb - have)) if have > np.uint64(0) else np.uint64(0)
    high = np.uint64(0)  # 2.
    if groups * 8 < codes.size:
        tail = _tail_word(codes, 8 * groups, bits)
        high = (tail >> (np.uint64(64) - have)) if have > np.uint64(0) else np.uint64(0)
        acc |= tail << have
    for k in range(out.size - 8 * wi):
        word = acc if k < 8 else high
        out[8 * wi + k] = np.uint8((word >> np.uint64(8 * (k % 8))) & np.uint64(0xFF))


@intrinsic
def _load_u64(typingctx, bytes_, at):
    """The eight bytes of uint8 array ``bytes_`` from index ``at`` as one little-endian
    uint64: a single unaligned load (eight byte loads joined by shifts cost 2x)."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        address = builder.bitcast(builder.gep(array.data, [args[1]]),
                                  ir.IntType(64).as_pointer())
        return builder.load(address, align=1)
    return types.uint64(bytes_, at), codegen


@numba.njit(nogil=True, cache=True)
def _unpack_groups(packed, bits, codes):
    """The inverse of ``_pack_groups`` for ``codes.size`` codes: each group's ``bits``
    bytes read as one unaligned eight-byte word from its start and spread back to eight
    codes (``_spread``); the groups whose eight bytes would run past the end, and the
    last partial group, byte by byte."""
    groups = codes.size // 8
    whole = codes[:8 * groups].view(np.uint64)
    mask = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - 8 * bits)
    fits = max(0, min(groups, (packed.size - 8) // bits + 1))
    for g in range(fits):
        whole[g] = _spread(_load_u64(packed, g * bits) & mask, bits)
    for g in range(fits, (codes.size + 7) // 8):
        word = np.uint64(0)
        for k in range(min(bits, packed.size - g * bits)):
            word |= np.uint64(packed[g * bits + k]) << np.uint64(8 * k)
        if g < groups:
            whole[g] = _spread(word, bits)
        else:
            for j in range(codes.size - 8 * g):
                codes[8 * g + j] = np.uint8((word >> np.uint64(j * bits))
                                            & np.uint64((1 << bits) - 1))


@numba.njit(nogil=True, cache=True)
def quantize_block(x, scales, bucket, levels, bits, key, first, offset, out):
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
        quantize_block(x[lo:hi], scales, bucket, levels, bits, key, lo, offset,
                        out[lo // 8 * bits:(hi * bits + 7) // 8])


@numba.njit(nogil=True, cache=True)
def dequantize_block(packed, scales, bucket, levels, bits, first, out):
    """``out.size`` values (elements ``first ..``) from their packed codes: 1. the codes,
    eight per ``bits`` bytes; 2. ±level * step, bucket run by bucket run (the run's step,
    scale / levels, held), the sign applied as a factor of ±1 (exact, so the reference's
    bits; a branch on it mispredicted on every other random code: 1.5x slower)."""
    codes = np.empty(out.size, np.uint8)
    _unpack_groups(packed, bits, codes)  # 1.
    low = np.uint8((1 << (bits - 1)) - 1)
    shift = np.uint8(bits - 1)
    i, k = 0, first // bucket
    while i < out.size:  # 2.
        run = min(out.size - i, (k + 1) * bucket - (first + i))
        step = np.float64(scales[k]) / levels
        cs, os = codes[i:i + run], out[i:i + run]
        for j in range(run):
            level = np.float64(cs[j] & low)
            negative = np.float64(cs[j] >> shift)
            os[j] = level * (1.0 - 2.0 * negative) * step
        i += run
        k += 1


@numba.njit(parallel=True, cache=True, nogil=True)
def _dequantize(packed, n, scales, bucket, levels, bits, out):
    for c in prange((n + BLOCK - 1) // BLOCK):
        lo = c * BLOCK
        hi = min(n, lo + BLOCK)
        dequantize_block(packed[lo // 8 * bits:(hi * bits + 7) // 8], scales, bucket, levels,
                          bits, lo, out[lo:hi])


def bucket_scales(x, bucket, norm, out):
    if out.size <= CHUNK:  # one task: its kernel itself, not a parallel region
        scales_of(x, np.int64(bucket), norm == "l2", out, np.int64(0), np.int64(out.size))
    else:
        _scales(x, np.int64(bucket), norm == "l2", out)
    return out


def quantize(x, scales, bucket, levels, bits, key, offset, out):
    if x.size <= BLOCK:  # one task: its kernel itself, not a parallel region
        quantize_block(x, scales, np.int64(bucket), np.int64(levels), np.int64(bits),
                        np.uint64(key), np.int64(0), np.int64(offset),
                        out[:(x.size * bits + 7) // 8])
        return out
    _quantize(x, scales, np.int64(bucket), np.int64(levels), np.int64(bits), np.uint64(key),
              np.int64(offset), out)
    return out


def dequantize(packed, n, scales, bucket, levels, bits, out):
    if n <= BLOCK:  # one task: its kernel itself
        dequantize_block(packed[:(n * bits + 7) // 8], scales, np.int64(bucket),
                          np.int64(levels), np.int64(bits), np.int64(0), out[:n])
        return out
    _dequantize(packed, np.int64(n), scales, np.int64(bucket), np.int64(levels),
                np.int64(bits), out)
    return out
