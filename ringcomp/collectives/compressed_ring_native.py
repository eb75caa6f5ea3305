"""The compressed ring's walk on a small host buffer compiled whole (Marsit, the scaled sign,
QSGD, TernGrad, top-k): the Python walk's payloads, messages and bits without its per-hop
cost."""

from __future__ import annotations

import sys
from functools import lru_cache

import numba
import numpy as np

from ringcomp.collectives import native_codecs as codecs
from ringcomp.collectives import schedule
from ringcomp.collectives.base import kept_scratch
from ringcomp.collectives.compressed_ring_walk import _allgather, _reduce_scatter, _walk
from ringcomp.collectives.schedule import ring_layout
from ringcomp.kernels import backends, numba_cache
from ringcomp.kernels.rng import threshold
from ringcomp.transport import walkstate
from ringcomp.transport.mpicalls import typed_like

#: the output dtypes (the codecs decode into float32 or float64)
DTYPES = frozenset(np.dtype(name) for name in ("float32", "float64"))
#: the widest chunk a walk takes (its kernels run serially: past this a chunk's parallel
#: kernels in the Python walk are worth their dispatch)
MAX_CHUNK = 1 << 16
#: off: every compressed ring runs the Python walk (the tests compare the two)
ENABLED = True


@lru_cache(maxsize=256)
def _plan(n: int, p: int, seg_elems: int, r: int, comp, block: int) -> tuple | None:
    """For a buffer of ``n`` elements over ``p`` ranks, its chunks of ``seg_elems`` or
    fewer each (one segment, ``ring_layout``) and of at least one element and at most
    ``block``: (chunk bounds, each chunk's payload bytes (``comp.nbytes``), each step's
    Marsit threshold, the widest payload in bytes rounded up to 8, the widest chunk, this
    rank's messages and bytes in each phase); None for any other layout."""
    chunks, segments, max_chunk = ring_layout(n, p, seg_elems)
    if not (all(len(s) == 1 for s in segments) and chunks[0][1] > chunks[0][0]
            and max_chunk <= block):
        return None
    bounds = np.array([lo for lo, _ in chunks] + [chunks[-1][1]], np.int64)
    sizes = np.array([comp.nbytes(hi - lo) for lo, hi in chunks], np.int64)
    thr = np.array([threshold(1, step + 2) for step in range(p - 1)], np.uint64)
    for array in (bounds, sizes, thr):
        array.flags.writeable = False
    rs, ag = schedule.ring(p, r).sent()
    width = -(-int(sizes.max()) // 8) * 8
    return (bounds, sizes, thr, width, max_chunk, (len(rs), int(sizes[rs].sum())),
            (len(ag), int(sizes[ag].sum())))


def _rider(transport, parts, dtype) -> tuple | None:
    """A rider's side of the walk (``RingParts``: an exact ring's sum of host arrays of
    ``dtype``, every chunk one segment): (its arrays as the walk takes them, its messages
    and bytes this rank sends in each phase); None where the walk cannot carry it."""
    src, buf = parts.ctx.src, parts.ctx.buf
    if not (type(src) is np.ndarray and type(buf) is np.ndarray and src.dtype == dtype
            and buf.dtype == dtype and src.flags.c_contiguous and buf.flags.c_contiguous
            and src.flags.writeable and all(len(s) <= 1 for s in parts.segments)):
        return None
    bounds, rs, ag = _rider_plan(tuple(parts.chunks), transport.rank)
    halves = tuple(kept_scratch(transport, np, dtype, parts.max_chunk, slot)
                   for slot in (0, 1))
    return (src, buf, halves, bounds), rs, ag


@lru_cache(maxsize=256)
def _rider_plan(chunks: tuple, r: int) -> tuple:
    """A rider's chunk bounds (one array) and the (messages, bytes in elements) this rank
    sends of it in each phase: one message per non-empty chunk sent."""
    bounds = np.array([lo for lo, _ in chunks] + [chunks[-1][1]], np.int64)
    bounds.flags.writeable = False
    size = [hi - lo for lo, hi in chunks]
    return bounds, *((sum(1 for c in sent if size[c]), sum(size[c] for c in sent))
                      for sent in schedule.ring(len(chunks), r).sent())


@lru_cache(maxsize=8)
def _no_rider(dtype, p: int) -> tuple:
    """What a walk carrying no rider takes in its place: empty arrays, empty chunks."""
    empty = np.empty(0, dtype)
    bounds = np.zeros(p + 1, np.int64)
    bounds.flags.writeable = False
    return (empty, empty, (empty, empty), bounds), (0, 0), (0, 0)


def bound(transport, comp, n: int, dtype, seg_elems: int) -> BoundWalk | None:
    """The walk for ``comp``'s sums of ``n`` elements of ``dtype`` in segments of
    ``seg_elems`` over ``transport``, its rule, schedule and buffers resolved; None where
    no walk applies (another compressor or dtype, a layout of several segments a chunk or
    chunks past the walk's block, no ``Transport.native``). The ring's ``Algorithm.walk``
    (``ring.compiled_walk``) binds it, for a plan to keep or a general-path call to run
    (``executor``)."""
    found = codecs.rule_of(comp)
    dtype = np.dtype(dtype)
    if not (ENABLED and found is not None and sys.byteorder == "little" and dtype in DTYPES):
        return None
    rule, spec = found
    kept = transport.kept
    if kept.kernel_threads is None:
        kept.kernel_threads = backends.share_cores(transport.local_size)
    # kernels on one thread: the Python walk's parallel kernels are serial too
    block = MAX_CHUNK if kept.kernel_threads == 1 else codecs.ONE_BLOCK[rule]
    plan = _plan(n, transport.size, seg_elems, transport.rank, comp, block)
    mpi = transport.native
    if plan is None or mpi is None:
        return None
    compile_walks((dtype,))  # now, not on its first call: that waits under the deadline
    return BoundWalk(transport, mpi, rule, spec, dtype, plan)


class BoundWalk:
    """``bound``'s walk: ``walk(src, out, tag_base, keys, rider)`` reduces the flat host
    array ``src`` into ``out`` (``src is out``: in place) with the hop streams of ``keys``
    (an int64 array: seed, step, bucket), carrying ``rider`` (``_rider``; None: none);
    ``reduce_scatter`` and ``allgather`` are its halves, for a call that agrees on its
    input between them; ``serve(ctx)`` runs a general-path call where it can."""

    __slots__ = ("transport", "_head", "_codec", "_tail", "_rs", "_ag", "_none")

    def __init__(self, transport, mpi, rule, spec, dtype, plan):
        bounds, sizes, thr, width, max_chunk, self._rs, self._ag = plan
        p = transport.size
        slots, reqs, statuses = _buffers(transport, mpi, p, width)
        scratch = kept_scratch(transport, np, dtype, max_chunk, slot=2)  # a cascade's sum
        self.transport = transport
        self._head, self._codec = (rule, spec), (slots, scratch, bounds, sizes, thr)
        ring = schedule.ring(p, transport.rank)
        self._tail = ((ring.order, ring.right, ring.left, mpi.fns, mpi.comm, mpi.byte),
                      (reqs, statuses, transport.walk_state))
        self._none = _no_rider(dtype, p)

    def __call__(self, src, out, tag_base: int, keys, rider=None) -> None:
        common, buffers = self._tail
        arrays, rs, ag = self._none if rider is None else rider
        self.transport.run_native(
            _walk, self._head + (src, out) + self._codec + (keys, arrays) + common
            + (tag_base,) + buffers, self._rs[0] + self._ag[0] + rs[0] + ag[0],
            self._rs[1] + self._ag[1] + (rs[1] + ag[1]) * out.itemsize, WHAT)

    def serve(self, ctx) -> bool:
        """Run ``ctx``'s compressed sum (flat host arrays, untraced, unshadowed:
        ``executor.run``) if this walk can; whether it did. It can for contiguous arrays
        with a rider (``ctx.rider``) of the same dtype whose every chunk is one segment, or
        none. Input the hops would refuse as they read it (``check_input``: NaN or Inf) is
        left to the Python walk, which sends the same messages."""
        src, buf, key = ctx.src, ctx.buf, ctx.key
        if not (buf.flags.c_contiguous and src.flags.c_contiguous):
            return False
        rider = None
        if ctx.rider is not None:
            rider = _rider(self.transport, ctx.rider, buf.dtype)
            if rider is None:
                return False
        if ctx.check_input and backends.for_size("finite", src.size, like=src).nonfinite(src):
            return False  # the Python walk hands it on as zeros and refuses it on every rank
        keys = np.array((key.seed, key.step, key.bucket), np.int64)
        if not ctx.check_input:
            self(src, buf, ctx.tag_base, keys, rider)
            return True
        self.reduce_scatter(src, ctx.tag_base, keys, rider)
        ctx.agree_input()  # 3. the input was all read; nothing of the call is outstanding
        self.allgather(buf, ctx.tag_base + 1, rider)
        return True

    def reduce_scatter(self, src, tag_base: int, keys, rider=None) -> None:
        common, buffers = self._tail
        arrays, rs, _ = self._none if rider is None else rider
        self.transport.run_native(
            _reduce_scatter, self._head + (src,) + self._codec + (keys, arrays) + common
            + (tag_base,) + buffers, self._rs[0] + rs[0], self._rs[1] + rs[1] * src.itemsize,
            WHAT)

    def allgather(self, out, tag: int, rider=None) -> None:
        common, buffers = self._tail
        arrays, _, ag = self._none if rider is None else rider
        slots, _, bounds, sizes, _ = self._codec
        self.transport.run_native(
            _allgather, self._head + (out, slots, bounds, sizes, arrays) + common + (tag,)
            + buffers, self._ag[0] + ag[0], self._ag[1] + ag[1] * out.itemsize, WHAT)


WHAT = "the compressed ring's compiled walk (its messages to and from both neighbours)"


def _buffers(transport, mpi, p: int, width: int) -> tuple:
    """(payload slots, requests, statuses) for a walk over ``p`` ranks of payloads up to
    ``width`` bytes (and a rider's messages): kept by the transport from call to call
    (its calls run one at a time, and a walk is done with them when it returns), grown
    when a wider one comes."""
    kept = transport.kept.walk_buffers.get(p)
    if kept is None or kept[0].shape[1] < width:
        kept = (np.empty((2 * p + 1, width), np.uint8), mpi.requests(4 * p),
                mpi.statuses(4 * p))
        transport.kept.walk_buffers[p] = kept
    return kept


def compile_walks(dtypes=DTYPES) -> None:
    """Compile the walk (whole, and its halves for a call checked as it reads) for each
    of ``dtypes`` (default both) into Numba's on-disk cache, or load it from there,
    without sending a message; a compile is said before it starts. ``bound`` runs it
    before a walk is first called (a compile inside the call would count against the
    deadline); ``python -m ringcomp.warm`` and a job's warm-up run it ahead."""
    todo = [d for d in map(np.dtype, dtypes) if d not in _COMPILED]
    if not todo:
        return
    numba_cache.prepare()
    mpi = typed_like()
    bounds, key = np.zeros(2, np.int64), np.zeros(3, np.int64)
    thr = np.zeros(1, np.uint64)
    bounds.flags.writeable = thr.flags.writeable = False
    spec = np.zeros(0, np.int64)
    slots = np.zeros((3, 8), np.uint8)
    ring = schedule.ring(2, 0)
    common = (ring.order, 0, 0, mpi.fns, mpi.comm, mpi.byte, 0, mpi.requests(1),
              mpi.statuses(1), walkstate.new())
    for dtype in todo:
        x = np.empty(1, dtype)
        rider = _no_rider(dtype, 1)[0]  # a rider's arrays type as these do
        for walk, args in (
                (_walk, (0, spec, x, x, slots, x, bounds, bounds, thr, key, rider)),
                (_reduce_scatter, (0, spec, x, slots, x, bounds, bounds, thr, key, rider)),
                (_allgather, (0, spec, x, slots, bounds, bounds, rider))):
            walk.compile(tuple(numba.typeof(value) for value in args + common))
        _COMPILED.add(dtype)


#: the dtypes whose walks this process compiled or loaded (``compile_walks``)
_COMPILED: set = set()
