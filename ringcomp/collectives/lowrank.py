"""PowerSGD inside any exact all-reduce: two rounds of summed factors, decoded once."""

from __future__ import annotations

from ringcomp.collectives import executor
from ringcomp.collectives.base import Ctx
from ringcomp.collectives.hops import Hops
from ringcomp.compression.powersgd import orthonormalize, outer_sum


def _allreduce_factor(ctx, factor, base: str, phase: str) -> None:
    """Sum ``factor`` (a small matrix) over all ranks in place with ``base``'s exact run."""
    flat = factor.reshape(-1)
    inner = Ctx(ctx.t, flat, "sum", base, ctx.options, ctx.tracer, f"allreduce-{phase}")
    executor.run(inner, base)


def lowrank_allreduce(ctx, base: str) -> None:
    """PowerSGD all-reduce of ``ctx.src`` over the exact algorithm ``base``.

    Steps (M_m: this rank's m x k matrix view of the input; Q: k x R, the bucket's last
    all-reduced Q when warm-starting, else drawn from the shared seed):
      1. P = M_m Q, all-reduced exactly (sum over ranks): P = (sum M) Q.
      2. Orthonormalise P's columns (deterministic Gram-Schmidt: same bits on all ranks).
      3. Q_m = M_m^T P, all-reduced exactly: Q = (sum M)^T P; kept for the next warm start.
      4. Output P Q^T (R rank-1 updates), i.e. the projection of sum M on span(P).
      5. With error feedback, this rank's residual is M_m - P Q_m^T: what the projection
         lost of its own contribution (the residuals of all ranks sum to sum M - output).

    Invariant: steps 2 and 4 run on all-reduced, bit-identical inputs, so every rank ends
    with the same bytes; nothing is decoded or re-encoded along the way (linear).
    """
    comp, src, hops = ctx.compressor, ctx.src, Hops(ctx)
    n = src.size
    mat = comp.matrix(src)
    q = comp.start_q(n, ctx.key, src.dtype, src)
    p = hops.timed("encode", "factors", 0, -1, mat.__matmul__, q)
    _allreduce_factor(ctx, p, base, "P")
    hops.timed("encode", "factors", 1, -1, orthonormalize, p)
    local_q = hops.timed("encode", "factors", 1, -1, mat.T.__matmul__, p)
    q = local_q.copy()
    _allreduce_factor(ctx, q, base, "Q")
    comp.keep_q(n, ctx.key, q)
    full = hops.timed("decode", "factors", 2, -1, outer_sum, p, q,
                      mat if ctx.memory is None else mat.copy())
    ctx.buf[...] = full.reshape(-1)[:n]
    if ctx.memory is not None:
        own = outer_sum(p, local_q, full)
        ctx.memory.remember(src - own.reshape(-1)[:n], ctx.key.bucket)
