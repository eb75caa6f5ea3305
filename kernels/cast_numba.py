"""Numba versions of the half-precision casts, bit for bit equal to ``cast_ref``.

The float32 -> binary16 rounding follows NumPy's ``npy_floatbits_to_halfbits`` (round to
nearest even, subnormals, overflow to infinity); binary16 -> float32 is exact, by a
65536-entry table built once from NumPy itself. Where the CPU converts half floats itself
(x86 F16C, AArch64) the fp16 kernels use its instructions instead: 3-9x faster, the same
bits (``HARDWARE_HALF``).
"""

from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

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


#: elements per parallel block: each block is a plain loop (LLVM vectorises those; a
#: ``prange`` body it does not), its arrays sliced so every index starts at 0
BLOCK = 1 << 16


@numba.njit(nogil=True, cache=True)
def _blocks(size):
    return (size + BLOCK - 1) // BLOCK


def _hardware_half() -> bool:
    """Whether LLVM turns float <-> half into instructions on the CPU Numba compiles for:
    x86 with F16C (Numba's default target is this host) or any AArch64. Elsewhere it would
    call a runtime helper that Numba's JIT does not link (a crash, seen with
    ``NUMBA_CPU_NAME=generic``), so the portable bit manipulation runs instead."""
    name, features = numba.config.CPU_NAME, numba.config.CPU_FEATURES or ""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return True
    if machine not in ("x86_64", "amd64"):
        return False
    if name not in (None, "", "host"):
        return "+f16c" in features
    return bool(llvm.get_host_cpu_features().get("f16c")) or "+f16c" in features


#: float32 -> binary16 and back by the CPU's conversion instructions (round to nearest
#: even, as NumPy); NaNs are rebuilt by the reference's rule (the CPU quiets a signalling
#: NaN, NumPy keeps its bits), so the results stay bit for bit ``cast_ref``'s
HARDWARE_HALF = _hardware_half()


@intrinsic
def _half_bits(typingctx, f):
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


@intrinsic
def _half_value(typingctx, h):
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@numba.njit(inline="always")
def _nan_to_f16(u):
    """``_f32_to_f16`` of the float32 NaN bits ``u`` (kept apart so a select, not a
    branch, picks it)."""
    ret = np.uint32(0x7C00) + ((u & np.uint32(0x007FFFFF)) >> np.uint32(13))
    ret += np.uint32(ret == np.uint32(0x7C00))
    return np.uint16(((u >> np.uint32(16)) & np.uint32(0x8000)) + ret)


@numba.njit(nogil=True, cache=True)
def _to_fp16_hw_block(x, out):
    for i in range(x.size):
        f = np.float32(x[i])
        u = f.view(np.uint32)
        nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        out[i] = _nan_to_f16(u) if nan else _half_bits(f)


@numba.njit(nogil=True, cache=True)
def _from_fp16_hw_block(bits, out):
    for i in range(bits.size):
        h = np.uint32(bits[i])
        nan = (h & np.uint32(0x7FFF)) > np.uint32(0x7C00)
        kept = np.uint32(((h & np.uint32(0x8000)) << np.uint32(16)) | np.uint32(0x7F800000)
                         | ((h & np.uint32(0x3FF)) << np.uint32(13))).view(np.float32)
        out[i] = kept if nan else _half_value(bits[i])


@numba.njit(nogil=True, cache=True)
def _add_fp16_hw_block(a, b, out):
    for i in range(a.size):
        total = _half_value(a[i]) + _half_value(b[i])
        out[i] = np.uint16(0x7E00) if total != total else _half_bits(total)


@numba.njit(parallel=True, cache=True, nogil=True)
def _to_fp16_hw(x, out):
    for k in prange(_blocks(x.size)):
        lo, hi = k * BLOCK, min(x.size, (k + 1) * BLOCK)
        _to_fp16_hw_block(x[lo:hi], out[lo:hi])


@numba.njit(parallel=True, cache=True, nogil=True)
def _from_fp16_hw(bits, out):
    for k in prange(_blocks(bits.size)):
        lo, hi = k * BLOCK, min(bits.size, (k + 1) * BLOCK)
        _from_fp16_hw_block(bits[lo:hi], out[lo:hi])


@numba.njit(parallel=True, cache=True, nogil=True)
def _add_fp16_hw(a, b, out):
    for k in prange(_blocks(a.size)):
        lo, hi = k * BLOCK, min(a.size, (k + 1) * BLOCK)
        _add_fp16_hw_block(a[lo:hi], b[lo:hi], out[lo:hi])


# -- the portable forms: NumPy's bit manipulation, and the exact binary16 table ----------
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


# -- bfloat16: integer operations only ---------------------------------------------------
@numba.njit(nogil=True, cache=True)
def _to_bf16_block(x, out):
    for i in range(x.size):
        out[i] = np.uint16(_f32_to_bf16(np.float32(x[i]).view(np.uint32)))


@numba.njit(nogil=True, cache=True)
def _from_bf16_block(bits, out):
    for i in range(bits.size):
        out[i] = _bf16_to_f32(bits[i])


@numba.njit(nogil=True, cache=True)
def _add_bf16_block(a, b, out):
    for i in range(a.size):
        total = np.float32(_bf16_to_f32(a[i]) + _bf16_to_f32(b[i]))
        out[i] = np.uint16(_f32_to_bf16(_quiet(total.view(np.uint32))))


@numba.njit(parallel=True, cache=True, nogil=True)
def _to_bf16(x, out):
    for k in prange(_blocks(x.size)):
        lo, hi = k * BLOCK, min(x.size, (k + 1) * BLOCK)
        _to_bf16_block(x[lo:hi], out[lo:hi])


@numba.njit(parallel=True, cache=True, nogil=True)
def _from_bf16(bits, out):
    for k in prange(_blocks(bits.size)):
        lo, hi = k * BLOCK, min(bits.size, (k + 1) * BLOCK)
        _from_bf16_block(bits[lo:hi], out[lo:hi])


@numba.njit(parallel=True, cache=True, nogil=True)
def _add_bf16(a, b, out):
    for k in prange(_blocks(a.size)):
        lo, hi = k * BLOCK, min(a.size, (k + 1) * BLOCK)
        _add_bf16_block(a[lo:hi], b[lo:hi], out[lo:hi])


def _one_block(size: int, block_kernel, parallel_kernel):
    """The block kernel itself for one block's elements (a few KB: entering a parallel
    region costs more than the work), else the parallel kernel: the same bits."""
    return block_kernel if size <= BLOCK else parallel_kernel


def to_fp16(x, out):
    if HARDWARE_HALF:
        _one_block(x.size, _to_fp16_hw_block, _to_fp16_hw)(x, out)
    else:
        _to_fp16(x, out)
    return out


def from_fp16(bits, out):
    if HARDWARE_HALF:
        _one_block(bits.size, _from_fp16_hw_block, _from_fp16_hw)(bits, out)
    else:
        _from_fp16(bits, _HALF_TO_FLOAT, out)
    return out


def _apart(out, a, b):
    """``out``, or a new array where it overlaps an operand: LLVM's vectorised loop checks
    for overlap at run time and falls back to a scalar one, 50x slower (measured: an
    in-place fp16 add of 4M elements, 15.5 ms against 0.27 ms)."""
    return np.empty_like(out) if np.may_share_memory(out, a) or np.may_share_memory(
        out, b) else out


def add_fp16(a, b, out):
    target = _apart(out, a, b)
    if HARDWARE_HALF:
        _one_block(a.size, _add_fp16_hw_block, _add_fp16_hw)(a, b, target)
    else:
        _add_fp16(a, b, _HALF_TO_FLOAT, target)
    if target is not out:
        out[...] = target
    return out


def to_bf16(x, out):
    _one_block(x.size, _to_bf16_block, _to_bf16)(x, out)
    return out


def from_bf16(bits, out):
    _one_block(bits.size, _from_bf16_block, _from_bf16)(bits, out)
    return out


def add_bf16(a, b, out):
    target = _apart(out, a, b)
    _one_block(a.size, _add_bf16_block, _add_bf16)(a, b, target)
    if target is not out:
        out[...] = target
    return out
