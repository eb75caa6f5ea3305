"""Device (GPU) buffers: recognise them, synchronise their stream, stage them through host.

Works with any object exposing ``__cuda_array_interface__``: CuPy arrays (``get``/``set``),
Numba device arrays (``copy_to_host``/``copy_to_device``), and the host-memory stand-in the
test suite uses to drive this code path on machines without a GPU.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque

import numpy as np

from ringcomp.kernels import arrays


def is_device(buf) -> bool:
    """True for arrays in GPU memory (anything exposing ``__cuda_array_interface__``)."""
    return arrays.on_device(buf)


def nbytes(buf) -> int:
    return int(buf.nbytes)


def synchronize(buf) -> None:
    """Wait for the stream that produced ``buf`` before MPI reads or writes it.

    mpi4py hands device pointers to MPI with no synchronisation of its own, so a kernel
    still writing ``buf`` on a stream would race the transfer. The CUDA array interface
    names that stream (None means the producer needs no sync).
    """
    stream = buf.__cuda_array_interface__.get("stream")
    if stream is None:
        return
    hook = getattr(buf, "synchronize_stream", None)
    if hook is not None:  # test stand-in: records the call
        hook()
        return
    import cupy

    cupy.cuda.runtime.streamSynchronize(stream)


#: set once ``import cupyx`` failed: Python does not remember a failed import, and
#: searching the path again for it on every staged hop cost about 100 us each
_no_cupyx = False


def host_staging(buf) -> np.ndarray:
    """A host byte buffer the size of ``buf`` (pinned when CuPy is there)."""
    global _no_cupyx
    cupyx = sys.modules.get("cupyx")
    if cupyx is None and not _no_cupyx:
        try:
            import cupyx
        except ImportError:
            _no_cupyx = True
    if cupyx is None:
        return np.empty(nbytes(buf), dtype=np.uint8)
    return cupyx.empty_pinned(nbytes(buf), dtype=np.uint8)


def to_host(buf) -> np.ndarray:
    """Copy a device buffer into a new host byte array; done when it returns (a CuPy
    buffer's copy is queued on the current stream, after the work that produced it, and
    that stream waited for)."""
    host = host_staging(buf)
    if hasattr(buf, "get"):  # CuPy
        import cupy

        stream = cupy.cuda.get_current_stream()
        buf.reshape(-1).view(np.uint8).get(stream=stream, out=host)
        stream.synchronize()
    else:  # Numba protocol
        buf.copy_to_host(host.view(buf.dtype).reshape(buf.shape))
    return host


#: this thread's pinned staging buffers whose host-to-device copies may still be queued
_in_flight = threading.local()
#: the most such buffers held at once (past it, the host waits for the oldest copy)
IN_FLIGHT = 256


def from_host(host: np.ndarray, buf) -> None:
    """Copy host bytes back into a device buffer of the same size.

    A CuPy buffer's copy is only queued on the current stream (whatever reads ``buf``
    next on that stream runs after it; the host does not wait). The pinned staging buffer
    is held until an event after the copy has passed: given back to CuPy's pool at once,
    the next staging would refill it before the copy ran - seen on an H100 as ranks
    ending with their own input instead of the sum. Other device arrays: done when it
    returns."""
    if hasattr(buf, "set"):  # CuPy
        import cupy

        stream = cupy.cuda.get_current_stream()
        buf.reshape(-1).view(np.uint8).set(host, stream=stream)
        _hold_until_copied(host, stream)
    else:
        buf.copy_to_device(host.view(buf.dtype).reshape(buf.shape))


def _hold_until_copied(host: np.ndarray, stream) -> None:
    """Keep ``host`` referenced until the work queued on ``stream`` so far has run;
    release the held buffers whose copies are done (at most ``IN_FLIGHT`` held)."""
    import cupy

    held = getattr(_in_flight, "held", None)
    if held is None:
        held = _in_flight.held = deque()
    event = cupy.cuda.Event(disable_timing=True)
    event.record(stream)
    held.append((event, host))
    while held and (len(held) > IN_FLIGHT or held[0][0].done):
        held[0][0].synchronize()
        held.popleft()


def resolve_cuda_aware(option: bool | None, detect) -> bool:
    """Explicit option first, then ``RINGCOMP_CUDA_AWARE`` (0/1/auto), then detection."""
    if option is not None:
        return bool(option)
    env = os.environ.get("RINGCOMP_CUDA_AWARE", "auto").strip().lower()
    if env in ("1", "true", "yes"):
        return True
    if env in ("0", "false", "no"):
        return False
    if env not in ("", "auto"):
        raise ValueError(f"RINGCOMP_CUDA_AWARE must be 0, 1 or auto, got {env!r}")
    return detect()


def array_module(buf):
    """The array namespace of ``buf``: ``numpy``, ``cupy``, or its ``__array_namespace__()``."""
    return arrays.array_module(buf)


def address_range(buf) -> tuple[int, int]:
    """``[start, end)`` of a contiguous host or device buffer's bytes."""
    if isinstance(buf, np.ndarray):
        start = buf.__array_interface__["data"][0]
    else:
        start = buf.__cuda_array_interface__["data"][0]
    return start, start + nbytes(buf)


def overlap(a, b) -> str:
    """How two contiguous buffers share memory: "" (not at all), "same" (the same bytes)
    or "partial". Host and device memory never overlap."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) \
            and not np.may_share_memory(a, b):  # bounds only, in C: the common case
        return ""
    if is_device(a) != is_device(b) or not nbytes(a) or not nbytes(b):
        return ""
    (a0, a1), (b0, b1) = address_range(a), address_range(b)
    if a1 <= b0 or b1 <= a0:
        return ""
    return "same" if (a0, a1) == (b0, b1) else "partial"


def _handed_as_is(buf, cuda_aware: bool, synced, verb: str) -> int | None:
    """``buf``'s byte count when MPI can take it as it is (host memory, or device memory
    with a CUDA-aware MPI), else None (device memory to stage). A device buffer's stream
    is synchronised first and ``synced`` told - except a CuPy buffer to stage, whose
    copies are ordered on the stream instead (a receive needs no wait: MPI writes host
    memory, and the copy in is queued after it; sends of CuPy buffers never come here:
    ``_stage_out_queued``)."""
    if not is_device(buf):
        if isinstance(buf, np.ndarray):
            return buf.nbytes
        raise TypeError(f"cannot {verb} a {type(buf).__name__}: need a contiguous array")
    if not cuda_aware and arrays.is_cupy(buf):
        return None
    synced()
    synchronize(buf)
    return nbytes(buf) if cuda_aware else None


#: this thread's staging copies while a traced call listens (``listen_staging``): a list
#: of (kind, nbytes, t0, t1), or None / no attribute (the hot path looks only for that)
_listening = threading.local()
#: the most copies kept for one call: a call that raised before its tracer's ``op`` leaves
#: its list open, and the untraced calls after it must not grow that list without bound
COPIES_KEPT = 100_000


def listen_staging() -> None:
    """From now on, record this thread's staging copies (a traced collective call begins;
    what a call that raised before ``staged_copies`` left open is dropped). Collective
    calls do not nest: one list per thread is enough."""
    _listening.copies = []


def staged_copies() -> list[tuple[str, int, float, float]]:
    """Stop listening (the traced call ends) and return the copies since ``listen_staging``:
    ``(kind, nbytes, t0, t1)``, kind ``stage-out`` (the device-to-host copy of a send; on
    CuPy only queueing it and an event after it - the transport waits for that event
    before posting the send, in a ``send`` hop's span) or ``stage-in`` (the host-to-device
    copy after a receive completed; on CuPy only queueing it - the copy runs on the
    stream, before the hop that reads it), times on ``time.perf_counter``."""
    copies = getattr(_listening, "copies", None) or []
    _listening.copies = None
    return copies


def _staged(kind: str, nbytes: int, t0: float) -> None:
    copies = getattr(_listening, "copies", None)
    if copies is not None and len(copies) < COPIES_KEPT:
        copies.append((kind, nbytes, t0, time.perf_counter()))


def stage_out(buf, cuda_aware: bool, synced=lambda: None):
    """(array to hand to MPI, nbytes, staging copy to keep alive until the send completes,
    ready) for sending ``buf``: device memory goes through a host copy unless MPI is
    CUDA-aware. ``ready``: None when MPI may read the array now; for a CuPy buffer a CUDA
    event MPI must wait for first - its copy out (or, CUDA-aware, the work that produced
    it) is only queued on the stream, so the host may queue the next hop's kernels
    before the GPU got to this one (the transport posts the send once the event passed)."""
    t0 = time.perf_counter()
    if arrays.is_cupy(buf):
        return _stage_out_queued(buf, cuda_aware, t0)
    size = _handed_as_is(buf, cuda_aware, synced, "send")
    if size is not None:
        return buf, size, None, None
    host = to_host(buf)
    _staged("stage-out", host.nbytes, t0)
    return host, host.nbytes, host, None


def _stage_out_queued(buf, cuda_aware: bool, t0: float):
    """``stage_out`` of a CuPy buffer: the copy out queued after the work that made it,
    and an event after that, on the current stream; nothing waited for."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    array = keep = None
    if cuda_aware:
        array = buf
    else:
        array = keep = host_staging(buf)
        buf.reshape(-1).view(np.uint8).get(stream=stream, out=keep)
    ready = cupy.cuda.Event(disable_timing=True)
    ready.record(stream)
    if keep is not None:
        _staged("stage-out", keep.nbytes, t0)
    return array, nbytes(buf), keep, ready


def stage_in(buf, cuda_aware: bool, synced=lambda: None):
    """(array to hand to MPI, nbytes, what to run once the receive completed - copying a
    host staging buffer to the device - or None) for receiving into ``buf``."""
    size = _handed_as_is(buf, cuda_aware, synced, "receive into")
    if size is not None:
        return buf, size, None
    host = host_staging(buf)

    def finish():
        t0 = time.perf_counter()
        from_host(host, buf)
        _staged("stage-in", host.nbytes, t0)
    return host, host.nbytes, finish


def event_pair(buf):
    """(start, end) CUDA events for timing work on the current stream when ``buf`` is a
    CuPy array, else None (host work, stand-ins: wall-clock time is the truth there)."""
    if not arrays.is_cupy(buf):
        return None
    import cupy

    return cupy.cuda.Event(), cupy.cuda.Event()


def elapsed_s(start, end) -> float:
    """Seconds of GPU time between two recorded events (waits for ``end``)."""
    import cupy

    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / 1e3
