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

# every module of the package is imported, so a new algorithm is one file: its decorators
# register it (a compressed form's module imports its exact form's module first)
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REGISTRY", "Algorithm", "Ctx", "compressed_algorithms", "register",
           "register_compressed"]
