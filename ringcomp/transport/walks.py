"""A Transport running walks compiled whole, which make their MPI calls from compiled code
(``collectives/ring_native``, ``compressed_ring_native``): as its own messages go (a mixin
of ``comm.Transport``)."""

from __future__ import annotations

from mpi4py import MPI

from ringcomp.errors import ArgumentMismatchError
from ringcomp.transport import walkstate


class NativeWalks:
    """``native`` (the communicator's MPI calls for compiled code) and ``run_native``."""

    @property
    def native(self):
        """This communicator's ``ringcomp.transport.mpicalls.NativeMPI``, for a walk compiled whole
        (its MPI calls made from compiled code), or None: where the calls cannot be made
        so, or while a device send is held (the walk would pass it)."""
        if self._native is False:
            from ringcomp.transport.mpicalls import native  # numba and llvmlite: only once needed

            self._native = native(self.comm)
        return None if self._held.queue else self._native

    def run_native(self, walk, args: tuple, messages: int, nbytes: int, what: str) -> None:
        """``walk(*args)``, a compiled walk making its own MPI calls on this communicator,
        as this transport's own messages go: stopped like a send once a call must stop
        sending, counted, under the deadline; a nonzero MPI error code raises."""
        if self.guard.closed:
            self._before_sending()
        self.bytes_sent += nbytes
        self.messages_sent += messages
        self.where = ""  # the walk notes its phase, step and peer in its state, at every
        # wait (its first blocking point is one: no stale place can be reported)
        waiting = self._waiting.get(what)
        if waiting is None:  # made once per walk: small calls are many
            waiting = self._waiting[what] = walkstate.Waiting(self.walk_state, what)
        result = []
        self._under_deadline(lambda: result.append(walk(*args)), None, waiting)
        if result[0]:
            self._walk_failed(int(result[0]))

    def _walk_failed(self, rc: int) -> None:
        """A compiled walk's nonzero return code, as the Python walk would end."""
        if rc == walkstate.STOPPED:
            self._before_sending()  # the guard's word: nothing more leaves; the deadline
        elif rc < 0 or MPI.Get_error_class(rc) == MPI.ERR_TRUNCATE:
            self._refuse_message(walkstate.refusal(rc, self.walk_state, self._op_name(),
                                                   self.rank))
        else:
            raise MPI.Exception(rc)

    def _op_name(self) -> str:
        return self._op[0] if self._op is not None else "collective"

    def _refuse_message(self, text: str) -> None:
        """A message this call cannot take arrived (another size, or contents out of
        range): its peer ran a call with other arguments - possible only without the
        agreement (``check=False``). Raise here, and close the transport: messages of the
        mismatched call may still be in flight, and a later call would meet them."""
        reason = (f"{text}: ranks called with different lengths or arguments (check=False "
                  f"skips the agreement that would say so on every rank)")
        self.guard.close(f"an earlier call failed: {reason}")
        raise ArgumentMismatchError(reason)
