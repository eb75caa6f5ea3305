"""Compressors, one file each, and the registry that names them."""

import importlib
import pkgutil

from ringcomp.compression.base import (
    REGISTRY,
    Compressor,
    Key,
    get_compressor,
    load_installed,
    register,
)
from ringcomp.compression.feedback import ErrorFeedback

# every module of the package is imported, so a new compressor is one file: @register
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def compressors() -> list[str]:
    """Names of the registered compressors (installed packages' included:
    ``base.load_installed``)."""
    load_installed()
    return sorted(REGISTRY)


__all__ = ["REGISTRY", "Compressor", "ErrorFeedback", "Key", "compressors", "get_compressor",
           "register"]
