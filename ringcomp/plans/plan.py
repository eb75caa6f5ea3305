"""Persistent all-reduce plans: checked and agreed once, replayed per call (MPI_Allreduce_init)."""

from __future__ import annotations

import threading

import numpy as np

from ringcomp.api import (
    agrees_lengths_first,
    allreduce_options,
    check_signed,
    checked_as_read,
    exact_rider,
    run_allreduce,
)
from ringcomp.checks import (
    finite_test,
)
from ringcomp.collectives import REGISTRY
from ringcomp.compression import Key
from ringcomp.kernels import backends
from ringcomp.plans import bind
from ringcomp.plans.percall import PerCallChecks
from ringcomp.transport.agree import (
    raise_local,
)
from ringcomp.transport.cache import get_transport


def allreduce_init(x, *, algorithm: str = "ring", comm=None, op: str = "sum", out=None,
                   tracer=None, check: bool = True, check_finite: bool = False,
                   compressor=None, seed: int = 0, bucket: int = 0, error_feedback=False,
                   shadow: bool = False, **options) -> AllreducePlan:
    """A persistent all-reduce of arrays like ``x`` (MPI-4's ``MPI_Allreduce_init``):
    collective, like ``allreduce``, which it takes the arguments of (less ``step``, given
    per call). Every check and the agreement across ranks run here, once; the compressor,
    its options and the hop schedule are resolved here too. Each call of the plan then
    runs the same all-reduce as ``allreduce`` with these arguments (the same bits), paying
    only for what can differ per call: with ``check`` one tiny agreement on the step and
    on every rank's verdict on its arrays (so a bad call still fails on every rank, never
    hangs); without ``check``, none (a rank's bad call raises there only, as ``allreduce``
    with ``check=False`` does).

    Returns:
        an ``AllreducePlan``; ``plan(step=i)`` reduces ``x``'s current values,
        ``plan(y, step=i)`` another array of the same shape, dtype and memory kind.
    """
    return AllreducePlan(get_transport(comm), x, algorithm=algorithm, op=op, out=out,
                         tracer=tracer, check=check, finite=check_finite,
                         compressor=compressor, seed=seed, bucket=bucket,
                         error_feedback=error_feedback, shadow=shadow, options=options)


class AllreducePlan(PerCallChecks):
    """One all-reduce resolved once (see ``allreduce_init``). ``x``: the array a call
    without one reduces (set it to None to let the plan's go; calls then pass theirs).

    Invariant: a call runs exactly what ``allreduce(x, out=out, step=step, **arguments)``
    would, after the same checks - those that cannot change between calls (algorithm,
    options, compressor, key seed and bucket, shapes) made and agreed at the plan's
    creation, the rest (the arrays of this call, their values' finiteness, the step)
    per call.
    """

    def __init__(self, transport, x, *, algorithm, op, out, tracer, check, finite, compressor,
                 seed, bucket, error_feedback, shadow, options, checked=None):
        """``checked``: what a plain call's checks and agreement resolved for ``x``
        (``check_signed``'s (merged options, compressor, signature)): the plan is then
        made here without communicating (``ringcomp.plans.call``)."""
        self.transport = transport
        if checked is None:
            with transport.exclusive("allreduce_init", check):
                # x's values are checked per call, not here: a buffer planned before it
                # is first filled may hold NaN garbage
                checked = check_signed(
                    transport, "allreduce_init", x, out=out, algorithm=algorithm, op=op,
                    options=options, known_options=allreduce_options(algorithm, compressor),
                    check=check, finite=False, values=False,
                    compression={"compressor": compressor, "seed": seed, "step": 0,
                                 "bucket": bucket, "error_feedback": error_feedback,
                                 "shadow": shadow, "traced": tracer is not None})
        merged, comp, signed = checked
        # in place, a call's output is its input (``out``: None, so a caller's ``out=``
        # is checked as any other array)
        self._x, self.in_place = x, out is x
        self.out = None if self.in_place else out
        self._guarded = transport.guard.call("allreduce", transport.rank, check)
        self.algorithm, self.op, self.tracer, self.check = algorithm, op, tracer, check
        self.compressor, self.seed, self.bucket = comp, seed, bucket
        self.error_feedback, self.shadow, self.options = error_feedback, shadow, merged
        self._like = (type(x), tuple(x.shape), x.dtype)
        # non-finite input is refused per call (a compressed payload cannot carry it), in
        # one pass first unless the collective checks it as its hops read it; both depend
        # only on what every call shares (the arrays' kind and size, the options)
        self._as_read = checked_as_read(algorithm, comp, x, check)
        self._finite_first = (finite or comp is not None) and not self._as_read
        # fp16's values past its range, as allreduce refuses them
        self._range = comp is not None and comp.overflows_at is not None
        self._sig, self._agreed = signed if signed is not None else (None, None)
        # the thread the signature names; a call from another is signed anew (``_agree``)
        self._thread = threading.current_thread().name
        # a key that does not fit int64 was hashed with the options: signed anew per call
        self._key_hashed = self._agreed is not None and "key" in self._agreed
        if self._key_hashed:
            self._agreed = {k: v for k, v in self._agreed.items() if k != "key"}
        # the signature then its negation, kept with the array the agreement fills: a call
        # patches three fields and compares bytes (``_agree``), allocating nothing
        self._mine = self._seen = None
        if self._sig is not None and not self._key_hashed:
            self._mine = np.empty(2 * len(self._sig), np.int64)
            self._mine[:len(self._sig)] = self._sig
            self._seen = np.empty_like(self._mine)
        # a small host call's MPI call or compiled walk, bound once (``ringcomp.plans.bind``)
        self._call = None
        bindable = tracer is None and not shadow and not error_feedback and (
            comp is None or (not comp.wraps_exact and comp.overflows_at is None))
        if bindable:
            # binding may be collective once a transport (the ranks' split by node, which
            # shares the cores among kernels): a deadline then names the call it plans
            label = algorithm if comp is None else f"{algorithm}+{comp.label()}"
            with transport.doing(f"planning allreduce[{label}] of {x.nbytes} bytes"):
                self._call = bind.bind(transport, x, algorithm, op, merged, comp, seed,
                                       bucket, self._as_read,
                                       agrees_lengths_first(algorithm, comp, x, check))
            self._remember()
        # a plan made before Numba was loaded (an exact ring's walk waits for it) tries
        # once more at its first call after it is
        self._bind_later = bindable and self._call is None and not backends.numba_loaded()
        # the finiteness test for arrays like x, resolved after the binding loaded Numba
        self._nonfinite = finite_test(x) if self._finite_first else None

    def __call__(self, x=None, *, out=None, step: int = 0):
        """All-reduce ``x`` (default: the plan's) with this call's ``step`` (keying the
        compressor's random choices); returns ``out`` (default: the plan's ``out``, in
        place - into ``x`` - when the plan was made in place, else a new array)."""
        transport = self.transport
        # a traced call notes when it began (``Transport.exclusive``); others enter the
        # guard's context straight (the same admission, a lookup less on every small call)
        with (self._guarded if self.tracer is None
              else transport.exclusive("allreduce", self.check)):
            x = self._x if x is None else x
            if out is None:
                out = x if self.in_place else self.out
            return self.checked_call(x, out, step)

    def checked_call(self, x, out, step: int):
        """A call inside the transport's admission (``__call__``, or a plain
        ``allreduce`` that found this plan cached): this rank's verdict on the call, the
        agreement on it (with ``check``), then ``run``."""
        error = self._local_error(x, out, step)
        if self.check:
            self._agree(error, step)
        elif error is not None:
            raise_local("allreduce", error)
        return self.run(x, out, step)

    def run(self, x, out, step: int, bound: bool = True):
        """The all-reduce of a call checked and agreed already: the bound executor, or
        the general path where it declines (or where none was bound; ``bound=False``: a
        plain call whose step is past int64, which the compiled walks cannot carry)."""
        if self._bind_later and backends.numba_loaded():
            self._bind_later = False
            self._call = bind.bind(self.transport, x, self.algorithm, self.op, self.options,
                                   self.compressor, self.seed, self.bucket, self._as_read,
                                   agrees_lengths_first(self.algorithm, self.compressor, x,
                                                        self.check))
            self._remember()
        if self._call is not None and bound:
            done = self._call(x, out, step)
            if done is not None:
                return done
        return run_allreduce(self.transport, x, out, self.algorithm, self.op, self.tracer,
                             self.check, self.compressor, Key(self.seed, step, self.bucket),
                             self.error_feedback, self.shadow, self.options, self._as_read)

    @property
    def x(self):
        """The array a call without one reduces (None once let go: calls then pass one)."""
        return self._x

    @x.setter
    def x(self, array) -> None:
        """The plan's calls without an array reduce ``array`` from now on: one of the shape,
        dtype and kind the plan was made for (else ValueError, on this rank: nothing is
        collective here), or None."""
        if array is not None:
            error = self._array_error(array, array if self.in_place else self.out)
            if error is not None:
                raise_local("plan.x", error)
        self._x = array
        self._remember()

    def _remember(self) -> None:
        """Let the bound call work out the plan's own arrays' views once (a call on them
        passes ``x`` and, in place, ``out = x``; else the plan's ``out``, when it has one),
        or forget them once the plan lets ``x`` go (it is then not kept alive either)."""
        if self._call is None:
            return
        out = self._x if self.in_place else self.out
        self._call.remember(self._x, out)

    def with_rider(self, x, rider: AllreducePlan, rider_x, *, step: int = 0):
        """This plan's call on ``x`` at ``step`` with ``rider``'s call on ``rider_x`` (an
        exact ring plan) travelling in the same walk: each chunk's payloads, then the
        rider's segments of that chunk (``Ctx.rider``). One agreement (both calls'
        verdicts) and one pass of messages instead of two calls; each result has the bits
        its own call would give. For a compressed ring of two or more ranks (the training
        engine's last compressed bucket carrying the small exact one: a separate call of
        a few KB costs its whole latency again). Returns ``(out, rider_out)``, both new
        arrays."""
        if not (self.algorithm == rider.algorithm and REGISTRY[self.algorithm].carries_riders
                and self.compressor is not None
                and not self.compressor.wraps_exact and rider.compressor is None
                and rider.op == "sum" and rider.transport is self.transport
                and self.transport.size > 1 and not self.in_place and not rider.in_place):
            raise ValueError("with_rider: a compressed ring plan and an exact ring sum plan "
                             "on one transport of two or more ranks, both out of place")
        transport = self.transport
        with transport.exclusive("allreduce", self.check):
            error = self._local_error(x, None, step) or rider._local_error(rider_x, None, step)
            if self.check:
                self._agree(error, step)
            elif error is not None:
                raise_local("allreduce", error)
            rider_out, parts = exact_rider(transport, rider_x, rider.options)
            out = run_allreduce(transport, x, None, self.algorithm, self.op, self.tracer,
                                self.check, self.compressor, Key(self.seed, step, self.bucket),
                                self.error_feedback, self.shadow, self.options,
                                self._as_read, rider=parts)
            return out, rider_out


__all__ = ["AllreducePlan", "allreduce_init"]
