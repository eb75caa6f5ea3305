"""Collective argument agreement: every rank reaches the same verdict and the same message.

A bad argument on one rank must not leave the others waiting inside a collective, so each
call packs its arguments into a small integer signature, the ranks agree on its element-wise
minimum and maximum in one tiny Allreduce, and all of them raise the same error.
"""

from __future__ import annotations

import hashlib
import operator

import numpy as np

from ringcomp.checks import OPS, SUPPORTED_DTYPES, LocalError
from ringcomp.errors import ArgumentMismatchError, EverywhereError
from ringcomp.kernels.rng import fits_int64

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
    20: (ValueError, "the arrays differ from those the persistent plan was made for"),
    21: (FloatingPointError, "the input holds values past the compressor's range: they would "
                             "arrive as Inf (fp16: |x| >= 65520; scale them down or use bf16)"),
}

_RANK_SPAN = (1 << 32) - 1
#: a supported native dtype -> its index in SUPPORTED_DTYPES (check_array let only these in)
_DTYPE_INDEX = {np.dtype(name): i for i, name in enumerate(SUPPORTED_DTYPES)}
FIELDS = ("length", "dtype", "algorithm", "op", "options", "root", "error", "error rank",
          "seed", "step", "bucket")
#: the fields a mismatch message names by value (the options' hash is named option by
#: option, the error fields are reported apart)
_COMPARED = (0, 1, 2, 3, 5, 8, 9, 10)
#: the key of a call without one (an exact call): nothing to convert
NO_KEY = (0, 0, 0)


def options_hash(options: dict) -> int:
    """A 62-bit hash of the options, identical on every rank for identical options.

    Remembered per set of hashable options: a job repeats a handful of them, and forming
    the text costs more than a small collective's own call."""
    try:
        # the type too: 1, 1.0 and True are equal keys but different options
        key = tuple((k, v.__class__, v) for k, v in options.items())
        return _HASHED[key]
    except TypeError:  # a list among the values: hashed afresh every time
        return _options_hash(options)
    except KeyError:
        if len(_HASHED) >= MAX_HASHED:
            _HASHED.clear()
        _HASHED[key] = value = _options_hash(options)
        return value


#: options_hash's memory of option sets (cleared when full: a job naming a new step or
#: seed on every call must not grow it without limit)
_HASHED: dict[tuple, int] = {}
MAX_HASHED = 64


def _options_hash(options: dict) -> int:
    text = repr(sorted((k, repr(v)) for k, v in options.items()))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2


def agree(transport, name: str, *, length: int, dtype, algorithm_index: int, op: str,
          options: dict, root: int = 0, error: LocalError | None = None,
          check: bool = True, algorithm_names: tuple = (), key: tuple = NO_KEY):
    """Raise the same exception on every rank unless all ranks' arguments are valid and equal.
    Returns (the signature agreed on, the options it hashed), or None without ``check``.

    Args:
        transport: the Transport the collective runs on.
        name: the collective's name, for the message.
        length, dtype, algorithm_index, op, options, root: this rank's arguments.
        error: a LocalError this rank already found, or None.
        algorithm_names: the names ``algorithm_index`` indexes, for the message.
        check: when False, skip the agreement (no communication) and only raise a local
            error; ranks with mismatched arguments will then hang until the deadline.
        key: a compressed call's (seed, step, bucket), compared as integers rather than
            hashed with the options (the step moves on every call: hashing it each time
            cost a small call several microseconds); one outside int64 joins the options.
    """
    if not check:
        if error is not None:
            raise_local(name, error)
        return None
    sig, options = signature(transport, length=length, dtype=dtype,
                             algorithm_index=algorithm_index, op=op, options=options,
                             root=root, error=error, key=key)
    settle(transport, name, sig, options, error, algorithm_names)
    return sig, options


def raise_local(name: str, error: LocalError):
    """Raise ``error`` on this rank only (a call without the agreement)."""
    exc_type, text = ERRORS[error.code]
    raise exc_type(f"{name}: {text}: {error.detail}")


#: where the signature holds the error, its packed rank and the step
ERROR_FIELD, PACKED_FIELD, STEP_FIELD = 6, 7, 9


def signature(transport, *, length: int, dtype, algorithm_index: int, op: str,
              options: dict, root: int = 0, error: LocalError | None = None,
              key: tuple = NO_KEY) -> tuple[list, dict]:
    """(this rank's int64 signature of a call, the options it hashed): what ``agree``
    compares. A persistent plan makes it once and patches the error and step fields per
    call (``ERROR_FIELD``, ``PACKED_FIELD``, ``STEP_FIELD``)."""
    dtype_index = -1
    if error is None:
        dtype_index = _DTYPE_INDEX.get(dtype)
        if dtype_index is None:  # a device array's dtype-like
            dtype_index = SUPPORTED_DTYPES.index(np.dtype(dtype).name)
    compared = key if key is NO_KEY else _int64s(key)
    if compared is None:  # not integers that fit: hashed with the options instead
        options, compared = {**options, "key": key}, NO_KEY
    return [length, dtype_index, algorithm_index, OPS.index(op) if op in OPS else -1,
            options_hash(options), root, error.code if error else 0,
            packed(transport, error), *compared], options


def settle(transport, name: str, sig: list, options: dict, error: LocalError | None,
           algorithm_names: tuple = ()) -> None:
    """Agree on ``sig`` (one tiny Allreduce) and raise the same exception on every rank
    unless no rank found an error and every field is equal."""
    lo, hi = transport.agree(sig)
    judge(transport, name, lo, hi, options, error, algorithm_names)


def judge(transport, name: str, lo, hi, options: dict, error: LocalError | None,
          algorithm_names: tuple = ()) -> None:
    """``settle``'s verdict on the agreed element-wise minimum ``lo`` and maximum ``hi``
    (int64 arrays) of every rank's signature; the same on every rank."""
    if hi[ERROR_FIELD] > 0:
        _raise_reported(name, int(hi[PACKED_FIELD]), error)
    if np.array_equal(lo, hi):  # every rank passed the same: the common case, decided in C
        return
    diffs = [f"{FIELDS[i]} (min {_show(i, lo[i], algorithm_names)}, max "
             f"{_show(i, hi[i], algorithm_names)})"
             for i in _COMPARED if lo[i] != hi[i]]
    if lo[4] != hi[4]:  # every rank sees it: name the options and their values
        diffs.append(differing_options(transport.allgather_obj(
            {k: repr(v) for k, v in options.items()})))
    if diffs:
        raise ArgumentMismatchError(
            f"{name}: ranks passed different arguments: {'; '.join(diffs)}. Every rank must "
            "call the same collective with the same length, dtype, algorithm, op and options.")


def _int64s(values: tuple) -> tuple | None:
    """``values`` as Python ints when each is an integer (NumPy's too) within int64."""
    try:
        ints = tuple(operator.index(v) for v in values)
    except TypeError:
        return None
    return ints if fits_int64(*ints) else None


def agree_error(transport, name: str, error: LocalError | None, length: int = -1,
                itemsize: int = 0) -> None:
    """Raise on every rank the error of the lowest rank that found one, as ``agree`` does
    (one tiny Allreduce): for what a collective finds while it runs, before it writes its
    output - a non-finite input its kernels met as they read it, say. ``length`` and
    ``itemsize`` (the call's elements and their bytes) are compared in the same call:
    without the argument agreement (``check=False``) a compressed payload of equal bytes
    for other lengths (bits packed in words) would otherwise pass unseen, and this is
    before anything is written."""
    lo, hi = transport.agree([packed(transport, error), length, itemsize])
    if hi[0] > 0:
        _raise_reported(name, int(hi[0]), error)
    if lo[1] != hi[1] or lo[2] != hi[2]:
        raise ArgumentMismatchError(
            f"{name}: ranks passed different arguments: length (min {lo[1]}, max {hi[1]}), "
            f"item size (min {lo[2]}, max {hi[2]}) - with check=False nothing else is "
            f"agreed; nothing was written")


def packed(transport, error: LocalError | None) -> int:
    """The error's code and this rank, packed so that MAX finds the largest code and the
    *lowest* rank that has it; 0 for no error."""
    return (error.code << 32) + (_RANK_SPAN - transport.rank) if error else 0


def _raise_reported(name: str, packed: int, error: LocalError | None):
    code, culprit = packed >> 32, _RANK_SPAN - (packed & _RANK_SPAN)
    exc_type, text = ERRORS[code]
    detail = f": {error.detail}" if error is not None and error.code == code else ""
    raise exc_type(f"{name}: rank {culprit} passed bad arguments: {text}{detail}")


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


def _show(field: int, value, names: tuple) -> str:
    value = int(value)
    if field == 1 and 0 <= value < len(SUPPORTED_DTYPES):
        return SUPPORTED_DTYPES[value]
    if field == 2:
        return names[value] if 0 <= value < len(names) else "unknown"
    if field == 3 and 0 <= value < len(OPS):
        return OPS[value]
    if field == 4:
        return f"hash {value:x}"
    return str(value)


def everywhere(transport, fn, raise_as: type[Exception] = EverywhereError):
    """Run ``fn`` on every rank; if it raised anywhere, raise ``raise_as`` on every rank
    (no hang), naming the first failing rank and its error."""
    return everywhere_shared(transport, lambda: (fn(), None), raise_as)[0]


def everywhere_shared(transport, fn, raise_as: type[Exception] = EverywhereError):
    """``everywhere`` for an ``fn`` returning (its result, a small picklable value to share):
    returns (this rank's result, every rank's shared value in rank order), from the same
    one exchange that agrees on errors - a call whose ranks must also agree with each
    other (the sizes of an all-to-all) judges them from this list, the same on every
    rank."""
    try:
        (result, mine), error = fn(), None
    except Exception as exc:  # reported collectively below (a file, a model, a state)
        result, mine, error = None, None, f"{type(exc).__name__}: {exc}"
    reports = transport.allgather_obj((error, mine))
    errors = [(r, e) for r, (e, _) in enumerate(reports) if e]
    if errors:
        rank, text = errors[0]
        raise raise_as(f"rank {rank}: {text}")
    return result, [shared for _, shared in reports]
