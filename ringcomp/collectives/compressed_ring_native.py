"""The compressed ring's walk on a small host buffer compiled whole (Marsit, the scaled sign,
QSGD, TernGrad, top-k): the Python walk's payloads, messages and bits without its per-hop
cost."""

from __future__ import annotations

import sys
from functools import lru_cache

import numba
import numpy as np

from ringcomp.collectives import native_codecs as codecs
from ringcomp.collectives.base import kept_scratch
from ringcomp.collectives.ring import ring_layout
from ringcomp.collectives.ring_native import _forward, _post, sent_chunks
from ringcomp.kernels import backends
from ringcomp.kernels.rng import threshold
from ringcomp.kernels.rng_numba import call_key, hop_stream
from ringcomp.mpicalls import IRECV, ISEND, WAIT, WAITALL, typed_like, wait, waitall

#: the output dtypes (the codecs decode into float32 or float64)
DTYPES = frozenset(np.dtype(name) for name in ("float32", "float64"))
#: the widest chunk a walk takes (its kernels run serially: past this a chunk's parallel
#: kernels in the Python walk are worth their dispatch)
MAX_CHUNK = 1 << 16
_INT64 = (-(1 << 63), 1 << 63)
#: off: every compressed ring runs the Python walk (the tests compare the two)
ENABLED = True


@numba.njit(nogil=True, cache=True)
def _reduce_scatter(rule, spec, x, slots, scratch, bounds, sizes, thr, key, r, fns, comm,
                    byte, tag, reqs, statuses):
    """The compressed ring's reduce-scatter of ``x`` (steps 1-2 of
    ``compressed_ring_allreduce``) over ``p = bounds.size - 1`` ranks, every chunk one
    non-empty segment whose payload is ``sizes[c]`` bytes; returns 0 or the first MPI
    error code.

    Steps (rank r; chunk c = [bounds[c], bounds[c + 1])):
      1. Encode chunk r into slot 0 (hop 0's stream), send it right; post step 0's
         receive (slot p).
      2. Step s: post step s + 1's receive (slots p and p + 1 alternate by step), wait for
         chunk (r - s - 1), join this rank's values to it into slot 1 + s (hop s + 1's
         stream, from the call's ``key``: seed, step, bucket; Marsit's threshold ``thr[s]``) and
         send that right, except at the last step: slot p - 1 then holds the final
         payload of chunk r + 1.
      3. Wait for every send (sends in request slots [0, p), receives in [p, p + 2)).
    """
    p = bounds.size - 1
    right, left = (r + 1) % p, (r - 1 + p) % p
    send, recv = fns[ISEND], fns[IRECV]
    call = call_key(key[0], key[1], key[2])
    lo, hi = bounds[r], bounds[r + 1]
    codecs.encode(rule, spec, x[lo:hi], slots[0][:sizes[r]], hop_stream(call, 0), lo)  # 1.
    rc = _post(send, slots[0].ctypes.data, sizes[r], byte, right, tag, comm, reqs, 0)
    if rc:
        return rc
    sends = 1
    c = (r - 1 + p) % p
    rc = _post(recv, slots[p].ctypes.data, sizes[c], byte, left, tag, comm, reqs, p)
    if rc:
        return rc
    for step in range(p - 1):  # 2.
        if step + 1 < p - 1:
            nxt = (r - step - 2 + 2 * p) % p
            half = p + (step + 1) % 2
            rc = _post(recv, slots[half].ctypes.data, sizes[nxt], byte, left, tag, comm,
                       reqs, half)
            if rc:
                return rc
        rc = wait(fns[WAIT], reqs[p + step % 2:].ctypes.data, statuses.ctypes.data)
        if rc:
            return rc
        c = (r - step - 1 + p) % p
        lo, hi = bounds[c], bounds[c + 1]
        codecs.join(rule, spec, slots[p + step % 2][:sizes[c]], x[lo:hi],
                    slots[1 + step][:sizes[c]], scratch, thr[step],
                    hop_stream(call, step + 1), lo)
        rc, sends = _forward(step < p - 2, send, slots[1 + step], 0, sizes[c], byte, right,
                             tag, comm, reqs, sends)
        if rc:
            return rc
    return waitall(fns[WAITALL], sends, reqs.ctypes.data, statuses.ctypes.data)  # 3.


@numba.njit(nogil=True, cache=True)
def _allgather(rule, spec, out, slots, bounds, sizes, r, fns, comm, byte, tag, reqs,
               statuses):
    """The compressed ring's all-gather (steps 4-5): the final payloads forwarded unchanged
    and each decoded into ``out`` once forwarded; returns 0 or the first MPI error code.

    Steps: 1. post every receive, chunk (r - s) at step s into slot p + 2 + s (request
    p + s); 2. send the owned chunk's final payload (slot p - 1) and decode it; 3. at step
    s wait, forward but at the last step, decode; 4. wait for every send.
    """
    p = bounds.size - 1
    right, left = (r + 1) % p, (r - 1 + p) % p
    send, recv = fns[ISEND], fns[IRECV]
    for step in range(p - 1):  # 1.
        c = (r - step + p) % p
        rc = _post(recv, slots[p + 2 + step].ctypes.data, sizes[c], byte, left, tag, comm,
                   reqs, p + step)
        if rc:
            return rc
    own = (r + 1) % p  # 2.
    rc = _post(send, slots[p - 1].ctypes.data, sizes[own], byte, right, tag, comm, reqs, 0)
    if rc:
        return rc
    sends = 1
    codecs.decode(rule, spec, slots[p - 1][:sizes[own]], out[bounds[own]:bounds[own + 1]])
    for step in range(p - 1):  # 3.
        c = (r - step + p) % p
        rc = wait(fns[WAIT], reqs[p + step:].ctypes.data, statuses.ctypes.data)
        if rc:
            return rc
        rc, sends = _forward(step < p - 2, send, slots[p + 2 + step], 0, sizes[c], byte,
                             right, tag, comm, reqs, sends)
        if rc:
            return rc
        codecs.decode(rule, spec, slots[p + 2 + step][:sizes[c]], out[bounds[c]:bounds[c + 1]])
    return waitall(fns[WAITALL], sends, reqs.ctypes.data, statuses.ctypes.data)  # 4.


@numba.njit(nogil=True, cache=True)
def _walk(rule, spec, x, out, slots, scratch, bounds, sizes, thr, key, r, fns, comm, byte,
          tag, reqs, statuses):
    """Both halves in one call, for a call with no agreement between them (``check_input``
    off: its input was checked before the call); 0 or the first MPI error code."""
    rc = _reduce_scatter(rule, spec, x, slots, scratch, bounds, sizes, thr, key, r, fns,
                         comm, byte, tag, reqs, statuses)
    if rc:
        return rc
    return _allgather(rule, spec, out, slots, bounds, sizes, r, fns, comm, byte, tag + 1,
                      reqs, statuses)


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
    rs, ag = sent_chunks(r, p)
    width = -(-int(sizes.max()) // 8) * 8
    return (bounds, sizes, thr, width, max_chunk, (len(rs), int(sizes[rs].sum())),
            (len(ag), int(sizes[ag].sum())))


def runs(ctx, seg_elems: int) -> bool:
    """Run ``ctx``'s compressed ring as one compiled walk if it can; whether it did. It can
    for the rules ``native_codecs`` compiles (Marsit, the scaled sign, QSGD, TernGrad,
    top-k) summing a flat float32/64 host array, untraced, unshadowed, carrying no rider,
    in chunks of one segment (of ``seg_elems``) each, every one of at least one element
    and at most 65,536 (at most the rule's one block where kernels run on several
    threads: ``native_codecs.ONE_BLOCK``), on a transport that calls MPI from compiled code
    (``Transport.native``), on a little-endian host. Input the hops would refuse as they
    read it (``check_input``: NaN or Inf) is left to the Python walk, which sends the same
    messages."""
    buf, src, key = ctx.buf, ctx.src, ctx.key
    if not (ctx.op == "sum" and ctx.tracer is None and not ctx.shadow and ctx.rider is None
            and type(buf) is np.ndarray and type(src) is np.ndarray
            and buf.flags.c_contiguous and src.flags.c_contiguous
            and all(_INT64[0] <= k < _INT64[1] for k in (key.seed, key.step, key.bucket))):
        return False
    walk = bound(ctx.t, ctx.compressor, src.size, buf.dtype, seg_elems)
    if walk is None:
        return False
    if ctx.check_input and backends.for_size("finite", src.size, like=src).nonfinite(src):
        return False  # the Python walk hands it on as zeros and refuses it on every rank
    keys = np.array((key.seed, key.step, key.bucket), np.int64)
    if not ctx.check_input:
        walk(src, buf, ctx.tag_base, keys)
        return True
    walk.reduce_scatter(src, ctx.tag_base, keys)
    ctx.agree_input()  # 3. the input was all read; nothing of the call is outstanding
    walk.allgather(buf, ctx.tag_base + 1)
    return True


def bound(transport, comp, n: int, dtype, seg_elems: int) -> BoundWalk | None:
    """The walk for ``comp``'s sums of ``n`` elements of ``dtype`` in segments of
    ``seg_elems`` over ``transport``, its rule, schedule and buffers resolved; None where
    no walk applies (another compressor or dtype, a layout of several segments a chunk or
    chunks past the walk's block, no ``Transport.native``). A persistent plan keeps it
    (``ringcomp.replay``); ``runs`` binds it per call."""
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
    return BoundWalk(transport, mpi, rule, spec, dtype, plan)


class BoundWalk:
    """``bound``'s walk: ``walk(src, out, tag_base, keys)`` reduces the flat host array
    ``src`` into ``out`` (``src is out``: in place) with the hop streams of ``keys`` (an
    int64 array: seed, step, bucket); ``reduce_scatter`` and ``allgather`` are its halves,
    for a call that agrees on its input between them."""

    __slots__ = ("transport", "_head", "_codec", "_tail", "_rs", "_ag")

    def __init__(self, transport, mpi, rule, spec, dtype, plan):
        bounds, sizes, thr, width, max_chunk, self._rs, self._ag = plan
        p = transport.size
        slots, reqs, statuses = _buffers(transport, mpi, p, width)
        scratch = kept_scratch(transport, np, dtype, max_chunk, slot=2)  # a cascade's sum
        self.transport = transport
        self._head, self._codec = (rule, spec), (slots, scratch, bounds, sizes, thr)
        self._tail = ((transport.rank, mpi.fns, mpi.comm, mpi.byte), (reqs, statuses))

    def __call__(self, src, out, tag_base: int, keys) -> None:
        common, buffers = self._tail
        self.transport.run_native(
            _walk, self._head + (src, out) + self._codec + (keys,) + common + (tag_base,)
            + buffers, self._rs[0] + self._ag[0], self._rs[1] + self._ag[1], WHAT)

    def reduce_scatter(self, src, tag_base: int, keys) -> None:
        common, buffers = self._tail
        self.transport.run_native(
            _reduce_scatter, self._head + (src,) + self._codec + (keys,) + common
            + (tag_base,) + buffers, self._rs[0], self._rs[1], WHAT)

    def allgather(self, out, tag: int) -> None:
        common, buffers = self._tail
        slots, _, bounds, sizes, _ = self._codec
        self.transport.run_native(
            _allgather, self._head + (out, slots, bounds, sizes) + common + (tag,) + buffers,
            self._ag[0], self._ag[1], WHAT)


WHAT = "the compressed ring's compiled walk (its messages to and from both neighbours)"


def _buffers(transport, mpi, p: int, width: int) -> tuple:
    """(payload slots, requests, statuses) for a walk over ``p`` ranks of payloads up to
    ``width`` bytes: kept by the transport from call to call (its calls run one at a
    time, and a walk is done with them when it returns), grown when a wider one comes."""
    kept = transport.kept.walk_buffers.get(p)
    if kept is None or kept[0].shape[1] < width:
        kept = (np.empty((2 * p + 1, width), np.uint8), mpi.requests(2 * p),
                mpi.statuses(2 * p))
        transport.kept.walk_buffers[p] = kept
    return kept


def compile_walks(dtypes=DTYPES) -> None:
    """Compile the walk (whole, and its halves for a call checked as it reads) for each
    of ``dtypes`` (default both) into Numba's on-disk cache, or load it from there,
    without sending a message (``tests/warm_kernels.py``; a job's warm-up)."""
    mpi = typed_like()
    bounds, key = np.zeros(2, np.int64), np.zeros(3, np.int64)
    thr = np.zeros(1, np.uint64)
    bounds.flags.writeable = thr.flags.writeable = False
    spec = np.zeros(0, np.int64)
    slots = np.zeros((3, 8), np.uint8)
    common = (0, mpi.fns, mpi.comm, mpi.byte, 0, mpi.requests(1), mpi.statuses(1))
    for dtype in dtypes:
        x = np.empty(1, dtype)
        for walk, args in (
                (_walk, (0, spec, x, x, slots, x, bounds, bounds, thr, key)),
                (_reduce_scatter, (0, spec, x, slots, x, bounds, bounds, thr, key)),
                (_allgather, (0, spec, x, slots, bounds, bounds))):
            walk.compile(tuple(numba.typeof(value) for value in args + common))
