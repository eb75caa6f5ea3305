"""Ring all-reduce: reduce-scatter then all-gather, segmented and pipelined."""

from __future__ import annotations

from functools import lru_cache

from ringcomp import device
from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, Ctx, register
from ringcomp.partition import block_bounds, even_segments

PHASE_RS, PHASE_AG = 0, 1


@lru_cache(maxsize=256)
def ring_layout(n: int, p: int, seg_elems: int):
    """Chunk bounds and their segments: ``(chunks, segments_per_chunk, max_chunk)``."""
    chunks = block_bounds(n, p)
    segments = [even_segments(lo, hi, seg_elems) for lo, hi in chunks]
    return chunks, segments, max(hi - lo for lo, hi in chunks)


def ring_chunk(rank: int, step: int, p: int, phase: int, shift: int = 0) -> int:
    """The ring's schedule, shared by the exact ring, the compressed ring and the tests'
    simulations: the chunk ``rank`` receives at ``step`` of ``phase``.

    Reduce-scatter (``PHASE_RS``): step s brings chunk (rank - s - 1 + shift) % p, a partial
    aggregate of s + 1 ranks, which ``rank`` joins; step -1 names the chunk it sends first
    (its own). All-gather (``PHASE_AG``): step s brings chunk (rank - s + shift) % p; step -1
    names the chunk ``rank`` owns when the all-gather starts, (rank + 1 + shift) % p.
    """
    return (rank - step - 1 + shift) % p if phase == PHASE_RS else (rank - step + shift) % p


def ring_position(rank: int, size: int, group=None) -> tuple[int, int, int, int]:
    """``(p, r, right, left)``: the ring's length, ``rank``'s position on it and its
    neighbours' ranks. ``group``: the communicator ranks forming the ring, in ring order
    (a row or a column of a torus); None: all ``size`` ranks in rank order."""
    if group is None:
        return size, rank, (rank + 1) % size, (rank - 1) % size
    p, r = len(group), group.index(rank)
    return p, r, group[(r + 1) % p], group[(r - 1) % p]


def _layout(ctx, p: int):
    seg_elems = max(1, int(ctx.options.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
                    // ctx.itemsize)
    return ring_layout(ctx.buf.size, p, seg_elems)


def reduce_scatter_phase(ctx, shift: int = 0, group=None) -> None:
    """Ring reduce-scatter of ``ctx.buf`` in place over ``p - 1`` hops (p ranks: all of
    the communicator, or the ring ``group``, positions standing for ranks below).

    Steps (rank r, right = r+1, left = r-1, chunks c = block_bounds(n, p)):
      1. Step 0: send every segment of chunk (r + shift) of the input to the right.
      2. Step s: receive the segments of chunk (r - s - 1 + shift) from the left into a
         scratch half (double-buffered by step parity, posted one step ahead), write
         input + incoming into the output as soon as each segment lands (each chunk is
         touched once, so out of place needs no initial copy), and forward it at once as
         step s + 1's send, so the reduction of one segment overlaps the next transfer.
      3. Wait for all sends before the buffer is overwritten by the all-gather.

    Invariant: after step s rank r holds the sum of s + 2 contributions of chunk
    (r - s - 1 + shift); after the phase it owns the full sum of chunk (r + 1 + shift) % p.
    """
    p, r, right, left = ring_position(ctx.rank, ctx.size, group)
    chunks, segments, max_chunk = _layout(ctx, p)
    buf, src = ctx.buf, ctx.src
    halves = (ctx.scratch(max_chunk, slot=0), ctx.scratch(max_chunk, slot=1))

    def post(step):
        c = ring_chunk(r, step, p, PHASE_RS, shift)
        lo = chunks[c][0]
        area = halves[step % 2]
        return [ctx.irecv(area[a - lo:b - lo], left, PHASE_RS) for a, b in segments[c]]

    sends = [ctx.isend(src[a:b], right, PHASE_RS)
             for a, b in segments[ring_chunk(r, -1, p, PHASE_RS, shift)]]
    pending = post(0)
    for step in range(p - 1):
        nxt = post(step + 1) if step + 1 < p - 1 else None
        c = ring_chunk(r, step, p, PHASE_RS, shift)
        lo = chunks[c][0]
        area = halves[step % 2]
        for seg, ((a, b), recv) in enumerate(zip(segments[c], pending, strict=True)):
            ctx.wait(recv, "reduce-scatter", step, seg, c)
            ctx.reduce_ordered(src[a:b], area[a - lo:b - lo], True, out=buf[a:b])
            if nxt is not None:
                sends.append(ctx.isend(buf[a:b], right, PHASE_RS))
        pending = nxt
    ctx.waitall(sends, "reduce-scatter", p - 2)


def allgather_phase(ctx, shift: int = 0, group=None) -> None:
    """Ring all-gather of ``ctx.buf`` in place over ``p - 1`` hops (over ``group`` as in
    ``reduce_scatter_phase``).

    Steps (rank r owns chunk (r + 1 + shift) % p on entry):
      1. Post receives for every segment of chunks (r - s + shift), s = 0..p-2, straight into
         the buffer (disjoint regions, matched in posting order).
      2. Send the owned chunk to the right; forward each received segment as soon as it lands
         (except at the last step, whose chunk the right neighbour already has).

    Invariant: after step s rank r holds the final values of s + 2 chunks; at the end every
    rank holds byte-for-byte the owners' chunks, so replicas cannot drift.
    """
    p, r, right, left = ring_position(ctx.rank, ctx.size, group)
    _, segments, _ = _layout(ctx, p)
    buf = ctx.buf
    recvs = [[ctx.irecv(buf[a:b], left, PHASE_AG)
              for a, b in segments[ring_chunk(r, s, p, PHASE_AG, shift)]] for s in range(p - 1)]
    sends = [ctx.isend(buf[a:b], right, PHASE_AG)
             for a, b in segments[ring_chunk(r, -1, p, PHASE_AG, shift)]]
    for step in range(p - 1):
        c = ring_chunk(r, step, p, PHASE_AG, shift)
        for seg, ((a, b), recv) in enumerate(zip(segments[c], recvs[step], strict=True)):
            ctx.wait(recv, "all-gather", step, seg, c)
            if step < p - 2:
                sends.append(ctx.isend(buf[a:b], right, PHASE_AG))
    ctx.waitall(sends, "all-gather", p - 2)


@register("ring", options={"segment_bytes": DEFAULT_SEGMENT_BYTES},
          summary="reduce-scatter + all-gather, 2(p-1) hops, bandwidth-optimal, pipelined")
def ring_allreduce(ctx) -> None:
    """Ring all-reduce = reduce-scatter phase + all-gather phase (2(p-1) hops).

    Each rank sends and receives 2(p-1)/p * n elements in total, the bandwidth optimum.
    """
    if ctx.size == 1:
        ctx.materialize()
        return
    reduce_scatter_phase(ctx)
    allgather_phase(ctx)


def gather_rows(ctx, row, tracer="inherit"):
    """Ring all-gather of one equal-length row per rank into a (p, len) array (the
    caller's tracer records the hops unless ``tracer`` says otherwise)."""
    rows = device.array_module(row).empty((ctx.size, row.size), row.dtype)
    rows[ctx.rank] = row
    if ctx.size > 1 and row.size:
        inner = Ctx(ctx.t, rows.reshape(-1), "sum", ctx.algorithm, dict(ctx.options),
                    ctx.tracer if tracer == "inherit" else tracer, "allgather")
        allgather_phase(inner, shift=-1)
    return rows
