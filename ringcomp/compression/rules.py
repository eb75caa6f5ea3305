"""The three hop rules a compressor inherits: cascade, linear, and Marsit's bit merge."""

from __future__ import annotations

from abc import abstractmethod

import numpy as np

from ringcomp.compression.base import Compressor, Key
from ringcomp.kernels.arrays import array_module


class Cascade(Compressor):
    """Cascading compression: decode, add exactly, re-encode at every hop.

    A partial aggregate is the raw sum of the decoded contributions, encoded once each time
    it is sent (a fresh random stream per encoding node, so rounding errors of different
    nodes are independent). Every re-encode loses again, so error grows with the hops.
    """

    aggregation = "cascade"
    cascades = True

    def join(self, incoming, x, have, key, scratch=None):
        """decode(incoming) + x, re-encoded from ``key`` (the hop's stream)."""
        partial = self.decode(incoming, x.size, array_module(x).empty_like(x)
                              if scratch is None else scratch)
        partial += x
        return self.encode(partial, key)

    def start(self, x, key):
        """The raw values themselves (never written: ``combine`` makes new arrays)."""
        return x

    def combine(self, agg, payload, n, have, joining, key, scratch):
        decoded = self.decode(payload, n, scratch)
        if agg is None:  # the sum of no rank yet: zeros, so every row is added alike
            agg = array_module(decoded).zeros_like(decoded)
        return agg + decoded

    def finish(self, agg, key, carry=None):
        """Encode the raw sum. ``carry`` (a two-stage owner's server error feedback, an
        array of ``agg.size`` elements) is added first and then holds what encoding lost."""
        if carry is None:
            return self.encode(agg, key)
        corrected = agg + carry
        payload = self.encode(corrected, key)
        np.subtract(corrected, self.decode(payload, agg.size,
                                          array_module(corrected).empty_like(corrected)),
                    out=carry)
        return payload


class _PayloadAggregates(Compressor):
    """Partial aggregates are payloads that merge without decoding (linear and Marsit)."""

    join_uses_scratch = False

    @abstractmethod
    def merge_payloads(self, agg, payload, n: int, have: int, joining: int,
                       key: Key) -> np.ndarray:
        """The payload of ``have + joining`` ranks from payloads of ``have`` and ``joining``."""

    def join(self, incoming, x, have, key, scratch=None):
        """Encode ``x`` (hop-0 stream, shared by every rank) and merge it in as one rank."""
        own = self.encode(x, key.at(0, key.offset))
        return self.merge_payloads(incoming, own, x.size, have, 1, key)

    def start(self, x, key):
        return self.encode(x, key)

    def combine(self, agg, payload, n, have, joining, key, scratch):
        return payload if agg is None else self.merge_payloads(agg, payload, n, have,
                                                               joining, key)

    def finish(self, agg, key, carry=None):
        """The aggregate is the payload already: nothing is re-encoded, nothing lost, so a
        server error feedback ``carry`` stays as it is."""
        return agg


class Linear(_PayloadAggregates):
    """Payloads add in the compressed domain (``add``) and are decoded once at the end:
    no cascading error, payload size independent of the number of ranks."""

    aggregation = "linear"
    linear = True

    @abstractmethod
    def add(self, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
        """The payload of the sum of what payloads ``a`` and ``b`` stand for."""

    def merge_payloads(self, agg, payload, n, have, joining, key):
        return self.add(agg, payload, n)


class SignMerge(_PayloadAggregates):
    """Marsit's rule: sign bits merge by unbiased reservoir sampling (``merge``), 1 bit per
    element on every hop; an all-gather of sign bits takes the majority vote."""

    aggregation = "marsit"
    signs_only = True
    unbiased = True

    @abstractmethod
    def merge(self, incoming: np.ndarray, own: np.ndarray, n: int, have: int, joining: int,
              key: Key) -> np.ndarray:
        """Each bit takes ``own``'s value with probability joining / (have + joining)."""

    def merge_payloads(self, agg, payload, n, have, joining, key):
        return self.merge(agg, payload, n, have, joining, key)

    def settle(self, total) -> None:
        """signSGD with majority vote: the sign of the sum of ±1 votes (ties -> +1)."""
        total[...] = array_module(total).where(total >= 0, 1, -1)
