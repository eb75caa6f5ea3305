"""A persistent plan's small all-reduce bound once: MPI's call or the compiled walk."""

from __future__ import annotations

import numpy as np

from ringcomp.checks import finite_test
from ringcomp.collectives import REGISTRY, auto, executor
from ringcomp.devices import device
from ringcomp.transport.agree import agree_error
from ringcomp.transport.control import native_op


def bind(transport, x, algorithm: str, op: str, options: dict, comp, seed: int,
         bucket: int, as_read: bool = False,
         agree_lengths: bool = False) -> Replay | Staged | Auto | None:
    """What a plan's call on arrays like ``x`` runs, resolved now: for host arrays MPI's
    own Allreduce (``algorithm="mpi"``, exact), or the algorithm's compiled walk where
    ``executor.compiled`` - the general path's choice too - binds one for ``x``'s size,
    dtype and ``options``; None for every other call, which takes the general path. The
    caller binds only calls that are untraced, unshadowed, without error feedback, whose
    compressor (if any) needs no check of the sum (``AllreducePlan``). ``as_read``: the
    input is not checked before the call (``api.checked_as_read``), so the compressed walk
    runs in two halves around the agreement on its finiteness, as the general path's
    (``BoundWalk.serve``). For ``auto``, what it settles on, bound then
    (``Auto``). For a device array where MPI is not CUDA-aware,
    the host twin's bound call on a host copy (``Staged``); ``agree_lengths``: its calls
    agree on the length and item size first, as the general path's unchecked compressed
    device calls do (``api._run_allreduce``), so the two pair message for message."""
    entry = REGISTRY.get(algorithm)
    binds = None if entry is None else entry.binds
    if binds == "choice" and comp is None:
        return Auto(transport, x, op, options) if x.size and transport.size > 1 else None
    if type(x) is not np.ndarray:
        staged = _staged(transport, x, algorithm, op, options, comp, seed, bucket)
        if staged is not None:
            staged.agree_lengths = agree_lengths
        return staged
    if not (x.size and transport.size > 1):
        return None
    if binds == "native" and comp is None:
        return Replay(transport, algorithm, _mpi_call(transport, op), None, walks=False)
    # the compiled walk the general path would run (``executor.compiled``, the one
    # choice); an exact one only once Numba is loaded, which a compressed plan loads now
    walk = executor.compiled(transport, algorithm, x.size, x.dtype, op, options, comp,
                             (seed, bucket))
    if walk is None:
        return None
    if comp is None:
        return Replay(transport, algorithm, walk, None)
    replay = Replay(transport, f"{algorithm}+{comp.label()}", walk,
                    np.array((seed, 0, bucket), np.int64))
    if as_read:
        replay.as_read = finite_test(x)
    return replay


def _staged(transport, x, algorithm, op, options, comp, seed, bucket) -> Staged | None:
    """``bind`` for a device array ``x`` where MPI is not CUDA-aware: its host twin's
    bound call, run on a host copy (``Staged``); None where the host call would not bind
    or MPI takes device memory itself."""
    if not device.is_device(x) or transport.cuda_aware:
        return None
    twin = np.empty(x.size, np.dtype(x.dtype))
    inner = bind(transport, twin, algorithm, op, options, comp, seed, bucket)
    return None if inner is None else Staged(inner)


def _mpi_call(transport, op: str):
    mpi_op = native_op(op)

    def call(src, out, tag_base: int) -> None:  # MPI's call takes no tag
        transport.host_allreduce(None if src is out else src, out, mpi_op)

    return call


class Replay:
    """One bound call (``bind``): ``replay(x, out, step)`` all-reduces ``x`` into ``out``
    (None: a new array; ``x`` itself: in place) and returns ``out``, with what the general
    path would send and give, bit for bit; or returns None, having sent nothing, where
    this call's arrays or the transport's state leave it to the general path (``out``
    overlapping ``x`` in part, messages held for a device).

    ``remember(x, out)``: the plan's own arrays, whose views and overlap are worked out
    once (a training loop's calls pass the same two arrays every time; each of those
    steps is a few hundred nanoseconds a call, out of a call of a few microseconds)."""

    __slots__ = ("transport", "algorithm", "call", "keys", "walks", "as_read", "_own")

    def __init__(self, transport, algorithm: str, call, keys, walks: bool = True):
        self.transport, self.algorithm, self.call, self.keys = transport, algorithm, call, keys
        # a compiled walk (MPI's own call: not), which calls MPI from compiled code
        self.walks = walks
        # a compressed walk whose input was not checked first: its finiteness test
        self.as_read = None
        self._own = (None, None, None, None)  # (x, out, src, flat) of ``remember``

    def remember(self, x, out) -> None:
        """Work out the views of the plan's arrays ``x`` and ``out`` now (either None:
        forget them); the plan holds both, so they are the same memory while it does."""
        views = None if x is None or out is None else self._views(x, out)
        self._own = (None, None, None, None) if views is None else (x, out, *views)

    @staticmethod
    def _views(x, out):
        """(source, destination) flat views for ``x`` into ``out``, or None where ``out``
        overlaps ``x`` in part (the general path's case)."""
        if out is x or np.may_share_memory(out, x):  # bounds only, in C: the common case
            shared = "same" if out is x else device.overlap(out, x)
            if shared == "partial":
                return None
            if shared:  # in place, through this array or another view of its memory
                x = out
        flat = out.reshape(-1)
        return (flat if x is out else x.reshape(-1)), flat

    def __call__(self, x, out, step: int):
        if self.walks and self.transport.native is None:
            return None  # messages held for a device go out first, in the general path's order
        own_x, own_out, src, flat = self._own
        if x is not own_x or out is not own_out:
            if out is None:
                out = np.empty_like(x)
            views = self._views(x, out)
            if views is None:
                return None
            src, flat = views
        if self.as_read is not None and self.as_read(src):
            return None  # the general path sends the same messages and refuses it everywhere
        tag_base = self.transport.begin_op("allreduce", self.algorithm, flat.nbytes)
        if self.keys is None:
            self.call(src, flat, tag_base)
        elif self.as_read is None:
            self.keys[1] = step
            self.call(src, flat, tag_base, self.keys, None)
        else:  # the input all read, nothing outstanding: every rank's verdict, then write
            self.keys[1] = step
            self.call.reduce_scatter(src, tag_base, self.keys, None)
            agree_error(self.transport, "allreduce", None, src.size, src.itemsize)
            self.call.allgather(flat, tag_base + 1, None)
        return out


class Staged:
    """A small device all-reduce through host memory, bound (``bind``): where MPI is not
    CUDA-aware every message is staged through host memory anyway, and the hop-by-hop
    device path pays per hop a copy out, a copy in and its launches and Python. Here the
    input is copied out once, the host twin's bound call (MPI's Allreduce or the compiled
    walk) runs in place on the copy, and the result is copied back: two copies a call
    instead of two a hop, the same messages, and the same bits (the host kernels and the
    device kernels are bit-equal, and the walk's segments are the same). The result is
    complete when the call returns, as every device result is (``api._run``)."""

    __slots__ = ("inner", "agree_lengths")

    def __init__(self, inner: Replay):
        self.inner = inner
        # an unchecked compressed call: the lengths agreed before any payload (``bind``)
        self.agree_lengths = False

    def remember(self, x, out) -> None:
        """Nothing to work out ahead: the host copy is new on every call."""

    def __call__(self, x, out, step: int):
        inner = self.inner
        if inner.walks and inner.transport.native is None:
            return None  # messages held for a device go out first, in the general path's order
        if out is None:
            out = device.array_module(x).empty(x.shape, dtype=x.dtype)
        elif out is not x and device.overlap(out, x) == "partial":
            return None
        if self.agree_lengths:  # before anything is sent or written
            agree_error(inner.transport, "allreduce", None, x.size, x.itemsize)
        device.synchronize(x)  # the work that produced x is done before it is copied
        inner.transport.device_syncs += 1  # (counted as the transport's own staging is)
        host = device.to_host(x)  # bytes, complete when it returns
        values = host.view(x.dtype)
        if inner(values, values, step) is None:
            return None  # nothing was sent: the general path runs the call
        device.from_host(host, out)
        device.synchronize(out)
        return out


class Auto:
    """``auto``'s plan: the algorithm auto settled on for this size (``auto.settled``),
    bound as a plan of that algorithm would bind it, once auto has decided - before that
    (its first call, the trial of its finalists) every call takes the general path,
    which decides. One choice, in one place, however the call came in."""

    __slots__ = ("transport", "op", "key", "bound", "_own")

    def __init__(self, transport, x, op: str, options: dict):
        self.transport, self.op = transport, op
        self.key = auto.choice_key(x.nbytes, options)
        self.bound: dict = {}  # the settled algorithm -> its bound call (or None)
        self._own = (None, None)

    def remember(self, x, out) -> None:
        self._own = (x, out)
        for inner in self.bound.values():
            if inner is not None:
                inner.remember(x, out)

    def __call__(self, x, out, step: int):
        decided = auto.settled(self.transport, self.key)
        if decided is None:
            return None
        inner = self.bound.get(decided, self)
        if inner is self:  # first call since auto settled: bind what it chose
            inner = self.bound[decided] = bind(self.transport, x, decided, self.op,
                                               dict(REGISTRY[decided].options), None, 0, 0)
            if inner is not None:
                inner.remember(*self._own)
        if inner is None:
            return None
        done = inner(x, out, step)
        if done is not None:
            self.transport.kept.auto_last = decided  # as the general path notes it
        return done
