"""The public collectives: allreduce, reduce_scatter, allgather, broadcast."""

from __future__ import annotations

import threading
import warnings
from functools import partial

import numpy as np

from ringcomp.checks import (
    OPS,
    LocalError,
    check_array,
    check_candidates,
    check_finite,
    check_out,
    check_range,
    check_segment_bytes,
    check_sum_in_range,
    check_writeable,
    parse_torus,
)
from ringcomp.collectives import REGISTRY, Ctx, compressed_algorithms, executor, lowrank
from ringcomp.collectives.auto import KNOWN_CANDIDATES
from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES
from ringcomp.collectives.ring import RingParts, allgather_phase, reduce_scatter_phase
from ringcomp.collectives.tree import binomial_broadcast
from ringcomp.compression import ErrorFeedback, get_compressor
from ringcomp.devices import device
from ringcomp.kernels import backends
from ringcomp.partition import block_bounds
from ringcomp.transport.agree import NO_KEY, THREAD_OPTION, agree, agree_error
from ringcomp.transport.cache import get_transport

#: options every compressed algorithm takes: the segment is the unit of compression. Every
#: aggregation rule runs on every compressed form: on an all-gather, sign bits (marsit)
#: are majority-voted (signSGD).
_COMPRESSED_OPTIONS = {"segment_bytes": DEFAULT_SEGMENT_BYTES}

#: reduce_scatter and allgather run the ring's phases, so they take the ring's options.
_RING_OPTIONS = {"segment_bytes": REGISTRY["ring"].options["segment_bytes"]}


def algorithms() -> list[str]:
    """Names of the registered all-reduce algorithms."""
    return sorted(REGISTRY)


def algorithm_options(name: str) -> dict:
    """The options algorithm ``name`` takes, with their defaults ({} for an unknown name:
    the call itself refuses it)."""
    return dict(REGISTRY[name].options) if name in REGISTRY else {}


def _empty_like(x, shape=None):
    xp = device.array_module(x)
    return xp.empty(x.shape if shape is None else shape, dtype=x.dtype)


#: resolved compressor specs a transport keeps (least recently used dropped first): a job
#: that names a new spec on every call must not grow without limit
MAX_RESOLVED_SPECS = 32


def _resolve(transport, compressor):
    """The compressor a call names: one instance per spec string and communicator, so a
    stateful one (PowerSGD's warm start) carries its state to the next call naming it. At
    most MAX_RESOLVED_SPECS are kept; dropping one that carries state says so."""
    if not isinstance(compressor, str):
        return get_compressor(compressor)
    known = transport.kept.compressors
    if compressor in known:
        known.move_to_end(compressor)
        return known[compressor]
    known[compressor] = get_compressor(compressor)
    if len(known) > MAX_RESOLVED_SPECS:
        spec, dropped = known.popitem(last=False)
        if dropped is not None and dropped.state_dict():
            warnings.warn(f"compressor {spec!r} was not named in the last "
                          f"{MAX_RESOLVED_SPECS} distinct specs: its state (e.g. PowerSGD's "
                          f"warm start) is dropped; pass a Compressor object to keep it",
                          RuntimeWarning, stacklevel=4)
    return known[compressor]


#: the dtypes a compressor takes (dtype objects: ``.name`` costs microseconds a call)
_COMPRESSIBLE = frozenset((np.dtype(np.float32), np.dtype(np.float64)))


def _compression(transport, compressor, algorithm, x, op, error_feedback):
    """Resolve ``compressor`` and check it fits; raises LocalError codes 10-14."""
    try:
        comp = _resolve(transport, compressor)
    except (ValueError, TypeError) as exc:
        raise LocalError(10, str(exc)) from None
    if comp is None:
        if error_feedback:
            raise LocalError(14, "error_feedback needs a compressor")
        return None
    if error_feedback and comp.signs_only:
        raise LocalError(14, "Marsit uses global compensation (c = p - eta_s * v, applied by "
                             "the optimizer step), not per-worker error feedback")
    no_form = algorithm not in REGISTRY or REGISTRY[algorithm].compressed is None
    if no_form and not comp.wraps_exact:
        raise LocalError(11, f"compressor {comp.spec()!r} ({comp.aggregation} aggregation) "
                             f"runs on {', '.join(compressed_algorithms())}, not "
                             f"{algorithm!r}")
    if x.dtype not in _COMPRESSIBLE:
        raise LocalError(12, f"got {x.dtype.name} with compressor {comp.spec()!r}")
    if op != "sum":
        raise LocalError(13, f"got op={op!r} with compressor {comp.spec()!r}")
    return comp


#: from this input size on, a compressed ring refuses NaN/Inf as its hops read the input
#: (and agrees on the verdict in a second tiny Allreduce before it writes); below it, one
#: pass over the input first costs less than that second agreement (at 4 KB the pass takes
#: microseconds, the agreement a message round, a large part of a small call's time), and
#: its verdict rides the call's own agreement. At 4 ranks on two cores a 1 MB Marsit plan
#: took 1.15 ms checked first against 1.4-1.6 ms checked as read (its walk compiled whole
#: only when checked first), 2 MB about 10% less, 4 and 8 MB the same either way
CHECK_AS_READ_FROM_BYTES = 1 << 22


def checked_as_read(algorithm: str, comp, x, check: bool) -> bool:
    """Whether the collective refuses non-finite input itself as its hops read it (a
    compressed form that reads all its input first, on host buffers: on a device each
    segment's verdict would cost a synchronisation), so no pass over ``x`` comes first:
    from CHECK_AS_READ_FROM_BYTES on, and at any size with ``check=False`` (no agreement
    for a verdict found first to ride on; the collective's own one still reaches every
    rank)."""
    return (comp is not None and not comp.wraps_exact and algorithm in REGISTRY
            and REGISTRY[algorithm].reads_input_first and not device.is_device(x)
            and (x.nbytes >= CHECK_AS_READ_FROM_BYTES or not check))


def agrees_lengths_first(algorithm: str, comp, x, check: bool) -> bool:
    """Whether an unchecked compressed call agrees on its length and item size before any
    payload (one tiny Allreduce): without the argument agreement nothing else would tell
    other lengths apart - payloads of equal bytes for other lengths (bits packed in words)
    pass every receive's count - except the host ring's agreement between its halves
    (``checked_as_read``). Device calls agree first on every scheme, their plans too
    (``bind.Staged``), so a plan's call and a plain one pair message for message."""
    return (not check and comp is not None
            and not checked_as_read(algorithm, comp, x, check))


def _check_shadow(compression: dict, comp, algorithm: str) -> None:
    if not compression["shadow"]:
        return
    if comp is None or comp.wraps_exact:
        raise LocalError(15, "shadow=True measures a compressor's hops (not powersgd, whose "
                             "factors are summed exactly, nor an uncompressed call)")
    if not compression["traced"]:
        raise LocalError(15, "shadow=True records into a tracer: pass tracer=")


def _check(transport, name, x, *, out_shape=None, out=None, algorithm="ring", op="sum",
           options=None, known_options=None, root=0, check=True, finite=False,
           compression=None, writes_input=False, also=None) -> tuple[dict, object]:
    """Local checks, then the collective agreement; returns (merged options, compressor).

    ``compression`` is None for collectives without compression, else a dict with the
    ``compressor`` argument and the key fields (seed, step, bucket), which are agreed too.
    """
    return check_signed(transport, name, x, out_shape=out_shape, out=out,
                        algorithm=algorithm, op=op, options=options,
                        known_options=known_options, root=root, check=check, finite=finite,
                        compression=compression, writes_input=writes_input, also=also)[:2]


def check_signed(transport, name, x, *, out_shape=None, out=None, algorithm="ring", op="sum",
                 options=None, known_options=None, root=0, check=True, finite=False,
                 compression=None, writes_input=False, values=True, also=None) -> tuple:
    """``_check``, returning also what was agreed (``agree``'s (signature, options), or
    None without ``check``): a persistent plan agrees on it again per call. ``values``:
    check ``x``'s values too (finiteness, the compressor's range); a plan checks them per
    call instead, so the buffer it is made for may still hold garbage."""
    options = dict(options or {})
    known = dict(known_options or {})
    # the calling thread's name is agreed too: calls pair up across ranks in call order,
    # so two threads sharing a communicator could otherwise pair one thread's call on one
    # rank with the other thread's on another and mix their data without a word
    agreed = {**options, **(also or {}), THREAD_OPTION: threading.current_thread().name}
    error = comp = None
    key = NO_KEY
    try:
        check_array(x)
        if writes_input:
            check_writeable(x, "the input (written in place)")
        if out is not None:
            check_out(out, x.shape if out_shape is None else out_shape, x.dtype)
        if algorithm not in REGISTRY:
            raise LocalError(4, f"{algorithm!r}; registered: {', '.join(algorithms())}")
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise LocalError(7, f"{unknown} for {name}[{algorithm}]; it takes "
                                f"{sorted(known) or 'none'}")
        check_segment_bytes(options, x.dtype.itemsize)
        if "torus" in options:
            parse_torus(options["torus"], transport.size)
        check_candidates(options, KNOWN_CANDIDATES)
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) \
                or not 0 <= root < transport.size:
            raise LocalError(8, f"root={root!r} with {transport.size} ranks")
        if compression is not None:
            comp = _compression(transport, compression["compressor"], algorithm, x, op,
                                compression["error_feedback"])
            _check_shadow(compression, comp, algorithm)
            # whether a rank traces is its own business (tracing on rank 0 only is fine);
            # the key (seed, step, bucket) is compared as integers
            agreed.update(shadow=compression["shadow"],
                          compressor=comp.spec() if comp else "none",
                          error_feedback=bool(compression["error_feedback"]))
            key = (compression["seed"], compression["step"], compression["bucket"])
        if values and (finite or comp is not None) and not checked_as_read(algorithm, comp,
                                                                           x, check):
            # a compressed payload (sign bits, indices, sketches) cannot carry NaN/Inf:
            # refused on every rank rather than dropped silently
            check_finite(x)
        if values and comp is not None:  # nor fp16's values past its range (Inf)
            check_range(x, comp)
    except LocalError as exc:
        error = exc
    if op not in OPS and error is None:
        error = LocalError(5, repr(op))
    names, index = _algorithm_names()
    signed = agree(transport, name, length=getattr(x, "size", -1) if error is None else -1,
          dtype=x.dtype if error is None else None,
          algorithm_index=index.get(algorithm, -1), op=op,
          options=agreed, root=root if error is None else -1, error=error, check=check,
          algorithm_names=names, key=key)
    return {**known, **options}, comp, signed


_NAMES: list = [(), {}]


def _algorithm_names() -> tuple[tuple, dict]:
    """``algorithms()`` as a tuple and name -> index; made again only when an algorithm was
    registered since (sorting the registry on every small call showed in its time)."""
    if len(_NAMES[0]) != len(REGISTRY):
        names = tuple(algorithms())
        _NAMES[:] = [names, {name: i for i, name in enumerate(names)}]
    return _NAMES[0], _NAMES[1]


def _run(transport, name, run, buf, op, algorithm, options, tracer, src=None, **compression):
    """Run one collective. On a GPU the result is complete when this returns (the stream
    it was computed on is synchronised), as after an MPI call: any stream or thread may
    read it. Without that, a reader on another stream - the legacy default stream after a
    ``with cupy.cuda.Stream(non_blocking=True)`` block, say - saw the last hop missing."""
    ctx = Ctx(transport, buf, op, algorithm, options, tracer, name, src, **compression)
    t0 = None if tracer is None else tracer.now()
    run(ctx)
    if device.is_device(buf):
        device.synchronize(buf)
    if tracer is not None:
        tracer.op(ctx, name, t0)
        if ctx.rider is not None:  # its own call's record (its hops are the carrier's)
            tracer.op(ctx.rider.ctx, name, t0)


def allreduce_options(algorithm: str, compressor) -> dict:
    """The options an all-reduce with ``algorithm`` and ``compressor`` takes, with their
    defaults ({} for an unknown algorithm: the check refuses it)."""
    known = dict(REGISTRY[algorithm].options) if algorithm in REGISTRY else {}
    if compressor is not None and compressor != "none":
        known = {**known, **_COMPRESSED_OPTIONS}
    return known


def run_allreduce(transport, x, out, algorithm, op, tracer, check, comp, key, error_feedback,
                  shadow, merged, as_read: bool, rider=None):
    """An all-reduce whose arguments were checked (and agreed) already: the general path a
    plan's call (``ringcomp.plans.plan``) takes where nothing was bound. Returns ``out``; a
    sum that left the compressor's range (fp16) raises on every rank. ``as_read``: the
    plan's ``checked_as_read`` (its hops refuse non-finite input as they read it), decided
    once with it. ``rider``: an exact ring (``exact_rider``) whose messages travel in this
    compressed ring's walk."""
    out = _run_allreduce(transport, x, out, algorithm, op, tracer, check, comp, key,
                         error_feedback, shadow, merged, as_read, rider)
    if comp is not None and comp.overflows_at is not None:
        check_sum_in_range(out, comp)
    return out


def exact_rider(transport, x, options: dict):
    """``(out, parts)``: a new output for ``x`` and the exact ring's parts (``RingParts``)
    of the sum of ``x`` into it, for a compressed ring's walk to carry (``Ctx.rider``);
    ``options``: the exact ring's, agreed (its ``segment_bytes``)."""
    out = _empty_like(x)
    ctx = Ctx(transport, out.reshape(-1), "sum", "ring", options, None, "allreduce",
              x.reshape(-1))
    return out, RingParts(ctx, transport.size)


def _run_allreduce(transport, x, out, algorithm, op, tracer, check, comp, key,
                   error_feedback, shadow, merged, as_read, rider=None):
    if out is None:
        out = _empty_like(x)
    shared = "same" if out is x else device.overlap(out, x)
    if shared == "partial":  # writing out would overwrite input not read yet: read a copy
        x = x.copy()
    src = None if shared == "same" else x.reshape(-1)
    if comp is None:
        # out of place, the algorithm reads x itself (the ring never copies it at all)
        _run(transport, "allreduce", partial(executor.run, algorithm=algorithm),
             out.reshape(-1), op, algorithm, merged, tracer, src=src)
        return out
    if not (check or as_read) and transport.size > 1:  # ``agrees_lengths_first``
        agree_error(transport, "allreduce", None, x.size, x.itemsize)
    memory = _memory(transport, error_feedback)

    def collective(src):  # traces name the call e.g. ``ring+marsit``, ``ring+topk:ratio=0.1``
        _run(transport, "allreduce", partial(_compressed, algorithm), out.reshape(-1), op,
             f"{algorithm}+{comp.label()}", merged, tracer, src=src, compressor=comp, key=key,
             memory=memory, shadow=shadow, check_input=as_read,
             rider=rider)

    if memory is None:
        # a compressed form reads its input apart from the buffer it writes, unless it
        # reads all of it before writing any (the ring; PowerSGD's factors are another
        # path): in place, the others read a copy
        if src is None and (comp.wraps_exact or not REGISTRY[algorithm].reads_input_first):
            src = x.reshape(-1).copy()
        collective(x.reshape(-1) if src is None else src)
        return out
    src = x.reshape(-1) if src is None else src  # compensating makes the copy
    segments = None  # PowerSGD keeps its own residual
    if not comp.wraps_exact:
        segments = REGISTRY[algorithm].segments(src.size, transport.size,
                                                int(merged["segment_bytes"]) // src.itemsize)
    memory.around(src, key.bucket, collective, comp, key, segments)
    return out


def _memory(transport, error_feedback) -> ErrorFeedback | None:
    if not error_feedback:
        return None
    if isinstance(error_feedback, ErrorFeedback):
        return error_feedback
    if transport.kept.error_feedback is None:
        transport.kept.error_feedback = ErrorFeedback()
    return transport.kept.error_feedback


def _compressed(algorithm, ctx) -> None:
    """Run ``algorithm``'s compressed form with ``ctx.compressor``."""
    if ctx.t.kept.kernel_threads is None:
        ctx.t.kept.kernel_threads = backends.share_cores(ctx.t.local_size)
    if ctx.compressor.wraps_exact:  # PowerSGD: factors summed by any exact algorithm
        lowrank.lowrank_allreduce(ctx, algorithm)
    else:
        executor.run(ctx, algorithm)


def reduce_scatter(x, *, comm=None, op: str = "sum", out=None, tracer=None,
                   check: bool = True, **options):
    """Reduce ``x`` over all ranks; rank r gets block r of the flattened result.

    Blocks follow ``ringcomp.partition.block_bounds(x.size, p)`` (sizes differ by at most
    one, the first ``x.size % p`` blocks are longer). Runs the ring's reduce-scatter phase.

    Returns:
        ``out`` (1-D, the length of this rank's block).
    """
    transport = get_transport(comm)
    with transport.exclusive("reduce_scatter", check):
        return _reduce_scatter(transport, x, op, out, tracer, check, options)


def _reduce_scatter(transport, x, op, out, tracer, check, options):
    p, r = transport.size, transport.rank
    size = getattr(x, "size", 0)
    lo, hi = block_bounds(size, p)[r] if isinstance(size, int) else (0, 0)
    merged, _ = _check(transport, "reduce_scatter", x, out=out, out_shape=(hi - lo,), op=op,
                       options=options, known_options=_RING_OPTIONS, check=check)
    work = _empty_like(x, (x.size,))
    if p == 1:
        work[...] = x.reshape(-1)
    elif x.size:
        # the phase reads x where it first touches a chunk and leaves rank r's block in
        # work; out is written only after that, so out may overlap x
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
    with transport.exclusive("allgather", check):
        return _allgather(transport, x, out, tracer, check, options)


def _allgather(transport, x, out, tracer, check, options):
    p, r = transport.size, transport.rank
    shape = (p, *getattr(x, "shape", ()))
    merged, _ = _check(transport, "allgather", x, out=out, out_shape=shape, options=options,
                       known_options=_RING_OPTIONS, check=check)
    if out is None:
        out = _empty_like(x, shape)
    if device.overlap(out, x):  # the phases write rows of out that x may still occupy
        x = x.copy()
    out[r] = x
    if p > 1 and x.size:
        _run(transport, "allgather", lambda ctx: allgather_phase(ctx, shift=-1),
             out.reshape(-1), "sum", "ring", merged, tracer)
    return out


def broadcast(x, *, root: int = 0, comm=None, tracer=None, check: bool = True):
    """Copy ``root``'s ``x`` into ``x`` on every rank (in place, binomial tree); returns x."""
    transport = get_transport(comm)
    with transport.exclusive("broadcast", check):
        # every rank's x must be writable, the root's too: the same verdict everywhere
        _check(transport, "broadcast", x, root=root, check=check, writes_input=True)
        if transport.size > 1 and x.size:
            _run(transport, "broadcast", lambda ctx: binomial_broadcast(ctx, root=root),
                 x.reshape(-1), "sum", "tree", {}, tracer)
    return x


__all__ = ["algorithms", "allgather", "broadcast", "reduce_scatter"]
