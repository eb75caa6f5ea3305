"""Numba's CUDA simulator, as ringcomp runs it, keeps a GPU's semantics its kernels rely on."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import XP
from numba import cuda, float64, uint8

from ringcomp.kernels import backends, signs_ref

pytestmark = pytest.mark.skipif(XP is not np, reason="the simulator's own behaviour")


@cuda.jit
def _two_shared_arrays(out):
    j = cuda.threadIdx.x
    flags = cuda.shared.array(64, uint8)
    row = cuda.shared.array(32, float64)
    flags[j] = 1
    row[j] = 0.25 * j
    cuda.syncthreads()
    out[j] = row[j] + flags[31 - j]


def test_every_thread_of_a_block_shares_one_shared_array(monkeypatch):
    """The sign scale's tree sum goes through a ``cuda.shared.array``; here its allocation
    yields the GIL (as a 10 us switch interval does at random), so every thread of the
    block looks the array up before the first has stored it. Unlocked, the simulator hands
    some threads arrays of their own and the sum drops their lanes (a wrong scale, the CI
    failure this test was written for); ringcomp's lock gives them one array, as a GPU does."""
    from numba.cuda.simulator import kernelapi

    class SlowEmptyNumpy:
        """NumPy as the simulator sees it, but ``empty`` lets the block's other threads
        run into the same lookup before it returns."""

        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def empty(*args, **kwargs):
            time.sleep(1e-3)
            return np.empty(*args, **kwargs)

    monkeypatch.setattr(kernelapi, "np", SlowEmptyNumpy())
    x = np.random.default_rng(0).standard_normal(51).astype(np.float32)
    scale = backends.backend("signs", "cuda").mean_abs(x, np.empty(1, np.float32))
    assert scale.tobytes() == signs_ref.mean_abs(x, np.empty(1, np.float32)).tobytes()


def test_two_shared_arrays_of_a_kernel_are_two_arrays():
    """The sign join keeps its sign flags (bytes) and its tree row (float64) in two shared
    arrays; the simulator, looking arrays up by call site, must not see them as one (seen
    through ringcomp's lock as a scale of 0 instead of 0.25)."""
    out = np.zeros(32)
    _two_shared_arrays[1, 32](out)
    assert np.array_equal(out, 0.25 * np.arange(32) + 1)
