"""``allreduce``: every plain call runs through a plan made for its arguments and kept."""

from __future__ import annotations

import operator
import threading

from ringcomp.api import allreduce_options, check_signed
from ringcomp.kernels.rng import fits_int64
from ringcomp.plans.plan import AllreducePlan
from ringcomp.transport.cache import get_transport

#: plans a transport keeps for plain calls (least recently used dropped first): a job that
#: calls with a new shape or option set every time must not grow without limit
MAX_CACHED_PLANS = 64


def allreduce(x, *, algorithm: str = "ring", comm=None, op: str = "sum", out=None,
              tracer=None, check: bool = True, check_finite: bool = False, compressor=None,
              seed: int = 0, step: int = 0, bucket: int = 0, error_feedback=False,
              shadow: bool = False, _agreed: dict | None = None, **options):
    """Reduce ``x`` over all ranks and return the result on every rank.

    Args:
        x: a C-contiguous NumPy or CUDA array (any shape, any supported dtype, may be empty).
        algorithm: a name from ``algorithms()``: ring, tree, dbtree, rd, rabenseifner,
            torus (rows x columns of rings: ``torus="RxC"``, default the squarest), mpi,
            auto, allgather, twostage.
        comm: an mpi4py communicator (duplicated internally), a ``Transport``, or None for
            the world.
        op: "sum", "max", "min" or "prod".
        out: where to write the result; ``out=x`` reduces in place. Default: a new array.
        tracer: a ``ringcomp.trace.Tracer`` to record every hop, or None (no cost).
        check: agree on the arguments across ranks first (one tiny Allreduce), so that bad or
            mismatched input raises the same error everywhere instead of hanging.
        check_finite: also refuse NaN/Inf in any rank's input, with the same error on every
            rank (costs one read of ``x``); by default they propagate as in MPI. With a
            compressor they are always refused (no payload can carry them); the
            compressed ring tests each segment as its hops read it and agrees before it
            writes anything, the other forms read ``x`` once first.
        compressor: None/"none" (exact), a name from ``ringcomp.compressors()``, a spec such
            as ``"sign"``, or a ``Compressor``: every hop then carries compressed payloads,
            aggregated by the compressor's rule (cascade, linear or marsit) on ring, tree,
            dbtree, allgather or twostage; ``powersgd`` (lowrank) sums its factors with
            any algorithm.
        seed, step, bucket: key every random choice of the compressor (with the hop and the
            element index), so results are reproducible and identical on all ranks.
        error_feedback: with a compressor, add the bucket's residual to ``x`` first and keep
            what this rank's compression lost for the next call (``True``: a memory kept on
            the transport; or a ``ringcomp.compression.ErrorFeedback`` of your own). One
            residual per ``bucket``: a call of another length replaces it (with a warning).
        shadow: with a compressor (not powersgd) and a tracer, also form the exact partial
            sums of the same ranks and record every hop's error against them (tracer
            records of kind ``shadow``: contributors, rel_err, cosine, rel_err_signs,
            sign_agree). The ring forwards exact partials beside its payloads; the other
            schemes all-gather the inputs once (p·n·8 bytes per rank), for measurement only.
        **options: algorithm options, e.g. ``segment_bytes`` for ring, dbtree, rabenseifner
            and torus, ``torus="2x4"`` for the torus.
        _agreed: for a layer on top (``ringcomp.torch``'s Horovod ops): what else every
            rank's call must pass alike (a name -> value dict, agreed with the options and
            named as they are when ranks differ).

    Every call runs through a plan (``allreduce_init``'s) made for its arguments on
    their first call and kept on the transport (the last MAX_CACHED_PLANS): the checks
    and the agreement of every call are the plan's per-call ones, and what it bound at
    its making (MPI's call, a compiled walk, a device staging) runs, or the general path.

    Returns:
        ``out`` holding the reduction; bit-identical on every rank (``algorithm="mpi"``:
        as MPI returns it - equal values, but NaN payloads and the sign of a zero from
        max/min may differ between ranks).
    """
    transport = get_transport(comm)
    with transport.exclusive("allreduce", check):
        key = _plan_key(x, algorithm, op, tracer, check, check_finite, compressor, seed,
                        step, bucket, error_feedback, shadow, _agreed, options)
        plans = transport.kept.plans
        try:
            plan = None if key is None else plans.get(key)
        except TypeError:  # an option value that is not hashable: no plan kept for it
            plan = key = None
        if plan is not None:
            plans.move_to_end(key)
            return plan.checked_call(x, out, step)
        return _first_call(transport, key, x, algorithm, op, out, tracer, check,
                           check_finite, compressor, seed, step, bucket, error_feedback,
                           shadow, _agreed, options)


def _first_call(transport, key, x, algorithm, op, out, tracer, check, finite, compressor,
                seed, step, bucket, error_feedback, shadow, also, options):
    """A call without a plan kept for it: every check and the agreement on this call (one
    tiny Allreduce, in the format of a plan's per-call one, so a rank that kept a plan and
    one that did not still pair), then the plan made from what they resolved - no
    communication - runs it and is kept (``key`` None: a call no plan is kept for, e.g.
    a step past int64)."""
    checked = check_signed(
        transport, "allreduce", x, out=out, algorithm=algorithm, op=op, options=options,
        known_options=allreduce_options(algorithm, compressor), check=check, finite=finite,
        also=also, compression={"compressor": compressor, "seed": seed, "step": step,
                                "bucket": bucket, "error_feedback": error_feedback,
                                "shadow": shadow, "traced": tracer is not None})
    plan = AllreducePlan(transport, x, algorithm=algorithm, op=op, out=None, tracer=tracer,
                         check=check, finite=finite, compressor=compressor, seed=seed,
                         bucket=bucket, error_feedback=error_feedback, shadow=shadow,
                         options=options, checked=checked)
    plan.x = None  # each call passes its array: the first one need not be kept alive
    if key is not None:
        plans = transport.kept.plans
        plans[key] = plan
        if len(plans) > MAX_CACHED_PLANS:
            plans.popitem(last=False)
    return plan.run(x, out, step, bound=key is not None)


def _plan_key(x, algorithm, op, tracer, check, finite, compressor, seed, step, bucket,
              error_feedback, shadow, also, options) -> tuple | None:
    """What a kept plan is found by: everything its making resolved (a compressor object,
    an error-feedback memory and a tracer by identity; the array's kind, shape and dtype;
    the calling thread, which the agreement names); None where no plan is kept (a step
    that is no integer, a step, seed or bucket past int64; an unhashable option value
    is found out by the lookup itself)."""
    try:
        # a NumPy integer step (a loop's counter) is the integer it stands for
        if not fits_int64(step if type(step) is int else operator.index(step), seed, bucket):
            return None
        key = (type(x), x.shape, x.dtype, algorithm, op, id(tracer), check, finite,
               compressor if compressor is None or isinstance(compressor, str)
               else id(compressor), seed, bucket,
               error_feedback if type(error_feedback) is bool else id(error_feedback),
               shadow, threading.current_thread().name,
               tuple((k, type(v), v) for k, v in options.items()),
               None if also is None else tuple(also.items()))
    except (AttributeError, TypeError):
        return None
    return key


__all__ = ["MAX_CACHED_PLANS", "allreduce"]
