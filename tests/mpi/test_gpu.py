"""Real CuPy buffers on a GPU (skipped without CuPy and a device): every algorithm against the
NumPy path, staged through host memory, and handed to MPI directly when it is CUDA-aware."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank

import ringcomp
from ringcomp.transport.mpilib import detect_cuda_aware

cupy = pytest.importorskip("cupy")
try:
    GPUS = cupy.cuda.runtime.getDeviceCount()
except Exception:  # no driver, no device
    GPUS = 0
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no CUDA device")

ALGORITHMS = ["ring", "tree", "dbtree", "rd", "rabenseifner", "mpi", "auto"]


@pytest.fixture(autouse=True)
def one_gpu_per_rank(comm):
    cupy.cuda.Device(comm.rank % max(GPUS, 1)).use()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("cuda_aware", [False, True])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cupy_matches_numpy(comm, algorithm, cuda_aware):
    if cuda_aware and not detect_cuda_aware():
        pytest.skip("this MPI is not CUDA-aware")
    t = ringcomp.Transport(comm, cuda_aware=cuda_aware)
    for n in (0, 1, comm.size + 1, 4099, 1 << 18):
        x = np.random.default_rng(comm.rank + n).standard_normal(n).astype(np.float32)
        expected = ringcomp.allreduce(x, algorithm=algorithm, comm=t)
        # produce the input on a non-default stream: the transport must wait for it
        with cupy.cuda.Stream(non_blocking=True):
            dev = cupy.asarray(x) * 1
            out = ringcomp.allreduce(dev, algorithm=algorithm, comm=t)
        # read on the legacy default stream, which does not wait for that stream: the
        # result must be complete when the call returns (it once missed its last hop)
        assert isinstance(out, cupy.ndarray)
        assert every_rank(comm, np.array_equal(out.get(), expected)), f"n={n}"
    t.close()


@pytest.mark.mpi(min_size=1)
def test_cupy_in_place_and_float16(comm):
    x = cupy.arange(1000, dtype=cupy.float16) % 7
    ringcomp.allreduce(x, out=x)
    assert every_rank(comm, bool((x == (cupy.arange(1000) % 7) * comm.size).all()))
