"""The public collectives: allreduce, reduce_scatter, allgather, broadcast."""

from __future__ import annotations

from ringcomp import device
from ringcomp.collectives import REGISTRY, Ctx
from ringcomp.collectives.ring import allgather_phase, reduce_scatter_phase
from ringcomp.collectives.tree import binomial_broadcast
from ringcomp.comm import get_transport
from ringcomp.partition import block_bounds
from ringcomp.validate import OPS, LocalError, agree, check_array, check_finite, check_out

#: reduce_scatter and allgather run the ring's phases, so they take the ring's options.
_RING_OPTIONS = {"segment_bytes": REGISTRY["ring"].options["segment_bytes"]}


def algorithms() -> list[str]:
    """Names of the registered all-reduce algorithms."""
    return sorted(REGISTRY)


def _empty_like(x, shape=None):
    xp = device.array_module(x)
    return xp.empty(x.shape if shape is None else shape, dtype=x.dtype)


def _check(transport, name, x, *, out_shape=None, out=None, algorithm="ring", op="sum",
           options=None, known_options=None, root=0, check=True, finite=False) -> dict:
    """Local checks, then the collective agreement; returns the merged options."""
    options = dict(options or {})
    known = dict(known_options or {})
    error = None
    try:
        check_array(x)
        if out is not None:
            check_out(out, x.shape if out_shape is None else out_shape, x.dtype)
        if algorithm not in REGISTRY:
            raise LocalError(4, f"{algorithm!r}; registered: {', '.join(algorithms())}")
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise LocalError(7, f"{unknown} for {name}[{algorithm}]; it takes "
                                f"{sorted(known) or 'none'}")
        if not 0 <= root < transport.size:
            raise LocalError(8, f"root={root} with {transport.size} ranks")
        if finite:
            check_finite(x)
    except LocalError as exc:
        error = exc
    if op not in OPS and error is None:
        error = LocalError(5, repr(op))
    names = algorithms()
    agree(transport, name, length=getattr(x, "size", -1) if error is None else -1,
          dtype=x.dtype if error is None else None,
          algorithm_index=names.index(algorithm) if algorithm in names else -1, op=op,
          options=options, root=root, error=error, check=check)
    return {**known, **options}


def _run(transport, name, run, buf, op, algorithm, options, tracer, src=None):
    ctx = Ctx(transport, buf, op, algorithm, options, tracer, name, src)
    if tracer is None:
        run(ctx)
        return
    t0 = tracer.now()
    run(ctx)
    tracer.op(ctx, name, t0)


def allreduce(x, *, algorithm: str = "ring", comm=None, op: str = "sum", out=None,
              tracer=None, check: bool = True, check_finite: bool = False, **options):
    """Reduce ``x`` over all ranks and return the result on every rank.

    Args:
        x: a C-contiguous NumPy or CUDA array (any shape, any supported dtype, may be empty).
        algorithm: a name from ``algorithms()``: ring, tree, dbtree, rd, rabenseifner, mpi,
            auto.
        comm: an mpi4py communicator (duplicated internally), a ``Transport``, or None for
            the world.
        op: "sum", "max", "min" or "prod".
        out: where to write the result; ``out=x`` reduces in place. Default: a new array.
        tracer: a ``ringcomp.trace.Tracer`` to record every hop, or None (no cost).
        check: agree on the arguments across ranks first (one tiny Allreduce), so that bad or
            mismatched input raises the same error everywhere instead of hanging.
        check_finite: also refuse NaN/Inf in any rank's input, with the same error on every
            rank (costs one read of ``x``); by default they propagate as in MPI.
        **options: algorithm options, e.g. ``segment_bytes`` for ring and dbtree.

    Returns:
        ``out`` holding the reduction; bit-identical on every rank.
    """
    transport = get_transport(comm)
    known = REGISTRY[algorithm].options if algorithm in REGISTRY else {}
    merged = _check(transport, "allreduce", x, out=out, algorithm=algorithm, op=op,
                    options=options, known_options=known, check=check, finite=check_finite)
    if out is None:
        out = _empty_like(x)
    # out of place, the algorithm reads x itself (the ring never copies it at all)
    _run(transport, "allreduce", REGISTRY[algorithm].run, out.reshape(-1), op, algorithm,
         merged, tracer, src=None if out is x else x.reshape(-1))
    return out


def reduce_scatter(x, *, comm=None, op: str = "sum", out=None, tracer=None,
                   check: bool = True, **options):
    """Reduce ``x`` over all ranks; rank r gets block r of the flattened result.

    Blocks follow ``ringcomp.partition.block_bounds(x.size, p)`` (sizes differ by at most
    one, the first ``x.size % p`` blocks are longer). Runs the ring's reduce-scatter phase.

    Returns:
        ``out`` (1-D, the length of this rank's block).
    """
    transport = get_transport(comm)
    p, r = transport.size, transport.rank
    size = getattr(x, "size", 0)
    lo, hi = block_bounds(size, p)[r] if isinstance(size, int) else (0, 0)
    merged = _check(transport, "reduce_scatter", x, out=out, out_shape=(hi - lo,), op=op,
                    options=options, known_options=_RING_OPTIONS, check=check)
    work = _empty_like(x, (x.size,))
    if p == 1:
        work[...] = x.reshape(-1)
    elif x.size:
        # the phase reads x where it first touches a chunk and leaves rank r's block in work
        _run(transport, "reduce_scatter", lambda ctx: reduce_scatter_phase(ctx, shift=-1),
             work, op, "ring", merged, tracer, src=x.reshape(-1))
    if out is None:
        return work[lo:hi].copy()
    out[...] = work[lo:hi]
    return out


def allgather(x, *, comm=None, out=None, tracer=None, check: bool = True, **options):
    """Gather every rank's ``x`` (same shape and dtype on all ranks) onto every rank.

    Returns:
        ``out`` of shape ``(p, *x.shape)``; row i is rank i's ``x``.
    """
    transport = get_transport(comm)
    p, r = transport.size, transport.rank
    shape = (p, *getattr(x, "shape", ()))
    merged = _check(transport, "allgather", x, out=out, out_shape=shape, options=options,
                    known_options=_RING_OPTIONS, check=check)
    if out is None:
        out = _empty_like(x, shape)
    out[r] = x
    if p > 1 and x.size:
        _run(transport, "allgather", lambda ctx: allgather_phase(ctx, shift=-1),
             out.reshape(-1), "sum", "ring", merged, tracer)
    return out


def broadcast(x, *, root: int = 0, comm=None, tracer=None, check: bool = True):
    """Copy ``root``'s ``x`` into ``x`` on every rank (in place, binomial tree); returns x."""
    transport = get_transport(comm)
    _check(transport, "broadcast", x, root=root, check=check)
    if transport.size > 1 and x.size:
        _run(transport, "broadcast", lambda ctx: binomial_broadcast(ctx, root=root),
             x.reshape(-1), "sum", "tree", {}, tracer)
    return x


__all__ = ["algorithms", "allreduce", "allgather", "broadcast", "reduce_scatter"]
