"""One API over the kernel backends: the NumPy reference (the spec) and Numba.

Every kernel family is a pair of modules with the same functions: ``<family>_ref`` (NumPy,
the specification) and ``<family>_numba`` (parallel Numba, compiled once and cached).
``RINGCOMP_KERNELS=numpy`` forces the reference; by default host arrays use Numba when it
imports.
"""

from __future__ import annotations

import importlib
import os

#: the kernel families: sign bits, Count-Sketch, stochastic quantization, float casts,
#: the fused optimizer update
FAMILIES = ("signs", "sketch", "quant", "cast", "optim")
_SUFFIX = {"numpy": "ref", "numba": "numba"}
_loaded: dict[tuple[str, str], object] = {}


def _load(family: str, name: str):
    key = (family, name)
    if key not in _loaded:
        try:
            _loaded[key] = importlib.import_module(f"ringcomp.kernels.{family}_{_SUFFIX[name]}")
        except ImportError:  # numba missing or broken: the reference still works
            _loaded[key] = None
    return _loaded[key]


def available(family: str) -> list[str]:
    """The backend names that import on this machine for ``family``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; known: {FAMILIES}")
    return [name for name in _SUFFIX if _load(family, name) is not None]


def backend(family: str, name: str | None = None):
    """The kernel module of ``family``: ``name``, else ``RINGCOMP_KERNELS``, else the
    fastest that imports."""
    names = available(family)
    name = name or os.environ.get("RINGCOMP_KERNELS") or names[-1]
    if name not in names:
        raise ValueError(f"unknown kernel backend {name!r}; available: {names}")
    return _load(family, name)


def share_cores(ranks_on_node: int) -> int:
    """Give Numba's parallel kernels this rank's share of the node's cores.

    Several ranks per node each running a full set of spinning kernel threads would fight
    over the cores (measured here: 4 ranks x 2 threads on 2 cores made a 64 KB sign
    all-reduce 100x slower). ``NUMBA_NUM_THREADS`` set by the user wins. Returns the
    thread count in use.
    """
    if "numba" not in available("signs"):
        return 1
    import numba

    if "NUMBA_NUM_THREADS" not in os.environ:
        numba.set_num_threads(max(1, min(numba.config.NUMBA_NUM_THREADS,
                                         (os.cpu_count() or 1) // max(1, ranks_on_node))))
    return numba.get_num_threads()
