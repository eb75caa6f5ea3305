"""The Transport: one communicator's messages and control collectives under deadlines."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import warnings

import numpy as np
from mpi4py import MPI

from ringcomp import device
from ringcomp.errors import ArgumentMismatchError
from ringcomp.transport import walkstate
from ringcomp.transport.guard import CallGuard
from ringcomp.transport.heldsends import HeldSends
from ringcomp.transport.kept import Kept
from ringcomp.transport.launch import check_launcher, install_abort_on_exception
from ringcomp.transport.mpilib import detect_cuda_aware
from ringcomp.transport.pending import Pending
from ringcomp.transport.startup import check_timeout
from ringcomp.transport.watchdog import Watchdog, deadline_message

#: Default deadline for any blocking wait, in seconds (``RINGCOMP_TIMEOUT`` overrides it).
DEFAULT_TIMEOUT_S = 300.0
#: Tags are ``(op_id % TAG_OPS) * TAG_PHASES + phase``; MPI guarantees tags up to 32767.
TAG_PHASES = 8
TAG_OPS = 32768 // TAG_PHASES

#: ringcomp's op names as MPI's ops (looked up by name at the call: at import there may be
#: no MPI library, and the tools that need none import this module too)
_NATIVE_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN", "prod": "PROD"}


def native_op(op: str):
    """MPI's own ``MPI.Op`` for one of ringcomp's op names ("sum", "max", "min", "prod")."""
    return getattr(MPI, _NATIVE_OPS[op])


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


_WATCHDOG = Watchdog(lambda: MPI.COMM_WORLD.Get_rank(), lambda: MPI.COMM_WORLD.Abort(3))
#: what a rank stuck in the agreement was doing, for the deadline message
AGREEING = "argument agreement (Allreduce of argument signatures)"


class Transport:
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

    # -- completion with a deadline ----------------------------------------------------
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

    def barrier(self) -> None:
        self._blocking(self.comm.Ibarrier(), None, "barrier")

    # -- small control collectives -----------------------------------------------------
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

    def same_ranks(self, other: Transport) -> bool:
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
