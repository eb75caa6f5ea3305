"""A bucket's hand-over from the training thread's CUDA stream to the engine's own stream.

Why the engine has a stream of its own: on the legacy default stream (CuPy's and
PyTorch's default), every kernel and copy of the communication thread is ordered after all
the work the training thread has queued so far - the rest of backward - and every
synchronisation before an MPI call waits for that work too, so no collective could overlap
backward. (ResNet-50 on an H100 showed it: the engine thread busy about as long as the
whole step.) On a non-blocking stream only the bucket's own producers are waited for:

1. ``ready(buf)`` on the submitting thread, at submit: an event recorded on its current
   stream, after the kernels that produce ``buf`` (None for host arrays and stand-ins).
2. ``engine_stream(buf, event)`` on the engine's thread, around the collective: the
   thread's own non-blocking stream of ``buf``'s GPU made current, told to wait for the
   event on the GPU (the host does not block).
3. The collective synchronises its stream before it returns (``api._run``), so the
   result may be read from any stream or thread.

Invariant: nothing the engine touches is written by the training thread after its
event - a bucket is not written again once submitted, and the next step's writes come
after ``synchronize`` has waited for every collective of this one. Memory CuPy's pool
hands from one stream to the other follows the same chain (recorded, waited on).
"""

from __future__ import annotations

import contextlib
import threading

from ringcomp.kernels.arrays import is_cupy

_local = threading.local()  # the calling thread's stream per GPU


def ready(buf):
    """An event on the calling thread's current stream marking ``buf`` produced, or None
    where there is nothing to wait for (host arrays, device stand-ins)."""
    if not is_cupy(buf):
        return None
    import cupy

    event = cupy.cuda.Event(block=False, disable_timing=True)
    event.record()
    return event


def own_stream(device: int):
    """The calling thread's non-blocking stream on GPU ``device``, made once."""
    import cupy

    streams = getattr(_local, "streams", None)
    if streams is None:
        streams = _local.streams = {}
    if device not in streams:
        with cupy.cuda.Device(device):
            streams[device] = cupy.cuda.Stream(non_blocking=True)
    return streams[device]


def engine_stream(buf, event):
    """Context: the calling thread's own stream of ``buf``'s GPU made current, waiting on
    the GPU for ``event`` (``ready``'s); nothing for host arrays and stand-ins."""
    if not is_cupy(buf):
        return contextlib.nullcontext()
    import cupy

    cupy.cuda.Device(buf.device.id).use()  # (a stream launches on its own GPU only)
    stream = own_stream(buf.device.id)
    if event is not None:
        stream.wait_event(event)
    return stream
