"""All-reduce by all-gather (GRACE-style): every rank gets every contribution and reduces."""

from __future__ import annotations

import numpy as np

from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, register, register_compressed
from ringcomp.collectives.hops import Hops
from ringcomp.collectives.ring import gather_rows
from ringcomp.collectives.shadow import oracle
from ringcomp.devices import device
from ringcomp.kernels import REDUCE_OPS
from ringcomp.partition import whole_vector_segments


def _reduce_rows(op: str, rows, out) -> None:
    """``out = rows[0] op rows[1] op ...`` in rank order: the same bytes on every rank."""
    out[...] = rows[0]
    for row in rows[1:]:
        REDUCE_OPS[op](out, row, out=out)


@register("allgather", options={"segment_bytes": 1 << 20},
          summary="all-gather every rank's vector, reduce locally (p·n bytes in, GRACE-style)")
def gather_allreduce(ctx) -> None:
    """Exact all-reduce by all-gather: the baseline that compressed gathers are measured on.

    Steps: 1. ring all-gather of the p input vectors; 2. every rank reduces them in rank
    order. Each rank receives (p - 1)·n elements - p/2 times the ring's traffic - which is
    why non-summable compressors that need this scheme scale badly.
    Invariant: every rank reduces the same rows in the same order: bit-identical results.
    """
    _reduce_rows(ctx.op, gather_rows(ctx, ctx.src), ctx.buf)


@register_compressed("allgather", segments=whole_vector_segments)
def compressed_gather_allreduce(ctx) -> None:
    """All-gather of compressed payloads, forwarded unchanged, decoded and summed by all.

    Steps: 1. encode the own vector segment by segment (hop 0 keys); 2. ring all-gather of
    the p payloads (bytes, unchanged on every hop - no cascading error); 3. decode every
    rank's payload and add them in rank order into the output; 4. ``settle`` the sum (sign
    bits, Marsit's: take its sign instead, signSGD with majority vote, ties -> +1).
    Invariant: all ranks decode the same bytes in the same order: bit-identical results;
    each contribution is compressed exactly once.
    """
    seg_bytes = int(ctx.options.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
    segments = whole_vector_segments(ctx.src.size, ctx.size, seg_bytes // ctx.itemsize)
    hops, shadow = Hops(ctx), oracle(ctx)
    own = [hops.own(a, b, 0, seg) for seg, (a, b) in enumerate(segments)]
    if shadow is not None:  # each message: one rank compressed once
        shadow.payloads(own, segments, [ctx.rank], "all-gather", 0)
    # every part starts 8-byte aligned, so a decoder's float32/uint64 views of it are
    # aligned too (a GPU faults on misaligned loads; the zero padding is never read)
    starts = np.cumsum([0] + [-(-part.size // 8) * 8 for part in own])
    payload = device.array_module(ctx.buf).zeros(int(starts[-1]), np.uint8)
    for start, part in zip(starts, own, strict=False):
        payload[start:start + part.size] = part
    rows = gather_rows(ctx, payload)
    ctx.buf[...] = 0
    decoded = ctx.scratch(ctx.src.size, slot=2)
    for row in rows:
        for (a, b), start, part in zip(segments, starts, own, strict=False):
            ctx.compressor.decode(row[start:start + part.size], b - a, decoded[a:b])
        ctx.buf += decoded
    ctx.compressor.settle(ctx.buf)  # sign bits: majority vote over the ranks' signs
    if shadow is not None:
        shadow.values(ctx.buf, 0, ctx.buf.size, range(ctx.size), "decode", ctx.size - 1, 0)
