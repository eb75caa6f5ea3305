"""Numba versions of the half-precision casts, bit for bit equal to ``cast_ref``.

The float32 -> binary16 rounding follows NumPy's ``npy_floatbits_to_halfbits`` (round to
nearest even, subnormals, overflow to infinity); binary16 -> float32 is exact, by a
65536-entry table built once from NumPy itself.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

_HALF_TO_FLOAT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)


@numba.njit(inline="always")
def _f32_to_f16(f):
    h_sgn = (f >> np.uint32(16)) & np.uint32(0x8000)
    f_exp = f & np.uint32(0x7F800000)
    f_sig = f & np.uint32(0x007FFFFF)
    if f_exp >= np.uint32(0x47800000):  # overflow, infinity or NaN
        if f_exp == np.uint32(0x7F800000) and f_sig != 0:
            ret = np.uint32(0x7C00) + (f_sig >> np.uint32(13))
            return h_sgn + (ret + np.uint32(1) if ret == np.uint32(0x7C00) else ret)
        return h_sgn + np.uint32(0x7C00)
    if f_exp <= np.uint32(0x38000000):  # subnormal half or zero
        if f_exp < np.uint32(0x33000000):
            return h_sgn
        e = f_exp >> np.uint32(23)
        sig = (np.uint32(0x00800000) + f_sig) >> (np.uint32(113) - e)
        if (sig & np.uint32(0x3FFF)) != np.uint32(0x1000) or (f & np.uint32(0x7FF)) != 0:
            sig += np.uint32(0x1000)
        return h_sgn + (sig >> np.uint32(13))
    h_exp = (f_exp - np.uint32(0x38000000)) >> np.uint32(13)
    if (f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000):
        f_sig += np.uint32(0x1000)
    return h_sgn + h_exp + (f_sig >> np.uint32(13))


@numba.njit(inline="always")
def _f32_to_bf16(f):
    if (f & np.uint32(0x7F800000)) == np.uint32(0x7F800000) and (f & np.uint32(0x7FFFFF)):
        return (f >> np.uint32(16)) | np.uint32(0x40)  # NaN stays a quiet NaN
    return (f + np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)


@numba.njit(inline="always")
def _quiet(u):
    """float32 bits ``u``, with every NaN as the one quiet NaN (``cast_ref._quiet``)."""
    if (u & np.uint32(0x7F800000)) == np.uint32(0x7F800000) and (u & np.uint32(0x7FFFFF)):
        return np.uint32(0x7FC00000)
    return u


@numba.njit(inline="always")
def _bf16_to_f32(h):
    return np.uint32(np.uint32(h) << np.uint32(16)).view(np.float32)


@numba.njit(parallel=True, cache=True, nogil=True)
def _to_fp16(x, out):
    for i in prange(x.size):
        out[i] = np.uint16(_f32_to_f16(np.float32(x[i]).view(np.uint32)))


@numba.njit(parallel=True, cache=True, nogil=True)
def _from_fp16(bits, table, out):
    for i in prange(bits.size):
        out[i] = table[bits[i]]


@numba.njit(parallel=True, cache=True, nogil=True)
def _add_fp16(a, b, table, out):
    for i in prange(a.size):
        total = np.float32(table[a[i]] + table[b[i]])
        out[i] = np.uint16(_f32_to_f16(_quiet(total.view(np.uint32))))


@numba.njit(parallel=True, cache=True, nogil=True)
def _to_bf16(x, out):
    for i in prange(x.size):
        out[i] = np.uint16(_f32_to_bf16(np.float32(x[i]).view(np.uint32)))


@numba.njit(parallel=True, cache=True, nogil=True)
def _from_bf16(bits, out):
    for i in prange(bits.size):
        out[i] = _bf16_to_f32(bits[i])


@numba.njit(parallel=True, cache=True, nogil=True)
def _add_bf16(a, b, out):
    for i in prange(a.size):
        total = np.float32(_bf16_to_f32(a[i]) + _bf16_to_f32(b[i]))
        out[i] = np.uint16(_f32_to_bf16(_quiet(total.view(np.uint32))))


def to_fp16(x, out):
    _to_fp16(x, out)
    return out


def from_fp16(bits, out):
    _from_fp16(bits, _HALF_TO_FLOAT, out)
    return out


def add_fp16(a, b, out):
    _add_fp16(a, b, _HALF_TO_FLOAT, out)
    return out


def to_bf16(x, out):
    _to_bf16(x, out)
    return out


def from_bf16(bits, out):
    _from_bf16(bits, out)
    return out


def add_bf16(a, b, out):
    _add_bf16(a, b, out)
    return out
