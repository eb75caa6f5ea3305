"""Sign kernels, one API over the backends: NumPy reference and Numba (CuPy to come).

``RINGCOMP_KERNELS=numpy`` forces the reference; the default uses Numba for host arrays.
"""

from __future__ import annotations

import os

from ringcomp.kernels import signs_ref

try:
    from ringcomp.kernels import signs_numba
except ImportError:  # numba missing or broken: the reference still works
    signs_numba = None

BACKENDS = {"numpy": signs_ref}
if signs_numba is not None:
    BACKENDS["numba"] = signs_numba


def backend(name: str | None = None):
    """The kernel module to use: ``name``, else ``RINGCOMP_KERNELS``, else numba if present."""
    name = name or os.environ.get("RINGCOMP_KERNELS") or ("numba" if signs_numba else "numpy")
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; available: {sorted(BACKENDS)}")
    return BACKENDS[name]


words_for = signs_ref.words_for
