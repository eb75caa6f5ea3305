"""MPI's point-to-point calls from compiled (Numba) code, through the libmpi mpi4py loaded.

A hop of a small call costs more in Python than in MPI (a 4 KB ring through ringcomp's
Python walk: tens of microseconds a hop; its messages: a few). So a walk may run whole in
one compiled function that calls ``MPI_Isend``, ``MPI_Irecv``, ``MPI_Wait`` and
``MPI_Waitall`` itself (and ``MPI_Get_count``, to check what arrived). The functions are
called by address, an argument (``NativeMPI.fns``), never a constant in the code: a
compiled walk is then cacheable on disk like any kernel and serves any process (ctypes
functions are baked in as addresses, which change every run). The handle widths
(``MPI_Comm``, ``MPI_Datatype``: a 32-bit int in MPICH, a pointer in Open MPI) come
from the argument types, so one compiled walk per width, chosen by the cache key.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from mpi4py import MPI
from numba import types
from numba.extending import intrinsic

from ringcomp.transport.mpilib import libmpi_path

#: the order of the functions' addresses in ``NativeMPI.fns``
ISEND, IRECV, WAIT, WAITALL, GET_COUNT = range(5)
_NAMES = ("MPI_Isend", "MPI_Irecv", "MPI_Wait", "MPI_Waitall", "MPI_Get_count")
#: the most bytes one message of a compiled walk may carry: MPI's counts are C ints
MAX_MESSAGE_BYTES = (1 << 31) - 1
_HANDLE = {4: np.int32, 8: np.int64}


@dataclass(frozen=True)
class NativeMPI:
    """What a compiled walk needs of one communicator: the functions' addresses, the
    communicator's and ``MPI_BYTE``'s handles (typed to their width), a request's dtype
    and a status's size in bytes."""

    fns: np.ndarray
    comm: object
    byte: object
    request: type
    status_bytes: int

    def requests(self, count: int) -> np.ndarray:
        return np.zeros(max(count, 1), self.request)

    def statuses(self, count: int) -> np.ndarray:
        return np.zeros(max(count, 1) * self.status_bytes, np.uint8)


def native(comm) -> NativeMPI | None:
    """``comm``'s ``NativeMPI``, or None where the calls cannot be made (no libmpi in this
    process's maps, a handle of an unexpected width): callers keep their Python walk."""
    path = libmpi_path()
    widths = [MPI._sizeof(kind) for kind in (MPI.Comm, MPI.Datatype, MPI.Request)]
    if path is None or any(w not in _HANDLE for w in widths):
        return None
    try:
        lib = ctypes.CDLL(path)
        fns = np.array([ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                        for name in _NAMES], np.int64)
    except (OSError, AttributeError):
        return None
    return NativeMPI(fns, _handle(MPI._handleof(comm), widths[0]),
                     _handle(MPI._handleof(MPI.BYTE), widths[1]), _HANDLE[widths[2]],
                     MPI._sizeof(MPI.Status))


def typed_like() -> NativeMPI:
    """A ``NativeMPI`` of this MPI's handle and request types with null values: what a
    walk is compiled for ahead of its first call (no communicator needed)."""
    widths = [MPI._sizeof(kind) for kind in (MPI.Comm, MPI.Datatype, MPI.Request)]
    return NativeMPI(np.zeros(len(_NAMES), np.int64), _HANDLE.get(widths[0], np.int64)(0),
                     _HANDLE.get(widths[1], np.int64)(0), _HANDLE.get(widths[2], np.int64),
                     MPI._sizeof(MPI.Status))


def _handle(value: int, width: int):
    """A handle's bits as a signed integer of its width (MPICH's communicators have the
    top bit of their 32 set)."""
    return np.array([value & ((1 << 8 * width) - 1)], f"u{width}").view(_HANDLE[width])[0]


def _int(ty) -> ir.IntType:
    return ir.IntType(ty.bitwidth)


def _i32(builder, value, ty):
    """An integer argument as C's ``int``."""
    return value if ty.bitwidth == 32 else builder.trunc(value, ir.IntType(32))


@intrinsic
def _isend_or_irecv(typingctx, fn, buf, nbytes, byte, peer, tag, comm, request):
    """``int MPI_I{send,recv}(void *buf, int count, MPI_Datatype, int peer, int tag,
    MPI_Comm, MPI_Request *)`` at address ``fn``; ``buf`` and ``request`` addresses."""
    sig = types.int32(fn, buf, nbytes, byte, peer, tag, comm, request)

    def codegen(context, builder, signature, args):
        f, b, n, dt, pe, tg, cm, rq = args
        i32, ptr = ir.IntType(32), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(i32, [ptr, i32, _int(byte), i32, i32, _int(comm), ptr])
        target = builder.inttoptr(f, fnty.as_pointer())
        return builder.call(target, [builder.inttoptr(b, ptr), _i32(builder, n, nbytes), dt,
                                     _i32(builder, pe, peer), _i32(builder, tg, tag), cm,
                                     builder.inttoptr(rq, ptr)])

    return sig, codegen


@intrinsic
def _wait(typingctx, fn, request, status):
    """``int MPI_Wait(MPI_Request *, MPI_Status *)`` at address ``fn``."""
    sig = types.int32(fn, request, status)

    def codegen(context, builder, signature, args):
        f, rq, st = args
        ptr = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [ptr, ptr])
        target = builder.inttoptr(f, fnty.as_pointer())
        return builder.call(target, [builder.inttoptr(rq, ptr), builder.inttoptr(st, ptr)])

    return sig, codegen


@intrinsic
def _waitall(typingctx, fn, count, requests, statuses):
    """``int MPI_Waitall(int count, MPI_Request *, MPI_Status *)`` at address ``fn``."""
    sig = types.int32(fn, count, requests, statuses)

    def codegen(context, builder, signature, args):
        f, n, rq, st = args
        i32, ptr = ir.IntType(32), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(i32, [i32, ptr, ptr])
        target = builder.inttoptr(f, fnty.as_pointer())
        return builder.call(target, [_i32(builder, n, count), builder.inttoptr(rq, ptr),
                                     builder.inttoptr(st, ptr)])

    return sig, codegen


@intrinsic
def _get_count(typingctx, fn, status, byte, count):
    """``int MPI_Get_count(const MPI_Status *, MPI_Datatype, int *count)`` at address
    ``fn``; ``status`` and ``count`` addresses."""
    sig = types.int32(fn, status, byte, count)

    def codegen(context, builder, signature, args):
        f, st, dt, ct = args
        ptr = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [ptr, _int(byte), ptr])
        target = builder.inttoptr(f, fnty.as_pointer())
        return builder.call(target, [builder.inttoptr(st, ptr), dt, builder.inttoptr(ct, ptr)])

    return sig, codegen


#: the compiled calls, for the walks: ``post`` is MPI_Isend or MPI_Irecv, by its address
post, wait, waitall, get_count = _isend_or_irecv, _wait, _waitall, _get_count

__all__ = ["GET_COUNT", "IRECV", "ISEND", "MAX_MESSAGE_BYTES", "WAIT", "WAITALL", "NativeMPI",
           "get_count", "native", "post", "typed_like", "wait", "waitall"]
