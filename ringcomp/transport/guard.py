"""One collective at a time per communicator: a second thread's call is refused, not mixed."""

from __future__ import annotations

import threading

from ringcomp.errors import ClosedTransportError, ConcurrentCallError
from ringcomp.transport.walkstate import STOP


class CallGuard:
    """Admits the calls of one thread at a time and remembers why it was closed.

    Calls pair up across ranks in the order each rank makes them; two threads sharing a
    communicator make that order differ between ranks, which silently mixes their data
    (MPI itself calls this erroneous). So a call that finds another thread's call in
    progress raises ConcurrentCallError, and the guard closes on this rank: the call
    already in flight raises too when it ends (its partners on other ranks may be the
    wrong thread's), and so does every later call. Nested calls of one thread (a
    collective built from collectives) are fine.

    A call made without the argument agreement (``checked=False``) has no thread names to
    tell its partners by: where only this rank saw the overlap, a peer may be running the
    other thread's call against it and would return a mix of both threads' data. So once
    overlapped, such a call sends nothing more (``must_stop_sending``; the transport then
    waits for the deadline), and the peer's call cannot complete.
    """

    def __init__(self, walk_state=None):
        self.closed = ""  # why the transport may no longer be used, once it may not
        # a compiled walk's state (``ringcomp.transport.walkstate``): its STOP word is set when the
        # call in flight must stop sending, which the walk reads before every send
        self._walk_state = walk_state
        # held by the thread inside a collective (re-entrant: a collective built from
        # collectives); taken without waiting, so a second thread finds it held at once
        self._lock = threading.RLock()
        self._owner: int | None = None  # that thread, and how deep
        self._depth = 0
        self._unchecked = False  # the call in progress skipped the argument agreement
        self._calls: dict[tuple, _Call] = {}  # (name, rank, checked) -> its context manager

    def must_stop_sending(self) -> bool:
        """Whether the call in progress skipped the agreement and was closed while in flight
        (another thread's call overlapped it): its data must not reach its peers."""
        return bool(self.closed) and self._unchecked

    def close(self, reason: str) -> None:
        self.closed = self.closed or reason
        self._tell_walk()

    def _tell_walk(self) -> None:
        """Set the compiled walk's STOP word when the call in flight must stop sending."""
        if self._walk_state is not None and self.must_stop_sending():
            self._walk_state[STOP] = 1

    def call(self, name: str, rank: int, checked: bool = True) -> _Call:
        """A context manager around one collective call (a class, not a generator, made
        once per kind of call: it is entered on every call, small ones included)."""
        key = (name, rank, checked)
        found = self._calls.get(key)
        if found is None:
            found = self._calls[key] = _Call(self, name, rank, checked)
        return found

    def enter(self, name: str, rank: int, checked: bool) -> None:
        if self.closed:
            raise ClosedTransportError(f"{name}: {self.closed}")
        if not self._lock.acquire(blocking=False):
            owner = self._owner
            other = next((t.name for t in threading.enumerate() if t.ident == owner),
                         "another thread")
            self.closed = (
                f"two threads ({other!r} and {threading.current_thread().name!r}) called "
                f"collectives on this communicator at once on rank {rank}. Calls pair "
                "up across ranks in the order each rank makes them, so concurrent calls "
                "mix data between threads. Give each thread its own communicator "
                "(comm.Dup(), created in the same order on every rank before the "
                "threads start) and pass it as comm=")
            self._tell_walk()  # a compiled walk in flight stops before its next send
            raise ConcurrentCallError(f"{name}: {self.closed}")
        if self._depth == 0:
            self._unchecked = not checked
            self._owner = threading.get_ident()
        self._depth += 1

    def leave(self, name: str, raised: bool) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
        self._lock.release()
        if self.closed and not raised:  # another thread overlapped this call: its partners
            raise ConcurrentCallError(f"{name}: {self.closed}")  # are suspect


class _Call:
    """``CallGuard.call``'s context manager."""

    __slots__ = ("guard", "name", "rank", "checked")

    def __init__(self, guard: CallGuard, name: str, rank: int, checked: bool):
        self.guard, self.name, self.rank, self.checked = guard, name, rank, checked

    def __enter__(self) -> None:
        self.guard.enter(self.name, self.rank, self.checked)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.guard.leave(self.name, exc_type is not None)
