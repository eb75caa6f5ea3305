"""2D-torus all-reduce with compressed payloads: compressed rings along the rows, the
compressor's combine along the columns."""

from __future__ import annotations

from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, register_compressed
from ringcomp.collectives.compressed_ring import ring_segments
from ringcomp.collectives.hops import Hops
from ringcomp.collectives.ring import walk_allgather, walk_reduce_scatter
from ringcomp.collectives.schedule import ring_layout
from ringcomp.collectives.shadow import oracle
from ringcomp.collectives.torus import torus_groups, torus_shape

PHASE_ROW_RS, PHASE_ROW_AG, PHASE_COLUMN_RS, PHASE_COLUMN_AG = 0, 1, 2, 3


def _payloads(ctx, chunks):
    """Receive buffers for chunk c's payloads (one per segment), as the walks ask."""
    return lambda c, step=None: [ctx.empty(ctx.compressor.nbytes(b - a)) for a, b in chunks[c]]


@register_compressed("torus", segments=ring_segments)
def compressed_torus_allreduce(ctx) -> None:
    """2D-torus all-reduce whose every message is a compressed payload.

    Layout: the buffer is cut into p blocks as on the compressed ring (so error feedback
    sees the ring's segments whatever the shape); row chunk c is blocks c·R .. c·R + R - 1
    and its piece k is block c·R + k. Rank r sits at row i = r // C, column j = r % C.

    Steps (a segment is the unit of compression):
      1. Row reduce-scatter, a compressed ring over the row's C ranks: at step s this
         rank's segments ``join`` the incoming aggregate of s + 1 ranks (cascade: decode,
         add, re-encode; linear: add payloads; Marsit: own bit with probability 1/(s + 2);
         stream hop 1 + i·C + s). Column j ends owning chunk (j + 1) % C, aggregated over
         its row.
      2. Column reduce-scatter over the column's R ranks on that chunk's R pieces: at
         step s the incoming aggregate of (s + 1)·C ranks and this rank's of C meet by
         ``combine`` and ``finish`` (cascade: decode both, add, re-encode; linear: add;
         Marsit: own bits with probability C / ((s + 2)·C); stream hop 1 + p + j·R + s).
         A piece's owner ends with its payload over all p ranks.
      3. Column all-gather, then row all-gather, of the final payloads, unchanged.
      4. Every rank decodes every payload.

    Invariant: each piece's final payload is made once, by its owner, and every rank
    decodes the same bytes (bit-identical); Marsit's final bit per element is the sign
    of a uniformly chosen rank (uniform in the row, rows uniform), so it stays unbiased.
    A contribution is re-encoded at most (C - 1) + (R - 1) times, the ring's p - 1: a
    cascading compressor's error grows with the hops of a row plus a column.
    """
    p, hops, shadow = ctx.size, Hops(ctx), oracle(ctx)
    rows, cols = torus_shape(ctx.t, ctx.options.get("torus", "auto"))
    row_group, col_group = torus_groups(ctx.rank, rows, cols)
    i, j = divmod(ctx.rank, cols)
    seg_bytes = int(ctx.options.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
    blocks = ring_layout(ctx.src.size, p, max(1, seg_bytes // ctx.itemsize))[1]
    chunks = [[s for k in range(rows) for s in blocks[c * rows + k]] for c in range(cols)]

    def record(payloads, segments, ranks, phase, step):
        if shadow is not None:
            shadow.payloads(payloads, segments, ranks, phase, step)

    # 1. row reduce-scatter: rank positions i·C + (j - t) % C have joined after step s
    def own(c):
        return [hops.own(a, b, 0, seg) for seg, (a, b) in enumerate(chunks[c])]

    def join(incoming, c, seg, step):
        a, b = chunks[c][seg]
        out = hops.join(incoming, a, b, step, seg, hop=1 + i * cols + step,
                        phase="row reduce-scatter")
        record([out], [(a, b)], [row_group[(j - t) % cols] for t in range(step + 2)],
               "row reduce-scatter", step)
        return out

    owned, row_final = walk_reduce_scatter(ctx, row_group, chunks, PHASE_ROW_RS,
                                           "row reduce-scatter", first=own,
                                           receive=_payloads(ctx, chunks), merge=join)

    # 2. column reduce-scatter of the owned chunk's pieces: whole rows have joined
    pieces = [blocks[owned * rows + k] for k in range(rows)]
    mine, start = [], 0
    for segments in pieces:
        mine.append(row_final[start:start + len(segments)])
        start += len(segments)

    def combine(incoming, k, seg, step):
        a, b = pieces[k][seg]
        hop, have = 1 + p + j * rows + step, (step + 1) * cols
        agg = hops.combine(None, incoming, a, b, 0, have, hop, "column reduce-scatter",
                           step, seg)
        agg = hops.combine(agg, mine[k][seg], a, b, have, cols, hop,
                           "column reduce-scatter", step, seg)
        out = hops.finish(agg, a, hop, "column reduce-scatter", step, seg)
        joined = [col_group[(i - t) % rows] for t in range(step + 2)]
        record([out], [(a, b)], [q for row in joined for q in range(row - j, row - j + cols)],
               "column reduce-scatter", step)
        return out

    piece, final = walk_reduce_scatter(ctx, col_group, pieces, PHASE_COLUMN_RS,
                                       "column reduce-scatter", first=lambda k: list(mine[k]),
                                       receive=_payloads(ctx, pieces), merge=combine)

    # 3. all-gathers: the column's pieces, then the row's chunks, forwarded unchanged
    done = walk_allgather(ctx, col_group, piece, final, PHASE_COLUMN_AG, "column all-gather",
                          receive=_payloads(ctx, pieces))
    owned_payloads = [payload for k in range(rows) for payload in done[k]]
    every = walk_allgather(ctx, row_group, owned, owned_payloads, PHASE_ROW_AG,
                           "row all-gather", receive=_payloads(ctx, chunks))

    # 4. decode
    for c in range(cols):
        for seg, ((a, b), payload) in enumerate(zip(chunks[c], every[c], strict=True)):
            hops.decode(payload, a, b, 0, seg)
