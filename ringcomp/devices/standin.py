"""A stand-in device: a host array that says it lives in GPU memory, and kernels that do
nothing - the device code path on a machine without a GPU.

``DeviceArray`` drives the whole device path on any machine (under Numba's CUDA simulator,
``NUMBA_ENABLE_CUDASIM=1``, which makes the CUDA kernels' modules importable): the tests
run it with the simulated kernels and compare every byte with the host run;
``skipped_launches`` skips the kernels instead, so what is left of a call's time is its
host path alone (``ringcomp.bench --device standin``).
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import threading

import numpy as np


class DeviceArray(np.ndarray):
    """A NumPy array that says it lives in GPU memory: the whole device code path on any
    machine. It exposes ``__cuda_array_interface__`` (so ringcomp picks the CUDA kernels,
    which Numba's simulator runs on it, and stages it for MPI through the Numba copy
    protocol), and its ``__array_namespace__`` allocates more of its kind, as CuPy's would,
    so payloads, scratch and results stay "on the device" exactly where a CuPy run's
    would (the tests check that results and residuals do). Views and ufunc results keep
    the class.

    Like CuPy it refuses host arrays as operands (ufuncs, NumPy functions, assignment into
    it): code that would mix host and device memory fails here as it would on a GPU,
    instead of silently working on the host. Python and NumPy scalars are fine."""

    @classmethod
    def of(cls, array) -> DeviceArray:
        return np.ascontiguousarray(array).view(cls)

    @property
    def __cuda_array_interface__(self):
        # made once per array object and shape (its memory never moves): CuPy's costs
        # about a microsecond, and a stand-in's made anew each time (``ctypes``, 4 us)
        # would be charged to the device path's host cost, which ``bench`` measures
        made = self.__dict__.get("_interface")
        if made is None or made["shape"] != self.shape:
            made = self.__dict__["_interface"] = {
                "shape": self.shape, "typestr": self.dtype.str,
                "data": (self.__array_interface__["data"][0], False), "version": 3,
                "strides": None, "stream": None}
        return made

    def __array_namespace__(self, api_version=None):
        return DEVICE_NAMESPACE

    def copy_to_host(self, out=None):
        host = np.array(self.view(np.ndarray)) if out is None else out
        if out is not None:
            out[...] = self.view(np.ndarray)
        return host

    def copy_to_device(self, src):
        self.view(np.ndarray)[...] = src

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _refuse_host(ufunc.__name__, inputs + tuple(kwargs.get("out") or ()))
        if kwargs.get("out"):
            kwargs["out"] = tuple(_host_view(o) for o in kwargs["out"])
        result = getattr(ufunc, method)(*(_host_view(x) for x in inputs), **kwargs)
        if isinstance(result, tuple):
            return tuple(_device_view(r) for r in result)
        return _device_view(result)

    def __array_function__(self, func, types, args, kwargs):
        _refuse_host(func.__name__, args + tuple(kwargs.values()))
        _INSIDE.depth = getattr(_INSIDE, "depth", 0) + 1
        try:  # NumPy's own implementation may mix in host temporaries: not the caller's
            result = super().__array_function__(func, types, args, kwargs)
        finally:
            _INSIDE.depth -= 1
        # as np.<function>(cupy arrays) returns CuPy arrays (NEP 18)
        if isinstance(result, tuple):
            return tuple(_device_view(r) for r in result)
        return _device_view(result)

    def __setitem__(self, key, value):
        _refuse_host("__setitem__", (key, value))
        super().__setitem__(key, value)


def _host_view(x):
    return x.view(np.ndarray) if isinstance(x, DeviceArray) else x


def _device_view(x):
    return x.view(DeviceArray) if type(x) is np.ndarray else x


_INSIDE = threading.local()  # depth of NumPy functions running on a DeviceArray


def _refuse_host(what: str, operands) -> None:
    """TypeError when a host array (not a scalar) is among ``operands``, as CuPy raises
    (calls made by NumPy's own function implementations are not checked)."""
    if getattr(_INSIDE, "depth", 0):
        return
    for x in operands:
        if isinstance(x, (list, tuple)):
            _refuse_host(what, x)
        elif type(x) is np.ndarray and x.ndim > 0:
            raise TypeError(f"{what}: a host numpy.ndarray {x.shape} mixed with a device "
                            "array (CuPy refuses implicit host-device transfers)")


class _DeviceNamespace:
    """NumPy's functions, returning ``DeviceArray``s where NumPy returns arrays."""

    __name__ = "fakedevice"

    def __getattr__(self, name):
        fn = getattr(np, name)
        if isinstance(fn, type) or not callable(fn):
            return fn

        def on_device(*args, **kwargs):
            result = fn(*args, **kwargs)
            return result.view(DeviceArray) if isinstance(result, np.ndarray) else result

        return on_device


DEVICE_NAMESPACE = _DeviceNamespace()


@contextlib.contextmanager
def skipped_launches():
    """Within it every CUDA kernel launch returns at once, doing nothing; yields a
    one-element list counting the launches. What a call then costs is its host path:
    Python, allocations, staging copies and MPI, without the kernels' work (nor, on a GPU,
    the driver's few microseconds a launch). Results are not computed: time only.

    The CUDA kernels' modules bind ``launch`` when they are imported, so every one is
    imported here and its name replaced, then restored on the way out."""
    from ringcomp import kernels
    from ringcomp.kernels import cuda_launch

    launched, real = [0], cuda_launch.launch

    def skip(kernel, items, *args, threads=cuda_launch.BLOCK):
        launched[0] += items > 0

    modules = [cuda_launch] + [importlib.import_module(f"ringcomp.kernels.{info.name}")
                               for info in pkgutil.iter_modules(kernels.__path__)
                               if info.name.endswith("_cuda")]
    patched = [module for module in modules if getattr(module, "launch", None) is real]
    for module in patched:
        module.launch = skip
    try:
        # what the skipped kernels leave is whatever the memory held: host arithmetic on
        # it may meet NaN or overflow, a warning about values nobody reads
        with np.errstate(all="ignore"):
            yield launched
    finally:
        for module in patched:
            module.launch = real
