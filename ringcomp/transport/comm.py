"""The Transport: one communicator's messages and control collectives under deadlines."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings

import numpy as np
from mpi4py import MPI

from ringcomp.devices import device
from ringcomp.transport import walkstate
from ringcomp.transport.completion import Completion
from ringcomp.transport.control import ControlCollectives
from ringcomp.transport.guard import CallGuard
from ringcomp.transport.heldsends import HeldSends
from ringcomp.transport.kept import Kept
from ringcomp.transport.launch import check_launcher, install_abort_on_exception
from ringcomp.transport.mpilib import detect_cuda_aware
from ringcomp.transport.pending import Pending
from ringcomp.transport.startup import check_timeout
from ringcomp.transport.walks import NativeWalks

#: Default deadline for any blocking wait, in seconds (``RINGCOMP_TIMEOUT`` overrides it).
DEFAULT_TIMEOUT_S = 300.0
#: Tags are ``(op_id % TAG_OPS) * TAG_PHASES + phase``; MPI guarantees tags up to 32767.
TAG_PHASES = 8
TAG_OPS = 32768 // TAG_PHASES

def _env_timeout() -> float:
    raw = os.environ.get("RINGCOMP_TIMEOUT", "")
    if not raw:
        return DEFAULT_TIMEOUT_S
    return check_timeout(raw, "RINGCOMP_TIMEOUT")


def check_comm(comm) -> None:
    """Refuse what ringcomp cannot run on, with a message instead of a raw MPI error."""
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator or a Transport, not "
                        f"{type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL (a freed communicator, or a Split/Create "
                         "that left this rank out): pass a live intracommunicator")
    if comm.Is_inter():
        raise ValueError("comm is an intercommunicator: ringcomp's collectives run on "
                         "intracommunicators (merge the groups first with comm.Merge())")


class Transport(ControlCollectives, NativeWalks, Completion):
    """Byte-level point-to-point messaging on a private duplicate of a communicator.

    Args:
        comm: an mpi4py communicator; it is duplicated, so ringcomp's messages can never
            match the caller's. Default: ``MPI.COMM_WORLD``.
        timeout: seconds any blocking wait may take before the job is aborted with a message
            naming the operation, peer and bytes (default ``RINGCOMP_TIMEOUT`` or 300;
            ``0`` disables the deadline).
        cuda_aware: pass device buffers straight to MPI (True), stage them through host
            memory (False), or detect at run time (None; ``RINGCOMP_CUDA_AWARE=0/1``
            overrides the detection).
    """

    def __init__(self, comm=None, *, timeout: float | None = None,
                 cuda_aware: bool | None = None):
        base = MPI.COMM_WORLD if comm is None else comm
        check_comm(base)
        check_launcher(base)
        self.timeout = _env_timeout() if timeout is None else check_timeout(timeout)
        self.cuda_aware = device.resolve_cuda_aware(cuda_aware, detect_cuda_aware)
        self._op = None
        self._held = HeldSends(self._post_send, self._wait_for_gpu)  # sends awaiting the GPU
        self._doing = "creating the transport (duplicating the communicator, collective)"
        self.where = ""
        self.rank = base.Get_rank()
        # Idup, not Dup: a rank that never arrives must hit the deadline, not hang us
        self.comm, request = base.Idup()
        self._blocking(request, None, "MPI_Comm_idup on every rank of the communicator")
        self.size = self.comm.Get_size()
        self._doing = "idle"
        if self.size > 1 and os.environ.get("RINGCOMP_ABORT_ON_EXCEPTION", "1") != "0":
            install_abort_on_exception()
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            warnings.warn("MPI was initialised below MPI_THREAD_MULTIPLE: MPICH's shared-memory "
                          "collectives may busy-spin (set MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD="
                          "1000000000), and a background communication thread is unsafe",
                          RuntimeWarning, stacklevel=2)
        self.bytes_sent = 0
        self.messages_sent = 0
        self.device_syncs = 0
        self._op_id = 0
        self.call_t0 = 0.0
        self.kept = Kept()
        # a compiled walk's state: where it waits, and the guard's word to stop sending
        self.walk_state = walkstate.new()
        self.guard = CallGuard(self.walk_state)
        self._status = MPI.Status()  # what a receive of the Python walk got (``complete``)
        self._waiting: dict = {}  # a compiled walk's deadline description, per walk
        self._native: object = False  # mpicalls.native(self.comm), made on first use

    # -- one collective at a time ------------------------------------------------------
    def exclusive(self, name: str, checked: bool = True):
        """Run one collective call (a context manager); see ``guard.CallGuard`` (a
        closed transport and a second thread's call are refused; ``checked``: the call
        runs the argument agreement). Notes when the call began (``call_t0``: a traced
        call's record splits its time into its checks and its collective)."""
        self.call_t0 = time.perf_counter()
        return self.guard.call(name, self.rank, checked)

    def _before_sending(self) -> None:
        """A call without the agreement that another thread's call overlapped on this rank
        stops here, before any more of its data leaves (``CallGuard``): it waits for the
        deadline, which ends the job with the reason. Its peers' calls then cannot finish on
        a mix of two threads' data, and its own buffers stay alive for the receives it has
        posted. (Without a deadline, RINGCOMP_TIMEOUT=0, it waits as its peers do.)"""
        if self.guard.must_stop_sending():
            self._under_deadline(threading.Event().wait, None,
                                 f"nothing: this call stopped sending because "
                                 f"{self.guard.closed}")

    @property
    def closed(self) -> str:
        """Why this transport may no longer be used ("" while it may)."""
        return self.guard.closed

    # -- bookkeeping -------------------------------------------------------------------
    def begin_op(self, name: str, algorithm: str, nbytes: int) -> int:
        """Start a collective: name it for diagnostics and return its tag base."""
        self._op_id += 1
        # the text is made only if a deadline message needs it: small calls are many
        self._op = (name, algorithm, nbytes, self._op_id)
        self.where = ""
        return (self._op_id % TAG_OPS) * TAG_PHASES

    @contextlib.contextmanager
    def doing(self, text: str):
        """What a deadline message names while this runs, when no collective has begun
        (a plan being made: its binding may be collective once)."""
        before = self._op, self._doing
        self._op, self._doing = None, text
        try:
            yield
        finally:
            self._op, self._doing = before

    @property
    def context(self) -> str:
        """What this transport is doing, for a deadline message."""
        if self._op is None:
            return self._doing
        name, algorithm, nbytes, op_id = self._op
        return f"{name}[{algorithm}] of {nbytes} bytes (op {op_id})"

    @property
    def op_id(self) -> int:
        return self._op_id

    @property
    def local_size(self) -> int:
        """Ranks of this communicator on this node (shared memory), computed once.

        Collective on first use; kernels use it to divide the node's cores among ranks.
        """
        self._node_layout()
        return self.kept.local_size

    @property
    def local_rank(self) -> int:
        """This rank's position among its node's ranks (``local_size``'s split, in rank
        order)."""
        self._node_layout()
        return self.kept.local_rank

    @property
    def node_leader(self) -> int:
        """The lowest rank of this communicator on this rank's node (names the node)."""
        self._node_layout()
        return self.kept.node_leader

    def _node_layout(self) -> None:
        """Collective on first use: one split of the communicator by shared memory gives
        the node's size, this rank's position on it and the node's lowest rank."""
        if self.kept.local_size is None:
            split = []  # under the deadline: a rank that never comes would hang it forever
            self._under_deadline(lambda: split.append(self.comm.Split_type(
                MPI.COMM_TYPE_SHARED, key=self.rank)), None, "the split of the ranks by node")
            node = split[0]
            first = MPI.Group.Translate_ranks(node.Get_group(), [0], self.comm.Get_group())
            self.kept.local_rank, self.kept.node_leader = node.Get_rank(), first[0]
            self.kept.local_size = node.Get_size()
            node.Free()

    # -- buffers -----------------------------------------------------------------------
    def _outgoing(self, buf):
        """(MPI message spec, nbytes, staging copy to keep alive, CUDA event to wait for or
        None) for sending ``buf``."""
        array, nbytes, staged, ready = device.stage_out(buf, self.cuda_aware, self._synced)
        return [array, MPI.BYTE], nbytes, staged, ready

    def _incoming(self, buf):
        """(MPI message spec, nbytes, finish after completion) for receiving into ``buf``."""
        array, nbytes, finish = device.stage_in(buf, self.cuda_aware, self._synced)
        return [array, MPI.BYTE], nbytes, finish

    def _synced(self) -> None:
        self.device_syncs += 1

    # -- point to point ----------------------------------------------------------------
    def isend(self, buf, dest: int, tag: int) -> Pending:
        """Post a send of ``buf``'s raw bytes to ``dest``.

        A CuPy buffer's send is held instead (its copy out, or CUDA-aware the work that
        produced it, only queued on the stream) and posted once its event has passed:
        checked at every later call of this transport, and waited for before anything
        blocks, so the host queues the next hop while the GPU finishes this one, and no
        rank blocks in MPI on a message it has not posted. Sends are posted in the order
        they were made (MPI matches a peer's receives in posting order).
        """
        if self.guard.closed:
            self._before_sending()
        if type(buf) is np.ndarray:  # host memory, handed to MPI as it is (the hot path)
            msg, nbytes, staged, ready = [buf, MPI.BYTE], buf.nbytes, None, None
        else:
            msg, nbytes, staged, ready = self._outgoing(buf)
        self.bytes_sent += nbytes
        self.messages_sent += 1
        pending = Pending(None, "send", dest, nbytes, tag, None, time.perf_counter(),
                          staged, ready, msg)
        if ready is None and not self._held.queue:
            pending.request = self.comm.Isend(msg, dest, tag)
        else:
            self._held.add(pending)
        return pending

    def _post_send(self, pending: Pending) -> None:
        pending.request = self.comm.Isend(pending.message, pending.peer, pending.tag)

    def _wait_for_gpu(self, pending: Pending) -> None:
        """A held send's GPU work, under the deadline: a kernel that never ends aborts the
        job with the reason, as a peer that never answers does."""
        self.device_syncs += 1
        self._under_deadline(pending.ready.synchronize, None,
                             f"the GPU work queued before a send of {pending.nbytes} bytes "
                             f"to rank {pending.peer} (tag {pending.tag})")

    def irecv(self, buf, source: int, tag: int) -> Pending:
        """Post a receive of exactly ``buf``'s size in bytes from ``source``."""
        if type(buf) is np.ndarray:  # host memory (the hot path)
            msg, nbytes, finish = [buf, MPI.BYTE], buf.nbytes, None
        else:
            msg, nbytes, finish = self._incoming(buf)
        pending = Pending(self.comm.Irecv(msg, source, tag), "recv", source, nbytes, tag,
                          finish, time.perf_counter())
        if self._held.queue:
            self._held.post()
        return pending

    def abort(self, code: int = 1, message: str = "") -> None:
        if message:
            sys.stderr.write(f"[ringcomp rank {self.rank}] {message}\n")
            sys.stderr.flush()
            time.sleep(1.0)  # let the launcher forward the message before the kill
        self.comm.Abort(code)

    def close(self, reason: str = "the transport was closed") -> None:
        """Free the private communicator; later calls raise ClosedTransportError."""
        self.guard.close(reason)
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()
