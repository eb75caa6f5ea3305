"""Binomial-tree all-reduce with compressed payloads, aggregated by the compressor's hop rule."""

from __future__ import annotations

import numpy as np

from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, register_compressed
from ringcomp.collectives.hops import Hops
from ringcomp.collectives.shadow import oracle
from ringcomp.collectives.tree import PHASE_REDUCE, binomial_broadcast
from ringcomp.partition import whole_vector_segments


class Partial:
    """What a tree node holds while reducing: the compressor's partial aggregate of every
    segment (raw sums for a cascading rule, payloads otherwise) and how many ranks it
    covers."""

    def __init__(self, hops: Hops, segments):
        self.hops, self.segments, self.count = hops, segments, 1
        self.aggs = [hops.start(a, b, seg) for seg, (a, b) in enumerate(segments)]

    def payload_sizes(self) -> list[int]:
        return [self.hops.comp.nbytes(b - a) for a, b in self.segments]

    def encoded(self, hop: int, step: int) -> list[np.ndarray]:
        """The aggregate's payloads (a cascading rule encodes now, from stream ``hop``)."""
        return [self.hops.finish(agg, a, hop, "reduce", step, seg)
                for seg, ((a, _), agg) in enumerate(zip(self.segments, self.aggs, strict=True))]

    def combine(self, incoming: list[np.ndarray], covers: int, hop: int, level: int) -> None:
        """Add a child's aggregate of ``covers`` ranks (random choices from stream ``hop``;
        Marsit keeps the child's bits with probability covers / (self.count + covers))."""
        for seg, ((a, b), payload) in enumerate(zip(self.segments, incoming, strict=True)):
            self.aggs[seg] = self.hops.combine(self.aggs[seg], payload, a, b, self.count,
                                               covers, hop, "reduce", level, seg)
        self.count += covers


@register_compressed("tree", segments=whole_vector_segments)
def compressed_tree_allreduce(ctx) -> None:
    """Binomial reduce of compressed aggregates to rank 0, then broadcast of the payloads.

    Steps (relative rank v = r; segments of ``segment_bytes`` are the unit of encoding):
      1. Start from the own contribution (``start``: raw values for a cascading rule,
         the own payloads otherwise).
      2. For mask = 1, 2, 4, ... (level 0, 1, 2, ...): if bit ``mask`` of v is set, send
         the aggregate's payloads (``finish``: cascade encodes here, once, from stream
         hop = (level + 1)·p + v) to v - mask and stop; else receive the aggregate of the
         subtree v + mask .. (min(p, v + 2 mask) - 1) and ``combine`` it (stream hop =
         (level + 1)·p + v): cascade decodes it and adds; linear adds payloads; Marsit
         keeps the child's bit with probability (child's ranks) / (all ranks so far).
      3. Rank 0 encodes the total once; a binomial broadcast forwards those bytes unchanged
         and every rank decodes them.

    Invariant: each node's aggregate covers exactly the ranks of its subtree, and every rank
    decodes the root's bytes (bit-identical); Marsit's final bit of every element is the
    sign of a uniformly chosen rank.
    """
    p, v = ctx.size, ctx.rank
    seg_bytes = int(ctx.options.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
    segments = whole_vector_segments(ctx.src.size, p, seg_bytes // ctx.itemsize)
    hops, shadow = Hops(ctx), oracle(ctx)
    partial = Partial(hops, segments)
    sizes = partial.payload_sizes()
    mask, level = 1, 0
    while mask < p:
        if v & mask:
            up = partial.encoded((level + 1) * p + v, level)
            sends = [ctx.isend(payload, v - mask, PHASE_REDUCE) for payload in up]
            if shadow is not None:  # the subtree's aggregate, ranks v .. v + count - 1
                shadow.payloads(up, segments, range(v, v + partial.count), "reduce", level)
            ctx.waitall(sends, "reduce", level)
            break
        if v + mask < p:
            incoming = [ctx.empty(size) for size in sizes]
            recvs = [ctx.irecv(buf, v + mask, PHASE_REDUCE) for buf in incoming]
            ctx.waitall(recvs, "reduce", level)
            partial.combine(incoming, min(mask, p - v - mask), (level + 1) * p + v, level)
        mask <<= 1
        level += 1
    if v == 0:
        final = partial.encoded((level + 1) * p, level)
        if shadow is not None:
            shadow.payloads(final, segments, range(p), "reduce", level)
    else:
        final = [ctx.empty(size) for size in sizes]
    binomial_broadcast(ctx, buffers=final)
    for seg, ((a, b), payload) in enumerate(zip(segments, final, strict=True)):
        hops.decode(payload, a, b, level, seg)
