"""One Transport per live communicator, cached on the communicator as an MPI attribute."""

from __future__ import annotations

import threading

from mpi4py import MPI

from ringcomp.errors import ClosedTransportError
from ringcomp.transport.comm import Transport, check_comm


def _forget_transport(comm, keyval, transport) -> None:
    """MPI's delete callback: the user freed ``comm``, so free the transport made for it."""
    transport.close(f"its communicator was freed (rank {transport.rank})")


#: the cached Transport hangs on the communicator itself as an MPI attribute: a freed
#: communicator's handle may be reused by the next one (MPICH does), an attribute cannot be,
#: and MPI calls the delete callback when the user frees the communicator.
_KEYVAL: list = []  # made on first use (at import there may be no MPI library)


def _transport_keyval() -> int:
    with _MAKING_LOCK:  # two threads' first transports on communicators of their own
        if not _KEYVAL:
            _KEYVAL.append(MPI.Comm.Create_keyval(delete_fn=_forget_transport))
    return _KEYVAL[0]



#: COMM_WORLD and COMM_SELF are never freed by a correct program; their transports are
#: kept here instead, so MPI_Finalize runs no callback that frees a communicator
_PREDEFINED: dict[str, Transport] = {}
#: one lock per communicator (by handle), held while its transport is looked up or made:
#: two threads making the first call on one communicator at once would otherwise each make
#: a transport (each duplicating the communicator), so neither transport's guard saw the
#: other thread and their calls mixed data between ranks (wrong sums with check=False).
#: Making one is collective, so a rank holds the lock while it waits for the others; per
#: communicator, so threads starting on communicators of their own never wait for each other.
_MAKING: dict[int, threading.Lock] = {}
_MAKING_LOCK = threading.Lock()


def get_transport(comm=None) -> Transport:
    """Return the cached Transport for ``comm`` (a Transport, an mpi4py communicator or None).

    One transport per live communicator; freeing the communicator frees its transport, and
    a communicator created later (even one with the same handle) gets a new one.
    """
    if isinstance(comm, Transport):
        if comm.closed:
            raise ClosedTransportError(comm.closed)
        return comm
    if comm is None or comm is MPI.COMM_WORLD:
        # the common case, with no lock and no MPI query once made: the world is never
        # freed, and a transport once in the dictionary stays there
        world = _PREDEFINED.get("world")
        if world is not None:
            return world
    base = MPI.COMM_WORLD if comm is None else comm
    check_comm(base)
    with _MAKING_LOCK:
        making = _MAKING.setdefault(base.py2f(), threading.Lock())
    with making:
        return _cached_or_new(base)


def _cached_or_new(base) -> Transport:
    """``base``'s transport, made (collectively) if it has none; under its making lock."""
    for name, predefined in (("world", MPI.COMM_WORLD), ("self", MPI.COMM_SELF)):
        if base == predefined:
            if name not in _PREDEFINED:
                _PREDEFINED[name] = Transport(predefined)
            return _PREDEFINED[name]
    transport = base.Get_attr(_transport_keyval())
    if transport is None:
        transport = Transport(base)
        base.Set_attr(_transport_keyval(), transport)
    return transport
