"""Collective argument checks: every rank reaches the same verdict and the same message.

A bad argument on one rank must not leave the others waiting inside a collective, so each
call packs its arguments into a small integer signature, the ranks agree on its element-wise
minimum and maximum in one tiny Allreduce, and all of them raise the same error.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from ringcomp import device
from ringcomp.errors import ArgumentMismatchError, EverywhereError

SUPPORTED_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                    "uint8", "uint16", "uint32", "uint64")
OPS = ("sum", "max", "min", "prod")

# code -> (exception type, text); larger codes win when ranks report different errors
ERRORS = {
    1: (TypeError, "the input is not an array (need a NumPy array or a CUDA array)"),
    2: (ValueError, "the input is not C-contiguous (pass numpy.ascontiguousarray(x))"),
    3: (TypeError, f"the dtype is not supported (supported: {', '.join(SUPPORTED_DTYPES)})"),
    4: (ValueError, "unknown algorithm"),
    5: (ValueError, f"unknown reduction op (known: {', '.join(OPS)})"),
    6: (ValueError, "`out` must be a C-contiguous array of the expected shape and dtype"),
    7: (ValueError, "unknown option for this algorithm"),
    8: (ValueError, "root is out of range"),
    9: (FloatingPointError, "the input holds NaN or Inf values"),
    10: (ValueError, "unknown or malformed compressor"),
    11: (ValueError, "this algorithm cannot run this compressor"),
    12: (TypeError, "compression needs float32 or float64 data"),
    13: (ValueError, "compressed all-reduce only sums (op='sum')"),
    14: (ValueError, "error feedback does not apply here"),
    15: (ValueError, "shadow mode does not apply here"),
    16: (ValueError, "bad option value"),
    17: (ValueError, "the buffer is read-only but this collective writes into it"),
    18: (ValueError, "the buffer is not in native byte order"),
    19: (ValueError, "the buffer is not aligned to its element size"),
}

_RANK_SPAN = (1 << 32) - 1
FIELDS = ("length", "dtype", "algorithm", "op", "options", "root", "error", "error rank")


def check_timeout(value, what: str = "timeout") -> float:
    """A deadline in seconds: a finite number >= 0 (0 disables the deadline)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}") from None
    if not (seconds >= 0 and seconds != float("inf")):
        raise ValueError(f"{what} must be a finite number of seconds >= 0 (0 = no deadline), "
                         f"got {value!r}")
    return seconds


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


def check_array(x, what: str = "input") -> None:
    """Raise LocalError unless ``x`` is a contiguous array of a supported dtype."""
    if not isinstance(x, np.ndarray) and not device.is_device(x):
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


def check_finite(x) -> None:
    """Raise LocalError if a floating-point ``x`` holds NaN or Inf (one read of ``x``)."""
    if np.dtype(x.dtype).kind != "f" or x.size == 0:
        return
    xp = device.array_module(x)
    # a float64 sum is finite unless an element is NaN/Inf (float32/16 sums cannot
    # overflow it); only then count, which needs a temporary as large as x
    if bool(xp.isfinite(xp.sum(x, dtype=np.float64))):
        return
    bad = int(xp.count_nonzero(~xp.isfinite(x)))
    if bad:
        raise LocalError(9, f"{bad} of {x.size} values are NaN or Inf")


def check_out(out, shape: tuple, dtype) -> None:
    """Raise LocalError unless ``out`` can receive a result of ``shape`` and ``dtype``."""
    check_array(out, "out")
    check_writeable(out, "out")
    if tuple(out.shape) != tuple(shape) or np.dtype(out.dtype) != np.dtype(dtype):
        raise LocalError(6, f"out has shape {tuple(out.shape)} and dtype {out.dtype}, "
                            f"expected {tuple(shape)} and {np.dtype(dtype)}")


def options_hash(options: dict) -> int:
    """A 62-bit hash of the options, identical on every rank for identical options."""
    text = repr(sorted((k, repr(v)) for k, v in options.items()))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2


def agree(transport, name: str, *, length: int, dtype, algorithm_index: int, op: str,
          options: dict, root: int = 0, error: LocalError | None = None,
          check: bool = True) -> None:
    """Raise the same exception on every rank unless all ranks' arguments are valid and equal.

    Args:
        transport: the Transport the collective runs on.
        name: the collective's name, for the message.
        length, dtype, algorithm_index, op, options, root: this rank's arguments.
        error: a LocalError this rank already found, or None.
        check: when False, skip the agreement (no communication) and only raise a local
            error; ranks with mismatched arguments will then hang until the deadline.
    """
    if not check:
        if error is not None:
            exc_type, text = ERRORS[error.code]
            raise exc_type(f"{name}: {text}: {error.detail}")
        return
    dtype_index = SUPPORTED_DTYPES.index(np.dtype(dtype).name) if error is None else -1
    sig = [length, dtype_index, algorithm_index, OPS.index(op) if op in OPS else -1,
           options_hash(options), root, error.code if error else 0,
           # the error's code and the *lowest* rank that has it, packed so MAX finds both
           (error.code << 32) + (_RANK_SPAN - transport.rank) if error else 0]
    lo, hi = transport.agree(sig)
    if hi[6] > 0:
        code, culprit = int(hi[7]) >> 32, _RANK_SPAN - (int(hi[7]) & (_RANK_SPAN))
        exc_type, text = ERRORS[code]
        detail = f": {error.detail}" if error is not None and error.code == code else ""
        raise exc_type(f"{name}: rank {culprit} passed bad arguments: {text}{detail}")
    diffs = [f"{FIELDS[i]} (min {_show(i, lo[i])}, max {_show(i, hi[i])})"
             for i in range(6) if lo[i] != hi[i] and i != 4]
    if lo[4] != hi[4]:  # every rank sees it: name the options and their values
        diffs.append(differing_options(transport.allgather_obj(
            {k: repr(v) for k, v in options.items()})))
    if diffs:
        raise ArgumentMismatchError(
            f"{name}: ranks passed different arguments: {'; '.join(diffs)}. Every rank must "
            "call the same collective with the same length, dtype, algorithm, op and options.")


#: the agreement's name for the calling thread (see ``api._check``)
THREAD_OPTION = "calling thread"


def differing_options(everyone: list[dict]) -> str:
    """'options: segment_bytes (rank 0=1024, rank 1=2048)' for the keys ranks disagree on."""
    keys = sorted({k for d in everyone for k in d})
    parts = []
    for key in keys:
        by_value: dict[str, list[int]] = {}
        for rank, d in enumerate(everyone):
            by_value.setdefault(d.get(key, "(not set)"), []).append(rank)
        if len(by_value) > 1:
            parts.append(f"{key} (" + ", ".join(f"{_ranks(r)}: {v}" for v, r in
                                                by_value.items()) + ")")
    text = "options: " + "; ".join(parts)
    if any(part.startswith(THREAD_OPTION) for part in parts):
        text += (". Calls on one communicator pair up across ranks in the order each rank "
                 "makes them, so these came from different threads: give each thread its "
                 "own communicator (comm.Dup(), made on every rank before the threads start), "
                 "or name the threads alike on every rank (threading.Thread(name=...))")
    return text


def _ranks(ranks: list[int]) -> str:
    """[0] -> 'rank 0'; [1, 2, 3] -> 'ranks 1-3'; [0, 2] -> 'ranks 0,2'."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def _show(field: int, value) -> str:
    value = int(value)
    if field == 1 and 0 <= value < len(SUPPORTED_DTYPES):
        return SUPPORTED_DTYPES[value]
    if field == 2:
        from ringcomp.collectives.base import REGISTRY

        names = sorted(REGISTRY)
        return names[value] if 0 <= value < len(names) else "unknown"
    if field == 3 and 0 <= value < len(OPS):
        return OPS[value]
    if field == 4:
        return f"hash {value:x}"
    return str(value)


def probe_writable(path: str) -> None:
    """Raise now, not after the work, if a file cannot be written at ``path`` (a test file
    ``path.tmp`` is created and removed)."""
    with open(path + ".tmp", "wb"):
        pass
    os.remove(path + ".tmp")


def everywhere(transport, fn):
    """Run ``fn`` on every rank; if it raised anywhere, raise on every rank (no hang)."""
    try:
        result, error = fn(), None
    except Exception as exc:  # reported collectively below (a file, a model, a state)
        result, error = None, f"{type(exc).__name__}: {exc}"
    errors = [(r, e) for r, e in enumerate(transport.allgather_obj(error)) if e]
    if errors:
        rank, text = errors[0]
        raise EverywhereError(f"rank {rank}: {text}")
    return result
