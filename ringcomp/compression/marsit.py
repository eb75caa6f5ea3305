"""``marsit``: 1 bit per element on every hop, merged by unbiased reservoir sampling."""

from __future__ import annotations

import numpy as np

from ringcomp.compression.base import Key, register
from ringcomp.compression.rules import SignMerge
from ringcomp.kernels import signs


@register
class MarsitSigns(SignMerge):
    """Marsit's bitwise sign aggregation (Wu et al., DAC 2022).

    Encode packs ``x >= 0``; when a partial aggregate of ``a`` contributors meets one of
    ``b``, each bit takes the newcomer's value with probability b/(a+b) (``merge``), so the
    final bit of every element is the sign of a uniformly chosen rank and the collective's
    ±1 output has the mean of the ranks' signs as its expectation. Messages stay 1 bit per
    element on every hop; nothing is decoded on the way.
    """

    name = "marsit"

    def nbytes(self, n: int) -> int:
        return 4 * signs.words_for(n)

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        return signs.backend(like=x).pack_signs(x).view(np.uint8)

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        return signs.backend(like=out).unpack_signs(payload.view(np.uint32), n, out, 1.0)

    def join(self, incoming, x, have, key, scratch=None):
        """Encode ``x`` and merge it in as one rank joining ``have``, in one pass over ``x``
        (the kernels' fused ``marsit_join``: the same bits as encode then merge)."""
        return signs.backend(like=x).marsit_join(
            incoming.view(np.uint32), x, 1, have + 1, key.stream(), key.offset).view(np.uint8)

    def merge(self, incoming: np.ndarray, own: np.ndarray, n: int, have: int, joining: int,
              key: Key) -> np.ndarray:
        """Merge ``own`` (``joining`` contributors) into ``incoming`` (``have`` of them)."""
        return signs.backend(like=own).marsit_merge(
            incoming.view(np.uint32), own.view(np.uint32), n, joining, have + joining,
            key.stream(), key.offset).view(np.uint8)
