"""Ring all-reduce: reduce-scatter then all-gather, segmented and pipelined."""

from __future__ import annotations

from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, Ctx, register
from ringcomp.collectives.schedule import (
    PHASE_AG,
    PHASE_RS,
    ring_chunk,
    ring_layout,
    ring_position,
)
from ringcomp.devices import device
from ringcomp.kernels import backends


def _layout(ctx, p: int):
    seg_elems = max(1, int(ctx.options.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
                    // ctx.itemsize)
    return ring_layout(ctx.buf.size, p, seg_elems)


def walk_reduce_scatter(ctx, group, chunks, phase: int, name: str, *, first, receive,
                        merge, shift: int = 0):
    """The ring's reduce-scatter walk, the one the exact ring, the compressed ring and the
    torus's rows and columns all take (``ring_chunk``'s schedule) around ``group`` (None:
    every rank in rank order); ``chunks[c]`` lists chunk c's segments. What travels and
    how a rank joins it are the caller's:

    - ``first(c)``: this rank's buffers for chunk c's segments, sent at step 0 (kept
      referenced until every send completes);
    - ``receive(c, step)``: the buffers chunk c's segments arrive in at ``step`` (posted
      one step ahead, so a buffer of step s is reused at step s + 2 at the earliest);
    - ``merge(incoming, c, seg, step)``: the buffer after this rank joined the incoming
      one of s + 1 ranks: forwarded at once as step s + 1's send, or, at the last step,
      kept as this rank's final one.

    Steps (rank r at position pos of q): 1. send ``first`` of chunk (pos + shift) % q;
    2. at step s receive chunk (pos - s - 1 + shift) % q and merge and forward each
    segment as it lands (the next step's receives already posted); 3. wait for every
    send. Returns (the chunk this rank owns, its final buffers): after the walk it holds
    chunk (pos + 1 + shift) % q joined over all q ranks.
    """
    q, pos, right, left = ring_position(ctx.rank, ctx.size, group)
    if q == 1:
        return 0, first(0)

    def post(step):
        c = ring_chunk(pos, step, q, PHASE_RS, shift)
        bufs = receive(c, step)
        return bufs, [ctx.irecv(buf, left, phase) for buf in bufs]

    keep = first(ring_chunk(pos, -1, q, PHASE_RS, shift))  # 1.
    sends = [ctx.isend(buf, right, phase) for buf in keep]
    pending, final = post(0), []
    for step in range(q - 1):  # 2.
        nxt = post(step + 1) if step + 1 < q - 1 else None
        c = ring_chunk(pos, step, q, PHASE_RS, shift)
        for seg, (incoming, recv) in enumerate(zip(*pending, strict=True)):
            ctx.wait(recv, name, step, seg, c)
            out = merge(incoming, c, seg, step)
            if nxt is None:
                final.append(out)
            else:
                keep.append(out)
                sends.append(ctx.isend(out, right, phase))
        pending = nxt
    ctx.waitall(sends, name, q - 2)  # 3.
    return ring_chunk(pos, -1, q, PHASE_AG, shift), final


def walk_allgather(ctx, group, owned: int, finals, phase: int, name: str, *, receive,
                   arrived=None, shift: int = 0) -> dict:
    """The ring's all-gather walk around ``group``, shared as ``walk_reduce_scatter``:
    this rank's ``finals`` of chunk ``owned`` and every chunk it receives (into
    ``receive(c)``, all posted first, matched in posting order) are forwarded unchanged.
    ``arrived(buf, c, seg, step)``: called for each segment once it is here and forwarded
    (step None: this rank's own, once their sends are posted).

    Steps: 1. post every receive, chunk (pos - s + shift) % q at step s; 2. send
    ``finals``; 3. forward each received segment as it lands, except at the last step,
    whose chunk the right neighbour already has. Invariant: every rank ends with the
    owners' bytes of every chunk, so replicas cannot drift. Returns {chunk: buffers}.
    """
    q, pos, right, left = ring_position(ctx.rank, ctx.size, group)
    done = {owned: finals}
    if q > 1:
        incoming = []
        for step in range(q - 1):  # 1.
            c = ring_chunk(pos, step, q, PHASE_AG, shift)
            done[c] = receive(c)
            incoming.append([ctx.irecv(buf, left, phase) for buf in done[c]])
        sends = [ctx.isend(buf, right, phase) for buf in finals]  # 2.
    if arrived is not None:
        for seg, buf in enumerate(finals):
            arrived(buf, owned, seg, None)
    for step in range(q - 1):  # 3.
        c = ring_chunk(pos, step, q, PHASE_AG, shift)
        for seg, (buf, recv) in enumerate(zip(done[c], incoming[step], strict=True)):
            ctx.wait(recv, name, step, seg, c)
            if step < q - 2:
                sends.append(ctx.isend(buf, right, phase))
            if arrived is not None:
                arrived(buf, c, seg, step)
    if q > 1:
        ctx.waitall(sends, name, q - 2)
    return done


class RingParts:
    """The exact ring's side of a walk over ``ctx.buf`` around ``p`` ranks: its chunks'
    segments, what a rank sends first, where each segment arrives and how the rank joins
    it. Shared by the exact ring's two phases and by an exact buffer riding along a
    compressed ring's walk (``Ctx.rider``: the same messages, the same sums, in one call).

    Out of place the input stays in ``ctx.src``: a chunk is read where the walk first
    touches it, and input + incoming is written into ``ctx.buf`` (each chunk is touched
    once, so no initial copy); incoming segments land in two scratch halves (slots 0 and
    1) alternating by step, so a receive of step s + 1 never lands on one still read."""

    def __init__(self, ctx, p: int):
        self.ctx = ctx
        self.chunks, self.segments, self.max_chunk = _layout(ctx, p)
        self._halves = None

    def first(self, c: int) -> list:
        return [self.ctx.src[a:b] for a, b in self.segments[c]]

    def receive(self, c: int, step: int) -> list:
        if self._halves is None:
            self._halves = (self.ctx.scratch(self.max_chunk, slot=0),
                            self.ctx.scratch(self.max_chunk, slot=1))
        lo, area = self.chunks[c][0], self._halves[step % 2]
        return [area[a - lo:b - lo] for a, b in self.segments[c]]

    def merge(self, incoming, c: int, seg: int, step: int):
        a, b = self.segments[c][seg]
        self.ctx.reduce_ordered(self.ctx.src[a:b], incoming, True, out=self.ctx.buf[a:b])
        return self.ctx.buf[a:b]

    def views(self, c: int) -> list:
        """Chunk c's segments of the output: where the all-gather receives them."""
        return [self.ctx.buf[a:b] for a, b in self.segments[c]]


def reduce_scatter_phase(ctx, shift: int = 0, group=None) -> None:
    """Ring reduce-scatter of ``ctx.buf`` in place over ``p - 1`` hops (p ranks: all of
    the communicator, or the ring ``group``, positions standing for ranks below), by
    ``walk_reduce_scatter`` with ``RingParts``: segments of the input go out at step 0;
    each incoming segment lands in a scratch half (double-buffered by step parity), input
    + incoming is written into the output and forwarded from there at once, so the
    reduction of one segment overlaps the next transfer.

    Invariant: after step s rank r holds the sum of s + 2 contributions of chunk
    (r - s - 1 + shift); after the phase it owns the full sum of chunk (r + 1 + shift) % p.
    """
    parts = RingParts(ctx, ring_position(ctx.rank, ctx.size, group)[0])
    walk_reduce_scatter(ctx, group, parts.segments, PHASE_RS, "reduce-scatter",
                        first=parts.first, receive=parts.receive, merge=parts.merge,
                        shift=shift)


def allgather_phase(ctx, shift: int = 0, group=None) -> None:
    """Ring all-gather of ``ctx.buf`` in place over ``p - 1`` hops (over ``group`` as in
    ``reduce_scatter_phase``) by ``walk_allgather``: rank r owns chunk (r + 1 + shift) % p
    on entry, and every segment is received straight into the buffer (disjoint regions).

    Invariant: after step s rank r holds the final values of s + 2 chunks; at the end every
    rank holds byte-for-byte the owners' chunks, so replicas cannot drift.
    """
    p, pos, _, _ = ring_position(ctx.rank, ctx.size, group)
    parts = RingParts(ctx, p)
    owned = ring_chunk(pos, -1, p, PHASE_AG, shift)
    walk_allgather(ctx, group, owned, parts.views(owned), PHASE_AG, "all-gather",
                   receive=parts.views, shift=shift)


def compiled_walk(transport, n: int, dtype, seg_elems: int, comp):
    """The ring's compiled host walk (``Algorithm.walk``, chosen by ``executor.compiled``)
    for sums of ``n`` elements of ``dtype`` in segments of ``seg_elems`` over
    ``transport``, bound: the exact walk (``ring_native``) for ``comp`` None, else the
    compressed ring's (``compressed_ring_native``); None where it does not apply. The
    exact walk only once Numba is loaded in this process (a compressor or any kernel loads
    it): never imported for it alone - Numba's import costs a process about 0.6 s, more
    than a short exact NumPy job's small calls would save. A compressed ring loads it on
    its first call, as its kernels would."""
    if comp is None:
        if not backends.numba_loaded():
            return None
        from ringcomp.collectives import ring_native

        return ring_native.bound(transport, ring_layout(n, transport.size, seg_elems), dtype)
    from ringcomp.collectives import compressed_ring_native

    return compressed_ring_native.bound(transport, comp, n, dtype, seg_elems)


@register("ring", options={"segment_bytes": DEFAULT_SEGMENT_BYTES}, walk=compiled_walk,
          carries_riders=True,
          summary="reduce-scatter + all-gather, 2(p-1) hops, bandwidth-optimal, pipelined")
def ring_allreduce(ctx) -> None:
    """Ring all-reduce = reduce-scatter phase + all-gather phase (2(p-1) hops): the
    Python walk (``executor.run`` runs the compiled one where it serves).

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
