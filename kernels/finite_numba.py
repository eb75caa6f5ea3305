"""Numba finiteness test: one read, an integer OR of the exponent fields (vectorised).

``(bits & EXP) + EXP_LSB`` sets the sign bit exactly where the exponent is all ones (NaN
or ±Inf), so the OR of it over the array answers "any non-finite?" with integer
operations LLVM vectorises (a float reduction it would not, its order being fixed). A
cache-hot 1 MB segment takes ~9 us here, a 64 MB array 1.5 ms on one thread (a summing
pass, NumPy's: 33 us and 2.8 ms).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ringcomp.kernels.finite_ref import MASKS

#: elements per parallel block; arrays under two blocks run on the calling thread
BLOCK = 1 << 20


@numba.njit(nogil=True, cache=True)
def _or_exponents(u, mask, lsb):
    acc = mask ^ mask
    for i in range(u.size):
        acc |= (u[i] & mask) + lsb
    return acc


@numba.njit(parallel=True, nogil=True, cache=True)
def _or_blocks(u, mask, lsb, block):
    blocks = (u.size + block - 1) // block
    acc = np.zeros(blocks, u.dtype)
    for k in prange(blocks):
        acc[k] = _or_exponents(u[k * block:min(u.size, (k + 1) * block)], mask, lsb)
    return acc


@numba.njit(nogil=True, cache=True)
def _nonfinite_32(x):
    u = x.view(np.uint32)
    acc = np.uint32(0)
    for i in range(u.size):
        acc |= (u[i] & np.uint32(0x7F800000)) + np.uint32(0x00800000)
    return (acc & np.uint32(0x80000000)) != 0


@numba.njit(nogil=True, cache=True)
def _nonfinite_64(x):
    u = x.view(np.uint64)
    acc = np.uint64(0)
    for i in range(u.size):
        acc |= (u[i] & np.uint64(0x7FF0000000000000)) + np.uint64(0x0010000000000000)
    return (acc & np.uint64(0x8000000000000000)) != 0


#: float32/64 arrays under two blocks: the test with its constants inside (a call with the
#: masks as NumPy scalars costs ~7 us of dispatch at 1K elements, this one ~0.4 us; a
#: compressed call checks its input once per call)
_SERIAL = {np.dtype(np.float32): _nonfinite_32, np.dtype(np.float64): _nonfinite_64}


def nonfinite(x) -> bool:
    """Whether any element of ``x`` is NaN or ±Inf (False for integer dtypes)."""
    serial = _SERIAL.get(x.dtype)
    if serial is not None and x.size < 2 * BLOCK:
        return bool(serial(x if x.ndim == 1 else x.reshape(-1)))
    if x.dtype.name not in MASKS or x.size == 0:
        return False
    view, mask, lsb, sign = MASKS[x.dtype.name]
    u = x.reshape(-1).view(view)
    if u.size < 2 * BLOCK:
        acc = _or_exponents(u, mask, lsb)
    else:
        acc = np.bitwise_or.reduce(_or_blocks(u, mask, lsb, BLOCK))
    return bool(acc & sign)
