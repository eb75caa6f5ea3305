"""Rabenseifner all-reduce: recursive-halving reduce-scatter + recursive-doubling all-gather."""

from __future__ import annotations

from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, register
from ringcomp.collectives.fold import Fold
from ringcomp.partition import block_bounds

PHASE_HALVING, PHASE_DOUBLING = 0, 1




@register("rabenseifner", options={"segment_bytes": DEFAULT_SEGMENT_BYTES},
          summary="recursive halving + doubling, 2 log2(p) hops, bandwidth-optimal, any p")
def rabenseifner_allreduce(ctx) -> None:
    """Rabenseifner's algorithm for any p.

    Steps (blocks = block_bounds(n, p2) over the p2 = 2^floor(log2 p) participants):
      1. Fold a non-power-of-two world onto p2 ranks (``Fold``).
      2. Recursive halving (the first step reads the input, so out of place nothing is
         copied), mask = p2/2 .. 1: keep the lower half of the current block range
         if bit ``mask`` of newrank is clear (else the upper), send the other half to
         newrank ^ mask, receive its copy of the kept half and combine in newrank order,
         segment by segment so each reduction overlaps the next segment's transfer.
      3. Recursive doubling, mask = 1 .. p2/2: swap the owned range with newrank ^ mask
         (the adjacent range of equal length), receiving straight into the buffer.
      4. Unfold.

    Invariant: after halving, newrank i owns the full sum of block i, computed once; the
    doubling copies owners' bytes, so every rank ends bit-identical.
    """
    if ctx.size == 1 or ctx.buf.size == 0:
        ctx.materialize()
        return
    fold = Fold(ctx.size, ctx.rank)
    current = fold.fold(ctx)  # out of place: still the input; the first step writes buf
    me = fold.newrank
    if me >= 0:
        buf = ctx.buf
        seg_elems = max(1, int(ctx.options["segment_bytes"]) // ctx.itemsize)
        blocks = block_bounds(buf.size, fold.p2)
        scratch = ctx.scratch(blocks[0][1] * ((fold.p2 + 1) // 2))
        lo, hi = 0, fold.p2
        mask, step = fold.p2 >> 1, 0
        while mask >= 1:
            partner = me ^ mask
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if not me & mask else ((mid, hi), (lo, mid))
            k0, k1 = blocks[keep[0]][0], blocks[keep[1] - 1][1]
            g0, g1 = blocks[give[0]][0], blocks[give[1] - 1][1]
            ctx.exchange_reduce(current[g0:g1], buf[k0:k1], scratch, fold.real(partner),
                                PHASE_HALVING, seg_elems, me < partner, "halving", step,
                                source=current[k0:k1])
            current = buf
            lo, hi = keep
            mask >>= 1
            step += 1
        mask = 1
        while mask < fold.p2:
            partner = me ^ mask
            width = hi - lo
            plo, phi = (lo - width, lo) if me & mask else (hi, hi + width)
            mine = buf[blocks[lo][0]:blocks[hi - 1][1]]
            theirs = buf[blocks[plo][0]:blocks[phi - 1][1]]
            ctx.exchange(mine, theirs, fold.real(partner), PHASE_DOUBLING, "doubling", step)
            lo, hi = min(lo, plo), max(hi, phi)
            mask <<= 1
            step += 1
    fold.unfold(ctx)
