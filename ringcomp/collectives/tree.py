"""Binomial-tree all-reduce: reduce to rank 0, then broadcast (latency-optimal)."""

from __future__ import annotations

from ringcomp.collectives.base import register

PHASE_REDUCE, PHASE_BCAST = 0, 1


def binomial_reduce(ctx, root: int = 0) -> None:
    """Reduce ``ctx.buf`` onto ``root`` along a binomial tree in ceil(log2 p) rounds.

    Steps (relative rank v = (r - root) mod p):
      1. For mask = 1, 2, 4, ...: if bit ``mask`` of v is set, send the partial sum to
         v - mask and stop; otherwise receive from v + mask (if it exists) and add it.

    Invariant: after the round with ``mask``, a rank whose low bits are clear holds the sum
    of the ranks v .. v + 2*mask - 1; the operand order is fixed, so the root's sum is
    deterministic.
    """
    p, v = ctx.size, (ctx.rank - root) % ctx.size
    scratch = ctx.scratch(ctx.buf.size) if ctx.buf.size else ctx.buf
    mask, step = 1, 0
    while mask < p:
        if v & mask:
            send = ctx.isend(ctx.buf, (v - mask + root) % p, PHASE_REDUCE)
            ctx.wait(send, "reduce", step)
            return
        if v + mask < p:
            recv = ctx.irecv(scratch, (v + mask + root) % p, PHASE_REDUCE)
            ctx.wait(recv, "reduce", step)
            ctx.reduce(ctx.buf, scratch)
        mask <<= 1
        step += 1


def binomial_broadcast(ctx, root: int = 0, phase: int = PHASE_BCAST, buffers=None) -> None:
    """Broadcast ``ctx.buf`` (or each of ``buffers``) from ``root`` along a binomial tree.

    Steps (relative rank v), ceil(log2 p) rounds:
      1. Receive from v - lowbit(v) (the root receives nothing).
      2. Send to v + m for every power of two m below lowbit(v) (all of them at the root),
         largest first, so the farthest subtree starts earliest.

    Invariant: every rank ends with the root's bytes. Empty buffers travel as no message
    (their sizes are the same on every rank).
    """
    p, v = ctx.size, (ctx.rank - root) % ctx.size
    buffers = [buf for buf in (buffers if buffers is not None else [ctx.buf]) if buf.size]
    if not buffers:
        return
    mask = 1
    while mask < p:
        if v & mask:
            ctx.waitall([ctx.irecv(buf, (v - mask + root) % p, phase) for buf in buffers],
                        "broadcast", mask.bit_length() - 1)
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:
        if v + mask < p:
            sends += [ctx.isend(buf, (v + mask + root) % p, phase) for buf in buffers]
        mask >>= 1
    ctx.waitall(sends, "broadcast")


@register("tree", summary="binomial reduce + broadcast, 2*ceil(log2 p) rounds, latency-optimal")
def tree_allreduce(ctx) -> None:
    """Binomial all-reduce: ``binomial_reduce`` to rank 0, then ``binomial_broadcast``.

    Every rank ends with the root's bytes, so results are bit-identical across ranks.
    """
    ctx.materialize()
    if ctx.size == 1 or ctx.buf.size == 0:
        return
    binomial_reduce(ctx)
    binomial_broadcast(ctx)
