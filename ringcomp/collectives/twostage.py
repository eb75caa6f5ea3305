"""Two-stage all-reduce (DeepSpeed 1-bit style): all-to-all to chunk owners, all-gather back."""

from __future__ import annotations

import numpy as np

from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, register, register_compressed
from ringcomp.collectives.hops import Hops
from ringcomp.collectives.shadow import oracle
from ringcomp.partition import block_bounds, even_segments

PHASE_SCATTER, PHASE_GATHER = 0, 1


def _chunks(n: int, p: int, seg_elems: int) -> list[list[tuple[int, int]]]:
    """The segments of every rank's chunk ``block_bounds(n, p)[c]``."""
    return [even_segments(lo, hi, max(1, seg_elems)) for lo, hi in block_bounds(n, p)]


def twostage_segments(n: int, p: int, seg_elems: int) -> list[tuple[int, int]]:
    """The ``(a, b)`` segments a rank encodes in stage 1: every chunk's, in order."""
    return [seg for chunk in _chunks(n, p, seg_elems) for seg in chunk]


def _seg_elems(ctx) -> int:
    return int(ctx.options.get("segment_bytes", DEFAULT_SEGMENT_BYTES)) // ctx.itemsize


def _exchange(ctx, outgoing, sizes, dtype, phase: int, name: str, received: list) -> list:
    """With every other rank q: receive ``dtype`` messages of ``sizes(q)`` elements into
    ``received[q]`` while sending ``outgoing(q)``; wait for the receives, return the sends."""
    recvs, sends = [], []
    for q in range(ctx.size):
        if q != ctx.rank:
            received[q] = [ctx.empty(size, dtype) for size in sizes(q)]
            recvs += [(q, s, ctx.irecv(buf, q, phase)) for s, buf in enumerate(received[q])]
            sends += [ctx.isend(msg, q, phase) for msg in outgoing(q)]
    for q, s, recv in recvs:
        ctx.wait(recv, name, q, s)
    return sends


def _scatter_gather(ctx, mine: list, size_of, dtype, combine) -> list:
    """Stage 1: send ``mine[c]`` (the segment messages of chunk c) to rank c and receive
    every rank's messages of this rank's chunk; ``combine(rows)`` (rows in rank order) makes
    the owner's final messages. Stage 2: send those to every rank and receive every other
    owner's. Messages are ``dtype`` arrays of ``size_of(chunk, segment)`` elements. Returns
    the final messages of every chunk."""
    p, r = ctx.size, ctx.rank
    sizes = [[size_of(c, s) for s in range(len(mine[c]))] for c in range(p)]
    rows = [mine[r] if q == r else None for q in range(p)]
    sends = _exchange(ctx, lambda q: mine[q], lambda q: sizes[r], dtype, PHASE_SCATTER,
                      "all-to-all", rows)
    final = [None] * p
    final[r] = combine(rows)
    sends += _exchange(ctx, lambda q: final[r], lambda q: sizes[q], dtype, PHASE_GATHER,
                       "all-gather", final)
    ctx.waitall(sends, "sends")
    return final


@register("twostage", options={"segment_bytes": DEFAULT_SEGMENT_BYTES},
          summary="all-to-all of chunks to their owners, owner reduces, direct all-gather")
def twostage_allreduce(ctx) -> None:
    """Exact two-stage all-reduce: the baseline of DeepSpeed's compressed all-reduce.

    Steps (chunks c = block_bounds(n, p), cut into segments):
      1. Send chunk c of the input to rank c, for every c != r; receive chunk r from all.
      2. Rank r reduces its chunk over the p contributions in rank order 0, 1, ..., p - 1.
      3. Send the reduced chunk r to every rank; receive every other chunk from its owner.

    Two message rounds (latency 2 alpha, p - 1 messages a round per rank), 2(p-1)/p · n
    bytes sent per rank like the ring. Invariant: each chunk is reduced once, by its owner,
    in rank order, and every rank copies the owner's bytes: bit-identical results.
    """
    p, r = ctx.size, ctx.rank
    chunks = _chunks(ctx.src.size, p, _seg_elems(ctx))
    if p == 1:
        ctx.materialize()
        return

    def combine(rows):
        if ctx.in_place:  # the own row is a view of the output being written
            rows[r] = [row.copy() for row in rows[r]]
        out = []
        for s, (a, b) in enumerate(chunks[r]):
            total = ctx.buf[a:b]
            total[...] = rows[0][s]
            for row in rows[1:]:
                ctx.reduce(total, row[s])
            out.append(total)
        return out

    mine = [[ctx.src[a:b] for a, b in chunks[c]] for c in range(p)]
    final = _scatter_gather(ctx, mine, lambda c, s: chunks[c][s][1] - chunks[c][s][0],
                            ctx.buf.dtype, combine)
    for c in range(p):
        if c != r:
            for (a, b), msg in zip(chunks[c], final[c], strict=True):
                ctx.buf[a:b] = msg


@register_compressed("twostage", segments=twostage_segments)
def compressed_twostage_allreduce(ctx) -> None:
    """DeepSpeed-style compressed all-reduce: compress once, owner aggregates, compress once.

    Steps (chunks and segments as in the exact form; hop-0 keys for the workers' payloads):
      1. Encode every segment of the own input; send chunk c's payloads to rank c.
      2. Rank r ``combine``s the p payloads of chunk r in rank order (the k-th with key
         hop k): cascade decodes each and sums exactly; linear adds the payloads; Marsit
         merges the k-th rank's bits with probability 1/(k + 1).
      3. ``finish`` each segment once (key hop 1): cascade re-encodes the sum, first adding
         the server residual of this bucket and chunk (with error feedback), which then
         keeps what that encoding lost; the other rules lose nothing here.
      4. Send the owner's final payloads to every rank (unchanged); every rank decodes
         every chunk.

    Each contribution is compressed at most twice whatever p (no cascade along a chain),
    traffic per rank is about twice the compressed size. Invariant: all ranks decode the
    owners' bytes: bit-identical results.
    """
    p, r = ctx.size, ctx.rank
    comp, hops, shadow = ctx.compressor, Hops(ctx), oracle(ctx)
    chunks = _chunks(ctx.src.size, p, _seg_elems(ctx))
    mine = [[hops.own(a, b, 0, s) for s, (a, b) in enumerate(chunks[c])] for c in range(p)]
    if shadow is not None:  # a worker's payload: one rank compressed once
        shadow.payloads(mine[r], chunks[r], [r], "worker", 0)

    def combine(rows):
        lo, hi = block_bounds(ctx.src.size, p)[r]
        carry = None if ctx.memory is None else ctx.memory.server_residual(
            ctx.key.bucket, hi - lo, ctx.src.dtype, ctx.src)
        out = []
        for s, (a, b) in enumerate(chunks[r]):
            agg = None
            for k, row in enumerate(rows):  # 2. rank order
                agg = hops.combine(agg, row[s], a, b, k, 1, k, "owner", k, s)
            out.append(hops.finish(agg, a, 1, "owner", p - 1, s,  # 3.
                                   None if carry is None else carry[a - lo:b - lo]))
        if carry is not None:
            ctx.memory.remember(carry, ctx.key.bucket, side="server")
        if shadow is not None:
            shadow.payloads(out, chunks[r], range(p), "owner", p - 1)
        return out

    def payload_size(c, s):
        a, b = chunks[c][s]
        return comp.nbytes(b - a)

    final = _scatter_gather(ctx, mine, payload_size, np.uint8, combine)
    for c in range(p):
        for s, ((a, b), payload) in enumerate(zip(chunks[c], final[c], strict=True)):
            hops.decode(payload, a, b, 0, s)
