"""MPI's own Allreduce, the baseline every benchmark compares against."""

from __future__ import annotations

from ringcomp.collectives.base import register


@register("mpi", summary="MPI's own Allreduce (the baseline; its algorithm is MPI's choice)")
def mpi_allreduce(ctx) -> None:
    """One call to MPI's (nonblocking) Allreduce in place, under the transport's deadline."""
    if ctx.size == 1 or ctx.buf.size == 0:
        return
    ctx.t.native_allreduce(ctx.buf, ctx.op)
