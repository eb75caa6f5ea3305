"""The kit's checks of a compressor's codec alone: sizes, decoding, purity, range, bias."""

from __future__ import annotations

import numpy as np

from ringcomp.compression import Key, get_compressor
from ringcomp.testing.replay import simulate_ring
from ringcomp.testing.verdict import judged

#: element counts the codec checks encode: one, a few, past a 32-bit word, odd, a page
SIZES = (1, 2, 7, 33, 777, 4096)
DTYPES = (np.float32, np.float64)
#: the inputs a payload's size may not depend on
KINDS = ("normal", "zeros", "constant", "alternating", "tiny", "large")


def sample(kind: str, n: int, dtype, seed: int = 0) -> np.ndarray:
    """An input of ``n`` elements of one ``KINDS`` kind."""
    rng = np.random.default_rng(seed)
    values = {"normal": lambda: rng.standard_normal(n),
              "zeros": lambda: np.zeros(n),
              "constant": lambda: np.full(n, 0.75),
              "alternating": lambda: np.where(np.arange(n) % 2, -1.5, 1.5),
              "tiny": lambda: rng.standard_normal(n) * 1e-30,
              "large": lambda: rng.standard_normal(n) * 1e4}[kind]()
    return values.astype(dtype)


def codecs(spec: str):
    """The compressor ``spec`` names, made afresh (a new instance for every check: no check
    sees another's state)."""
    comp = get_compressor(spec)
    if comp is None:
        raise ValueError(f"{spec!r} names no compression: the kit checks compressors")
    return comp


def bytes_as_declared(spec: str, comm=None) -> None:
    """``encode`` returns a 1-D uint8 array of exactly ``nbytes(n)`` bytes for every size,
    dtype and kind of data: receivers post receives of ``nbytes(n)`` before any payload
    exists, so the size may depend on ``n`` alone."""

    def find():
        comp = codecs(spec)
        for dtype in DTYPES:
            for n in SIZES:
                declared = comp.nbytes(n)
                if not isinstance(declared, (int, np.integer)) or declared < 0:
                    return f"nbytes({n}) is {declared!r}, not a count of bytes"
                for kind in KINDS:
                    payload = comp.encode(sample(kind, n, dtype), Key(seed=3))
                    if not isinstance(payload, np.ndarray) or payload.dtype != np.uint8 \
                            or payload.ndim != 1:
                        return (f"encode of {n} {np.dtype(dtype).name} elements gave "
                                f"{type(payload).__name__} {getattr(payload, 'dtype', '')} "
                                f"of shape {getattr(payload, 'shape', '?')}, not 1-D uint8")
                    if payload.size != declared:
                        return (f"encode of {n} {np.dtype(dtype).name} elements ({kind}) gave "
                                f"{payload.size} bytes; nbytes({n}) declares {declared}")
        return None

    judged(comm, spec, "bytes as declared", find)


def decodes_into_out(spec: str, comm=None) -> None:
    """``decode(payload, n, out)`` writes every one of ``out``'s ``n`` elements (finite,
    for finite input) and returns ``out`` itself, in its dtype."""

    def find():
        comp = codecs(spec)
        for dtype in DTYPES:
            for n in SIZES:
                x = sample("normal", n, dtype, seed=n)
                out = np.full(n, np.nan, dtype)
                got = comp.decode(comp.encode(x, Key(seed=3)), n, out)
                if got is not out:
                    return f"decode of {n} {np.dtype(dtype).name} elements returned a " \
                           f"new array, not out"
                if out.dtype != dtype or not np.isfinite(out).all():
                    bad = np.flatnonzero(~np.isfinite(out))
                    return (f"decode of {n} {np.dtype(dtype).name} elements left "
                            f"{bad.size} of them not finite (first: index {bad[0]})")
        return None

    judged(comm, spec, "decode fills out", find)


def pure(spec: str, comm=None) -> None:
    """``encode`` is a function of (data, key) alone: the same key gives the same bytes -
    on another instance too, and after other calls - and neither ``encode`` nor ``decode``
    writes its input. Every rank re-encodes what another encoded (error feedback re-encodes
    its own input to learn what was lost), so anything else gives wrong sums."""

    def find():
        first, second = codecs(spec), codecs(spec)
        for dtype in DTYPES:
            for n in (7, 777):
                x = sample("normal", n, dtype, seed=n)
                kept = x.copy()
                payload = first.encode(x, Key(seed=5, step=2, bucket=1, hop=3))
                if not np.array_equal(x, kept):
                    return f"encode wrote its input ({n} {np.dtype(dtype).name} elements)"
                first.encode(sample("normal", n, dtype, seed=n + 1), Key(seed=9))
                again = first.encode(x, Key(seed=5, step=2, bucket=1, hop=3))
                other = second.encode(x, Key(seed=5, step=2, bucket=1, hop=3))
                if not (np.array_equal(payload, again) and np.array_equal(payload, other)):
                    which = "another instance" if np.array_equal(payload, again) else \
                        "the same instance, after another call"
                    return (f"the same data and key encoded twice gave different bytes "
                            f"({n} {np.dtype(dtype).name} elements; {which})")
                sent = payload.copy()
                first.decode(payload, n, np.empty(n, dtype))
                if not np.array_equal(payload, sent):
                    return "decode wrote its payload"
        return None

    judged(comm, spec, "encode is pure", find)


#: the magnitude a compressor that declares no ``overflows_at`` is checked to carry
UNDECLARED_RANGE = 1e15


def carried(comp) -> float:
    """The magnitude ``comp`` must carry: its declared ``overflows_at``, else
    ``UNDECLARED_RANGE``; the range checks stay below it."""
    return UNDECLARED_RANGE if comp.overflows_at is None else comp.overflows_at


def finite_within_range(spec: str, comm=None) -> None:
    """Finite input within the declared range (``overflows_at``; 1e15 where none is
    declared) decodes to finite values: a compressor that cannot carry a magnitude
    declares it, and the all-reduce refuses such input instead of summing Inf."""

    def find():
        comp = codecs(spec)
        scale = carried(comp) / 2
        for dtype in DTYPES:
            x = (sample("normal", 777, dtype) / 4 * scale).astype(dtype)
            out = comp.decode(comp.encode(x, Key(seed=3)), x.size, np.empty_like(x))
            if not np.isfinite(out).all():
                return (f"{np.dtype(dtype).name} values up to {np.abs(x).max():.3g} decoded to "
                        f"{np.count_nonzero(~np.isfinite(out))} non-finite values (declare "
                        f"overflows_at = the smallest magnitude the payload cannot carry)")
        return None

    judged(comm, spec, "finite within its range", find)


#: the unbiasedness check's elements, draws (keys) and threshold on the normalised
#: chi-square statistic. Measured on 256 elements and 400 draws, five seeds each: qsgd,
#: terngrad and a scaled random-k scored -0.6 to 2.5; that random-k decoding 10% high
#: scored 14.5-16.8
ELEMENTS, DRAWS, Z_LIMIT = 256, 400, 6.0


def unbiased(spec: str, comm=None) -> None:
    """Where the class claims ``unbiased``: over many keys the decoded payload's mean is
    its input (a codec: E[decode(encode(x))] = x), and a ring of three ranks' mean is the
    sum (signs only: the mean of the ranks' signs). Judged element by element, each mean's
    deviation over its standard error, pooled in a chi-square statistic; an element whose
    draws never vary must be exact (within 1% of the input's typical magnitude). Fixed
    seeds: the verdict never changes between runs."""

    def find():
        comp = codecs(spec)
        if not comp.unbiased:
            return None
        rng = np.random.default_rng(7)
        xs = [rng.standard_normal(ELEMENTS).astype(np.float64) for _ in range(3)]
        xs[0][:8] = 0.0  # zeros: a codec must keep them exactly zero in the mean
        if not comp.signs_only:
            draws = [comp.decode(comp.encode(xs[0], Key(seed=k)), ELEMENTS,
                                 np.empty(ELEMENTS)) for k in range(DRAWS)]
            problem = _bias(np.array(draws), xs[0], "decode(encode(x))")
            if problem:
                return problem
        target = np.mean([np.where(x >= 0, 1.0, -1.0) for x in xs], axis=0) \
            if comp.signs_only else np.sum(xs, axis=0)
        draws = [simulate_ring(comp, xs, Key(seed=k)) for k in range(DRAWS // 2)]
        return _bias(np.array(draws), target, "a ring of 3 ranks")

    judged(comm, spec, "unbiased", find)


def _bias(draws: np.ndarray, target: np.ndarray, what: str) -> str | None:
    mean, spread = draws.mean(axis=0), draws.std(axis=0, ddof=1)
    fixed = spread == 0
    # an element that never varied yet missed: judged past 1% of the input's typical
    # magnitude (a small value that a quantizer rounds up once in a thousand draws may
    # stay at zero in all of them)
    typical = np.sqrt(np.mean(target ** 2))
    off = fixed & ~np.isclose(mean, target, rtol=1e-6, atol=1e-2 * typical)
    if off.any():
        i = np.flatnonzero(off)[0]
        return (f"{what} never varies at {off.sum()} elements yet misses them (index {i}: "
                f"always {mean[i]:.6g}, expected {target[i]:.6g})")
    t2 = ((mean - target)[~fixed] / (spread[~fixed] / np.sqrt(len(draws)))) ** 2
    if t2.size:
        z = (t2.sum() - t2.size) / np.sqrt(2 * t2.size)
        if z > Z_LIMIT:
            worst = np.flatnonzero(~fixed)[np.argmax(t2)]
            return (f"the mean of {what} over {len(draws)} keys is off its expectation "
                    f"(chi-square z = {z:.1f} > {Z_LIMIT}; worst index {worst}: "
                    f"{mean[worst]:.4g}, expected {target[worst]:.4g})")
    return None
