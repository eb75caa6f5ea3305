"""What every collective algorithm shares: the registry and the per-call context."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ringcomp import alphabeta
from ringcomp.checks import LocalError, nonfinite_detail
from ringcomp.devices import device
from ringcomp.kernels import backends, reduce_into, reduce_pair_into
from ringcomp.partition import even_segments
from ringcomp.transport.agree import agree_error

#: the pipelining segment of the ring and Rabenseifner, and the unit of compression of
#: every compressed form (the double binary tree pipelines its own, smaller one)
DEFAULT_SEGMENT_BYTES = 1 << 20


@dataclass(frozen=True)
class Algorithm:
    """A registered all-reduce algorithm: ``run(ctx)`` reduces ``ctx.buf`` in place.

    ``compressed(ctx)``, when the algorithm has a compressed form, runs it with
    ``ctx.compressor``; ``segments(n, p, seg_elems)`` lists the ``(a, b)`` element ranges
    that form encodes (error feedback encodes the same ones). ``reads_input_first``: the
    compressed form reads all of its input (through ``Ctx.read``) before it writes any
    output, and calls ``Ctx.agree_input`` in between - so it runs in place without a copy,
    and refuses non-finite input as its hops read it instead of after a separate pass.

    Its executors: ``run`` and ``compressed`` are its Python walks; ``walk``, where it has
    one, binds its compiled host walk, ``walk(transport, n, dtype, seg_elems, comp) ->
    walk | None`` (``comp`` None: the exact sum; the ring's walks read its ``schedule``),
    which ``executor.compiled`` alone chooses. What a plan binds a small host call of it
    to (``plans.bind``), ``binds``: "native" (MPI's own call), "choice" (what ``auto``
    settled on), or None (its ``walk``, else the general path). ``carries_riders``: its
    compressed walk carries an exact ring's segments in its messages (``Ctx.rider``).
    ``cost``: its alpha-beta coefficients
    ``(p, nbytes) -> (alpha, beta, gamma)`` (``alphabeta.COSTS``), None where there is
    no formula."""

    name: str
    run: Callable
    options: dict = field(default_factory=dict)
    summary: str = ""
    compressed: Callable | None = None
    segments: Callable | None = None
    reads_input_first: bool = False
    binds: str | None = None
    carries_riders: bool = False
    walk: Callable | None = None

    @property
    def cost(self) -> Callable | None:
        return alphabeta.COSTS.get(self.name)


REGISTRY: dict[str, Algorithm] = {}
#: what a plan may bind an algorithm's small host calls to (``Algorithm.binds``)
BINDS = (None, "native", "choice")


def register(name: str, *, options: dict | None = None, summary: str = "",
             binds: str | None = None, carries_riders: bool = False,
             walk: Callable | None = None):
    """Decorator: register ``run(ctx)`` under ``name`` with its option defaults (``binds``,
    ``carries_riders``, ``walk``: see ``Algorithm``)."""
    if binds not in BINDS:
        raise ValueError(f"binds={binds!r}: one of {BINDS}")

    def wrap(run):
        if name in REGISTRY:
            raise ValueError(f"algorithm {name!r} registered twice")
        REGISTRY[name] = Algorithm(name, run, dict(options or {}), summary, binds=binds,
                                   carries_riders=carries_riders, walk=walk)
        return run

    return wrap


def register_compressed(name: str, *, segments: Callable, reads_input_first: bool = False):
    """Decorator: make ``run(ctx)`` the compressed form of the registered algorithm
    ``name``; ``segments(n, p, seg_elems)`` names the ranges it encodes
    (``reads_input_first``: see ``Algorithm``)."""

    def wrap(run):
        exact = REGISTRY.get(name)
        if exact is None:
            raise ValueError(f"register the exact algorithm {name!r} before its compressed form")
        if exact.compressed is not None:
            raise ValueError(f"compressed form of {name!r} registered twice")
        REGISTRY[name] = replace(exact, compressed=run, segments=segments,
                                 reads_input_first=reads_input_first)
        return run

    return wrap


def compressed_algorithms() -> list[str]:
    """Names of the algorithms that have a compressed form."""
    return sorted(name for name, algorithm in REGISTRY.items() if algorithm.compressed)


@dataclass(eq=False, slots=True)
class Ctx:
    """One collective call: the transport, the flat buffer, the op, tags, tracing, scratch,
    and - for a compressed call - the compressor, its key, the error-feedback memory and
    whether to shadow the hops (``None``/``False`` when exact); ``check_input``: refuse
    NaN/Inf in the input as ``read`` meets it (``agree_input`` raises on every rank);
    ``rider``: another buffer's exact ring whose segments travel in the same walk (only the
    compressed ring takes one: ``ringcomp.plans.plan.AllreducePlan.with_rider``).

    Algorithms talk only to this object (never to mpi4py or cupy), which keeps each
    algorithm file to its steps and lets the tracer see every hop. Out of place, the input
    stays in ``src`` and ``buf`` starts uninitialised; an algorithm either reads ``src``
    where it first touches a region (ring) or calls ``materialize()`` to copy it over first.
    """

    t: object
    buf: object
    op: str
    algorithm: str
    options: dict
    tracer: object = None
    name: str = "allreduce"
    src: object = None
    compressor: object = None
    key: object = None
    memory: object = None
    shadow: bool = False
    check_input: bool = False
    rider: object = None  # an exact ring riding along a compressed ring (``RingParts``)
    input_nonfinite: bool = field(init=False, default=False)
    _finite: object = field(init=False, default=None)  # the finiteness kernel, once
    in_place: bool = field(init=False)
    rank: int = field(init=False)
    size: int = field(init=False)
    itemsize: int = field(init=False)
    tag_base: int = field(init=False)
    op_id: int = field(init=False)
    chosen: str | None = field(init=False, default=None)  # what ``auto`` ran

    def __post_init__(self):
        self.in_place = self.src is None
        if self.src is None:
            self.src = self.buf
        self.rank, self.size = self.t.rank, self.t.size
        self.itemsize = self.buf.dtype.itemsize
        self.tag_base = self.t.begin_op(self.name, self.algorithm, self.buf.nbytes)
        self.op_id = self.t.op_id

    def view(self, lo: int, hi: int, phase_offset: int) -> Ctx:
        """This call restricted to elements [lo, hi) of its output, reduced in place there,
        for an algorithm that runs another on a part of its partial result (the torus's
        column rings): the same op, tracer and scratch, tags shifted by ``phase_offset``
        so its messages never match the caller's."""
        sub = copy.copy(self)
        sub.buf = sub.src = self.buf[lo:hi]
        sub.in_place = True
        sub.tag_base = self.tag_base + phase_offset
        return sub

    # -- messages ----------------------------------------------------------------------
    def isend(self, view, peer: int, phase: int):
        return self.t.isend(view, peer, self.tag_base + phase)

    def irecv(self, view, peer: int, phase: int):
        return self.t.irecv(view, peer, self.tag_base + phase)

    def wait(self, pending, phase_name: str = "", step: int = -1, seg: int = -1,
             chunk: int = -1) -> None:
        """Complete a posted message; when tracing, record it as one hop."""
        self.t.where = (phase_name, step)
        if self.tracer is None:
            self.t.complete(pending)
            return
        waited = self.t.wait(pending)
        self.tracer.hop(op=self.op_id, alg=self.algorithm, phase=phase_name, step=step,
                        chunk=chunk, seg=seg, kind=pending.kind,
                        src=pending.peer if pending.kind == "recv" else self.rank,
                        dst=self.rank if pending.kind == "recv" else pending.peer,
                        bytes=pending.nbytes, t0=pending.t_post, t1=time.perf_counter(),
                        wait=waited)

    def waitall(self, pendings, phase_name: str = "", step: int = -1) -> None:
        if self.tracer is None:  # nothing to record: in one MPI call where it can
            self.t.where = (phase_name, step)
            self.t.waitall(pendings)
            return
        for pending in pendings:
            self.wait(pending, phase_name, step)

    def test(self, pending) -> bool:
        """Non-blocking completion check (does not run the GPU unstaging step)."""
        return self.t.test(pending)

    def exchange(self, sendview, recvview, peer: int, phase: int, phase_name: str = "",
                 step: int = -1) -> None:
        """Swap data with ``peer``; empty sides post no message (both ranks know the sizes)."""
        recv = self.irecv(recvview, peer, phase) if recvview.size else None
        send = self.isend(sendview, peer, phase) if sendview.size else None
        if recv is not None:
            self.wait(recv, phase_name, step)
        if send is not None:
            self.wait(send, phase_name, step)

    def exchange_reduce(self, sendview, target, scratch, peer: int, phase: int,
                        seg_elems: int, mine_first: bool, phase_name: str = "",
                        step: int = -1, source=None) -> None:
        """Send ``sendview`` to ``peer`` while receiving its copy of ``target``, in segments,
        writing op(``source``, incoming) into ``target`` (fixed operand order; ``source``
        defaults to ``target``) as each segment lands, so the reduction of one segment
        overlaps the transfer of the next."""
        source = target if source is None else source
        pieces = even_segments(0, target.size, seg_elems)
        recvs = [self.irecv(scratch[a:b], peer, phase) for a, b in pieces]
        sends = [self.isend(sendview[a:b], peer, phase)
                 for a, b in even_segments(0, sendview.size, seg_elems)]
        for seg, ((a, b), recv) in enumerate(zip(pieces, recvs, strict=True)):
            self.wait(recv, phase_name, step, seg)
            self.reduce_ordered(source[a:b], scratch[a:b], mine_first, out=target[a:b])
        self.waitall(sends, phase_name, step)

    # -- reading the input ---------------------------------------------------------------
    def read(self, a: int, b: int):
        """Elements [a, b) of the input, as a hop is about to read them. With
        ``check_input`` each segment gets a second look while it is in cache (~9 us a MB
        here) instead of a pass over the whole input first; one holding NaN or Inf is
        noted and handed on as zeros, so no codec ever meets them (a top-k selection or an
        index computed from a NaN could crash) - the call is refused before it writes."""
        x = self.src[a:b]
        if self.check_input:
            if self._finite is None:
                self._finite = backends.for_size("finite", self.src.size, like=self.src)
            if self._finite.nonfinite(x):
                self.input_nonfinite = True
                return device.array_module(x).zeros_like(x)
        return x

    def agree_input(self) -> None:
        """With ``check_input``: raise the same error on every rank if any rank's input held
        NaN or Inf (one tiny Allreduce). Called after the input is read, before the output
        is written, with no message of the call outstanding."""
        if self.check_input:
            error = LocalError(9, nonfinite_detail(self.src)) if self.input_nonfinite else None
            agree_error(self.t, self.name, error, self.src.size, self.src.itemsize)

    # -- local compute -----------------------------------------------------------------
    def materialize(self) -> None:
        """Copy the input into the output buffer (for algorithms that work in place)."""
        if not self.in_place:
            self.buf[...] = self.src
            self.src = self.buf
            self.in_place = True

    def reduce(self, dst, src) -> None:
        reduce_into(self.op, dst, src)

    def reduce_ordered(self, mine, theirs, mine_first: bool, out=None) -> None:
        """``out = op(lower, higher)`` with a rank-agreed operand order (bit-identical);
        ``out`` defaults to ``mine``."""
        out = mine if out is None else out
        if mine_first:
            reduce_pair_into(self.op, mine, theirs, out)
        else:
            reduce_pair_into(self.op, theirs, mine, out)

    def empty(self, shape, dtype=np.uint8):
        """A new array in the memory of the buffers (host or device): payloads, messages."""
        return device.array_module(self.buf).empty(shape, dtype)

    def scratch(self, count: int, slot: int = 0):
        """A reusable scratch array of ``count`` elements of the buffer's dtype and device."""
        return kept_scratch(self.t, device.array_module(self.buf), self.buf.dtype, count, slot)


def kept_scratch(transport, xp, dtype, count: int, slot: int = 0):
    """``count`` elements of scratch of ``dtype`` in ``xp``'s memory, kept by ``transport``
    from call to call in ``slot`` (its calls run one at a time), grown when a longer one
    is asked for (a view of it handed out earlier stays valid: its owner keeps it)."""
    key = (slot, xp.__name__, np.dtype(dtype).str)
    cached = transport.kept.scratch.get(key)
    if cached is None or cached.size < count:
        cached = xp.empty(max(count, 1), dtype=dtype)
        transport.kept.scratch[key] = cached
    return cached[:count]
