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
def _any_nonfinite(x, bits):
    """Whether the flat float array ``x`` holds NaN or ±Inf; ``bits``: the exponent mask,
    its lowest bit and the sign bit, as an array of the integers of ``x``'s width."""
    return (_or_exponents(x.view(bits.dtype), bits[0], bits[1]) & bits[2]) != 0


#: float32/64 arrays under two blocks: ``_any_nonfinite``'s bits (the masks passed as NumPy
#: scalars cost ~7 us of dispatch at 1K elements, as an array well under 1 us; a
#: compressed call checks its input once per call)
_SERIAL = {np.dtype(name): np.array(MASKS[name][1:], MASKS[name][0])
           for name in ("float32", "float64")}


def nonfinite(x) -> bool:
    """Whether any element of ``x`` is NaN or ±Inf (False for integer dtypes)."""
    bits = _SERIAL.get(x.dtype)
    if bits is not None and x.size < 2 * BLOCK:
        return bool(_any_nonfinite(x if x.ndim == 1 else x.reshape(-1), bits))
    if x.dtype.name not in MASKS or x.size == 0:
        return False
    view, mask, lsb, sign = MASKS[x.dtype.name]
    u = x.reshape(-1).view(view)
    if u.size < 2 * BLOCK:
        acc = _or_exponents(u, mask, lsb)
    else:
        acc = np.bitwise_or.reduce(_or_blocks(u, mask, lsb, BLOCK))
    return bool(acc & sign)
