"""CUDA versions of the half-precision casts, bit for bit equal to ``cast_ref``.

The rounding is ``cast_numba``'s (NumPy's own float -> half bit manipulation), compiled
for the device from the same Python source; binary16 -> float32 reads the exact
65536-entry table, copied to each device once. One thread per element.
"""

from __future__ import annotations

from numba import cuda, float32, uint16, uint32

from ringcomp.kernels.cast_numba import _HALF_TO_FLOAT, _f32_to_bf16, _f32_to_f16, _quiet
from ringcomp.kernels.cuda_launch import (  # noqa: F401 - usable
    bits_f32,
    device_table,
    f32_bits,
    launch,
    usable,
)

_to_half = cuda.jit(device=True)(_f32_to_f16.py_func)
_to_bfloat = cuda.jit(device=True)(_f32_to_bf16.py_func)
_quiet_nan = cuda.jit(device=True)(_quiet.py_func)


def _table(like):
    """The binary16 -> float32 table in the memory of ``like`` (one copy per device)."""
    return device_table(like, "half-to-float", lambda: _HALF_TO_FLOAT)


@cuda.jit(device=True, inline=True)
def _bf16_to_f32(h):
    return bits_f32(uint32(h) << uint32(16))


@cuda.jit
def _to_fp16(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = uint16(_to_half(f32_bits(float32(x[i]))))


@cuda.jit
def _from_fp16(bits, table, out):
    i = cuda.grid(1)
    if i < bits.size:
        out[i] = table[bits[i]]


@cuda.jit
def _add_fp16(a, b, table, out):
    i = cuda.grid(1)
    if i < a.size:
        out[i] = uint16(_to_half(_quiet_nan(f32_bits(float32(table[a[i]] + table[b[i]])))))


@cuda.jit
def _to_bf16(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = uint16(_to_bfloat(f32_bits(float32(x[i]))))


@cuda.jit
def _from_bf16(bits, out):
    i = cuda.grid(1)
    if i < bits.size:
        out[i] = _bf16_to_f32(bits[i])


@cuda.jit
def _add_bf16(a, b, out):
    i = cuda.grid(1)
    if i < a.size:
        total = float32(_bf16_to_f32(a[i]) + _bf16_to_f32(b[i]))
        out[i] = uint16(_to_bfloat(_quiet_nan(f32_bits(total))))


def to_fp16(x, out):
    launch(_to_fp16, x.size, x, out)
    return out


def from_fp16(bits, out):
    launch(_from_fp16, bits.size, bits, _table(bits), out)
    return out


def add_fp16(a, b, out):
    launch(_add_fp16, a.size, a, b, _table(a), out)
    return out


def to_bf16(x, out):
    launch(_to_bf16, x.size, x, out)
    return out


def from_bf16(bits, out):
    launch(_from_bf16, bits.size, bits, out)
    return out


def add_bf16(a, b, out):
    launch(_add_bf16, a.size, a, b, out)
    return out
