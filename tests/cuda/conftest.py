"""The CUDA kernels' tests run where CUDA kernels can: under Numba's simulator
(``NUMBA_ENABLE_CUDASIM=1``, NumPy arrays, small sizes; what ``make test`` runs in its own
process) or on a GPU (CuPy arrays, large sizes too). Anywhere else they are skipped."""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from fakedevice import GPUS, NO_DEVICE, SIMULATED  # noqa: E402 - after the path

if SIMULATED:  # (fakedevice set the simulator's switch interval)
    XP = np
elif GPUS:
    import cupy as XP
else:
    XP = None
#: element counts: awkward small ones everywhere, large ones on a real GPU only
SIZES = [0, 1, 7, 31, 32, 33, 255, 257, 1000] + ([1 << 20, (1 << 22) + 5] if XP is not np
                                                 and XP is not None else [])


def pytest_collection_modifyitems(config, items):
    if XP is None:
        skip = pytest.mark.skip(reason=NO_DEVICE)
        for item in items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def quiet_wraparound():
    # the simulator runs the counter-based RNG on NumPy scalars, whose uint64 products
    # wrap (as they must) with a RuntimeWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def dev(a):
    """A host array in the kernels' memory (itself under the simulator)."""
    return XP.asarray(a)


def host(a):
    """A kernel result back on the host."""
    return a if isinstance(a, np.ndarray) else a.get()
