"""CUDA finiteness test: every thread flags an all-ones exponent; one flag read back."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ringcomp.kernels.arrays import array_module
from ringcomp.kernels.cuda_launch import launch, usable  # noqa: F401
from ringcomp.kernels.finite_ref import MASKS


@cuda.jit
def _flag_nonfinite(u, mask, flag):
    i = cuda.grid(1)
    if i < u.size and (u[i] & mask) == mask:
        flag[0] = 1  # every writer writes the same value: no atomic needed


def nonfinite(x) -> bool:
    """Whether any element of ``x`` is NaN or ±Inf (False for integer dtypes); reading the
    flag waits for the stream."""
    if x.dtype.name not in MASKS or x.size == 0:
        return False
    view, mask, _, _ = MASKS[x.dtype.name]
    u = x.reshape(-1).view(view)
    flag = array_module(x).zeros(1, np.uint32)
    launch(_flag_nonfinite, u.size, u, mask, flag)
    return bool(int(flag[0]))
