"""``cuda_direct``'s argument blocks without a GPU, against Numba's own packer.

The oracle is numba-cuda itself: views made by its ``from_cuda_array_interface`` (as
``cuda_launch.numba_view`` makes them; its context check bypassed, host memory standing in
for the device), typed by its ``typeof`` and packed by its ``_Kernel._prepare_args``. Every
argument kind ringcomp's kernels take must pack to the same bytes; a layout that does not
is refused (the kernel keeps Numba's path, said once); a launch hands the driver pointers
to exactly those bytes. The launches themselves run on a GPU (tests/cuda/test_launch.py).
"""

from __future__ import annotations

import ctypes
import types as pytypes

import numpy as np
import pytest
from fakedevice import FakeCupy

from ringcomp.kernels import cuda_direct

numba_cuda = pytest.importorskip("numba.cuda.dispatcher")  # numba-cuda's real target
from numba import cuda  # noqa: E402
from numba.cuda.typing.typeof import Purpose, typeof  # noqa: E402


@pytest.fixture(autouse=True)
def no_context(monkeypatch):
    """Numba's view maker and empty arrays ask for a CUDA context: host memory needs none."""
    from numba.cuda import api
    from numba.cuda.cudadrv import devicearray

    context = pytypes.SimpleNamespace()
    monkeypatch.setattr(api, "current_context", lambda: context)
    monkeypatch.setattr(devicearray.devices, "get_context", lambda: context)


def device_like(a: np.ndarray):
    """A stand-in CuPy array over host array ``a``: the attributes ``cuda_direct`` reads."""
    d = FakeCupy()
    d.host, d.shape, d.size, d.ndim = a, a.shape, a.size, a.ndim
    d.dtype, d.itemsize, d.strides, d.flags = a.dtype, a.itemsize, a.strides, a.flags
    d.data = pytypes.SimpleNamespace(ptr=a.__array_interface__["data"][0])
    return d


def numba_form(arg):
    """What ``cuda_launch.launch`` hands Numba for ``arg``: a view for an array (made by
    Numba from the interface CuPy exports: no strides when C-contiguous), else itself."""
    if not isinstance(arg, FakeCupy):
        return arg
    a = arg.host
    desc = {"shape": a.shape, "strides": None if a.flags.c_contiguous else a.strides,
            "data": (arg.data.ptr, False), "typestr": a.dtype.str, "version": 3,
            "stream": None}
    return cuda.from_cuda_array_interface.__wrapped__(desc, owner=None, sync=False)


class Compiled:
    """A stand-in compiled overload: Numba's argument packer, a made-up function handle."""

    debug = cooperative = False
    extensions = ()

    def __init__(self, argument_types, prepare=None):
        self.argument_types = argument_types
        numba_self = pytypes.SimpleNamespace(extensions=[])
        self._prepare_args = prepare or (
            lambda *a: numba_cuda._Kernel._prepare_args(numba_self, *a))
        cufunc = pytypes.SimpleNamespace(handle=ctypes.c_void_p(0xF00D))
        self._codelibrary = pytypes.SimpleNamespace(get_cufunc=lambda: cufunc)


class Dispatcher:
    """A stand-in kernel: Numba's ``typeof`` picks the overload, as the dispatcher does."""

    def __init__(self, name="k", prepare=None):
        self.py_func = pytypes.SimpleNamespace(__name__=name)
        self.overloads, self.prepare = {}, prepare

    def typeof_pyval(self, v):
        return typeof(v, Purpose.argument)

    def called(self, views):
        sig = tuple(self.typeof_pyval(v) for v in views)
        self.overloads.setdefault(sig, Compiled(sig, self.prepare))


def launcher():
    calls = []

    def driver_launch(*a):  # reads the parameters back through the pointers given
        function, gx, gy, gz, bx, by, bz, shared, stream, params, extra = a
        layout = next(iter(found for found in out.layouts.values() if found))[1]
        pointers = (ctypes.c_uint64 * layout.slots).from_address(params)
        calls.append(((function, gx, bx, shared, stream, extra),
                      [ctypes.string_at(p, 8) for p in pointers]))

    out = cuda_direct.DirectLauncher(driver_launch, device_id=lambda: 0)
    return out, calls


ARRAYS = {"float32": np.arange(7, dtype=np.float32), "uint32": np.arange(5, dtype=np.uint32),
          "int64 2-D": np.zeros((3, 4), np.int64), "uint8": np.zeros(9, np.uint8),
          "float64 3-D": np.zeros((2, 3, 4)), "empty": np.zeros(0, np.float32)}
SCALARS = [np.int64(-3), np.uint64(2**63 + 5), np.int32(-7), np.uint32(4_000_000_000),
           np.float32(1.5), np.float64(-2.25), np.bool_(True), np.uint8(200), np.int16(-9),
           7, 2.5, True, False]


@pytest.mark.parametrize("name", sorted(ARRAYS))
@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
def test_the_block_is_numbas_own(name, scalar):
    args = [device_like(ARRAYS[name]), scalar, device_like(np.ones(3, np.float32))]
    views = [numba_form(a) for a in args]
    kernel = Dispatcher()
    kernel.called(views)
    out, calls = launcher()
    out.learn(kernel, args, views, 0)
    (function, layout), = out.layouts.values()
    assert function == 0xF00D
    theirs = []
    for ty, v in zip(layout_types(kernel), views, strict=True):
        numba_cuda._Kernel._prepare_args(pytypes.SimpleNamespace(extensions=[]), ty, v, 0,
                                         [], theirs)
    assert out.launch(kernel, 5, 32, 0xABC, args)
    (launch_args, slots), = calls
    assert launch_args == (0xF00D, 5, 32, 0, 0xABC, 0)
    assert len(slots) == len(theirs)
    for got, want in zip(slots, theirs, strict=True):
        want = cuda_direct.numba_arg_bytes(want)
        assert got[:len(want)] == want


def layout_types(kernel):
    (compiled,) = kernel.overloads.values()
    return compiled.argument_types


def test_each_launch_packs_its_own_values():
    out, calls = launcher()
    kernel = Dispatcher()
    a, b = np.zeros(4, np.float32), np.zeros(8, np.float32)
    first = [device_like(a), np.int64(1)]
    views = [numba_form(x) for x in first]
    kernel.called(views)
    out.learn(kernel, first, views, 0)
    assert out.launch(kernel, 1, 32, 0, [device_like(b), np.int64(42)])
    slots = calls[-1][1]
    assert int.from_bytes(slots[2], "little") == 8  # nitems of b, not a
    assert int.from_bytes(slots[4], "little") == b.__array_interface__["data"][0]
    assert int.from_bytes(slots[-1], "little") == 42


def test_unknown_kinds_and_values_beyond_a_slot_take_numbas_path():
    out, calls = launcher()
    kernel = Dispatcher()
    args = [device_like(np.zeros(4, np.float32)), 3]
    views = [numba_form(x) for x in args]
    assert not out.launch(kernel, 1, 32, 0, args)  # nothing learnt yet
    kernel.called(views)
    out.learn(kernel, args, views, 0)
    assert out.launch(kernel, 1, 32, 0, args)
    assert not out.launch(kernel, 1, 32, 0, [args[0], 2**64])  # Numba types it otherwise
    assert not out.launch(kernel, 1, 32, 0, [args[0], np.float32(1)])  # another overload
    strided = device_like(np.zeros(8, np.float32)[::2])
    assert cuda_direct.kinds([strided]) is None
    assert len(calls) == 1


def test_a_layout_numba_disagrees_with_is_refused_once():
    def prepare(ty, val, stream, retr, kernelargs):  # an ABI with one more parameter
        numba_cuda._Kernel._prepare_args(pytypes.SimpleNamespace(extensions=[]), ty, val,
                                         stream, retr, kernelargs)
        kernelargs.append(0)

    out, calls = launcher()
    kernel = Dispatcher("odd", prepare)
    args = [device_like(np.zeros(4, np.float32))]
    views = [numba_form(x) for x in args]
    kernel.called(views)
    with pytest.warns(RuntimeWarning, match="odd launches through Numba's dispatcher"):
        out.learn(kernel, args, views, 0)
    assert list(out.layouts.values()) == [None] and "odd" in out.refused
    assert not out.launch(kernel, 1, 32, 0, args)
    other = [device_like(np.zeros(4, np.float64))]
    other_views = [numba_form(x) for x in other]
    kernel.called(other_views)
    out.learn(kernel, other, other_views, 0)  # refused again, not said again
    assert calls == []


def test_the_switch_is_zero_or_one(monkeypatch):
    for raw, want in (("1", True), ("0", False), (" 1 ", True)):
        monkeypatch.setenv("RINGCOMP_DIRECT_LAUNCH", raw)
        assert cuda_direct.enabled() is want
    monkeypatch.setenv("RINGCOMP_DIRECT_LAUNCH", "yes")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        cuda_direct.enabled()


def test_a_layout_the_driver_refuses_at_once_is_dropped_later_errors_raise():
    out, calls = launcher()
    refuse = {"now": True}
    record = out._driver_launch

    def driver_launch(*a):
        if refuse["now"]:
            raise RuntimeError("CUDA_ERROR_INVALID_HANDLE")
        record(*a)

    out._driver_launch = driver_launch
    kernel = Dispatcher("bad")
    args = [device_like(np.zeros(4, np.float32))]
    views = [numba_form(x) for x in args]
    kernel.called(views)
    out.learn(kernel, args, views, 0)
    with pytest.warns(RuntimeWarning, match="the driver refused its launch"):
        assert not out.launch(kernel, 1, 32, 0, args)  # Numba's path launches instead
    assert list(out.layouts.values()) == [None]
    good = Dispatcher("good")
    good.called(views)
    refuse["now"] = False
    out.learn(good, args, views, 0)
    assert out.launch(good, 1, 32, 0, args) and len(calls) == 1
    refuse["now"] = True  # once launched, an error is this launch's: raised
    with pytest.raises(RuntimeError, match="INVALID_HANDLE"):
        out.launch(good, 1, 32, 0, args)
