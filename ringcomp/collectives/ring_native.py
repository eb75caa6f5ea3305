"""The exact ring's sum of a small host buffer as one compiled walk, its MPI calls made from
compiled code: the Python walk's messages, order and bits, without its per-hop cost."""

from __future__ import annotations

from functools import lru_cache

import numba
import numpy as np

from ringcomp.collectives.base import kept_scratch
from ringcomp.mpicalls import IRECV, ISEND, WAIT, WAITALL, post, typed_like, wait, waitall

#: what the compiled walk sums: LLVM's add is NumPy's, bit for bit, on these
DTYPES = frozenset(np.dtype(name) for name in ("float32", "float64", "int32", "int64"))
#: off: every ring runs the Python walk (the tests compare the two)
ENABLED = True


@numba.njit(cache=True, nogil=True)
def _walk(x, out, even, odd, bounds, r, fns, comm, byte, tag_rs, tag_ag, reqs, statuses):
    """Ring all-reduce (sum) of ``x`` into ``out`` over ``p = bounds.size - 1`` ranks, one
    message per chunk and hop; returns 0 or the first MPI error code.

    Steps (rank r; chunk c = [bounds[c], bounds[c + 1]); an empty chunk sends nothing, as
    in the Python walk, whose ``ring_chunk`` schedule this is):
      1. Reduce-scatter: send chunk r of ``x`` right; post step 0's receive from the left.
      2. Step s: post step s + 1's receive (the scratch halves alternate by step), wait for
         step s's chunk (r - s - 1), write ``out = x + incoming`` (that operand order) and
         send it right, except at the last step: r then owns chunk r + 1.
      3. Wait for every send.
      4. All-gather: post every receive straight into ``out`` (chunk r - s at step s),
         send the owned chunk, forward each arriving chunk but the last step's.
    Requests: sends in slots [0, p), receives in [p, 2p).
    """
    p = bounds.size - 1
    right, left = (r + 1) % p, (r - 1 + p) % p
    size = x.itemsize
    halves = (even, odd)
    send, recv = fns[ISEND], fns[IRECV]
    n = bounds[1:] - bounds[:-1]  # each chunk's elements
    sends = 0
    if n[r]:  # 1.
        rc = _post(send, x[bounds[r]:].ctypes.data, n[r] * size, byte, right, tag_rs, comm,
                   reqs, sends)
        if rc:
            return rc
        sends += 1
    c = (r - 1 + p) % p
    if n[c]:
        rc = _post(recv, even.ctypes.data, n[c] * size, byte, left, tag_rs, comm, reqs, p)
        if rc:
            return rc
    for step in range(p - 1):  # 2.
        nxt = (r - step - 2 + 2 * p) % p
        if step + 1 < p - 1 and n[nxt]:
            rc = _post(recv, halves[(step + 1) % 2].ctypes.data, n[nxt] * size, byte, left,
                       tag_rs, comm, reqs, p + (step + 1) % 2)
            if rc:
                return rc
        c = (r - step - 1 + p) % p
        if n[c] == 0:
            continue
        rc, sends = _join(fns[WAIT], reqs, p + step % 2, statuses, x, out, halves[step % 2],
                          bounds[c], n[c], step < p - 2, send, byte, right, tag_rs, comm,
                          sends)
        if rc:
            return rc
    rc = waitall(fns[WAITALL], sends, reqs.ctypes.data, statuses.ctypes.data)  # 3.
    if rc:
        return rc
    for step in range(p - 1):  # 4.
        c = (r - step + p) % p
        if n[c]:
            rc = _post(recv, out[bounds[c]:].ctypes.data, n[c] * size, byte, left, tag_ag,
                       comm, reqs, p + step)
            if rc:
                return rc
    own = (r + 1) % p
    rc, sends = _forward(n[own] > 0, send, out, bounds[own], n[own] * size, byte, right,
                         tag_ag, comm, reqs, 0)
    if rc:
        return rc
    for step in range(p - 1):
        c = (r - step + p) % p
        if n[c] == 0:
            continue
        rc = wait(fns[WAIT], reqs[p + step:].ctypes.data, statuses.ctypes.data)
        if rc:
            return rc
        rc, sends = _forward(step < p - 2, send, out, bounds[c], n[c] * size, byte, right,
                             tag_ag, comm, reqs, sends)
        if rc:
            return rc
    return waitall(fns[WAITALL], sends, reqs.ctypes.data, statuses.ctypes.data)


# the helpers are plain functions, not inlined by Numba (LLVM inlines them): inlining them
# at every call site made the compressed ring's walk take twice as long to compile
@numba.njit(nogil=True)
def _post(fn, address, nbytes, byte, peer, tag, comm, reqs, slot):
    """``MPI_Isend`` or ``MPI_Irecv`` (``fn``) of ``nbytes`` at ``address``, its request in
    ``reqs[slot]``."""
    return post(fn, address, nbytes, byte, peer, tag, comm, reqs[slot:].ctypes.data)


@numba.njit(nogil=True)
def _join(wait_fn, reqs, slot, statuses, x, out, incoming, lo, count, now, send, byte, right,
          tag, comm, sends):
    """A reduce-scatter hop of an exact sum: wait for the receive in ``reqs[slot]``, write
    ``out = x + incoming`` (that operand order) over ``count`` elements from ``lo`` and
    send them right if ``now``: (the error code, sends posted). The exact ring's hop, and
    a rider's in the compressed ring's walk."""
    rc = wait(wait_fn, reqs[slot:].ctypes.data, statuses.ctypes.data)
    if rc:
        return rc, sends
    for i in range(count):
        out[lo + i] = x[lo + i] + incoming[i]
    return _forward(now, send, out, lo, count * x.itemsize, byte, right, tag, comm, reqs,
                    sends)


@numba.njit(nogil=True)
def _forward(now, send, out, lo, nbytes, byte, right, tag, comm, reqs, sends):
    """Send ``out[lo:]``'s ``nbytes`` right if ``now``: (the error code, sends posted)."""
    if not now:
        return 0, sends
    rc = _post(send, out[lo:].ctypes.data, nbytes, byte, right, tag, comm, reqs, sends)
    return rc, sends + (rc == 0)


def sent_chunks(r: int, p: int) -> tuple[list, list]:
    """The chunks rank ``r`` of ``p`` sends, in order, in the reduce-scatter and in the
    all-gather (``ring.ring_chunk``'s schedule; the last step's chunk is kept, not sent)."""
    return ([r] + [(r - s - 1) % p for s in range(p - 2)],
            [(r + 1) % p] + [(r - s) % p for s in range(p - 2)])


@lru_cache(maxsize=256)
def _plan(chunks: tuple, r: int) -> tuple[np.ndarray, int, int]:
    """(chunk bounds as one array, messages and bytes this rank sends, in elements): the
    Python walk's count - one message per non-empty chunk it sends."""
    p = len(chunks)
    bounds = np.array([lo for lo, _ in chunks] + [chunks[-1][1]], np.int64)
    bounds.flags.writeable = False
    rs, ag = sent_chunks(r, p)
    sizes = [chunks[c][1] - chunks[c][0] for c in rs + ag]
    return bounds, sum(1 for n in sizes if n), sum(sizes)


def runs(ctx, layout) -> bool:
    """Run ``ctx``'s ring as one compiled walk if it can; whether it did. It can for a sum
    of a flat host array of a ``DTYPES`` dtype, untraced, whose every chunk is one segment
    (``layout``: the ring's ``ring_layout``), on a transport that can call MPI from
    compiled code with nothing held (``Transport.native``)."""
    if not (ctx.op == "sum" and ctx.tracer is None and type(ctx.buf) is np.ndarray
            and type(ctx.src) is np.ndarray):
        return False
    walk = bound(ctx.t, layout, ctx.buf.dtype)
    if walk is None:
        return False
    walk(ctx.src, ctx.buf, ctx.tag_base)
    return True


def bound(transport, layout, dtype):
    """The walk for sums of one ``layout`` (the ring's ``ring_layout``) of ``dtype`` over
    ``transport``, its scratch and schedule resolved: ``walk(src, out, tag_base)`` sums the
    flat host arrays ``src`` into ``out`` (``src is out``: in place); None where no walk
    applies (another dtype, a chunk of several segments, no ``Transport.native``). A
    persistent plan keeps it (``ringcomp.plancall``); ``runs`` binds it per call."""
    chunks, segments, max_chunk = layout
    dtype = np.dtype(dtype)
    if not (ENABLED and dtype in DTYPES and all(len(s) <= 1 for s in segments)):
        return None
    mpi = transport.native
    if mpi is None:
        return None
    r, p = transport.rank, transport.size
    bounds, messages, elements = _plan(tuple(chunks), r)
    even = kept_scratch(transport, np, dtype, max_chunk, slot=0)
    odd = kept_scratch(transport, np, dtype, max_chunk, slot=1)
    common = (even, odd, bounds, r, mpi.fns, mpi.comm, mpi.byte)
    reqs, statuses = mpi.requests(2 * p), mpi.statuses(2 * p)
    nbytes = elements * dtype.itemsize

    def walk(src, out, tag_base: int) -> None:
        transport.run_native(_walk, (src, out) + common + (tag_base, tag_base + 1, reqs,
                                                           statuses),
                             messages, nbytes, WHAT)

    return walk


WHAT = "the ring's compiled walk (its messages to and from both neighbours)"


def compile_walks(dtypes=DTYPES) -> None:
    """Compile the walk for each of ``dtypes`` (default every ``DTYPES`` one) into Numba's
    on-disk cache, or load it from there, without sending a message
    (``tests/warm_kernels.py``: the suite's processes then load it; a job's warm-up)."""
    mpi = typed_like()
    bounds = np.zeros(2, np.int64)
    bounds.flags.writeable = False
    for dtype in sorted(map(np.dtype, dtypes), key=str):
        x = np.empty(1, dtype)
        _walk.compile(tuple(numba.typeof(value) for value in (
            x, x, x, x, bounds, 0, mpi.fns, mpi.comm, mpi.byte, 0, 0, mpi.requests(1),
            mpi.statuses(1))))
