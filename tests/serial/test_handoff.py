"""The communication engine's own CUDA stream: a bucket is handed over by an event recorded
at submit and waited for on the GPU, so the engine's work is not queued behind backward
on the legacy default stream (``ringcomp.training.handoff``).

CuPy needs a GPU, so a stand-in ``cupy`` module records what would be called; the real
thing runs in the device tests on a GPU (``tests/mpi/test_device_train.py``)."""

from __future__ import annotations

import sys
import threading
import types

import numpy as np
import pytest
from fakedevice import DeviceArray
from mpi4py import MPI

from ringcomp.training import engine as engine_module
from ringcomp.training import handoff
from ringcomp.training.engine import CommEngine


class Log(list):
    def add(self, *what):
        self.append((threading.current_thread().name, *what))


def stand_in_cupy(log: Log) -> types.ModuleType:
    """What ``handoff`` calls of CuPy: events, streams (current per thread), devices."""
    current = threading.local()

    class Stream:
        def __init__(self, non_blocking=False):
            self.non_blocking = non_blocking
            log.add("stream", non_blocking)

        def wait_event(self, event):
            log.add("wait", event)

        def __enter__(self):
            current.stream = self
            return self

        def __exit__(self, *exc):
            current.stream = None

    class Event:
        def __init__(self, block=True, disable_timing=False):
            self.timing = not disable_timing

        def record(self, stream=None):
            log.add("record", getattr(current, "stream", None))

    class Device:
        def __init__(self, index):
            self.index = index

        def use(self):
            log.add("device", self.index)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    cuda = types.SimpleNamespace(Stream=Stream, Event=Event, Device=Device)
    return types.SimpleNamespace(cuda=cuda)


class GpuArray:
    """Recognised as a CuPy array (by its module's name), on GPU 1."""
    __module__ = "cupy._core.core"
    device = types.SimpleNamespace(id=1)


@pytest.fixture
def log(monkeypatch):
    found = Log()
    monkeypatch.setitem(sys.modules, "cupy", stand_in_cupy(found))
    monkeypatch.setattr(handoff, "_local", threading.local())
    return found


@pytest.mark.parametrize("buf", [np.zeros(3, np.float32), DeviceArray.of(np.zeros(3))],
                         ids=["host", "stand-in device"])
def test_host_arrays_and_stand_ins_need_no_hand_over(buf):
    assert handoff.ready(buf) is None
    with handoff.engine_stream(buf, None) as stream:
        assert stream is None


def test_the_engine_thread_waits_on_its_own_non_blocking_stream_for_the_event(log):
    buf = GpuArray()
    event = handoff.ready(buf)  # on the submitting thread, its current stream
    assert event is not None and not event.timing
    seen = []

    def engine():
        for _ in range(2):
            with handoff.engine_stream(buf, event) as stream:
                seen.append(stream)

    worker = threading.Thread(target=engine, name="engine")
    worker.start()
    worker.join()
    assert seen[0] is seen[1] and seen[0].non_blocking  # one stream, made once
    assert [w for w in log if w[0] == "engine"] == [
        ("engine", "device", 1), ("engine", "stream", True), ("engine", "wait", event),
        ("engine", "device", 1), ("engine", "wait", event)]
    with handoff.engine_stream(buf, None) as mine:  # another thread: a stream of its own
        assert mine is not seen[0]


def test_comm_engine_hands_over_at_submit_and_reduces_inside_the_engine_stream(monkeypatch):
    """The event is taken on the submitting thread when the bucket is submitted; on the
    engine's thread ``before`` and the collective run inside ``engine_stream`` with it,
    and the sum comes back."""
    calls = Log()

    def ready(buf):
        calls.add("ready")
        return "event"

    class Context:
        def __init__(self, buf, event):
            calls.add("enter", event)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            calls.add("exit")

    monkeypatch.setattr(engine_module.handoff, "ready", ready)
    monkeypatch.setattr(engine_module.handoff, "engine_stream", Context)
    engine = CommEngine(MPI.COMM_SELF, algorithm="ring", compressor=None,
                        error_feedback=False, seed=0)
    try:
        x = np.arange(5, dtype=np.float32)
        out = engine.submit(x, step=0, bucket=0, compressed=False,
                            before=lambda: calls.add("before")).result(timeout=30)
    finally:
        engine.close()
    np.testing.assert_array_equal(out, x)
    here = threading.current_thread().name
    assert calls == [(here, "ready"), ("ringcomp-comm", "enter", "event"),
                     ("ringcomp-comm", "before"), ("ringcomp-comm", "exit")]
