"""``standin.skipped_launches``: inside it no CUDA kernel runs (those of kernel modules
imported before it too, which bound ``launch`` at their import); after it every one runs
again and gives the host's bytes."""

from __future__ import annotations

import numpy as np
import pytest
from fakedevice import SIMULATED

from ringcomp.compression import Key, get_compressor
from ringcomp.devices import standin
from ringcomp.kernels import cuda_launch
from ringcomp.kernels.arrays import to_numpy

pytestmark = pytest.mark.skipif(not SIMULATED, reason="the stand-in device runs under the "
                                                      "simulator (NUMBA_ENABLE_CUDASIM=1)")


def test_launches_are_skipped_inside_and_run_again_after():
    from ringcomp.kernels import signs_cuda  # imported first: its ``launch`` is bound

    real, sign = cuda_launch.launch, get_compressor("sign")
    host = np.linspace(-1.0, 1.0, 100, dtype=np.float32)
    x = standin.DeviceArray.of(host)
    with standin.skipped_launches() as launched:
        sign.encode(x, Key())
        assert launched[0] > 0 and signs_cuda.launch is not real
    assert signs_cuda.launch is real and cuda_launch.launch is real
    assert to_numpy(sign.encode(x, Key())).tobytes() == sign.encode(host, Key()).tobytes()
