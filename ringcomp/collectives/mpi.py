"""MPI's own Allreduce, the baseline every benchmark compares against."""

from __future__ import annotations

from ringcomp.collectives.base import register


@register("mpi", binds="native",
          summary="MPI's own Allreduce (the baseline; its algorithm is MPI's choice)")
def mpi_allreduce(ctx) -> None:
    """One call to MPI's (nonblocking) Allreduce, under the transport's deadline."""
    if ctx.size == 1 or ctx.buf.size == 0:
        ctx.materialize()
        return
    ctx.t.native_allreduce(ctx.buf, ctx.op, None if ctx.in_place else ctx.src)
