"""NumPy reference of the sign kernels: the specification the other backends must match.

Bit layout: element i is bit (i % 32) of word i // 32 (least significant bit first); a set
bit means ``x >= 0`` (so +0.0 and -0.0 both map to +1, NaN to -1); bits past n in the last
word are zero.
"""

from __future__ import annotations

import sys

import numpy as np

from ringcomp.kernels.arrays import array_module
from ringcomp.kernels.rng import mix, threshold


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


def sliced_uniform32(key: int, offset: int, n: int) -> np.ndarray:
    """The merge's uniform value in [0, 2^32) for elements 0..n-1 of a call (uint64).

    Bit-sliced: word w of the call draws 32 random 32-bit *planes* from 16 values of the
    stream, ``mix(key, offset + 32 w + q)`` for q = 0..15 (plane 2q is the low half of value
    q, plane 2q + 1 the high half), and element j of the word takes bit j of plane i as
    bit i of its value. Every value is uniform and independent of the others (the planes
    are), and a kernel can compare all 32 values of a word with a threshold one plane at a
    time, most significant first, stopping once every element where the inputs differ is
    settled: about 6 planes (3 draws) per word instead of 32 draws. This function is the
    specification of that order.
    """
    words = words_for(n)
    index = (offset + 32 * np.arange(words, dtype=np.uint64)[:, None]
             + np.arange(16, dtype=np.uint64)[None, :])
    planes = mix(key, index.reshape(-1)).astype("<u8").view("<u4").reshape(words, 32)
    bits = np.unpackbits(planes.view(np.uint8).reshape(words, 32, 4), axis=2,
                         bitorder="little")  # bits[w, i, j] = bit j of plane i
    values = np.packbits(np.ascontiguousarray(bits.transpose(0, 2, 1)), axis=2,
                         bitorder="little")  # values[w, j]: bit i = bits[w, i, j]
    return values.reshape(words, 32, 4).view("<u4").reshape(-1)[:n].astype(np.uint64)


def marsit_merge(inc: np.ndarray, own: np.ndarray, n: int, take: int, of: int, key: int,
                 offset: int, out: np.ndarray | None = None) -> np.ndarray:
    """Reservoir-sampling merge of two packed sign vectors.

    Element i takes the ``own`` bit with probability ``take / of`` (independently, from the
    bit-sliced stream ``sliced_uniform32(key, offset, n)``) and keeps ``inc`` otherwise.
    Merging a partial aggregate of ``of - take`` contributors with one of ``take`` keeps every
    contributor's sign equally likely (1/k for the k-th contributor of a ring).
    """
    u = sliced_uniform32(key, offset, n)
    mask = _bits_to_words(u < np.uint64(threshold(take, of)))
    merged = (inc & ~mask) | (own & mask)
    if out is None:
        return merged
    out[...] = merged
    return out


#: the width of the fixed summation tree (a GPU block reduces one row of it in shared memory)
TREE = 256


def tree_sum(values: np.ndarray) -> float:
    """The float64 sum of ``values`` in the fixed order every backend reproduces.

    1. Pad with zeros to whole rows of ``TREE`` values.
    2. Sum each row by halving: ``row[:h] + row[h:]`` for h = TREE/2, ..., 1.
    3. Repeat on the row sums until one value remains (0.0 for no values).
    The order does not depend on threads or devices (NumPy's own pairwise sum does, on its
    buffer sizes), so a GPU gets the same bits.
    """
    a = np.asarray(values, dtype=np.float64).reshape(-1)
    if not a.size:
        return 0.0
    while True:
        rows = np.zeros((-(-a.size // TREE), TREE))
        rows.reshape(-1)[:a.size] = a
        h = TREE // 2
        while h:
            rows = rows[:, :h] + rows[:, h:]
            h //= 2
        a = rows[:, 0]
        if a.size == 1:
            return float(a[0])


def mean_abs(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[0] = tree_sum(|x|) / x.size`` (0 for an empty ``x``), in ``out``'s dtype."""
    out[0] = tree_sum(np.abs(x.astype(np.float64))) / x.size if x.size else 0.0
    return out


def join_with(kernels, inc, scale, x, words, scale_out):
    """A scaled-sign ring hop from a backend's own kernels: the payload (``scale_out[0]``,
    ``words``) of ``unpack_signs(inc, scale) + x`` in ``x``'s dtype (the backends that fuse
    it into one pass must give exactly these bits)."""
    partial = kernels.unpack_signs(inc, x.size, array_module(x).empty_like(x), scale)
    partial += x
    kernels.mean_abs(partial, scale_out)
    return kernels.pack_signs(partial, words)


def encode_with(kernels, x, words, scale_out):
    """The scaled-sign payload of ``x`` from a backend's own kernels: ``scale_out[0] =
    mean_abs(x)``, ``words = pack_signs(x)`` (the backends that fuse it into one pass must
    give exactly these bits)."""
    kernels.mean_abs(x, scale_out)
    return kernels.pack_signs(x, words)


def sign_encode(x, words, scale_out):
    """See ``encode_with``."""
    return encode_with(sys.modules[__name__], x, words, scale_out)


def sign_join(inc, scale, x, words, scale_out):
    """See ``join_with``."""
    return join_with(sys.modules[__name__], inc, scale, x, words, scale_out)


def marsit_join(inc, x, take, of, key, offset, out=None):
    """A Marsit ring hop: ``x``'s sign bits merged into ``inc`` (``marsit_merge``)."""
    return marsit_merge(inc, pack_signs(x), x.size, take, of, key, offset, out)
