"""The launcher's cached Numba views of CuPy arguments (``cuda_launch.numba_view``): a
launch through a cached view writes into the very CuPy array it was made from, every
time, and a different shape or buffer gets a view of its own; launches after the first
go straight to the driver (``cuda_direct``) and compute the same. On a GPU only (the
simulator passes NumPy arrays through unchanged)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import XP
from numba import cuda

from ringcomp.kernels import cuda_direct, cuda_launch
from ringcomp.kernels.cuda_launch import launch, numba_view

pytestmark = pytest.mark.skipif(XP is np, reason="the simulator takes NumPy arrays as they are")


@cuda.jit
def _add_one(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += 1


def test_a_view_is_made_once_and_launches_write_through_it():
    a = XP.zeros(1000, np.float32)
    assert numba_view(a) is numba_view(a)
    for _ in range(3):
        launch(_add_one, a.size, a)
    np.testing.assert_array_equal(a.get(), np.full(1000, 3, np.float32))


def test_other_shapes_and_buffers_get_their_own_views():
    a = XP.zeros(1024, np.float32)
    assert numba_view(a) is not numba_view(a.reshape(32, 32))
    assert numba_view(a) is not numba_view(a[:512])
    b = XP.zeros(1024, np.float32)
    launch(_add_one, b.size, b)
    np.testing.assert_array_equal(a.get(), 0)
    np.testing.assert_array_equal(b.get(), 1)


def test_the_cache_is_bounded():
    buffers = [XP.zeros(8, np.float32) for _ in range(cuda_launch.VIEW_CACHE + 10)]
    for b in buffers:
        numba_view(b)
    assert len(cuda_launch._views) <= cuda_launch.VIEW_CACHE


@cuda.jit
def _axpy(x, a, n, flip, out):
    i = cuda.grid(1)
    if i < n:
        out[i] += -a * x[i] if flip else a * x[i]


def test_launches_after_the_first_go_straight_to_the_driver():
    """The first launch of these argument kinds goes through Numba and its layout is kept
    (``cuda_direct``: equal to Numba's own block); the later ones through the driver."""
    x = XP.arange(1000, dtype=np.float32)
    out = XP.zeros(1000, np.float32)
    for flip in (False, True, False):
        launch(_axpy, 1000, x, np.float32(2), np.int64(1000), flip, out)
    if cuda_launch.DIRECT:
        kept = [found for (kernel, _, _), found in cuda_direct.LAUNCHER.layouts.items()
                if kernel is _axpy]
        assert len(kept) == 1 and kept[0] is not None, cuda_direct.LAUNCHER.refused
    np.testing.assert_array_equal(out.get(), 2 * np.arange(1000, dtype=np.float32))
    launch(_axpy, 999, x[1:], np.float32(1), np.int64(999), False, out[:999])
    want = 2 * np.arange(999, dtype=np.float32) + np.arange(1, 1000, dtype=np.float32)
    np.testing.assert_array_equal(out.get()[:999], want)  # a view's own pointer and size
