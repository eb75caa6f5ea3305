"""Fold a non-power-of-two world onto a power of two (shared by rd and rabenseifner)."""

from __future__ import annotations

from ringcomp.partition import largest_power_of_two_at_most

PHASE_FOLD, PHASE_UNFOLD = 6, 7


class Fold:
    """Rank arithmetic of the fold: the first ``2*rem`` ranks pair up, evens drop out.

    With p2 the largest power of two <= p and rem = p - p2, even ranks below 2*rem hand
    their data to the next odd rank and sit out; the p2 remaining ranks get new ranks
    0..p2-1 (odd r < 2*rem -> r // 2, r >= 2*rem -> r - rem).
    """

    def __init__(self, p: int, r: int):
        self.p2 = largest_power_of_two_at_most(p)
        self.rem = p - self.p2
        self.rank = r
        if r < 2 * self.rem:
            self.newrank = r // 2 if r % 2 else -1
        else:
            self.newrank = r - self.rem

    def real(self, newrank: int) -> int:
        """Real rank of a participant."""
        return newrank * 2 + 1 if newrank < self.rem else newrank + self.rem

    def fold(self, ctx):
        """Step 0: even ranks below 2*rem send their input to r + 1, which adds it.

        Returns the array that holds this rank's data afterwards: the output buffer where
        the fold wrote it, else the untouched input (out of place, nothing is copied).
        """
        r = self.rank
        if r >= 2 * self.rem:
            return ctx.src
        if self.newrank < 0:
            ctx.wait(ctx.isend(ctx.src, r + 1, PHASE_FOLD), "fold")
            return None
        scratch = ctx.scratch(ctx.buf.size)
        ctx.wait(ctx.irecv(scratch, r - 1, PHASE_FOLD), "fold")
        ctx.reduce_ordered(ctx.src, scratch, mine_first=False, out=ctx.buf)
        return ctx.buf

    def unfold(self, ctx) -> None:
        """Last step: odd ranks below 2*rem return the finished result to r - 1."""
        r = self.rank
        if r >= 2 * self.rem:
            return
        if self.newrank < 0:
            ctx.wait(ctx.irecv(ctx.buf, r + 1, PHASE_UNFOLD), "unfold")
        else:
            ctx.wait(ctx.isend(ctx.buf, r - 1, PHASE_UNFOLD), "unfold")
