"""Two-stage all-reduce (DeepSpeed 1-bit style): all-to-all to chunk owners, all-gather back."""

from __future__ import annotations

import numpy as np

from ringcomp.collectives.base import register, register_compressed
from ringcomp.collectives.hops import DEFAULT_SEGMENT_BYTES, Hops
from ringcomp.collectives.shadow import oracle
from ringcomp.partition import block_bounds, even_segments

PHASE_SCATTER, PHASE_GATHER = 0, 1


def _chunks(n: int, p: int, seg_elems: int) -> list[list[tuple[int, int]]]:
    """The segments of every rank's chunk ``block_bounds(n, p)[c]``."""
    return [even_segments(lo, hi, max(1, seg_elems)) for lo, hi in block_bounds(n, p)]


def compression_segments(n: int, p: int, seg_elems: int) -> list[tuple[int, int]]:
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
            received[q] = [np.empty(size, dtype) for size in sizes(q)]
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


@register_compressed("twostage", segments=compression_segments)
def compressed_twostage_allreduce(ctx) -> None:
    """DeepSpeed-style compressed all-reduce: compress once, owner aggregates, compress once.

    Steps (chunks and segments as in the exact form; hop-0 keys for the workers' payloads):
      1. Encode every segment of the own input; send chunk c's payloads to rank c.
      2. Rank r aggregates the p payloads of chunk r in rank order by the compressor's rule:
         cascade - decode each, sum exactly, add the server residual of this bucket and
         chunk (with error feedback), re-encode once (key hop 1) and keep what that
         encoding lost as the new server residual; linear - add the payloads; Marsit -
         merge the k-th rank's bits with probability 1/k (key hop k).
      3. Send the owner's final payloads to every rank (unchanged); every rank decodes
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
        if comp.aggregation == "cascade":
            out = _owner_recompress(ctx, hops, chunks[r], rows)
            if shadow is not None:
                shadow.payloads(out, chunks[r], range(p), "owner", p - 1)
            return out
        out = []
        for s, (a, b) in enumerate(chunks[r]):
            payload = rows[0][s]
            for k in range(1, p):
                if comp.aggregation == "linear":
                    payload = hops.timed("merge", "owner", k, s, comp.add, payload,
                                         rows[k][s], b - a)
                else:
                    payload = hops.timed("merge", "owner", k, s, comp.merge, payload,
                                         rows[k][s], b - a, k, 1, ctx.key.at(k, a))
                if shadow is not None:  # ranks 0..k merged so far
                    shadow.payloads([payload], [(a, b)], range(k + 1), "owner", k)
            out.append(payload)
        return out

    def payload_size(c, s):
        a, b = chunks[c][s]
        return comp.nbytes(b - a)

    final = _scatter_gather(ctx, mine, payload_size, np.uint8, combine)
    for c in range(p):
        for s, ((a, b), payload) in enumerate(zip(chunks[c], final[c], strict=True)):
            hops.decode(payload, a, b, 0, s)


def _owner_recompress(ctx, hops, segments, rows) -> list:
    """Cascade at the owner: exact sum of the decoded rows, server error feedback, one
    re-encode per segment."""
    comp, memory = ctx.compressor, ctx.memory
    lo, hi = (segments[0][0], segments[-1][1]) if segments else (0, 0)
    total = np.zeros(hi - lo, ctx.src.dtype)
    part = ctx.scratch(hi - lo, slot=2)
    for row in rows:
        for s, (a, b) in enumerate(segments):
            hops.timed("decode", "owner", 0, s, comp.decode, row[s], b - a, part[a - lo:b - lo])
        total += part
    if memory is not None:
        total = memory.compensate(total, ctx.key.bucket, side="server")
    out = [hops.encode(total[a - lo:b - lo], a, 1, 0, s) for s, (a, b) in enumerate(segments)]
    if memory is not None:
        for s, (a, b) in enumerate(segments):
            comp.decode(out[s], b - a, part[a - lo:b - lo])
        memory.remember(total - part, ctx.key.bucket, side="server")
    return out
