"""Argument checks one rank makes on its own; each failure is a ``LocalError`` with a code
that ``ringcomp.transport.agree`` turns into the same exception on every rank."""

from __future__ import annotations

import errno
import os
import sys

import numpy as np

from ringcomp.devices import device
from ringcomp.kernels import backends, finite_ref

SUPPORTED_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                    "uint8", "uint16", "uint32", "uint64")
OPS = ("sum", "max", "min", "prod")

class LocalError(Exception):
    """A locally detected bad argument: an ERRORS code plus this rank's detail."""

    def __init__(self, code: int, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


def is_contiguous(x) -> bool:
    flags = getattr(x, "flags", None)
    if flags is not None:
        return bool(flags["C_CONTIGUOUS"] if isinstance(flags, dict) else flags.c_contiguous)
    cai = getattr(x, "__cuda_array_interface__", None)
    return cai is not None and cai.get("strides") is None


#: the supported dtypes in native byte order (a set lookup: ``dtype.name`` is Python code
#: in NumPy, several microseconds on every call of a small collective)
NATIVE_DTYPES = frozenset(np.dtype(name) for name in SUPPORTED_DTYPES)


def check_array(x, what: str = "input") -> None:
    """Raise LocalError unless ``x`` is a contiguous array of a supported dtype."""
    if isinstance(x, np.ndarray):
        if x.flags.c_contiguous and x.dtype in NATIVE_DTYPES and x.flags.aligned:
            return  # the common case, decided in three lookups
    elif not device.is_device(x):
        raise LocalError(1, f"{what} is a {type(x).__name__}")
    if not is_contiguous(x):
        raise LocalError(2, f"{what} has shape {x.shape} and strides {x.strides}")
    dtype = np.dtype(x.dtype)
    if dtype.name not in SUPPORTED_DTYPES:
        raise LocalError(3, f"{what} has dtype {dtype.name}")
    if not dtype.isnative:
        # '>f8' and '<f8' are both "float64": comparing names would let them meet
        raise LocalError(18, f"{what} has dtype {dtype.str} (pass "
                             f"x.astype(x.dtype.newbyteorder('=')))")
    if isinstance(x, np.ndarray) and not x.flags.aligned:
        raise LocalError(19, f"{what} starts at byte address {x.ctypes.data} (pass x.copy())")


def check_writeable(x, what: str = "out") -> None:
    """Raise LocalError if ``x`` is a read-only NumPy array (device arrays are writable)."""
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise LocalError(17, f"{what} is read-only (x.flags.writeable is False)")


def check_candidates(options: dict, known) -> None:
    """``candidates``, where given, must name one or more algorithms ``auto`` can model."""
    if "candidates" not in options:
        return
    raw = options["candidates"]
    names = (raw.split(",") if isinstance(raw, str) else
             list(raw) if isinstance(raw, (list, tuple)) else None)
    if not names or any(name not in known for name in names):
        raise LocalError(16, f"candidates={raw!r}: need one or more of {sorted(known)}, as a "
                             "comma-separated string or a list")


def check_segment_bytes(options: dict, itemsize: int) -> None:
    """``segment_bytes``, where given, must be a whole number of bytes holding at least one
    element (it is rounded down to whole elements)."""
    value = options.get("segment_bytes")
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < itemsize:
        raise LocalError(16, f"segment_bytes={value!r}: need a whole number of bytes of at "
                             f"least one element ({itemsize})")


def parse_torus(value, size: int) -> tuple[int, int] | None:
    """``(rows, columns)`` of a torus from ``"RxC"`` or ``(R, C)``; None for ``"auto"``.

    Raises LocalError unless R and C are whole numbers >= 1 with R·C = ``size``."""
    if value is None or value == "auto":
        return None
    try:
        parts = value.lower().split("x") if isinstance(value, str) else list(value)
        if len(parts) != 2 or any(isinstance(v, (bool, float)) for v in parts):
            raise ValueError
        rows, cols = (int(part) for part in parts)
    except (TypeError, ValueError, AttributeError):
        raise LocalError(16, f"torus={value!r}: need 'RxC' (e.g. '2x4'), (R, C) or "
                             f"'auto'") from None
    if rows < 1 or cols < 1 or rows * cols != size:
        raise LocalError(16, f"torus={value!r}: rows x columns must be {size} (the ranks), "
                             f"each >= 1")
    return rows, cols


def check_finite(x, test=None) -> None:
    """Raise LocalError if a floating-point ``x`` holds NaN or Inf (one read of ``x``; the
    elements are counted, for the message, only then). ``test``: ``finite_test``'s for
    arrays like ``x``, resolved before (default: resolved now)."""
    if (test or _has_nonfinite)(x):
        raise LocalError(9, nonfinite_detail(x))


def finite_test(x):
    """The test ``check_finite`` runs on contiguous arrays like ``x`` (its kind and dtype),
    resolved once: a persistent plan's calls skip the lookups (``x -> bool``)."""
    if np.dtype(x.dtype).kind != "f":
        return lambda _: False
    kernels = _host_kernels(x)
    return _has_nonfinite if kernels is None else kernels.nonfinite


def _host_kernels(x):
    """The ``finite`` kernels for a contiguous host array at any size where the process
    loaded Numba anyway (every compressed job): ~0.7 us at 1K elements against ~3 us for
    the NumPy reference's dot product, once per compressed call; None otherwise (exact
    NumPy jobs never import Numba for this)."""
    if type(x) is np.ndarray and backends.numba_loaded():
        return backends.backend("finite", like=x)
    return None


def _has_nonfinite(x) -> bool:
    """Whether a floating-point ``x`` holds NaN or Inf: one read, by the ``finite`` kernels."""
    if np.dtype(x.dtype).kind != "f" or x.size == 0:
        return False
    kernels = _host_kernels(x) if x.flags.c_contiguous else None
    if kernels is not None:
        return bool(kernels.nonfinite(x))
    try:
        kernels = backends.for_size("finite", x.size, like=x)
    except ValueError:  # a device array where the CUDA kernels cannot run (no numba-cuda):
        kernels = finite_ref  # NumPy's functions, which CuPy arrays take as they are
    return bool(kernels.nonfinite(x))


def check_range(x, comp) -> None:
    """Raise LocalError (21) if ``x`` holds values that ``comp``'s payload cannot carry
    (they would arrive as Inf: fp16's |x| >= 65520), as a NaN is refused."""
    limit = comp.overflows_at
    if limit is None or np.dtype(x.dtype).kind != "f" or x.size == 0:
        return
    xp = device.array_module(x)
    if float(xp.max(x)) >= limit or float(xp.min(x)) <= -limit:
        beyond = int(xp.count_nonzero(xp.abs(x) >= limit))
        raise LocalError(21, f"{beyond} of {x.size} values are beyond {comp.name}'s range "
                             f"(|x| >= {limit:g})")


def check_sum_in_range(out, comp) -> None:
    """Raise FloatingPointError if the sum of finite inputs left ``comp``'s range on the way
    (fp16's partial sums past 65504 arrive as Inf). Every rank holds the same result, so
    every rank raises alike; the output is left as it came."""
    if comp.overflows_at is not None and _has_nonfinite(out):
        xp = device.array_module(out)
        raise FloatingPointError(
            f"{comp.name} overflowed: the sum over ranks reached {comp.overflows_at:g} in "
            f"{int(xp.count_nonzero(~xp.isfinite(out)))} of {out.size} elements and arrived "
            f"as Inf (the inputs were finite). Scale the values down (e.g. by 1/size first) "
            f"or use bf16")


def nonfinite_detail(x) -> str:
    """'3 of 100 values are NaN or Inf': the message of a refused non-finite input."""
    xp = device.array_module(x)
    return f"{int(xp.count_nonzero(~xp.isfinite(x)))} of {x.size} values are NaN or Inf"


def check_out(out, shape: tuple, dtype) -> None:
    """Raise LocalError unless ``out`` can receive a result of ``shape`` and ``dtype``."""
    check_array(out, "out")
    check_writeable(out, "out")
    if tuple(out.shape) != tuple(shape) or np.dtype(out.dtype) != np.dtype(dtype):
        raise LocalError(6, f"out has shape {tuple(out.shape)} and dtype {out.dtype}, "
                            f"expected {tuple(shape)} and {np.dtype(dtype)}")


#: Linux's FS_IOC_GETFLAGS, and the flags with which a file can be neither replaced nor
#: rewritten, even by root: FS_IMMUTABLE_FL, FS_APPEND_FL (``chattr +i`` / ``+a``)
_GETFLAGS, _LOCKED = 0x80086601, 0x10 | 0x20


def _locked(path: str) -> bool:
    """Whether the existing file ``path`` is immutable or append-only (False where the
    file system keeps no such flags)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        flags = bytearray(8)
        fcntl.ioctl(fd, _GETFLAGS, flags)
    except OSError:
        return False
    finally:
        os.close(fd)
    return bool(int.from_bytes(flags[:4], sys.byteorder) & _LOCKED)


def probe_writable(path: str) -> None:
    """Raise now, not after the work, if the file ``path`` could not be written as a
    run's end writes it (``path.tmp``, renamed over ``path``; or opened in place): not a
    directory, not an immutable or append-only file, and its folder takes a new file
    (``path.tmp`` is created and removed)."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory: give a file name", path)
    if os.path.exists(path) and _locked(path):
        raise PermissionError(errno.EPERM, "is immutable or append-only (chattr): it cannot "
                              "be replaced", path)
    with open(path + ".tmp", "wb"):
        pass
    os.remove(path + ".tmp")


def probe_directory(directory: str, names) -> None:
    """Make ``directory`` now and raise if any of ``names`` could not be written in it
    (``probe_writable``): a run's trace, written at its end."""
    os.makedirs(directory, exist_ok=True)
    for name in names:
        probe_writable(os.path.join(directory, name))
