"""Every CUDA kernel compiled for a GPU by NVVM, with the argument types the simulator
stages launched it with - no GPU needed.

Numba's CUDA simulator runs a kernel's Python and never compiles it, so it accepts code
NVVM refuses (a shared array sized by an expression passed every simulator test and would
have failed its first launch on a GPU). ``tests/run_suite.py`` runs the simulator stages
with ``RINGCOMP_LAUNCH_LOG`` set: each process writes the (module, kernel, argument kinds)
it launched (``cuda_launch.argument_kind``); this stage compiles each to PTX for sm_90 with
the NVVM and NVRTC of NVIDIA's wheels (the ``test`` extra installs them), checks that no
kernel but an allowed one keeps per-thread arrays in local memory, and that every kernel
in ``ringcomp/kernels/*_cuda.py`` was launched, hence compiled."""

from __future__ import annotations

import glob
import importlib
import json
import os
import types as pytypes

import numpy as np
import pytest

LOG = os.environ.get("RINGCOMP_LAUNCH_LOG", "")
if not LOG:
    pytest.skip("run by tests/run_suite.py after the simulator stages (RINGCOMP_LAUNCH_LOG)",
                allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("needs Numba's CUDA target, not the simulator", allow_module_level=True)

from numba import cuda, types  # noqa: E402
from numba.cuda import dispatcher  # noqa: E402
from numba.np import numpy_support  # noqa: E402

#: the GPU generation compiled for (the lent H100/H200's)
CC = (9, 0)
#: kernels allowed per-thread local memory (a stack in DRAM behind the caches): the
#: Count-Sketch decode past 8 rows, whose estimates need an array with runtime bounds
#: (float16 arithmetic is allowed it anywhere: Numba lowers it through local temporaries)
LOCAL_MEMORY = {("ringcomp.kernels.sketch_cuda", "_decode")}
KERNEL_FILES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..",
                                             "ringcomp", "kernels", "*_cuda.py")))


def launched() -> list[tuple[str, str, tuple[str, ...]]]:
    found = set()
    for path in glob.glob(os.path.join(LOG, "launches-*.json")):
        with open(path) as f:
            found |= {(module, name, tuple(kinds)) for module, name, kinds in json.load(f)}
    return sorted(found)


def numba_type(kind: str):
    """``cuda_launch.argument_kind``'s text back as a Numba type."""
    if kind.startswith("array "):
        _, dtype, ndim, layout = kind.split()
        return types.Array(numpy_support.from_dtype(np.dtype(dtype)), int(ndim), layout)
    return getattr(types, kind)


@pytest.fixture(scope="module", autouse=True)
def no_device(monkeypatch_module):
    """A kernel calling a device function asks the current device's compute capability:
    answer for the GPU compiled for (there is none here)."""
    monkeypatch_module.setattr(dispatcher, "get_current_device",
                               lambda: pytypes.SimpleNamespace(compute_capability=CC))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize("module,name,kinds", launched(),
                         ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_nvvm_compiles_it(module, name, kinds):
    try:
        from numba.cuda.cudadrv import nvrtc, nvvm  # noqa: F401 - loaded on first use
        nvvm.NVVM()
    except Exception as err:  # the test extra installs them; a platform without the wheels
        pytest.skip(f"NVIDIA's NVVM/NVRTC libraries not found: {err}")
    kernel = getattr(importlib.import_module(module), name)
    ptx, _ = cuda.compile_ptx(kernel.py_func, tuple(numba_type(k) for k in kinds), cc=CC)
    assert ".entry" in ptx
    # a per-thread array indexed at run time lands in local memory (the Count-Sketch
    # decode's did: a 512-byte stack per thread); kept out of every other kernel
    half = any(k == "float16" or k.startswith("array <f2") for k in kinds)
    if (module, name) not in LOCAL_MEMORY and not half:
        assert ".local" not in ptx, f"{name} uses local memory"


def test_every_kernel_was_launched_under_the_simulator():
    defined = set()
    for path in KERNEL_FILES:
        module = "ringcomp.kernels." + os.path.basename(path)[:-3]
        for name, value in vars(importlib.import_module(module)).items():
            if isinstance(value, dispatcher.CUDADispatcher) and not value.targetoptions.get(
                    "device") and value.py_func.__module__ == module:
                defined.add((module, name))
    assert defined, "no kernels found"
    missing = defined - {(module, name) for module, name, _ in launched()}
    assert not missing, f"kernels no simulator test launched (never compiled): {missing}"
