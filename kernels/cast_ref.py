"""NumPy reference of the half-precision casts: the specification for the other backends.

Payloads are uint16 bit patterns. ``fp16``: IEEE binary16 of ``float32(x)`` (float64 input
is rounded to float32 first), round to nearest even, as NumPy's float16. ``bf16``: the top
16 bits of ``float32(x)`` rounded to nearest even (NaN stays a quiet NaN). Sums of two
payloads are computed in float32 and rounded once; a NaN sum is the one quiet NaN
0x7FC00000 before rounding (which NaN an add returns is the hardware's choice: x86 keeps
an operand's payload, a GPU returns its own).
"""

from __future__ import annotations

import numpy as np


def to_fp16(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond 65504 -> inf is the defined result
        out[...] = x.astype(np.float32, copy=False).astype(np.float16).view(np.uint16)
    return out


def from_fp16(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    out[...] = bits.view(np.float16)
    return out


def add_fp16(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    total = a.view(np.float16).astype(np.float32) + b.view(np.float16).astype(np.float32)
    return to_fp16(_quiet(total), out)


def to_bf16(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32, copy=False).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = np.isnan(x)
    out[...] = np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)
    return out


def from_bf16(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    out[...] = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return out


def add_bf16(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    total = from_bf16(a, np.empty(a.size, np.float32)) + from_bf16(b, np.empty(b.size,
                                                                               np.float32))
    return to_bf16(_quiet(total), out)


def _quiet(total: np.ndarray) -> np.ndarray:
    """Every NaN of a float32 sum as the one quiet NaN 0x7FC00000."""
    return np.where(np.isnan(total), np.uint32(0x7FC00000).view(np.float32), total)
