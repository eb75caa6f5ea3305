"""NumPy reference of the sign kernels: the specification the other backends must match.

Bit layout: element i is bit (i % 32) of word i // 32 (least significant bit first); a set
bit means ``x >= 0`` (so +0.0 and -0.0 both map to +1, NaN to -1); bits past n in the last
word are zero.
"""

from __future__ import annotations

import numpy as np
from ringcomp.kernels.rng import threshold, uniform32


def words_for(n: int) -> int:
    return (n + 31) // 32


def _bits_to_words(bits: np.ndarray) -> np.ndarray:
    n = bits.size
    padded = np.zeros(words_for(n) * 32, dtype=np.uint8)
    padded[:n] = bits
    return np.packbits(padded, bitorder="little").view("<u4").astype(np.uint32)


def _words_to_bits(words: np.ndarray, n: int) -> np.ndarray:
    return np.unpackbits(words.astype("<u4").view(np.uint8), bitorder="little")[:n]


def pack_signs(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Pack ``x >= 0`` into uint32 words."""
    words = _bits_to_words(x >= 0)
    if out is None:
        return words
    out[...] = words
    return out


def unpack_signs(words: np.ndarray, n: int, out: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Write ``+scale`` where the bit is set and ``-scale`` elsewhere into ``out[:n]``."""
    bits = _words_to_bits(words, n)
    out[...] = np.where(bits.astype(bool), scale, -scale).astype(out.dtype)
    return out


def marsit_merge(inc: np.ndarray, own: np.ndarray, n: int, take: int, of: int, key: int,
                 offset: int, out: np.ndarray | None = None) -> np.ndarray:
    """Reservoir-sampling merge of two packed sign vectors.

    Element i takes the ``own`` bit with probability ``take / of`` (independently, from the
    counter-based stream ``key`` at global index ``offset + i``) and keeps ``inc`` otherwise.
    Merging a partial aggregate of ``of - take`` contributors with one of ``take`` keeps every
    contributor's sign equally likely (1/k for the k-th contributor of a ring).
    """
    u = uniform32(key, np.arange(offset, offset + n, dtype=np.uint64))
    mask = _bits_to_words(u < np.uint64(threshold(take, of)))
    merged = (inc & ~mask) | (own & mask)
    if out is None:
        return merged
    out[...] = merged
    return out
