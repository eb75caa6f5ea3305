"""Binomial-tree all-reduce with compressed payloads: cascade, linear or Marsit aggregation."""

from __future__ import annotations

import numpy as np

from ringcomp.collectives.base import register_compressed
from ringcomp.collectives.hops import DEFAULT_SEGMENT_BYTES, Hops
from ringcomp.collectives.shadow import oracle
from ringcomp.collectives.tree import PHASE_REDUCE, binomial_broadcast
from ringcomp.partition import even_segments


class Partial:
    """What a tree node holds while reducing: raw values (cascade) or payloads, per segment,
    and how many ranks they cover. The segments are contiguous; cascade copies only their
    span ``[lo, hi)`` of the input (half of it on each tree of the dbtree)."""

    def __init__(self, hops: Hops, segments):
        self.hops, self.segments, self.count = hops, segments, 1
        self.lo = segments[0][0] if segments else 0
        agg = hops.comp.aggregation
        if agg == "cascade":  # raw values; encoded only when sent up
            hi = segments[-1][1] if segments else 0
            self.values = hops.ctx.src[self.lo:hi].copy()
            self.payloads = None
        else:
            self.values = None
            self.payloads = [hops.own(a, b, 0, seg) for seg, (a, b) in enumerate(segments)]

    def payload_sizes(self) -> list[int]:
        return [self.hops.comp.nbytes(b - a) for a, b in self.segments]

    def encoded(self, hop: int, step: int) -> list[np.ndarray]:
        """The aggregate's payloads (cascade encodes the raw values now, from stream ``hop``)."""
        if self.payloads is not None:
            return self.payloads
        lo = self.lo
        return [self.hops.encode(self.values[a - lo:b - lo], a, hop, step, seg)
                for seg, (a, b) in enumerate(self.segments)]

    def join(self, incoming: list[np.ndarray], covers: int, hop: int, level: int) -> None:
        """Add a child's aggregate of ``covers`` ranks (Marsit: its bits survive with
        probability covers / (self.count + covers), drawn from stream ``hop``)."""
        comp = self.hops.comp
        for seg, ((a, b), payload) in enumerate(zip(self.segments, incoming, strict=True)):
            if comp.aggregation == "cascade":
                decoded = self.hops.ctx.scratch(b - a, slot=3)
                self.hops.timed("decode", "reduce", level, seg, comp.decode, payload, b - a,
                                decoded)
                self.values[a - self.lo:b - self.lo] += decoded
            elif comp.aggregation == "linear":
                self.payloads[seg] = self.hops.timed("merge", "reduce", level, seg, comp.add,
                                                     self.payloads[seg], payload, b - a)
            else:
                self.payloads[seg] = self.hops.timed(
                    "merge", "reduce", level, seg, comp.merge, self.payloads[seg], payload,
                    b - a, self.count, covers, self.hops.key.at(hop, a))
        self.count += covers


def compression_segments(n: int, p: int, seg_elems: int) -> list[tuple[int, int]]:
    """The ``(a, b)`` segments the compressed tree encodes: the whole vector, cut evenly."""
    return even_segments(0, n, max(1, seg_elems))


@register_compressed("tree", segments=compression_segments)
def compressed_tree_allreduce(ctx) -> None:
    """Binomial reduce of compressed aggregates to rank 0, then broadcast of the payloads.

    Steps (relative rank v = r; segments of ``segment_bytes`` are the unit of encoding):
      1. Start from the own contribution: raw values (cascade) or own payloads.
      2. For mask = 1, 2, 4, ... (level 0, 1, 2, ...): if bit ``mask`` of v is set, send
         the aggregate encoded (cascade encodes here, once, from stream hop = (level + 1)·p
         + v) to v - mask and stop; else receive the
         aggregate of the subtree v + mask .. (min(p, v + 2 mask) - 1) and join it:
         cascade decodes it and adds; linear adds payloads; Marsit keeps the child's bit with
         probability (child's ranks) / (all ranks so far), from stream hop = level·p + v.
      3. Rank 0 encodes the total once; a binomial broadcast forwards those bytes unchanged
         and every rank decodes them.

    Invariant: each node's aggregate covers exactly the ranks of its subtree, and every rank
    decodes the root's bytes (bit-identical); Marsit's final bit of every element is the
    sign of a uniformly chosen rank.
    """
    p, v = ctx.size, ctx.rank
    seg_bytes = int(ctx.options.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
    segments = compression_segments(ctx.src.size, p, seg_bytes // ctx.itemsize)
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
            incoming = [np.empty(size, np.uint8) for size in sizes]
            recvs = [ctx.irecv(buf, v + mask, PHASE_REDUCE) for buf in incoming]
            ctx.waitall(recvs, "reduce", level)
            partial.join(incoming, min(mask, p - v - mask), (level + 1) * p + v, level)
        mask <<= 1
        level += 1
    if v == 0:
        final = partial.encoded((level + 1) * p, level)
        if shadow is not None:
            shadow.payloads(final, segments, range(p), "reduce", level)
    else:
        final = [np.empty(size, np.uint8) for size in sizes]
    binomial_broadcast(ctx, buffers=final)
    for seg, ((a, b), payload) in enumerate(zip(segments, final, strict=True)):
        hops.decode(payload, a, b, level, seg)
