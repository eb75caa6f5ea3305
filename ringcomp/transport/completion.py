"""Completing a Transport's posted messages under its deadline: waits, tests, the byte
count each receive got, and the message a wait past its deadline aborts with (a mixin of
``comm.Transport``)."""

from __future__ import annotations

import threading
import time

from mpi4py import MPI

from ringcomp.transport.pending import Pending
from ringcomp.transport.watchdog import Watchdog, deadline_message

#: the one thread that aborts the job when a wait passes its deadline (every transport's)
_WATCHDOG = Watchdog(lambda: MPI.COMM_WORLD.Get_rank(), lambda: MPI.COMM_WORLD.Abort(3))
#: what a rank stuck in the agreement was doing, for the deadline message


class Completion:
    """``wait``, ``complete``, ``waitall``, ``test`` and the deadline around every
    blocking MPI call of a ``Transport``."""

    def _describe(self, pending: Pending | None, started: float, what: str = "") -> str:
        """The deadline message for a wait that began at ``started`` (made when it fires)."""
        if pending is not None:
            direction = "to" if pending.kind == "send" else "from"
            what = (f"{pending.kind} of {pending.nbytes} bytes {direction} rank "
                    f"{pending.peer} (tag {pending.tag})")
        return deadline_message(time.monotonic() - started, self.timeout, self.context,
                                self.where, what)

    def _describe_allreduce(self, started: float, nbytes: int) -> str:
        return self._describe(None, started, f"MPI Allreduce of {nbytes} bytes")

    def _blocking(self, request, pending: Pending | None, what: str = "",
                  status=None) -> None:
        self._held.post_all()
        self._under_deadline(request.Wait if status is None else
                             lambda: request.Wait(status), pending, what)

    def _under_deadline(self, call, pending: Pending | None, what: str = "") -> None:
        """``call()`` (a wait, or a blocking MPI call) with the watchdog armed: past the
        deadline its thread prints what this rank was waiting for and aborts the job,
        whether or not ``call`` ever returns."""
        if self.timeout <= 0:
            call()
            return
        key = threading.get_ident()
        started = time.monotonic()
        _WATCHDOG.enter(key, started + self.timeout, self._describe, pending, started, what)
        try:
            call()
        finally:
            _WATCHDOG.leave(key)

    def wait(self, pending: Pending) -> float:
        """Complete one posted operation; return the seconds spent blocked in it (for a held
        send, waiting for its GPU work too)."""
        t0 = time.perf_counter()
        self.complete(pending)
        return time.perf_counter() - t0

    def complete(self, pending: Pending) -> None:
        """``wait`` untimed (the hops of an untraced call)."""
        if self._held.queue:
            self._held.post(pending if pending.request is None else None)
        status = self._status
        if not pending.request.Test(status):
            self._blocking(pending.request, pending, status=status)
        self._count(pending, status)
        if pending.finish is not None:
            pending.finish()

    def _count(self, pending: Pending, status) -> None:
        """Check the bytes a receive got, once, as it completes (``status``: its status):
        a shorter message is no MPI error, and a peer whose call has other lengths (no
        agreement, ``check=False``) would leave the rest of the buffer stale."""
        if pending.kind != "recv" or pending.counted:
            return
        pending.counted = True
        got = status.Get_count(MPI.BYTE)
        if got != pending.nbytes:
            self._refuse_message(f"{self._op_name()}: rank {self.rank} received {got} bytes "
                                 f"from rank {pending.peer} (tag {pending.tag}) where this "
                                 f"call expects {pending.nbytes}")

    def waitall(self, pendings) -> None:
        """Complete every one of ``pendings``, untimed: host sends with nothing held in
        one MPI call (a ring's sends), others one by one."""
        # receives one by one: each one's byte count is checked (``complete``)
        if self._held.queue or any(p.request is None or p.finish is not None
                                   or p.kind == "recv" for p in pendings):
            for pending in pendings:
                self.complete(pending)
            return
        requests = [p.request for p in pendings]
        if requests and not MPI.Request.Testall(requests):
            self._under_deadline(lambda: MPI.Request.Waitall(requests), pendings[0])

    def test(self, pending: Pending) -> bool:
        """Whether a posted operation completed (a held send: not before it is posted);
        does not run a receive's ``finish``."""
        if self._held.queue:
            self._held.post()
        if pending.request is None or not pending.request.Test(self._status):
            return False
        self._count(pending, self._status)  # completed now: its status is here, not later
        return True
