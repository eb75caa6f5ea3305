"""The exact ring's sum of a small host buffer as one compiled walk, its MPI calls made from
compiled code: the Python walk's messages, order and bits, without its per-hop cost."""

from __future__ import annotations

from functools import lru_cache

import numba
import numpy as np

from ringcomp.collectives import schedule
from ringcomp.collectives.base import kept_scratch
from ringcomp.kernels import numba_cache
from ringcomp.transport import walkstate
from ringcomp.transport.mpicalls import (
    GET_COUNT,
    IRECV,
    ISEND,
    MAX_MESSAGE_BYTES,
    WAIT,
    WAITALL,
    get_count,
    post,
    typed_like,
    wait,
    waitall,
)
from ringcomp.transport.walkstate import (
    GOT,
    KIND,
    MISMATCH,
    NBYTES,
    PEER,
    PHASE,
    RECEIVING,
    SENDING,
    STEP,
    STOP,
    STOPPED,
    TAG,
)

#: what the compiled walk sums: LLVM's add is NumPy's, bit for bit, on these
DTYPES = frozenset(np.dtype(name) for name in ("float32", "float64", "int32", "int64"))
#: off: every ring runs the Python walk (the tests compare the two)
ENABLED = True


@numba.njit(cache=True, nogil=True)
def _walk(x, out, even, odd, bounds, order, right, left, fns, comm, byte, tag_rs, tag_ag,
          reqs, statuses, state):
    """Ring all-reduce (sum) of ``x`` into ``out`` over ``p = bounds.size - 1`` ranks, one
    message per chunk and hop; returns 0, the first MPI error code or a ``walkstate``
    code (stopped by the guard, a message of another size, ``_received``).

    Steps (chunk c = [bounds[c], bounds[c + 1]); ``order``, ``right``, ``left``: the
    rank's ``schedule.ring`` - rs = order[PHASE_RS], ag = order[PHASE_AG]; an empty chunk
    sends nothing, as in the Python walk, which reads the same schedule):
      1. Reduce-scatter: send chunk rs[0] of ``x`` right; post step 0's receive from the
         left.
      2. Step s: post step s + 1's receive (the scratch halves alternate by step), wait for
         step s's chunk rs[s + 1], write ``out = x + incoming`` (that operand order) and
         send it right, except at the last step: the rank then owns chunk ag[0].
      3. Wait for every send.
      4. All-gather: post every receive straight into ``out`` (chunk ag[s + 1] at step s),
         send the owned chunk, forward each arriving chunk but the last step's.
    Requests: sends in slots [0, p), receives in [p, 2p). Every wait notes where it is in
    ``state`` (the deadline's message names it) and every send first reads the guard's
    word to stop there (``walkstate``).
    """
    p = bounds.size - 1
    rs, ag = order[0], order[1]
    size = x.itemsize
    halves = (even, odd)
    recv = fns[IRECV]
    n = bounds[1:] - bounds[:-1]  # each chunk's elements
    sends = 0
    first = rs[0]
    if n[first]:  # 1.
        rc = _send(fns, state, x[bounds[first]:].ctypes.data, n[first] * size, byte, right,
                   tag_rs, comm, reqs, sends)
        if rc:
            return rc
        sends += 1
    c = rs[1]
    if n[c]:
        rc = _post(recv, even.ctypes.data, n[c] * size, byte, left, tag_rs, comm, reqs, p)
        if rc:
            return rc
    for step in range(p - 1):  # 2.
        nxt = rs[min(step + 2, p - 1)]
        if step + 1 < p - 1 and n[nxt]:
            rc = _post(recv, halves[(step + 1) % 2].ctypes.data, n[nxt] * size, byte, left,
                       tag_rs, comm, reqs, p + (step + 1) % 2)
            if rc:
                return rc
        c = rs[step + 1]
        if n[c] == 0:
            continue
        rc = _received(fns, state, reqs, p + step % 2, statuses, byte, 0, step, left, tag_rs,
                       n[c] * size)
        if rc:
            return rc
        rc, sends = _join(fns, state, x, out, halves[step % 2], bounds[c], n[c],
                          step < p - 2, byte, right, tag_rs, comm, reqs, sends)
        if rc:
            return rc
    rc = _sent(fns, state, sends, reqs, statuses, 0, right, tag_rs)  # 3.
    if rc:
        return rc
    for step in range(p - 1):  # 4.
        c = ag[step + 1]
        if n[c]:
            rc = _post(recv, out[bounds[c]:].ctypes.data, n[c] * size, byte, left, tag_ag,
                       comm, reqs, p + step)
            if rc:
                return rc
    own = ag[0]
    rc, sends = _forward(fns, state, n[own] > 0, out, bounds[own], n[own] * size, byte,
                         right, tag_ag, comm, reqs, 0)
    if rc:
        return rc
    for step in range(p - 1):
        c = ag[step + 1]
        if n[c] == 0:
            continue
        rc = _received(fns, state, reqs, p + step, statuses, byte, 1, step, left, tag_ag,
                       n[c] * size)
        if rc:
            return rc
        rc, sends = _forward(fns, state, step < p - 2, out, bounds[c], n[c] * size, byte,
                             right, tag_ag, comm, reqs, sends)
        if rc:
            return rc
    return _sent(fns, state, sends, reqs, statuses, 1, right, tag_ag)


# the helpers are plain functions, not inlined by Numba (LLVM inlines them): inlining them
# at every call site made the compressed ring's walk take twice as long to compile
@numba.njit(nogil=True)
def _post(fn, address, nbytes, byte, peer, tag, comm, reqs, slot):
    """``MPI_Isend`` or ``MPI_Irecv`` (``fn``) of ``nbytes`` at ``address``, its request in
    ``reqs[slot]``."""
    return post(fn, address, nbytes, byte, peer, tag, comm, reqs[slot:].ctypes.data)


@numba.njit(nogil=True)
def _send(fns, state, address, nbytes, byte, peer, tag, comm, reqs, slot):
    """``MPI_Isend`` as ``_post``, unless the guard said to stop sending (``STOPPED``):
    another thread's call overlapped this unchecked one, so a peer may be running the
    other call against it and must not get its data (``ringcomp.transport.guard``)."""
    if state[STOP]:
        return STOPPED
    return _post(fns[ISEND], address, nbytes, byte, peer, tag, comm, reqs, slot)


@numba.njit(nogil=True)
def _received(fns, state, reqs, slot, statuses, byte, phase, step, peer, tag, nbytes):
    """Wait for the receive in ``reqs[slot]`` (noting in ``state`` where: ``phase``,
    ``step``, ``peer``, ``tag``, ``nbytes``) and check that exactly ``nbytes`` arrived:
    a shorter message is no MPI error, and a peer whose call has other lengths (no
    agreement, ``check=False``) would otherwise leave the rest of the buffer stale.
    Returns 0, an MPI error code or ``MISMATCH`` (the count in ``state[GOT]``)."""
    state[PHASE], state[STEP], state[KIND] = phase, step, RECEIVING
    state[PEER], state[TAG], state[NBYTES] = peer, tag, nbytes
    rc = wait(fns[WAIT], reqs[slot:].ctypes.data, statuses.ctypes.data)
    if rc:
        return rc
    rc = get_count(fns[GET_COUNT], statuses.ctypes.data, byte, state[GOT:].ctypes.data)
    if rc:
        return rc
    return MISMATCH if state[GOT] != nbytes else 0


@numba.njit(nogil=True)
def _sent(fns, state, sends, reqs, statuses, phase, peer, tag):
    """Wait for the ``sends`` posted in ``reqs[:sends]`` (noting it in ``state``)."""
    state[PHASE], state[KIND], state[PEER], state[TAG] = phase, SENDING, peer, tag
    return waitall(fns[WAITALL], sends, reqs.ctypes.data, statuses.ctypes.data)


@numba.njit(nogil=True)
def _join(fns, state, x, out, incoming, lo, count, now, byte, right, tag, comm, reqs, sends):
    """A reduce-scatter hop of an exact sum, its receive complete (``_received``): write
    ``out = x + incoming`` (that operand order) over ``count`` elements from ``lo`` and
    send them right if ``now``: (the error code, sends posted). The exact ring's hop, and
    a rider's in the compressed ring's walk."""
    for i in range(count):
        out[lo + i] = x[lo + i] + incoming[i]
    return _forward(fns, state, now, out, lo, count * x.itemsize, byte, right, tag, comm,
                    reqs, sends)


@numba.njit(nogil=True)
def _forward(fns, state, now, out, lo, nbytes, byte, right, tag, comm, reqs, sends):
    """Send ``out[lo:]``'s ``nbytes`` right if ``now``: (the error code, sends posted)."""
    if not now:
        return 0, sends
    rc = _send(fns, state, out[lo:].ctypes.data, nbytes, byte, right, tag, comm, reqs, sends)
    return rc, sends + (rc == 0)


@lru_cache(maxsize=256)
def _plan(chunks: tuple, r: int) -> tuple[np.ndarray, int, int]:
    """(chunk bounds as one array, messages and bytes this rank sends, in elements): the
    Python walk's count - one message per non-empty chunk it sends."""
    p = len(chunks)
    bounds = np.array([lo for lo, _ in chunks] + [chunks[-1][1]], np.int64)
    bounds.flags.writeable = False
    rs, ag = schedule.ring(p, r).sent()
    sizes = [chunks[c][1] - chunks[c][0] for c in rs + ag]
    return bounds, sum(1 for n in sizes if n), sum(sizes)


def bound(transport, layout, dtype) -> BoundWalk | None:
    """The walk for sums of one ``layout`` (the ring's ``ring_layout``) of ``dtype`` over
    ``transport``, its scratch and schedule resolved (``BoundWalk``); None where no walk
    applies (another dtype, a chunk of several segments, no ``Transport.native``). The
    ring's ``Algorithm.walk`` (``ring.compiled_walk``) binds it, for a plan to keep or a
    general-path call to run (``executor``)."""
    chunks, segments, max_chunk = layout
    dtype = np.dtype(dtype)
    # MPI's counts are C ints: a chunk past 2 GiB goes the Python walk (mpi4py's large
    # counts) rather than wrap around
    if not (ENABLED and dtype in DTYPES and all(len(s) <= 1 for s in segments)
            and max_chunk * dtype.itemsize <= MAX_MESSAGE_BYTES):
        return None
    mpi = transport.native
    if mpi is None:
        return None
    compile_walks((dtype,))  # now, not on its first call: that waits under the deadline
    return BoundWalk(transport, mpi, dtype, chunks, max_chunk)


class BoundWalk:
    """``bound``'s walk: ``walk(src, out, tag_base)`` sums the flat host arrays ``src``
    into ``out`` (``src is out``: in place); ``serve(ctx)`` runs a general-path call."""

    __slots__ = ("transport", "_args", "_messages", "_nbytes")

    def __init__(self, transport, mpi, dtype, chunks, max_chunk):
        r, p = transport.rank, transport.size
        bounds, self._messages, elements = _plan(tuple(chunks), r)
        even = kept_scratch(transport, np, dtype, max_chunk, slot=0)
        odd = kept_scratch(transport, np, dtype, max_chunk, slot=1)
        ring = schedule.ring(p, r)
        self.transport = transport
        self._args = ((even, odd, bounds, ring.order, ring.right, ring.left, mpi.fns,
                       mpi.comm, mpi.byte),
                      (mpi.requests(2 * p), mpi.statuses(2 * p), transport.walk_state))
        self._nbytes = elements * dtype.itemsize

    def __call__(self, src, out, tag_base: int) -> None:
        common, tail = self._args
        self.transport.run_native(_walk, (src, out) + common + (tag_base, tag_base + 1)
                                  + tail, self._messages, self._nbytes, WHAT)

    def serve(self, ctx) -> bool:
        """Run ``ctx``'s exact sum (its arrays flat host ones: ``executor.run``); True."""
        self(ctx.src, ctx.buf, ctx.tag_base)
        return True


WHAT = "the ring's compiled walk (its messages to and from both neighbours)"


def compile_walks(dtypes=DTYPES) -> None:
    """Compile the walk for each of ``dtypes`` (default every ``DTYPES`` one) into Numba's
    on-disk cache, or load it from there, without sending a message: a compile is said
    before it starts (``numba_cache.announce_compiles``). ``bound`` runs it before a walk
    is first called (a compile inside the call would count against the deadline);
    ``python -m ringcomp.warm`` and a job's warm-up run it ahead."""
    todo = [d for d in map(np.dtype, dtypes) if d not in _COMPILED]
    if not todo:
        return
    numba_cache.prepare()
    mpi = typed_like()
    bounds = np.zeros(2, np.int64)
    bounds.flags.writeable = False
    order = schedule.ring(2, 0).order
    for dtype in sorted(todo, key=str):
        x = np.empty(1, dtype)
        _walk.compile(tuple(numba.typeof(value) for value in (
            x, x, x, x, bounds, order, 0, 0, mpi.fns, mpi.comm, mpi.byte, 0, 0,
            mpi.requests(1), mpi.statuses(1), walkstate.new())))
        _COMPILED.add(dtype)


#: the dtypes whose walk this process compiled or loaded (``compile_walks``)
_COMPILED: set = set()
