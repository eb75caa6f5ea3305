"""The hop codecs a compiled compressed-ring walk calls: Marsit's signs, the scaled sign,
stochastic quantization (QSGD, TernGrad) and top-k, each the compressor's own bits through
its serial block kernels (``compressed_ring_native``)."""

from __future__ import annotations

from functools import lru_cache

import numba
import numpy as np

from ringcomp.compression.marsit import MarsitSigns
from ringcomp.compression.quantize import StochasticQuantizer
from ringcomp.compression.sign import ScaledSign
from ringcomp.compression.topk import TopK
from ringcomp.kernels import quant_numba as quant
from ringcomp.kernels import select_serial as select
from ringcomp.kernels import signs_blocks as signs

#: the hop rules compiled here
MARSIT, SIGN, QUANT, TOPK = range(4)
#: the elements a chunk may hold for a rule's walk on a process whose kernels run on
#: several threads: what its Python walk runs as one serial block kernel too
ONE_BLOCK = {MARSIT: 32 * signs.BLOCK, SIGN: signs.BLOCK // 8 * signs.TREE,
             QUANT: quant.BLOCK, TOPK: 32 * signs.BLOCK}


@lru_cache(maxsize=64)
def rule_of(comp) -> tuple[int, np.ndarray] | None:
    """(the rule, its constants) of a compressor whose hops are compiled here, else None;
    by exact class, as a subclass may change its codec. Constants: QSGD's and TernGrad's
    levels, bucket (0: the whole segment), bits per element and whether the scale is an L2
    norm; none for the others."""
    kind = type(comp)
    if kind is MarsitSigns:
        return MARSIT, np.zeros(0, np.int64)
    if kind is ScaledSign:
        return SIGN, np.zeros(0, np.int64)
    if kind is TopK:
        return TOPK, np.zeros(0, np.int64)
    if isinstance(comp, StochasticQuantizer) and kind.__module__ == StochasticQuantizer.__module__:
        return QUANT, np.array([comp.levels, comp.bucket, comp.bits, comp.norm == "l2"],
                               np.int64)
    return None


@numba.njit(inline="always")
def _words(n):
    return (n + 31) // 32


@numba.njit(nogil=True, cache=True)
def encode(rule, spec, x, payload, key, offset):
    """``x``'s payload into ``payload`` (bytes), as the compressor's ``encode`` with stream
    ``key`` at element ``offset``."""
    n = x.size
    if rule == MARSIT:
        signs.pack_block(x, payload.view(np.uint32)[:_words(n)])
    elif rule == SIGN:
        payload[:4].view(np.float32)[0] = signs.serial_mean_abs(x)
        signs.pack_block(x, payload[4:4 + 4 * _words(n)].view(np.uint32))
    elif rule == QUANT:
        _quantize(spec, x, payload, key, offset)
    else:
        select.topk_pack(x, payload)


@numba.njit(nogil=True, cache=True)
def join(rule, spec, incoming, x, out, scratch, take, key, offset):
    """``x`` joins ``incoming`` into ``out``, as the compressor's ``join``: Marsit's bits
    merged (its own taken with probability ``take`` / 2^32, stream ``key`` at element
    ``offset``), the scaled sign's fused decode-add-encode, and for the other cascades
    decode into ``scratch`` (the output's dtype), add, encode with ``key``. Returns
    ``decode``'s verdict on ``incoming`` (1: it cannot be of ``x``'s size), else 0."""
    n = x.size
    bad = 0
    if rule == MARSIT:
        w = _words(n)
        tail = n - 32 * (w - 1)
        last = signs.ALL_BITS if tail >= 32 else (np.uint32(1) << np.uint32(tail)) - np.uint32(1)
        signs.marsit_join_block(incoming.view(np.uint32)[:w], x, take, key,
                                 np.uint64(offset), last, out.view(np.uint32)[:w])
    elif rule == SIGN:
        w = _words(n)
        one = np.empty(1, x.dtype)
        one[0] = incoming[:4].view(np.float32)[0]
        rows = np.empty((n + signs.TREE - 1) // signs.TREE)
        signs.sign_join_rows(incoming[4:4 + 4 * w].view(np.uint32), one[0], -one[0], x,
                              out[4:4 + 4 * w].view(np.uint32), rows)
        out[:4].view(np.float32)[0] = signs.tree_of_rows(rows) / n
    else:
        partial = scratch[:n]
        bad = decode(rule, spec, incoming, partial)
        if bad:
            return bad
        for i in range(n):
            partial[i] += x[i]
        encode(rule, spec, partial, out, key, offset)
    return bad


@numba.njit(nogil=True, cache=True)
def decode(rule, spec, payload, out):
    """The values a payload stands for into ``out``, as the compressor's ``decode``;
    returns 1 for a payload that cannot be of ``out``'s size (top-k indices past its end:
    a peer's call of another length, no agreement), having written nothing past it,
    else 0."""
    n = out.size
    if rule <= SIGN:  # MARSIT or SIGN: sign bits
        head = 4 if rule == SIGN else 0
        scale = np.ones(1, out.dtype)
        if rule == SIGN:
            scale[0] = payload[:4].view(np.float32)[0]
        bits = select.as_bits(out)
        signs.unpack_bits_block(payload[head:head + 4 * _words(n)].view(np.uint32), n,
                                 bits, scale.view(bits.dtype)[0])
    elif rule == QUANT:
        levels, bucket, bits, count = _quant_shape(spec, n)
        scales = payload[:4 * count].view(np.float32)
        packed = payload[4 * count:]
        for lo in range(0, n, quant.BLOCK):
            hi = min(n, lo + quant.BLOCK)
            quant.dequantize_block(packed[lo // 8 * bits:(hi * bits + 7) // 8], scales,
                                    bucket, levels, bits, lo, out[lo:hi])
    else:
        k = payload.size // 8
        out[:] = 0
        index, values = payload[:4 * k].view(np.uint32), payload[4 * k:8 * k].view(np.float32)
        for j in range(k):
            if index[j] >= n:  # compiled code checks no bounds: it would write anywhere
                return 1
            out[index[j]] = values[j]
    return 0


@numba.njit(inline="always")
def _quant_shape(spec, n):
    """(levels, elements per bucket, bits per element, buckets) of a segment of ``n``."""
    bucket = spec[1] if spec[1] else max(n, 1)
    return spec[0], bucket, spec[2], max(1, (n + bucket - 1) // bucket)


@numba.njit(nogil=True, cache=True)
def _quantize(spec, x, payload, key, offset):
    """``StochasticQuantizer.encode``: each bucket's scale, then the codes block by block
    (``quant_numba``'s parallel kernels' blocks, in order)."""
    n = x.size
    levels, bucket, bits, count = _quant_shape(spec, n)
    scales = payload[:4 * count].view(np.float32)
    quant.scales_of(x, bucket, spec[3] != 0, scales, 0, count)
    packed = payload[4 * count:]
    for lo in range(0, n, quant.BLOCK):
        hi = min(n, lo + quant.BLOCK)
        quant.quantize_block(x[lo:hi], scales, bucket, levels, bits, key, lo, offset,
                              packed[lo // 8 * bits:(hi * bits + 7) // 8])
