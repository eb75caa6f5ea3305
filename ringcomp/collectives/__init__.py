"""Collective algorithms, one file each, written against the Transport only."""

import importlib
import pkgutil

from ringcomp.collectives.base import (
    REGISTRY,
    Algorithm,
    Ctx,
    compressed_algorithms,
    register,
    register_compressed,
)

#: register nothing and import Numba: loaded by the ring only once a process has Numba
#: (``ring.compiled_walk``), so an exact NumPy job starts without it, and by the
#: compressed ring on its first call
_LAZY = {"ring_native", "compressed_ring_native", "compressed_ring_walk", "native_codecs"}

# every other module of the package is imported, so a new algorithm is one file: its
# decorators register it (a compressed form's module imports its exact form's module first)
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _LAZY:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REGISTRY", "Algorithm", "Ctx", "compressed_algorithms", "register",
           "register_compressed"]
