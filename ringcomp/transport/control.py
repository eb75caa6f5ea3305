"""The Transport's small control collectives: the argument agreement, objects, MPI's own
Allreduce and the barrier, each under the deadline (a mixin of ``comm.Transport``)."""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
from mpi4py import MPI

from ringcomp.devices import device
from ringcomp.transport.completion import _WATCHDOG

#: ringcomp's op names as MPI's ops (looked up by name at the call: at import there may be
#: no MPI library, and the tools that need none import this module too); the bitwise ones
#: only here, for callers that serve them with MPI's own Allreduce (torch's BAND/BOR/BXOR)
_NATIVE_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN", "prod": "PROD", "band": "BAND",
               "bor": "BOR", "bxor": "BXOR"}

AGREEING = "argument agreement (Allreduce of argument signatures)"


def native_op(op: str):
    """MPI's own ``MPI.Op`` for one of ringcomp's op names ("sum", "max", "min", "prod",
    and the bitwise "band", "bor", "bxor")."""
    return getattr(MPI, _NATIVE_OPS[op])


class ControlCollectives:
    """The control collectives a ``Transport`` offers the layers above (``agree``,
    ``allgather_obj``, ...): small calls on its communicator, blocking under its deadline.
    They stay methods of the Transport, not functions of their own: the tests' fakes and
    the layers above call them as methods, and they share its deadline and held sends."""

    def barrier(self) -> None:
        self._blocking(self.comm.Ibarrier(), None, "barrier")

    def agree(self, values) -> tuple[np.ndarray, np.ndarray]:
        """Return the element-wise (min, max) of an int64 vector over all ranks, in one call.

        Used to validate arguments collectively: every rank learns the same verdict.
        """
        n = len(values)
        both = np.empty(2 * n, np.int64)
        both[:n] = values
        np.negative(both[:n], out=both[n:])
        self.agree_into(MPI.IN_PLACE, both)
        return -both[n:], both[:n]

    def agree_into(self, mine, agreed: np.ndarray) -> None:
        """``agree``'s one call: the element-wise maximum of every rank's int64 ``mine``
        (values then their negations; ``MPI.IN_PLACE``: ``agreed`` holds them) into
        ``agreed``. A persistent plan keeps both arrays (``AllreducePlan``)."""
        # the blocking call under the deadline (as native_allreduce): MPICH's nonblocking
        # Allreduce and its Wait cost more, and every checked call makes one
        if self._held.queue:
            self._held.post_all()
        if self.timeout <= 0:
            self.comm.Allreduce(mine, agreed, op=MPI.MAX)
            return
        key = threading.get_ident()
        started = time.monotonic()
        _WATCHDOG.enter(key, started + self.timeout, self._describe, None, started, AGREEING)
        try:
            self.comm.Allreduce(mine, agreed, op=MPI.MAX)
        finally:
            _WATCHDOG.leave(key)

    def world_ranks(self) -> tuple[int, ...]:
        """The ``MPI_COMM_WORLD`` ranks of this communicator's ranks, in its order (local:
        no communication): what names a set of processes across communicators."""
        world = MPI.COMM_WORLD.Get_group()
        mine = self.comm.Get_group()
        try:
            return tuple(MPI.Group.Translate_ranks(mine, list(range(self.size)), world))
        finally:
            mine.Free()
            world.Free()

    def same_ranks(self, other: ControlCollectives) -> bool:
        """Whether ``other`` runs over the same ranks, in the same order."""
        return MPI.Comm.Compare(self.comm, other.comm) in (MPI.IDENT, MPI.CONGRUENT)

    def allgather_obj(self, obj) -> list:
        """Every rank's picklable ``obj``, in rank order, under the deadline."""
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        sizes = np.empty(self.size, np.int64)
        self._blocking(self.comm.Iallgather(np.array([data.size], np.int64), sizes), None,
                       "allgather of object sizes")
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        everything = np.empty(int(sizes.sum()), np.uint8)
        self._blocking(self.comm.Iallgatherv(data, [everything, sizes, offsets, MPI.BYTE]),
                       None, "allgather of pickled objects")
        return [pickle.loads(everything[o:o + n].tobytes()) for o, n in zip(offsets, sizes,
                                                                          strict=True)]

    def bcast_obj(self, obj, root: int = 0):
        """``root``'s picklable ``obj`` on every rank, under the deadline."""
        data = np.frombuffer(pickle.dumps(obj), np.uint8) if self.rank == root else None
        size = np.array([0 if data is None else data.size], np.int64)
        self._blocking(self.comm.Ibcast(size, root=root), None, "broadcast of an object size")
        buf = data.copy() if data is not None else np.empty(int(size[0]), np.uint8)
        self._blocking(self.comm.Ibcast(buf, root=root), None, "broadcast of a pickled object")
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def native_allreduce(self, buf, op: str, src=None) -> None:
        """MPI's own Allreduce of ``src`` into ``buf`` (in place when ``src`` is None)."""
        if self.guard.closed:
            self._before_sending()
        self._held.post_all()
        if device.is_device(buf):
            self.device_syncs += 1
            if src is not None:  # queued on the current stream, which the sync waits for
                buf[...] = src
            device.synchronize(buf)
            if not self.cuda_aware:
                host = device.to_host(buf)
                self.native_allreduce(host.view(buf.dtype), op)
                device.from_host(host, buf)
                return
            src = None
        self.host_allreduce(src, buf, native_op(op))

    def host_allreduce(self, src, buf, mpi_op) -> None:
        """MPI's own Allreduce of host memory, ``src`` into ``buf`` (None: in place), with
        the ``MPI.Op`` ``mpi_op`` (``native_op``), under the deadline: every argument
        resolved, so that a persistent plan's call (``ringcomp.plans.bind``) pays little else."""
        send = MPI.IN_PLACE if src is None else src
        if self.guard.closed:
            self._before_sending()
        if self._held.queue:
            self._held.post_all()
        if self.timeout <= 0:
            self.comm.Allreduce(send, buf, op=mpi_op)
            return
        # the blocking call, not Iallreduce + Wait: MPICH's nonblocking collectives run
        # other (scheduled) algorithms, measured 11% slower at 16 MB and ~4 us at 4 KB on
        # 4 ranks; the watchdog aborts from its own thread either way
        key = threading.get_ident()
        started = time.monotonic()
        _WATCHDOG.enter(key, started + self.timeout, self._describe_allreduce, started,
                        buf.nbytes)
        try:
            self.comm.Allreduce(send, buf, op=mpi_op)
        finally:
            _WATCHDOG.leave(key)
