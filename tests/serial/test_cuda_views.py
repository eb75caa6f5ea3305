"""``cuda_launch.numba_view``'s cache without a GPU: a stand-in CuPy array and a counting
stand-in for Numba's view maker show that one view is made per (address, shape, strides,
type), reused after, made without an owner (the cache keeps no buffer alive), and that the
cache drops its least recently used views past ``VIEW_CACHE``. The launches themselves are
checked on a GPU (tests/cuda/test_launch.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from fakedevice import FakeCupy

from ringcomp.kernels import cuda_launch


def fake_array(ptr: int, shape=(4,), strides=(4,), dtype=np.float32):
    a = FakeCupy()
    a.data, a.shape, a.strides, a.dtype = SimpleNamespace(ptr=ptr), shape, strides, \
        np.dtype(dtype)
    a.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape}
    return a


@pytest.fixture
def made(monkeypatch):
    calls = []

    def from_cai(desc, owner="unset", sync="unset"):
        calls.append((desc["data"][0], owner, sync))
        return object()

    monkeypatch.setattr(cuda_launch, "SIMULATED", False)
    monkeypatch.setattr(cuda_launch, "_views", type(cuda_launch._views)())
    monkeypatch.setattr(cuda_launch.cuda, "from_cuda_array_interface", from_cai)
    return calls


def test_one_view_per_buffer_shape_and_type_made_without_an_owner(made):
    a = fake_array(0x1000)
    first = cuda_launch.numba_view(a)
    assert cuda_launch.numba_view(fake_array(0x1000)) is first  # same bytes, same view
    assert made == [(0x1000, None, False)]
    others = [fake_array(0x2000), fake_array(0x1000, shape=(2, 2), strides=(8, 4)),
              fake_array(0x1000, dtype=np.int32), fake_array(0x1000, strides=(8,))]
    views = {id(cuda_launch.numba_view(o)) for o in others}
    assert len(views) == 4 and id(first) not in views and len(made) == 5


def test_non_cupy_arguments_pass_through(made):
    x = np.zeros(3)
    assert cuda_launch.numba_view(x) is x and cuda_launch.numba_view(7) == 7
    assert made == []


def test_the_least_recently_used_view_goes_first(made, monkeypatch):
    monkeypatch.setattr(cuda_launch, "VIEW_CACHE", 3)
    arrays = [fake_array(p) for p in (1, 2, 3)]
    views = [cuda_launch.numba_view(a) for a in arrays]
    cuda_launch.numba_view(arrays[0])  # 1 is used again: 2 is now the oldest
    cuda_launch.numba_view(fake_array(4))
    assert len(cuda_launch._views) == 3
    assert cuda_launch.numba_view(arrays[0]) is views[0]
    assert cuda_launch.numba_view(arrays[2]) is views[2]
    assert cuda_launch.numba_view(arrays[1]) is not views[1]  # dropped, made again
