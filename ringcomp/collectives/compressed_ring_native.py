"""The compressed ring's walk for Marsit's signs and the scaled sign on a small host buffer,
compiled whole: the Python walk's payloads, messages and bits without its per-hop cost."""

from __future__ import annotations

from functools import lru_cache

import numba
import numpy as np

from ringcomp.collectives.ring import ring_layout
from ringcomp.collectives.ring_native import _forward, _post
from ringcomp.compression.marsit import MarsitSigns
from ringcomp.compression.sign import ScaledSign
from ringcomp.kernels import backends
from ringcomp.kernels import signs_numba as kernels
from ringcomp.kernels.rng import call_key, threshold
from ringcomp.kernels.rng_numba import hop_stream
from ringcomp.mpicalls import IRECV, ISEND, WAIT, WAITALL, typed_like, wait, waitall

#: the hop rules compiled here, by the exact compressor class (a subclass may change them)
MARSIT, SIGN = 0, 1
RULES = {MarsitSigns: MARSIT, ScaledSign: SIGN}
#: a payload's words before its sign words: the scaled sign's float32 scale
HEAD = {MARSIT: 0, SIGN: 1}
#: the output dtype -> the unsigned integer of its bits (the decode writes bit patterns)
BITS = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}
#: off: every compressed ring runs the Python walk (the tests compare the two)
ENABLED = True


@numba.njit(inline="always")
def _words(n):
    return (n + 31) // 32


@numba.njit(nogil=True, cache=True)
def _mean_abs(x):
    """``signs_numba.mean_abs`` of a non-empty ``x`` serially: the same rows, the same
    tree, the same bits."""
    a = np.empty((x.size + kernels.TREE - 1) // kernels.TREE)
    kernels._row_sums(x, a)
    while a.size > 1:
        sums = np.empty((a.size + kernels.TREE - 1) // kernels.TREE)
        kernels._row_sums(a, sums)
        a = sums
    return a[0] / x.size


@numba.njit(nogil=True, cache=True)
def _encode(rule, x, payload):
    """``x``'s payload (hop 0: Marsit's signs; the scaled sign's scale, then its signs)."""
    if rule == SIGN:
        payload[:1].view(np.float32)[0] = _mean_abs(x)
        kernels._pack_block(x, payload[1:1 + _words(x.size)])
    else:
        kernels._pack_block(x, payload[:_words(x.size)])


@numba.njit(nogil=True, cache=True)
def _join(rule, incoming, x, out, thr, key, offset):
    """``x`` joins ``incoming`` into ``out``, as the compressor's ``join`` does: Marsit's
    ``marsit_join`` (its own bits taken with probability ``thr`` / 2^32, from stream
    ``key`` at element ``offset``), the scaled sign's ``sign_join`` (decode, add, encode)."""
    n = x.size
    w = _words(n)
    if rule == SIGN:
        one = np.empty(1, x.dtype)
        one[0] = incoming[:1].view(np.float32)[0]
        sums = np.empty((n + kernels.TREE - 1) // kernels.TREE)
        kernels._sign_join_rows(incoming[1:1 + w], one[0], -one[0], x, out[1:1 + w], sums)
        a = sums
        while a.size > 1:
            nxt = np.empty((a.size + kernels.TREE - 1) // kernels.TREE)
            kernels._row_sums(a, nxt)
            a = nxt
        out[:1].view(np.float32)[0] = a[0] / n
        return
    tail = n - 32 * (w - 1)
    last = kernels._ALL if tail >= 32 else (np.uint32(1) << np.uint32(tail)) - np.uint32(1)
    kernels._marsit_join_block(incoming[:w], x, thr, key, np.uint64(offset), last,
                               out[:w])


@numba.njit(nogil=True, cache=True)
def _decode(rule, payload, out, bits):
    """``out`` (``bits``: the same memory as unsigned integers) from a payload: +scale
    where a bit is set, -scale elsewhere (Marsit's scale is 1), as bit patterns."""
    scale = np.ones(1, out.dtype)
    head = 0
    if rule == SIGN:
        scale[0] = payload[:1].view(np.float32)[0]
        head = 1
    kernels._unpack_bits_block(payload[head:head + _words(out.size)], out.size, bits,
                               scale.view(bits.dtype)[0])


@numba.njit(nogil=True, cache=True)
def _reduce_scatter(rule, x, slots, bounds, thr, call, r, fns, comm, byte, tag, reqs,
                    statuses):
    """The compressed ring's reduce-scatter of ``x`` (steps 1-2 of
    ``compressed_ring_allreduce``) over ``p = bounds.size - 1`` ranks, every chunk one
    non-empty segment; returns 0 or the first MPI error code.

    Steps (rank r; chunk c = [bounds[c], bounds[c + 1])):
      1. Encode chunk r into slot 0, send it right; post step 0's receive (slot p).
      2. Step s: post step s + 1's receive (slots p and p + 1 alternate by step), wait for
         chunk (r - s - 1), join this rank's values to it into slot 1 + s (hop s + 1's
         stream, derived from the call's key ``call``; threshold ``thr[s]``) and send
         that right, except at the last step: slot p - 1 then holds the final payload
         of chunk r + 1.
      3. Wait for every send (sends in request slots [0, p), receives in [p, p + 2)).
    """
    p = bounds.size - 1
    right, left = (r + 1) % p, (r - 1 + p) % p
    head = 1 if rule == SIGN else 0
    send, recv = fns[ISEND], fns[IRECV]
    _encode(rule, x[bounds[r]:bounds[r + 1]], slots[0])  # 1.
    rc = _post(send, slots[0].ctypes.data, _nbytes(bounds, r, head), byte, right, tag, comm,
               reqs, 0)
    if rc:
        return rc
    sends = 1
    c = (r - 1 + p) % p
    rc = _post(recv, slots[p].ctypes.data, _nbytes(bounds, c, head), byte, left, tag, comm,
               reqs, p)
    if rc:
        return rc
    for step in range(p - 1):  # 2.
        if step + 1 < p - 1:
            nxt = (r - step - 2 + 2 * p) % p
            half = p + (step + 1) % 2
            rc = _post(recv, slots[half].ctypes.data, _nbytes(bounds, nxt, head), byte,
                       left, tag, comm, reqs, half)
            if rc:
                return rc
        rc = wait(fns[WAIT], reqs[p + step % 2:].ctypes.data, statuses.ctypes.data)
        if rc:
            return rc
        c = (r - step - 1 + p) % p
        lo, hi = bounds[c], bounds[c + 1]
        _join(rule, slots[p + step % 2], x[lo:hi], slots[1 + step], thr[step],
              hop_stream(call, step + 1), lo)
        rc, sends = _forward(step < p - 2, send, slots[1 + step], 0,
                             _nbytes(bounds, c, head), byte, right, tag, comm, reqs, sends)
        if rc:
            return rc
    return waitall(fns[WAITALL], sends, reqs.ctypes.data, statuses.ctypes.data)  # 3.


@numba.njit(nogil=True, cache=True)
def _allgather(rule, out, bits, slots, bounds, r, fns, comm, byte, tag, reqs, statuses):
    """The compressed ring's all-gather (steps 4-5): the final payloads forwarded unchanged
    and each decoded into ``out`` once forwarded; returns 0 or the first MPI error code.

    Steps: 1. post every receive, chunk (r - s) at step s into slot p + 2 + s (request
    p + s); 2. send the owned chunk's final payload (slot p - 1) and decode it; 3. at step
    s wait, forward but at the last step, decode; 4. wait for every send.
    """
    p = bounds.size - 1
    right, left = (r + 1) % p, (r - 1 + p) % p
    head = 1 if rule == SIGN else 0
    send, recv = fns[ISEND], fns[IRECV]
    for step in range(p - 1):  # 1.
        c = (r - step + p) % p
        rc = _post(recv, slots[p + 2 + step].ctypes.data, _nbytes(bounds, c, head), byte,
                   left, tag, comm, reqs, p + step)
        if rc:
            return rc
    own = (r + 1) % p  # 2.
    rc = _post(send, slots[p - 1].ctypes.data, _nbytes(bounds, own, head), byte, right, tag,
               comm, reqs, 0)
    if rc:
        return rc
    sends = 1
    lo, hi = bounds[own], bounds[own + 1]
    _decode(rule, slots[p - 1], out[lo:hi], bits[lo:hi])
    for step in range(p - 1):  # 3.
        c = (r - step + p) % p
        rc = wait(fns[WAIT], reqs[p + step:].ctypes.data, statuses.ctypes.data)
        if rc:
            return rc
        rc, sends = _forward(step < p - 2, send, slots[p + 2 + step], 0,
                             _nbytes(bounds, c, head), byte, right, tag, comm, reqs, sends)
        if rc:
            return rc
        lo, hi = bounds[c], bounds[c + 1]
        _decode(rule, slots[p + 2 + step], out[lo:hi], bits[lo:hi])
    return waitall(fns[WAITALL], sends, reqs.ctypes.data, statuses.ctypes.data)  # 4.


@numba.njit(nogil=True, cache=True)
def _walk(rule, x, out, bits, slots, bounds, thr, call, r, fns, comm, byte, tag, reqs,
          statuses):
    """Both halves in one call, for a call with no agreement between them (``check_input``
    off: its input was checked before the call); 0 or the first MPI error code."""
    rc = _reduce_scatter(rule, x, slots, bounds, thr, call, r, fns, comm, byte, tag, reqs,
                         statuses)
    if rc:
        return rc
    return _allgather(rule, out, bits, slots, bounds, r, fns, comm, byte, tag + 1, reqs,
                      statuses)


@numba.njit(inline="always")
def _nbytes(bounds, c, head):
    """The payload bytes of chunk ``c``: ``nbytes`` of its elements."""
    return 4 * (head + _words(bounds[c + 1] - bounds[c]))


@lru_cache(maxsize=256)
def _plan(n: int, p: int, seg_elems: int, r: int, head: int) -> tuple | None:
    """For a buffer of ``n`` elements over ``p`` ranks, its chunks of ``seg_elems`` or
    fewer each (one segment, ``ring_layout``) and of at least one element and at most one
    kernel block: (chunk bounds, each step's threshold, the widest payload in words, this
    rank's messages and bytes per phase); None for any other layout."""
    chunks, segments, max_chunk = ring_layout(n, p, seg_elems)
    if not (all(len(s) == 1 for s in segments) and chunks[0][1] > chunks[0][0]
            and max_chunk <= 32 * kernels.BLOCK):
        return None
    bounds = np.array([lo for lo, _ in chunks] + [chunks[-1][1]], np.int64)
    thr = np.array([threshold(1, step + 2) for step in range(p - 1)], np.uint64)
    bounds.flags.writeable = thr.flags.writeable = False

    def size(c):
        return 4 * (head + (chunks[c][1] - chunks[c][0] + 31) // 32)

    rs = [r] + [(r - s - 1) % p for s in range(p - 2)]
    ag = [(r + 1) % p] + [(r - s) % p for s in range(p - 2)]
    width = head + (max_chunk + 31) // 32
    return bounds, thr, width, (len(rs), sum(map(size, rs))), (len(ag), sum(map(size, ag)))


def runs(ctx, seg_elems: int) -> bool:
    """Run ``ctx``'s compressed ring as one compiled walk if it can; whether it did. It can
    for Marsit's signs or the scaled sign (``RULES``) summing a flat float32/64 host array,
    untraced, unshadowed, carrying no rider, in chunks of one segment (of ``seg_elems``)
    each, every one of at least one element and at most one kernel block (``_plan``), on a
    transport that calls MPI from compiled code (``Transport.native``), on a little-endian
    host. Input the hops would refuse as they read it (``check_input``: NaN or Inf) is
    left to the Python walk, which sends the same messages."""
    rule = RULES.get(type(ctx.compressor))
    buf, src = ctx.buf, ctx.src
    if not (ENABLED and rule is not None and kernels.LITTLE_ENDIAN and ctx.op == "sum"
            and ctx.tracer is None and not ctx.shadow and ctx.rider is None
            and type(buf) is np.ndarray and type(src) is np.ndarray and buf.dtype in BITS
            and buf.flags.c_contiguous and src.flags.c_contiguous):
        return False
    plan = _plan(src.size, ctx.size, seg_elems, ctx.rank, HEAD[rule])
    mpi = ctx.t.native
    if plan is None or mpi is None:
        return False
    if ctx.check_input and backends.for_size("finite", src.size, like=src).nonfinite(src):
        return False  # the Python walk hands it on as zeros and refuses it on every rank
    bounds, thr, width, (rs_messages, rs_bytes), (ag_messages, ag_bytes) = plan
    key = ctx.key
    call = np.uint64(call_key(key.seed, key.step, key.bucket))
    slots = np.empty((2 * ctx.size + 1, width), np.uint32)
    reqs, statuses = mpi.requests(2 * ctx.size), mpi.statuses(2 * ctx.size)
    what = "the compressed ring's compiled walk (its messages to and from both neighbours)"
    bits = buf.view(BITS[buf.dtype])
    common = (ctx.rank, mpi.fns, mpi.comm, mpi.byte)
    if not ctx.check_input:
        ctx.t.run_native(_walk, (rule, src, buf, bits, slots, bounds, thr, call) + common + (
            ctx.tag_base, reqs, statuses), rs_messages + ag_messages, rs_bytes + ag_bytes, what)
        return True
    ctx.t.run_native(_reduce_scatter, (rule, src, slots, bounds, thr, call) + common + (
        ctx.tag_base, reqs, statuses), rs_messages, rs_bytes, what)
    ctx.agree_input()  # 3. the input was all read; nothing of the call is outstanding
    ctx.t.run_native(_allgather, (rule, buf, bits, slots, bounds) + common + (
        ctx.tag_base + 1, reqs, statuses), ag_messages, ag_bytes, what)
    return True


def compile_walks() -> None:
    """Compile the walk (whole, and its halves for a call checked as it reads) for each
    output dtype into Numba's on-disk cache without sending a message
    (``tests/warm_kernels.py``)."""
    mpi = typed_like()
    bounds = np.zeros(2, np.int64)
    thr = np.zeros(1, np.uint64)
    bounds.flags.writeable = thr.flags.writeable = False
    slots = np.zeros((3, 1), np.uint32)
    common = (0, mpi.fns, mpi.comm, mpi.byte, 0, mpi.requests(1), mpi.statuses(1))
    for dtype, bits in BITS.items():
        x = np.empty(1, dtype)
        for walk, args in (
                (_walk, (MARSIT, x, x, x.view(bits), slots, bounds, thr, np.uint64(0))),
                (_reduce_scatter, (MARSIT, x, slots, bounds, thr, np.uint64(0))),
                (_allgather, (MARSIT, x, x.view(bits), slots, bounds))):
            walk.compile(tuple(numba.typeof(value) for value in args + common))
