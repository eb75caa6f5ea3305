"""``cuda_launch.launch``'s routing without a GPU: CuPy arguments go through Numba's
dispatcher on the first launch of their kinds (whose layout ``cuda_direct`` then learns)
and straight to the driver after; ``RINGCOMP_DIRECT_LAUNCH=0`` (``DIRECT`` off) always takes
Numba's path; host arrays and the simulator never touch ``cuda_direct``. Stand-ins record
what each path was given; the launches themselves run on a GPU (tests/cuda/test_launch.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from fakedevice import FakeCupy

from ringcomp.kernels import cuda_launch


class Kernel:
    """A stand-in dispatcher: ``kernel[blocks, threads, stream](*args)`` is recorded."""

    def __init__(self):
        self.numba = []

    def __getitem__(self, config):
        return lambda *args: self.numba.append((config, args))


class Launcher:
    """A stand-in ``cuda_direct.LAUNCHER``: launches once it has learnt the kernel."""

    def __init__(self):
        self.learnt, self.direct = set(), []

    def launch(self, kernel, blocks, threads, stream, args):
        if kernel not in self.learnt:
            return False
        self.direct.append((blocks, threads, stream, args))
        return True

    def learn(self, kernel, args, views, stream):
        assert views == [("view", a) for a in args] and stream == ("stream", 7)
        self.learnt.add(kernel)


@pytest.fixture
def gpu(monkeypatch):
    launcher = Launcher()
    monkeypatch.setattr(cuda_launch, "SIMULATED", False)
    monkeypatch.setattr(cuda_launch, "DIRECT", True)
    monkeypatch.setattr(cuda_launch.cuda_direct, "LAUNCHER", launcher)
    monkeypatch.setattr(cuda_launch, "_current_stream_ptr", lambda: 7)
    monkeypatch.setattr(cuda_launch, "_numba_stream", lambda ptr: ("stream", ptr))
    monkeypatch.setattr(cuda_launch, "numba_view", lambda a: ("view", a))
    return launcher


def test_the_first_launch_of_kinds_goes_through_numba_the_next_to_the_driver(gpu):
    kernel, a = Kernel(), FakeCupy()
    cuda_launch.launch(kernel, 1000, a, np.int64(3), threads=256)
    assert kernel.numba == [((4, 256, ("stream", 7)), (("view", a), ("view", np.int64(3))))]
    assert gpu.direct == []
    cuda_launch.launch(kernel, 1000, a, np.int64(4), threads=256)
    assert len(kernel.numba) == 1 and gpu.direct == [(4, 256, 7, (a, np.int64(4)))]
    cuda_launch.launch(kernel, 0, a)  # no items: nothing launched at all
    assert len(kernel.numba) == 1 and len(gpu.direct) == 1


def test_with_direct_launches_off_numba_launches_every_time(gpu, monkeypatch):
    monkeypatch.setattr(cuda_launch, "DIRECT", False)
    kernel, a = Kernel(), FakeCupy()
    for _ in range(3):
        cuda_launch.launch(kernel, 10, a)
    assert len(kernel.numba) == 3 and gpu.direct == [] and gpu.learnt == set()


def test_host_arrays_and_the_simulator_never_reach_the_driver(gpu, monkeypatch):
    kernel, x = Kernel(), np.zeros(4, np.float32)
    cuda_launch.launch(kernel, 4, x, 2)
    (config, args), = kernel.numba
    assert args == (x, 2) and config[2] == 0  # as given, on the default stream
    monkeypatch.setattr(cuda_launch, "SIMULATED", True)
    cuda_launch.launch(kernel, 4, FakeCupy())
    assert len(kernel.numba) == 2 and gpu.direct == [] and gpu.learnt == set()
