"""Ring all-reduce with a compressor at every hop, joined by the compressor's hop rule."""

from __future__ import annotations

from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, register_compressed
from ringcomp.collectives.hops import Hops
from ringcomp.collectives.ring import PHASE_AG, PHASE_RS, ring_chunk, ring_layout
from ringcomp.collectives.shadow import Shadow


def ring_segments(n: int, p: int, seg_elems: int) -> list[tuple[int, int]]:
    """The ``(a, b)`` segments the compressed ring encodes, in order: every chunk's."""
    return [seg for chunk in ring_layout(n, p, max(1, seg_elems))[1] for seg in chunk]


@register_compressed("ring", segments=ring_segments, reads_input_first=True)
def compressed_ring_allreduce(ctx) -> None:
    """Ring all-reduce whose every message is a compressed payload.

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
    """
    p, r = ctx.size, ctx.rank
    comp = ctx.compressor
    seg_bytes = int(ctx.options.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
    chunks, segments, _ = ring_layout(ctx.src.size, p, max(1, seg_bytes // ctx.itemsize))
    hops = Hops(ctx)
    if p == 1:
        own = [hops.own(a, b, 0, seg) for seg, (a, b) in enumerate(segments[0])]
        ctx.agree_input()
        for seg, ((a, b), payload) in enumerate(zip(segments[0], own, strict=True)):
            hops.decode(payload, a, b, 0, seg)
        return
    right, left = (r + 1) % p, (r - 1) % p

    def post(phase, chunk):
        bufs = [ctx.empty(comp.nbytes(b - a)) for a, b in segments[chunk]]
        return bufs, [ctx.irecv(buf, left, phase) for buf in bufs]

    # 1-2. reduce-scatter (shadow mode: exact partial sums travel alongside)
    shadow = Shadow(ctx) if ctx.shadow else None
    first = ring_chunk(r, -1, p, PHASE_RS)  # the own chunk, each segment sent once encoded
    keep, sends = [], []
    for seg, (a, b) in enumerate(segments[first]):
        keep.append(hops.own(a, b, 0, seg))
        sends.append(ctx.isend(keep[-1], right, PHASE_RS))
    if shadow is not None:
        for a, b in segments[first]:
            shadow.send_own(a, b, right)
    pending = post(PHASE_RS, ring_chunk(r, 0, p, PHASE_RS))
    final = []
    for step in range(p - 1):
        nxt = post(PHASE_RS, ring_chunk(r, step + 1, p, PHASE_RS)) if step + 1 < p - 1 else None
        c = ring_chunk(r, step, p, PHASE_RS)
        exact = shadow.post(segments[c], left) if shadow is not None else None
        for seg, ((a, b), inc, recv) in enumerate(zip(segments[c], *pending, strict=True)):
            ctx.wait(recv, "reduce-scatter", step, seg, c)
            out = hops.join(inc, a, b, step, seg)
            if nxt is not None:
                keep.append(out)
                sends.append(ctx.isend(out, right, PHASE_RS))
            else:
                final.append(out)
            if shadow is not None:
                shadow.join(exact, seg, a, b, step, c, out, right if nxt is not None else None)
        pending = nxt
    ctx.waitall(sends, "reduce-scatter", p - 2)
    if shadow is not None:
        shadow.finish()
    ctx.agree_input()  # 3.

    # 4-5. all-gather of the final payloads, decoded as they arrive
    owner_chunk = ring_chunk(r, -1, p, PHASE_AG)
    incoming = [post(PHASE_AG, ring_chunk(r, s, p, PHASE_AG)) for s in range(p - 1)]
    sends = [ctx.isend(payload, right, PHASE_AG) for payload in final]
    for seg, ((a, b), payload) in enumerate(zip(segments[owner_chunk], final, strict=True)):
        hops.decode(payload, a, b, 0, seg)
    for step in range(p - 1):
        c = ring_chunk(r, step, p, PHASE_AG)
        bufs, recvs = incoming[step]
        for seg, ((a, b), payload, recv) in enumerate(zip(segments[c], bufs, recvs,
                                                          strict=True)):
            ctx.wait(recv, "all-gather", step, seg, c)
            if step < p - 2:
                sends.append(ctx.isend(payload, right, PHASE_AG))
            hops.decode(payload, a, b, step, seg)
    ctx.waitall(sends, "all-gather", p - 2)
