"""2D-torus (hierarchical) all-reduce: rings along the rows, then along the columns."""

from __future__ import annotations

import math

from ringcomp.checks import parse_torus
from ringcomp.collectives.base import register
from ringcomp.collectives.ring import DEFAULT_SEGMENT_BYTES, allgather_phase, reduce_scatter_phase
from ringcomp.collectives.schedule import PHASE_AG, ring_chunk
from ringcomp.partition import block_bounds

#: the column rings' messages use phases 2 and 3 (the row rings' are 0 and 1)
PHASE_COLUMN = 2


def squarest(size: int) -> tuple[int, int]:
    """``(R, C)``, R·C = size, R the largest divisor <= sqrt(size) (a prime: 1 x size)."""
    rows = max(d for d in range(1, math.isqrt(size) + 1) if size % d == 0)
    return rows, size // rows


def torus_shape(transport, value) -> tuple[int, int]:
    """The torus of this call: ``value`` parsed, or for ``"auto"`` one row per node
    (columns = ranks per node: a ring inside each node, then rings across nodes) when
    the ranks fill several nodes evenly, else ``squarest(p)``.

    "auto" is collective the first time on a transport (one all-gather of every rank's
    node size, cached), so every rank resolves it alike."""
    shape = parse_torus(value, transport.size)
    if shape is not None:
        return shape
    cached = transport.kept.torus_auto
    if cached is None:
        local = set(transport.allgather_obj(transport.local_size))
        per_node = local.pop() if len(local) == 1 else 0
        cached = ((transport.size // per_node, per_node)
                  if 1 < per_node < transport.size and transport.size % per_node == 0
                  else squarest(transport.size))
        transport.kept.torus_auto = cached
    return cached


def torus_groups(rank: int, rows: int, cols: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the ranks of ``rank``'s row, of its column), each in ring order. Rank r sits at
    row r // cols, column r % cols: consecutive ranks (one node under block placement)
    share a row."""
    row, col = divmod(rank, cols)
    return (tuple(range(row * cols, (row + 1) * cols)),
            tuple(range(col, rows * cols, cols)))


@register("torus", options={"segment_bytes": DEFAULT_SEGMENT_BYTES, "torus": "auto"},
          summary="rings along rows, then columns: 2(R-1)+2(C-1) hops on an R x C torus")
def torus_allreduce(ctx) -> None:
    """2D-torus all-reduce of ``ctx.buf`` (ranks as R rows x C columns, ``torus`` option).

    Steps (rank r at row r // C, column j = r % C; rings as in the ring all-reduce):
      1. Row reduce-scatter: a ring of the row's C ranks over the whole buffer cut into C
         chunks; column j ends owning the row's sum of chunk (j + 1) % C.
      2. Column all-reduce of that chunk: a ring reduce-scatter and all-gather over the
         column's R ranks (the chunk cut into R pieces); every rank of the column ends
         with the sum over all p ranks of its chunk.
      3. Row all-gather: a ring of the row's ranks spreads the C finished chunks.

    Cost: 2(C-1) + 2(R-1) hops (the ring: 2(p-1)); bytes sent per rank
    2(C-1)/C·n + 2(R-1)/R·n/C, the ring's 2(p-1)/p·n. Invariant: every element is summed
    once, by the owner of its piece in step 2, and copied verbatim after that, so all
    ranks end bit-identical.
    """
    rows, cols = torus_shape(ctx.t, ctx.options.get("torus", "auto"))
    row_group, col_group = torus_groups(ctx.rank, rows, cols)
    if cols > 1:
        reduce_scatter_phase(ctx, group=row_group)  # 1.
    else:
        ctx.materialize()
    if rows > 1:  # 2. on the chunk this rank owns, in place
        owned = ring_chunk(ctx.rank % cols, -1, cols, PHASE_AG)
        lo, hi = block_bounds(ctx.buf.size, cols)[owned]
        column = ctx.view(lo, hi, PHASE_COLUMN)
        reduce_scatter_phase(column, group=col_group)
        allgather_phase(column, group=col_group)
    if cols > 1:
        allgather_phase(ctx, group=row_group)  # 3.
