"""A host array that only looks like a CUDA array: drives the GPU code path on any machine.

It exposes ``__cuda_array_interface__`` (so mpi4py takes its device-buffer path), the Numba
copy protocol (``copy_to_host``/``copy_to_device``, used for host staging), an array
namespace for scratch allocation, and NumPy ufunc dispatch - and it counts the stream
synchronisations the transport performs before every MPI call.
"""

from __future__ import annotations

import types

import numpy as np


class FakeDeviceArray:
    syncs = 0  # class-wide count of stream synchronisations

    def __init__(self, array):
        self._a = array

    @classmethod
    def of(cls, array):
        return cls(np.ascontiguousarray(array))

    # -- the CUDA array interface -------------------------------------------------------
    @property
    def __cuda_array_interface__(self):
        return {"shape": self._a.shape, "typestr": self._a.dtype.str,
                "data": (self._a.ctypes.data, False), "version": 3,
                "strides": None if self._a.flags.c_contiguous else self._a.strides,
                "stream": 1}

    def synchronize_stream(self):
        FakeDeviceArray.syncs += 1

    # -- Numba's copy protocol (host staging) -------------------------------------------
    def copy_to_host(self, out):
        out[...] = self._a

    def copy_to_device(self, src):
        self._a[...] = src

    # -- enough of an array for the collectives -----------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)

    def reshape(self, *shape):
        return FakeDeviceArray(self._a.reshape(*shape))

    def __getitem__(self, key):
        return FakeDeviceArray(self._a[key])

    def __setitem__(self, key, value):
        self._a[key] = _unwrap(value)

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        args = [_unwrap(x) for x in inputs]
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o) for o in out)
        result = getattr(ufunc, method)(*args, **kwargs)
        return out[0] if out is not None else FakeDeviceArray(result)

    def __array_namespace__(self):
        return NAMESPACE

    def host(self) -> np.ndarray:
        return self._a.copy()


def _unwrap(x):
    return x._a if isinstance(x, FakeDeviceArray) else x


NAMESPACE = types.SimpleNamespace(
    __name__="fakedevice",
    empty=lambda shape, dtype=float: FakeDeviceArray(np.empty(shape, dtype)))
