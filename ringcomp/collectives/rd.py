"""Recursive-doubling all-reduce: log2(p) full-vector exchanges (small messages)."""

from __future__ import annotations

from ringcomp.collectives.base import register
from ringcomp.collectives.fold import Fold

PHASE_EXCHANGE = 0


@register("rd", summary="recursive doubling, log2(p) full exchanges (+2 fold hops if p != 2^k)")
def rd_allreduce(ctx) -> None:
    """Recursive doubling.

    Steps:
      1. Fold a non-power-of-two world onto p2 = 2^floor(log2 p) ranks (``Fold``).
      2. For mask = 1, 2, ..., p2/2: exchange the whole vector with newrank ^ mask and
         combine as op(lower newrank's data, higher newrank's data).
      3. Unfold: hand the result back to the ranks that sat out.

    Invariant: after the round with ``mask`` both partners hold identical bytes of the sum
    over their 2*mask-rank group, because they combine the same operands in the same order.
    """
    ctx.materialize()
    if ctx.size == 1 or ctx.buf.size == 0:
        return
    fold = Fold(ctx.size, ctx.rank)
    fold.fold(ctx)
    if fold.newrank >= 0:
        scratch = ctx.scratch(ctx.buf.size)
        mask, step = 1, 0
        while mask < fold.p2:
            partner = fold.newrank ^ mask
            ctx.exchange(ctx.buf, scratch, fold.real(partner), PHASE_EXCHANGE, "exchange", step)
            ctx.reduce_ordered(ctx.buf, scratch, mine_first=fold.newrank < partner)
            mask <<= 1
            step += 1
    fold.unfold(ctx)
