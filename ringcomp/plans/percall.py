"""What a persistent plan checks and agrees on every call: its arrays against the ones it
was made for, the step, the values' finiteness and range, and the one tiny agreement (a
mixin of ``plan.AllreducePlan``)."""

from __future__ import annotations

import operator
import threading

import numpy as np

from ringcomp.checks import (
    LocalError,
    check_array,
    check_finite,
    check_out,
    check_range,
    check_writeable,
)
from ringcomp.kernels.rng import fits_int64
from ringcomp.transport.agree import (
    ERROR_FIELD,
    PACKED_FIELD,
    STEP_FIELD,
    THREAD_OPTION,
    judge,
    packed,
    settle,
    signature,
)


class PerCallChecks:
    """A call's verdict on what it passed (``_local_error``) and the agreement on every
    rank's (``_agree``), as a plain ``allreduce``'s checks and agreement give them."""

    def _array_error(self, x, out) -> LocalError | None:
        """This rank's verdict on the arrays of a call: ``x`` and ``out`` are checked on
        every call, the plan's own too - their dtype, shape and strides can change in
        place (``x.dtype = ...``), and a walk bound to the old layout would then write
        wrong values or past the end. (Their address cannot: a NumPy or CuPy array's
        ``data`` is read-only, and ``resize`` refuses an array the plan references.)"""
        try:
            if x is None:
                raise LocalError(1, "no array: the plan let its own go (plan.x = None), so "
                                    "each call passes one")
            check_array(x)
            if (type(x), tuple(x.shape), x.dtype) != self._like:
                changed = " (the plan's own array, changed in place)" if x is self._x else ""
                raise LocalError(20, f"got {type(x).__name__} {tuple(x.shape)} {x.dtype}"
                                     f"{changed}; the plan was made for "
                                     f"{self._like[0].__name__} "
                                     f"{self._like[1]} {self._like[2]}: make a new plan "
                                     f"(allreduce_init) for it")
            if out is x:
                check_writeable(x, "the input (written in place)")
            elif out is not None:
                check_out(out, self._like[1], self._like[2])
        except LocalError as exc:
            return exc
        return None

    def _local_error(self, x, out, step) -> LocalError | None:
        """This rank's verdict on what this call passed, as ``allreduce``'s checks give it."""
        _, shape, dtype = self._like
        if not (x is self._x and x is not None and x.dtype is dtype and x.shape == shape
                and x.flags.c_contiguous and (out is None or (
                    out is x and x.flags.writeable) or (
                    out is self.out and out.dtype is dtype and out.shape == shape
                    and out.flags.c_contiguous and out.flags.writeable))):
            # not the plan's own arrays as they were planned (the common call, decided
            # in a few lookups): every check
            error = self._array_error(x, out)
            if error is not None:
                return error
        try:
            if not isinstance(step, int):
                step = operator.index(step)
            if not fits_int64(step):
                raise OverflowError
        except (TypeError, OverflowError):
            return LocalError(16, f"step={step!r} (an integer within int64)")
        except LocalError as exc:
            return exc
        try:
            if self._finite_first:
                check_finite(x, self._nonfinite)
            if self._range:
                check_range(x, self.compressor)
        except LocalError as exc:
            return exc
        return None

    def _agree(self, error: LocalError | None, step: int) -> None:
        """One tiny agreement: every rank's verdict and step, as ``allreduce``'s."""
        step = step if error is None else 0
        mine = self._mine
        thread = threading.current_thread().name
        if mine is not None and thread == self._thread:
            n = len(self._sig)
            mine[STEP_FIELD] = step
            mine[ERROR_FIELD] = error.code if error is not None else 0
            mine[PACKED_FIELD] = packed(self.transport, error)
            np.negative(mine[:n], out=mine[n:])
            seen = self._seen
            self.transport.agree_into(mine, seen)
            # every rank passed the same signature exactly when the maximum of the values
            # and of their negations are this rank's own
            if error is not None or seen.tobytes() != mine.tobytes():
                judge(self.transport, "allreduce", -seen[n:], seen[:n], self._agreed, error)
            return
        # a key past int64 (hashed with the options), or a call from a thread other than
        # the plan's: signed anew, as ``allreduce`` would sign it - calls pair up across
        # ranks in call order, so a thread's name is agreed as ``allreduce`` agrees it
        agreed = self._agreed
        if thread != self._thread:
            agreed = {**agreed, THREAD_OPTION: thread}
        sig, agreed = signature(self.transport, length=self._sig[0], dtype=self._like[2],
                                algorithm_index=self._sig[2], op=self.op, options=agreed,
                                root=self._sig[5], key=(self.seed, step, self.bucket))
        sig[ERROR_FIELD] = error.code if error is not None else 0
        sig[PACKED_FIELD] = packed(self.transport, error)
        settle(self.transport, "allreduce", sig, agreed, error)
