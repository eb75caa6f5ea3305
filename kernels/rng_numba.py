"""The counter-based stream of ``rng.py`` as Numba device-inlined functions."""

from __future__ import annotations

import numba
import numpy as np

from ringcomp.kernels.rng import GAMMA, M1, M2

_GAMMA = np.uint64(GAMMA)
_M1 = np.uint64(M1)
_M2 = np.uint64(M2)


@numba.njit(inline="always")
def mix(key, index):
    """64 random bits of element ``index`` (uint64) of stream ``key`` (uint64)."""
    return mix64(key + (index + np.uint64(1)) * _GAMMA)


@numba.njit(inline="always")
def mix64(z):
    """``rng.mix64`` on a uint64 (its products wrap mod 2^64, as the reference masks)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@numba.njit(inline="always")
def call_key(seed, step, bucket):
    """``rng.call_key`` of int64s, as a uint64: the reference's sums and products mod 2^64
    are the wrapping uint64 ones of the same bits."""
    key = mix64(np.uint64(seed) + _GAMMA)
    key = mix64(key ^ ((np.uint64(step) + np.uint64(1)) * _GAMMA))
    return mix64(key ^ ((np.uint64(bucket) + np.uint64(1)) * _GAMMA))


@numba.njit(inline="always")
def hop_stream(call, hop):
    """``rng.stream_key`` of ``hop`` from the call's key (uint64, ``rng.call_key``)."""
    return mix64(np.uint64(call) ^ (np.uint64(hop + 1) * _GAMMA))


@numba.njit(inline="always")
def uniform32(key, index):
    """A uniform value in [0, 2^32) (as uint64) for element ``index`` of stream ``key``."""
    return mix(key, index) >> np.uint64(32)
