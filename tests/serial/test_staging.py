"""Staging CuPy buffers through host memory (``ringcomp.devices.device``): how often the host waits
for the stream, and that nothing is read or recycled before the stream got to it.

CuPy needs a GPU, so a stand-in ``cupy`` queues every copy on its stream and runs the
queue only when the stream (or an event on it) is synchronised - the ordering a GPU gives.
A send never waits: its copy out (staged) is queued with an event after it, which the
transport waits for before posting it (``ringcomp.transport.heldsends``); a staged receive never
waits, its copy in queued and its pinned buffer held until an event after it has passed;
a CUDA-aware receive waits before MPI writes the buffer. The real thing runs in the device
tests on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from fakedevice import install_lazy_cupy

from ringcomp.devices import device


@pytest.fixture
def gpu(monkeypatch):
    return install_lazy_cupy(monkeypatch)


def test_a_staged_send_only_queues_its_copy_and_an_event_after_it(gpu):
    stream, ndarray = gpu
    buf, synced = ndarray(np.zeros(6, np.float32)), []
    stream.produce(buf, np.arange(6, dtype=np.float32))
    host, nbytes, keep, ready = device.stage_out(buf, False, lambda: synced.append(1))
    assert stream.syncs == 0 and synced == [] and nbytes == 24 and keep is host
    assert not ready.done
    np.testing.assert_array_equal(host, 0)  # nothing ran yet: MPI must not read it
    stream.produce(buf, np.full(6, -1, np.float32))  # the next hop overwrites buf
    ready.synchronize()
    np.testing.assert_array_equal(host.view(np.float32), np.arange(6))  # the kernel's bytes
    assert stream.ran == 2 and len(stream.queue) == 3  # the later kernel stays queued


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


def test_cuda_aware_send_hands_an_event_and_a_receive_waits(gpu):
    stream, ndarray = gpu
    buf, synced = ndarray(np.zeros(3, np.float32)), []
    stream.produce(buf, np.ones(3, np.float32))
    array, nbytes, keep, ready = device.stage_out(buf, True, lambda: synced.append("send"))
    assert array is buf and keep is None and stream.syncs == 0 and not ready.done
    ready.synchronize()
    np.testing.assert_array_equal(buf.host, 1)  # the producer ran before MPI reads it
    array, nbytes, finish = device.stage_in(buf, True, lambda: synced.append("recv"))
    assert array is buf and finish is None and stream.syncs == 1
    assert synced == ["recv"]  # a kernel still reading buf ran before MPI writes it


def test_other_device_arrays_are_copied_or_synchronised_at_once(gpu):
    """Numba's arrays and other ``__cuda_array_interface__`` objects have no stream to
    queue on here: they are ready when ``stage_out`` returns (no event)."""
    from fakedevice import FakeDeviceArray

    dev = FakeDeviceArray.of(np.arange(4.0))
    host, nbytes, keep, ready = device.stage_out(dev, False)
    assert ready is None and keep is host and nbytes == 32
    np.testing.assert_array_equal(host.view(np.float64), np.arange(4.0))
    array, _, keep, ready = device.stage_out(dev, True)
    assert array is dev and keep is None and ready is None
