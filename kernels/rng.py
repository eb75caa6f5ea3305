"""Counter-based random numbers: the same value for (key, element) on every backend and rank.

SplitMix64: element i of stream ``key`` is ``mix(key + (i + 1) * GAMMA)``. No state is
carried between calls, so any thread, rank or GPU computes any element independently and
results never depend on the thread count or the order of work.
"""

from __future__ import annotations

import functools

import numpy as np

GAMMA = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB
MASK64 = (1 << 64) - 1


def mix64(z: int) -> int:
    """SplitMix64's finaliser on a Python int (mod 2^64)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    return z ^ (z >> 31)


def fits_int64(*values: int) -> bool:
    """Whether every key part fits an int64, as the compiled walks carry them (a part
    outside takes the Python walk, whose keys are Python ints)."""
    for v in values:  # noqa: SIM110 - a loop: a third of all()'s time, per plan call
        if not -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF:
            return False
    return True


def stream_key(seed: int, step: int, bucket: int, hop: int) -> int:
    """One 64-bit stream key per (seed, step, bucket, hop), as a Python int: the call's
    key (seed, step, bucket: remembered, as every hop of a call derives from it) mixed
    with the hop."""
    return mix64(call_key(seed, step, bucket) ^ ((hop + 1) * GAMMA))


@functools.lru_cache(maxsize=256)
def call_key(seed: int, step: int, bucket: int) -> int:
    """The key every hop's stream of one call derives from (``stream_key``; a compiled
    walk derives its hops' streams from it itself: ``rng_numba.hop_stream``)."""
    key = mix64(seed + GAMMA)
    for part in (step, bucket):
        key = mix64(key ^ ((part + 1) * GAMMA))
    return key


def mix(key: int, index: np.ndarray) -> np.ndarray:
    """NumPy reference: the 64 random bits (uint64) of element ``index`` of stream ``key``."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (index.astype(np.uint64) + np.uint64(1)) * np.uint64(GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(M2)
        return z ^ (z >> np.uint64(31))


def uniform32(key: int, index: np.ndarray) -> np.ndarray:
    """NumPy reference: a uint64 array of uniform values in [0, 2^32) for element ``index``."""
    return mix(key, index) >> np.uint64(32)


def substream(key: int, part: int) -> int:
    """A derived stream key (e.g. one per sketch row), as a Python int."""
    return mix64(key ^ ((part + 1) * GAMMA))


def threshold(numerator: int, denominator: int) -> int:
    """u < threshold(a, b) has probability a/b for u uniform in [0, 2^32) (up to 2^-32)."""
    if not 0 <= numerator <= denominator or denominator <= 0:
        raise ValueError(f"need 0 <= {numerator} <= {denominator}, denominator > 0")
    return (numerator << 32) // denominator
