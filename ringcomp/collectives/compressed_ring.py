"""Ring all-reduce with a compressor at every hop, joined by the compressor's hop rule."""

from __future__ import annotations

from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, register_compressed
from ringcomp.collectives.hops import Hops
from ringcomp.collectives.ring import walk_allgather, walk_reduce_scatter
from ringcomp.collectives.schedule import PHASE_AG, PHASE_RS, ring_layout
from ringcomp.collectives.shadow import Shadow


def ring_segments(n: int, p: int, seg_elems: int) -> list[tuple[int, int]]:
    """The ``(a, b)`` segments the compressed ring encodes, in order: every chunk's."""
    return [seg for chunk in ring_layout(n, p, max(1, seg_elems))[1] for seg in chunk]


@register_compressed("ring", segments=ring_segments, reads_input_first=True)
def compressed_ring_allreduce(ctx) -> None:
    """Ring all-reduce whose every message is a compressed payload: the Python walk
    (``executor.run`` runs the compiled one where it serves).

    Steps (rank r, chunks and segments as in the exact ring; a segment is the unit of
    compression and its payload size ``nbytes(len)`` is known to both ends):
      1. Reduce-scatter, step 0: send the payload of every segment of chunk r.
      2. Step s: receive the payloads of chunk (r - s - 1), a partial aggregate of s + 1
         ranks, and ``join`` this rank's segment to it (key hop s + 1):
         cascade - decode, add own values, re-encode;
         linear - add own payload in the compressed domain;
         Marsit - merge own sign bits, each bit taken with probability 1/(s + 2).
         Forward the result (step s + 1's send) or, at the last step, keep it: rank r
         then owns the final payload of chunk (r + 1).
      3. Every rank has read all of its input: agree that no rank's held NaN/Inf
         (``check_input``) before anything is written.
      4. All-gather: forward the final payloads unchanged around the ring.
      5. Every rank decodes every final payload into the output.

    Invariant: each chunk's final payload is produced once, by its owner, and every rank
    decodes the same bytes, so all ranks end bit-identical; random choices come from
    (seed, step, bucket, hop, element), so runs are reproducible.

    With a rider (``ctx.rider``, another buffer's exact ring) each chunk's messages are
    the payloads, then the rider's segments of the same chunk: one walk, one call, and
    the rider's sums are those of its own exact ring (same schedule, same operand order).
    """
    p = ctx.size
    comp = ctx.compressor
    seg_bytes = int(ctx.options.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
    seg_elems = max(1, seg_bytes // ctx.itemsize)
    _, segments, _ = ring_layout(ctx.src.size, p, seg_elems)
    hops = Hops(ctx)
    right, left = (ctx.rank + 1) % p, (ctx.rank - 1) % p
    shadow = Shadow(ctx) if ctx.shadow and p > 1 else None  # exact partials alongside
    exact = {}

    def payloads(c, step=None):
        return [ctx.empty(comp.nbytes(b - a)) for a, b in segments[c]]

    def own(c):  # 1.
        mine = [hops.own(a, b, 0, seg) for seg, (a, b) in enumerate(segments[c])]
        if shadow is not None:
            for a, b in segments[c]:
                shadow.send_own(a, b, right)
        return mine

    def join(incoming, c, seg, step):  # 2.
        a, b = segments[c][seg]
        out = hops.join(incoming, a, b, step, seg)
        if shadow is not None:
            if seg == 0:
                exact[step] = shadow.post(segments[c], left)
            shadow.join(exact[step], seg, a, b, step, c, out,
                        right if step < p - 2 else None)
        return out

    rider = ctx.rider
    walk = (own, payloads, join) if rider is None else _carrying(  # its segments after
        rider, segments, own, payloads, join)                      # every chunk's payloads
    owned, final = walk_reduce_scatter(ctx, None, segments, PHASE_RS, "reduce-scatter",
                                       first=walk[0], receive=walk[1], merge=walk[2])
    if shadow is not None:
        shadow.finish()
    ctx.agree_input()  # 3.

    def decode(payload, c, seg, step):  # 5.
        if seg < len(segments[c]):  # not a rider's segment: it arrived in its output
            a, b = segments[c][seg]
            hops.decode(payload, a, b, 0 if step is None else step, seg)

    def gathered(c):
        return payloads(c) + (rider.views(c) if rider is not None else [])

    # 4-5. all-gather of the final payloads, each decoded once forwarded
    walk_allgather(ctx, None, owned, final, PHASE_AG, "all-gather", receive=gathered,
                   arrived=decode)


def _carrying(rider, segments, own, payloads, join):
    """``own``, ``payloads`` and ``join`` of the compressed ring's reduce-scatter with the
    rider's exact segments after each chunk's payloads (its ``first``, ``receive`` and
    ``merge``)."""
    def own_and_rider(c):
        return own(c) + rider.first(c)

    def payloads_and_rider(c, step=None):
        return payloads(c) + rider.receive(c, step)

    def join_or_merge(incoming, c, seg, step):
        n = len(segments[c])
        if seg < n:
            return join(incoming, c, seg, step)
        return rider.merge(incoming, c, seg - n, step)

    return own_and_rider, payloads_and_rider, join_or_merge
