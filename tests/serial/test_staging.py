"""Staging CuPy buffers through host memory (``ringcomp.device``): how often the host waits
for the stream, and that nothing is read or recycled before the stream got to it.

CuPy needs a GPU, so a stand-in ``cupy`` queues every copy on its stream and runs the
queue only when the stream (or an event on it) is synchronised - the ordering a GPU gives.
A staged send waits once, after its copy out; a staged receive not at all, its copy in
queued and its pinned buffer held until an event after it has passed; a CUDA-aware hand-off
waits before every MPI call. The real thing runs in the device tests on a GPU."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from ringcomp import device


class Stream:
    def __init__(self):
        self.queue, self.ran, self.syncs = [], 0, 0

    def run_to(self, position: int) -> None:
        while self.ran < position:
            self.queue[self.ran]()
            self.ran += 1

    def synchronize(self):
        self.syncs += 1
        self.run_to(len(self.queue))


def stand_in_cupy(stream: Stream):
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

        def record(self, on):
            self.stream, self.position = on, len(on.queue)

        @property
        def done(self):
            return self.stream.ran >= self.position

        def synchronize(self):
            self.stream.run_to(self.position)

    cupy.ndarray, cupy.cuda = ndarray, types.SimpleNamespace(
        get_current_stream=lambda: stream, Event=Event,
        runtime=types.SimpleNamespace(streamSynchronize=lambda ptr: stream.synchronize()))
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda n, dtype: np.zeros(n, dtype)
    return cupy, cupyx


@pytest.fixture
def gpu(monkeypatch):
    stream = Stream()
    cupy, cupyx = stand_in_cupy(stream)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setattr(device, "_in_flight", type(device._in_flight)())
    return stream, cupy.ndarray


def produced(stream, buf, values):
    """A kernel writing ``values`` into ``buf``, queued on the stream (not yet run)."""
    stream.queue.append(lambda: buf.host.__setitem__(..., values))


def test_a_staged_send_waits_once_after_its_copy_is_queued(gpu):
    stream, ndarray = gpu
    buf, synced = ndarray(np.zeros(6, np.float32)), []
    produced(stream, buf, np.arange(6, dtype=np.float32))
    host, nbytes, keep = device.stage_out(buf, False, lambda: synced.append(1))
    assert stream.syncs == 1 and synced == [1] and nbytes == 24 and keep is host
    np.testing.assert_array_equal(host.view(np.float32), np.arange(6))  # the kernel's bytes


def test_a_staged_receive_never_waits_and_holds_its_buffer_until_copied(gpu):
    stream, ndarray = gpu
    buf = ndarray(np.zeros(4, np.float32))
    host, nbytes, finish = device.stage_in(buf, False)
    assert stream.syncs == 0 and nbytes == 16
    host.view(np.float32)[:] = [1, 2, 3, 4]  # MPI's receive lands
    finish()
    assert stream.syncs == 0
    np.testing.assert_array_equal(buf.host, 0)  # only queued
    (event, held), = device._in_flight.held
    assert held is host and not event.done
    stream.synchronize()  # the hop that reads it waits on the stream
    np.testing.assert_array_equal(buf.host, [1, 2, 3, 4])
    other = ndarray(np.zeros(4, np.float32))
    _, _, finish_other = device.stage_in(other, False)
    finish_other()
    assert [h is host for _, h in device._in_flight.held] == [False]  # done: let go


def test_at_most_in_flight_buffers_are_held(gpu, monkeypatch):
    stream, ndarray = gpu
    monkeypatch.setattr(device, "IN_FLIGHT", 2)
    bufs = [ndarray(np.zeros(2, np.float32)) for _ in range(3)]
    for i, buf in enumerate(bufs):
        host, _, finish = device.stage_in(buf, False)
        host.view(np.float32)[:] = i + 1
        finish()
    assert len(device._in_flight.held) == 2
    np.testing.assert_array_equal(bufs[0].host, 1)  # the oldest copy was waited for
    np.testing.assert_array_equal(bufs[2].host, 0)


def test_cuda_aware_hand_off_waits_before_every_mpi_call(gpu):
    stream, ndarray = gpu
    buf, synced = ndarray(np.zeros(3, np.float32)), []
    produced(stream, buf, np.ones(3, np.float32))
    array, nbytes, keep = device.stage_out(buf, True, lambda: synced.append("send"))
    assert array is buf and keep is None and stream.syncs == 1
    np.testing.assert_array_equal(buf.host, 1)  # the producer ran before MPI reads it
    array, nbytes, finish = device.stage_in(buf, True, lambda: synced.append("recv"))
    assert array is buf and finish is None and stream.syncs == 2
    assert synced == ["send", "recv"]
