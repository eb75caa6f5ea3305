"""Launching the Numba CUDA kernels: grid size, CuPy's current stream, the simulator.

Kernels run on the stream CuPy is using (``cupy.cuda.get_current_stream()``), so they are
ordered after whatever produced their inputs and before whatever consumes their outputs
without a host synchronisation; that is also why Numba's own stream sync on every
``__cuda_array_interface__`` argument is switched off here (it would block the host on
every launch). Under ``NUMBA_ENABLE_CUDASIM=1`` the same kernels run in Numba's simulator
on NumPy arrays - how CI checks them bit for bit without a GPU.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict

import numpy as np
from numba import cuda, int32, types, uint32

from ringcomp.kernels import cuda_direct
from ringcomp.kernels.arrays import array_module, is_cupy

try:  # numba-cuda
    from numba.cuda.core import config
except ImportError:  # the CUDA target built into older Numba
    from numba.core import config

#: threads per block; the tree reductions' fixed width (``signs_ref.TREE``) as well
THREADS = 256
SIMULATED = bool(config.ENABLE_CUDASIM)
#: the simulator runs every GPU thread as a Python thread: small blocks waste fewer on the
#: short segments the tests use (a block's size changes no result, only the tree's does)
BLOCK = 32 if SIMULATED else THREADS
config.CUDA_ARRAY_INTERFACE_SYNC = False  # ordered by the shared stream instead (above)
#: launch CuPy arguments through ``cuda_direct`` (``RINGCOMP_DIRECT_LAUNCH``, default 1)
DIRECT = cuda_direct.enabled()
_streams: dict[int, object] = {}
#: Numba views of CuPy arrays kept for reuse (least recently used dropped first): a hop
#: launches the same few kernels on the same few buffers over and over
VIEW_CACHE = 1024
_views: OrderedDict = OrderedDict()


def usable() -> str:
    """'' when CUDA kernels can run here (a GPU, or the simulator), else the reason."""
    if SIMULATED:
        return ""
    try:
        if cuda.is_available():
            return ""
    except Exception as err:  # a broken driver install
        return f"CUDA unusable: {err}"
    return "no CUDA device or driver (NUMBA_ENABLE_CUDASIM=1 runs the simulator)"


def stream_of(a):
    """The stream to launch on for array ``a``: CuPy's current stream for CuPy arrays,
    the default stream otherwise (the simulator, Numba device arrays)."""
    if SIMULATED or not is_cupy(a):
        return 0
    return _numba_stream(_current_stream_ptr())


def _current_stream_ptr() -> int:
    import cupy

    return cupy.cuda.get_current_stream().ptr


def _numba_stream(ptr: int):
    if ptr not in _streams:
        _streams[ptr] = cuda.external_stream(ptr) if ptr else cuda.default_stream()
    return _streams[ptr]


#: constant arrays kernels read (lookup tables), one copy per array module, device and key
_tables: dict = {}


def device_table(like, key, make):
    """The host array ``make()`` copied once into the memory of ``like`` (per device and
    ``key``): a kernel's constant table, uploaded on its first use instead of each call."""
    xp = array_module(like)
    where = (xp.__name__, xp.cuda.Device().id if xp.__name__ == "cupy" else None, key)
    if where not in _tables:
        _tables[where] = xp.asarray(make())
    return _tables[where]


def numba_view(a):
    """``a`` as a Numba device array when it is a CuPy array (anything else unchanged).

    Numba turns a ``__cuda_array_interface__`` argument into a device array of its own on
    every launch, some tens of microseconds of Python - more than a 1 MiB hop's kernel
    runs. The view is only a pointer, shape, strides and type, so one made once serves
    every later launch on the same memory: it is cached under exactly those, and made
    without an owner so that the cache keeps no buffer alive. A freed buffer's address
    reused by a new array of the same shape and type yields the same view, which is right
    for the new array too (it describes the same bytes)."""
    if SIMULATED or not is_cupy(a):
        return a
    key = (a.data.ptr, a.shape, a.strides, a.dtype.str)
    view = _views.get(key)
    if view is None:
        view = cuda.from_cuda_array_interface(a.__cuda_array_interface__, owner=None,
                                              sync=False)
        _views[key] = view
        if len(_views) > VIEW_CACHE:
            _views.popitem(last=False)
    else:
        _views.move_to_end(key)
    return view


def launch(kernel, items: int, *args, threads: int = BLOCK) -> None:
    """Run ``kernel`` with one thread per item (``items`` rounded up to whole blocks) on
    the stream of its first argument; nothing to do for no items. CuPy arguments go
    straight to the driver in a block laid out once per argument kinds
    (``cuda_direct``; the first launch of those kinds, and any the layout does not fit,
    through Numba's dispatcher with cached Numba views, ``numba_view``)."""
    if items <= 0:
        return
    blocks = (items + threads - 1) // threads
    if _launched is not None:
        _launched.add((kernel.py_func.__module__, kernel.py_func.__name__,
                       tuple(argument_kind(a) for a in args)))
    if SIMULATED or not is_cupy(args[0]):
        kernel[blocks, threads, stream_of(args[0])](*args)
        return
    ptr = _current_stream_ptr()
    if DIRECT and cuda_direct.LAUNCHER.launch(kernel, blocks, threads, ptr, args):
        return
    stream, views = _numba_stream(ptr), [numba_view(a) for a in args]
    kernel[blocks, threads, stream](*views)
    if DIRECT:
        cuda_direct.LAUNCHER.learn(kernel, args, views, stream)


def argument_kind(a) -> str:
    """How Numba would type kernel argument ``a`` on a GPU, as text: ``array <dtype> <ndim>
    <layout>`` for an array (host arrays stand in for device ones under the simulator), the
    Numba type's name for a scalar."""
    if isinstance(a, (bool, np.bool_)):
        return "boolean"
    if isinstance(a, np.generic):
        return str(a.dtype)
    if isinstance(a, (int, float)):
        return {int: "int64", float: "float64"}[type(a)]
    flags = a.flags
    layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
    return f"array {np.dtype(a.dtype).str} {a.ndim} {layout}"


#: ``RINGCOMP_LAUNCH_LOG=DIR`` (an existing directory): every (module, kernel, argument
#: kinds) a process launched is written to DIR when it ends - under the simulator, what
#: tests/nvvm compiles for a GPU with NVVM, since the simulator never compiles a kernel (it
#: accepts code NVVM refuses)
_launched: set | None = None


def _write_launch_log(directory: str) -> None:
    import json

    path = os.path.join(directory, f"launches-{os.getpid()}-{threading.get_ident()}.json")
    with open(path, "w") as f:
        json.dump(sorted(_launched), f)


if os.environ.get("RINGCOMP_LAUNCH_LOG"):
    if not os.path.isdir(os.environ["RINGCOMP_LAUNCH_LOG"]):
        raise ValueError("RINGCOMP_LAUNCH_LOG must name an existing directory, got "
                         f"{os.environ['RINGCOMP_LAUNCH_LOG']!r}")
    import atexit

    _launched = set()
    atexit.register(_write_launch_log, os.environ["RINGCOMP_LAUNCH_LOG"])


def _shared_arrays_made_once_per_block() -> None:
    """Make the simulator give every thread of a block the same ``cuda.shared.array``.

    Numba's simulator (numba-cuda 0.30) looks a block's shared array up by call site and
    creates it when missing, unlocked: two of the block's Python threads can both miss and
    each get an array of its own, whose writes the others never see. A tree sum then drops
    lanes - the sign scale came out 0.78 instead of 1.38 in about 1 run in 5 of the device
    tests at a 10 us switch interval (and twice in one CI run at 100 us). A GPU has one
    shared array per block by construction; the lock gives the simulator the same.

    The call site is the kernel's line that asks (the simulator's own lookup would see
    this wrapper's line instead, and alias every shared array of a block - a kernel with
    two, such as the sign join's flags and its tree row, then wrote floats into bytes)."""
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "made_once", False):
        return
    lock, unlocked = threading.Lock(), shared.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic, or refused: the simulator's
            return unlocked(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        site = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            found = self._allocations.get(site)
            if found is None:
                kind = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) \
                    else dtype
                found = self._allocations[site] = kernelapi.np.empty(shape, kind)
        return found

    array.made_once = True
    shared.array = array


if SIMULATED:  # the simulator runs Python: nothing is ever fused; numpy views the bits
    _shared_arrays_made_once_per_block()

    @cuda.jit(device=True)
    def mul_f32(a, b):
        """``a * b`` in float32, rounded once (never fused into an add)."""
        return a * b

    @cuda.jit(device=True)
    def mul_f64(a, b):
        """``a * b`` in float64, rounded once (never fused into an add)."""
        return a * b

    @cuda.jit(device=True)
    def f32_bits(f):
        """The bits of float32 ``f`` as uint32."""
        return np.float32(f).view(np.uint32)

    @cuda.jit(device=True)
    def bits_f32(u):
        """The float32 whose bits are uint32 ``u``."""
        return np.uint32(u).view(np.float32)
else:
    from numba.cuda import libdevice

    # NVVM contracts a * b + c into one fused multiply-add by default (numba-cuda exposes
    # no switch), which rounds once instead of twice and breaks bit-equality with NumPy;
    # the round-to-nearest intrinsics are never fused.
    mul_f32 = libdevice.fmul_rn
    mul_f64 = libdevice.dmul_rn

    @cuda.jit(device=True, inline=True)
    def f32_bits(f):
        return uint32(libdevice.float_as_int(f))

    @cuda.jit(device=True, inline=True)
    def bits_f32(u):
        return libdevice.int_as_float(int32(u))
