"""Which array module an array belongs to (NumPy, CuPy, a stand-in) and whether it is on a GPU."""

from __future__ import annotations

import numpy as np


def on_device(a) -> bool:
    """True for arrays in GPU memory: anything exposing ``__cuda_array_interface__``
    (CuPy, Numba device arrays, the test suite's stand-ins); NumPy arrays never do.
    Asked of the type: on an instance ``hasattr`` would compute the interface's dict
    (a property), and this is asked several times a hop."""
    return hasattr(type(a), "__cuda_array_interface__")


def is_cupy(a) -> bool:
    """True for CuPy arrays (recognised without importing CuPy)."""
    return type(a).__module__.split(".")[0] == "cupy"


def array_module(a):
    """The array namespace of ``a``: ``numpy``, ``cupy``, or its ``__array_namespace__()``.

    Checked in that order so that a NumPy subclass standing in for a device array (it
    overrides ``__array_namespace__``) gets its own namespace, not NumPy's.
    """
    if type(a) is np.ndarray:
        return np
    if is_cupy(a):
        import cupy

        return cupy
    namespace = getattr(a, "__array_namespace__", None)
    if namespace is None or isinstance(a, np.ndarray) and not on_device(a):
        return np
    return namespace()


def to_numpy(a) -> np.ndarray:
    """A host copy (or the array itself, on the host) of any array: NumPy, CuPy
    (``get``), a Numba device array (``copy_to_host``) or a stand-in."""
    if isinstance(a, np.ndarray) and not on_device(a):
        return a
    for method in ("get", "copy_to_host"):
        if hasattr(a, method):
            return getattr(a, method)()
    raise TypeError(f"cannot copy a {type(a).__name__} to the host")
