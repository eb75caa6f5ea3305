"""The one choice of what runs an all-reduce: its algorithm's compiled walk or Python walk."""

from __future__ import annotations

import numpy as np

from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, REGISTRY
from ringcomp.kernels.rng import fits_int64


def compiled(transport, algorithm: str, n: int, dtype, op: str, options: dict, comp=None,
             keys: tuple = ()):
    """The compiled host walk of ``algorithm`` (``Algorithm.walk``) for sums of ``n``
    elements of ``dtype`` with ``options`` (its compressed form's with ``comp``, drawing
    on the random streams of ``keys``: seed, step, bucket) over ``transport``, bound;
    None where the Python walk runs the call: no walk for this algorithm, another op, one
    rank or nothing to sum, keys past the walk's int64, or a size, dtype, layout or
    compressor the walk does not take (its own ``bound``).

    The only place an executor is chosen: a plan keeps what it returns (``plans.bind``);
    the general path asks on every call (``run``)."""
    entry = REGISTRY.get(algorithm)
    if (entry is None or entry.walk is None or op != "sum" or not n or transport.size == 1
            or not fits_int64(*keys)):
        return None
    dtype = np.dtype(dtype)
    seg_elems = max(1, int(options.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
                    // dtype.itemsize)
    return entry.walk(transport, n, dtype, seg_elems, comp)


def run(ctx, algorithm: str) -> None:
    """Run ``ctx`` - the general path's call, or a part of one (``auto``'s pick,
    PowerSGD's factors) - as ``algorithm``, its compressed form for a ``ctx.compressor``:
    by the compiled walk ``compiled`` binds, where the walk serves ``ctx`` (its
    ``serve``: flat contiguous host arrays, no rider it cannot carry, input it would not
    refuse), else by the algorithm's Python walk. A traced or shadowed call always takes
    the Python walk, which records every hop."""
    entry = REGISTRY[algorithm]
    comp = ctx.compressor
    if (ctx.tracer is None and not ctx.shadow and type(ctx.buf) is np.ndarray
            and type(ctx.src) is np.ndarray):
        key = ctx.key
        walk = compiled(ctx.t, algorithm, ctx.src.size, ctx.buf.dtype, ctx.op, ctx.options,
                        comp, () if key is None else (key.seed, key.step, key.bucket))
        if walk is not None and walk.serve(ctx):
            return
    (entry.run if comp is None else entry.compressed)(ctx)
