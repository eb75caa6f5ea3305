"""A host array that only looks like a CUDA array: drives the GPU code path on any machine.

It exposes ``__cuda_array_interface__`` (so mpi4py takes its device-buffer path), the Numba
copy protocol (``copy_to_host``/``copy_to_device``, used for host staging), an array
namespace for scratch allocation, and NumPy ufunc dispatch - and it counts the stream
synchronisations the transport performs before every MPI call. ``lazy_cupy`` is a stand-in
``cupy`` whose stream runs queued work only when it (or an event on it) is waited for:
what the host may do before the GPU got there (staging, held sends, traced hops).
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np

# the device-resident stand-in array (and its namespace) the library provides
from ringcomp.devices.standin import DEVICE_NAMESPACE, DeviceArray  # noqa: F401

#: device tests run under Numba's CUDA simulator (on the stand-ins below) or on a real GPU
SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
#: Numba's simulator runs every CUDA thread of a block as a Python thread and polls them in
#: a busy loop at each ``syncthreads``; at Python's default 5 ms switch interval each hand-off
#: of the GIL waits out the poller's slice (QSGD's tree sum ran 4x slower; the 3-rank device
#: stage takes 205 s instead of 237). It also makes the simulator's thread races likelier:
#: the one that hit ringcomp (tests/cuda/test_simulator.py) is locked out in cuda_launch.
#: ``RINGCOMP_SIM_SWITCH_INTERVAL`` (seconds) overrides it for a stress run: a shorter one
#: switches threads more often, where a race among a kernel's threads shows (docs/testing.md)
SIMULATOR_SWITCH_INTERVAL = float(os.environ.get("RINGCOMP_SIM_SWITCH_INTERVAL", "1e-4"))
if SIMULATED:
    sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL)


def _gpu_count() -> int:
    if SIMULATED:
        return 0
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device
        return 0


GPUS = _gpu_count()
NO_DEVICE = "no GPU and not under NUMBA_ENABLE_CUDASIM=1"  # the skip reason elsewhere


#: a class whose instances ringcomp takes for CuPy arrays (``arrays.is_cupy`` looks at the
#: type's module only): tests give them the attributes the code under test reads
FakeCupy = type("ndarray", (), {"__module__": "cupy"})


class LazyStream:
    """A stand-in CUDA stream: work queued on it runs only when the stream, or an event
    recorded on it, is synchronised - the latest a GPU may run it, so code that reads a
    result without waiting for it reads stale bytes, and code that blocks elsewhere while
    waiting for it hangs."""

    def __init__(self):
        self.queue, self.ran, self.syncs = [], 0, 0

    def run_to(self, position: int) -> None:
        while self.ran < position:
            self.queue[self.ran]()
            self.ran += 1

    def synchronize(self):
        self.syncs += 1
        self.run_to(len(self.queue))

    def produce(self, buf, values) -> None:
        """A kernel writing ``values`` into the stand-in CuPy array ``buf``, queued."""
        self.queue.append(lambda: buf.host.__setitem__(..., values))


def lazy_cupy(stream: LazyStream):
    """Stand-in ``cupy`` and ``cupyx`` modules whose arrays (host memory, exposing
    ``__cuda_array_interface__``) copy to and from the host on ``stream``."""
    cupy = types.ModuleType("cupy")

    class ndarray:  # noqa: N801 - CuPy's name
        __module__ = "cupy"

        def __init__(self, host):
            self.host = host

        @property
        def __cuda_array_interface__(self):
            return {"shape": self.host.shape, "typestr": self.host.dtype.str,
                    "data": (self.host.ctypes.data, False), "version": 3, "stream": 1}

        nbytes = property(lambda self: self.host.nbytes)
        dtype = property(lambda self: self.host.dtype)
        size = property(lambda self: self.host.size)

        def reshape(self, *shape):
            return ndarray(self.host.reshape(*shape))

        def view(self, dtype):
            return ndarray(self.host.view(dtype))

        def get(self, stream=None, out=None):
            stream.queue.append(lambda: out.__setitem__(..., self.host))

        def set(self, host, stream=None):
            stream.queue.append(lambda: self.host.__setitem__(..., host))

    class Event:
        def __init__(self, disable_timing=False):
            self.stream = self.position = None

        def record(self, on=None):
            on = stream if on is None else on
            self.stream, self.position = on, len(on.queue)

        @property
        def done(self):
            return self.stream.ran >= self.position

        def synchronize(self):
            self.stream.run_to(self.position)

    def get_elapsed_time(start, end):
        """Milliseconds between two events: here one per piece of work queued between
        them, and only once the later one has passed (as CUDA refuses before)."""
        assert end.done, "elapsed time asked before the event passed"
        return float(end.position - start.position)

    cupy.ndarray, cupy.cuda = ndarray, types.SimpleNamespace(
        get_current_stream=lambda: stream, Event=Event, get_elapsed_time=get_elapsed_time,
        runtime=types.SimpleNamespace(streamSynchronize=lambda ptr: stream.synchronize()))
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda n, dtype: np.zeros(n, dtype)
    return cupy, cupyx


def install_lazy_cupy(monkeypatch):
    """Put ``lazy_cupy`` in ``sys.modules`` for one test (with a fresh set of held staging
    buffers); returns (its stream, its array class)."""
    from ringcomp.devices import device

    stream = LazyStream()
    cupy, cupyx = lazy_cupy(stream)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setattr(device, "_in_flight", type(device._in_flight)())
    return stream, cupy.ndarray


class FakeDeviceArray:
    syncs = 0  # class-wide count of stream synchronisations

    def __init__(self, array):
        self._a = array

    @classmethod
    def of(cls, array):
        return cls(np.ascontiguousarray(array))

    # -- the CUDA array interface -------------------------------------------------------
    @property
    def __cuda_array_interface__(self):
        return {"shape": self._a.shape, "typestr": self._a.dtype.str,
                "data": (self._a.ctypes.data, False), "version": 3,
                "strides": None if self._a.flags.c_contiguous else self._a.strides,
                "stream": 1}

    def synchronize_stream(self):
        FakeDeviceArray.syncs += 1

    # -- Numba's copy protocol (host staging) -------------------------------------------
    def copy_to_host(self, out):
        out[...] = self._a

    def copy_to_device(self, src):
        self._a[...] = src

    # -- enough of an array for the collectives -----------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)

    def reshape(self, *shape):
        return FakeDeviceArray(self._a.reshape(*shape))

    def __getitem__(self, key):
        return FakeDeviceArray(self._a[key])

    def __setitem__(self, key, value):
        self._a[key] = _unwrap(value)

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        args = [_unwrap(x) for x in inputs]
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o) for o in out)
        result = getattr(ufunc, method)(*args, **kwargs)
        return out[0] if out is not None else FakeDeviceArray(result)

    def __array_namespace__(self):
        return NAMESPACE

    def host(self) -> np.ndarray:
        return self._a.copy()


def _unwrap(x):
    return x._a if isinstance(x, FakeDeviceArray) else x


NAMESPACE = types.SimpleNamespace(
    __name__="fakedevice",
    empty=lambda shape, dtype=float: FakeDeviceArray(np.empty(shape, dtype)))


