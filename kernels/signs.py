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


def share_cores(ranks_on_node: int) -> int:
    """Give Numba's parallel kernels this rank's share of the node's cores.

    Several ranks per node each running a full set of spinning kernel threads would fight
    over the cores (measured here: 4 ranks x 2 threads on 2 cores made a 64 KB sign
    all-reduce 100x slower). ``NUMBA_NUM_THREADS`` set by the user wins. Returns the
    thread count in use.
    """
    if signs_numba is None:
        return 1
    import numba

    if "NUMBA_NUM_THREADS" not in os.environ:
        numba.set_num_threads(max(1, min(numba.config.NUMBA_NUM_THREADS,
                                         (os.cpu_count() or 1) // max(1, ranks_on_node))))
    return numba.get_num_threads()
