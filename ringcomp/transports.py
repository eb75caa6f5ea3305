"""One Transport per live communicator, cached on the communicator as an MPI attribute."""

from __future__ import annotations

from mpi4py import MPI

from ringcomp.comm import Transport, check_comm
from ringcomp.errors import ClosedTransportError


def _forget_transport(comm, keyval, transport) -> None:
    """MPI's delete callback: the user freed ``comm``, so free the transport made for it."""
    transport.close(f"its communicator was freed (rank {transport.rank})")


#: the cached Transport hangs on the communicator itself as an MPI attribute: a freed
#: communicator's handle may be reused by the next one (MPICH does), an attribute cannot be,
#: and MPI calls the delete callback when the user frees the communicator.
_TRANSPORT_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_forget_transport)
#: COMM_WORLD and COMM_SELF are never freed by a correct program; their transports are
#: kept here instead, so MPI_Finalize runs no callback that frees a communicator
_PREDEFINED: dict[str, Transport] = {}


def get_transport(comm=None) -> Transport:
    """Return the cached Transport for ``comm`` (a Transport, an mpi4py communicator or None).

    One transport per live communicator; freeing the communicator frees its transport, and
    a communicator created later (even one with the same handle) gets a new one.
    """
    if isinstance(comm, Transport):
        if comm.closed:
            raise ClosedTransportError(comm.closed)
        return comm
    base = MPI.COMM_WORLD if comm is None else comm
    check_comm(base)
    for name, predefined in (("world", MPI.COMM_WORLD), ("self", MPI.COMM_SELF)):
        if base == predefined:
            if name not in _PREDEFINED:
                _PREDEFINED[name] = Transport(predefined)
            return _PREDEFINED[name]
    transport = base.Get_attr(_TRANSPORT_KEYVAL)
    if transport is None:
        transport = Transport(base)
        base.Set_attr(_TRANSPORT_KEYVAL, transport)
    return transport
