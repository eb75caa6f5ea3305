"""Element-wise reduction kernels used at every hop of an exact collective.

NumPy's ufuncs are already memory-bound SIMD loops, and CuPy arrays take the same calls
through ``__array_ufunc__``, so one spelling serves every backend; compressed aggregation
kernels (later) get NumPy reference, Numba and CuPy variants.
"""

from __future__ import annotations

import numpy as np

#: Reduction name -> ufunc. ``max``/``min`` are meaningful for every real dtype.
REDUCE_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def reduce_into(op: str, dst, src) -> None:
    """``dst = op(dst, src)`` in place (``dst`` first: the operand order is fixed)."""
    REDUCE_OPS[op](dst, src, out=dst)


def reduce_pair_into(op: str, first, second, out) -> None:
    """``out = op(first, second)``; callers choose the operand order to stay bit-identical."""
    REDUCE_OPS[op](first, second, out=out)
