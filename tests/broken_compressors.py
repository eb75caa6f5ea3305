"""Compressors each broken in one way, for the kit's own tests: every check of
``ringcomp.testing`` must fail on the one broken its way (``BROKEN``: class -> property).
Not registered on import (the suites enumerate the registry): ``registered`` adds one for a
test and takes it out again."""

from __future__ import annotations

import contextlib

import numpy as np

from ringcomp.compression import REGISTRY, Key
from ringcomp.compression.fp16 import Fp16
from ringcomp.compression.powersgd import PowerSGD
from ringcomp.compression.quantize import QSGD
from ringcomp.compression.randomk import RandomK
from ringcomp.compression.sign import ScaledSign
from ringcomp.compression.topk import TopK


class ExtraByteOnZeros(Fp16):
    """One byte more than declared where the data hold a zero: a size set by the data."""

    name = "broken-size"

    def encode(self, x, key):
        payload = super().encode(x, key)
        return np.append(payload, np.uint8(0)) if (x == 0).any() else payload


class LastElementUnwritten(ScaledSign):
    """Decodes all but the last element."""

    name = "broken-decode"

    def decode(self, payload, n, out):
        full = super().decode(payload, n, np.empty(n, out.dtype))
        out[:-1] = full[:-1]
        return out


class GlobalRandomness(QSGD):
    """Rounds with NumPy's global generator instead of the key's stream."""

    name = "broken-purity"

    def encode(self, x, key):
        return super().encode(x, Key(seed=int(np.random.randint(1 << 30))))


class UndeclaredRange(Fp16):
    """fp16 that does not declare where it overflows: finite input arrives as Inf."""

    name = "broken-range"
    overflows_at = None


class ClaimsUnbiased(TopK):
    """Top-k claiming to be unbiased."""

    name = "broken-bias"
    unbiased = True


class JoinDropsOwn(ScaledSign):
    """A ring hop that forwards the incoming payload without the rank's own values."""

    name = "broken-join"

    def join(self, incoming, x, have, key, scratch=None):
        return incoming.copy()


class AddKeepsFirst(RandomK):
    """Linear payloads that do not add: the first one wins."""

    name = "broken-add"

    def add(self, a, b, n):
        return a.copy()


class RankSalted(ScaledSign):
    """Encodes differently on each rank (a scale skewed by the MPI rank): the collective's
    result is no longer the replay's of the same hops."""

    name = "broken-composition"

    def encode(self, x, key):
        from mpi4py import MPI

        return super().encode(x * (1 + 0.25 * MPI.COMM_WORLD.Get_rank()), key)


class StaleScale(ScaledSign):
    """Decodes with the scale of this instance's last encode instead of the payload's."""

    name = "broken-feedback"

    def encode(self, x, key):
        payload = super().encode(x, key)
        self.last = payload[:4].copy()
        return payload

    def decode(self, payload, n, out):
        stale = payload.copy()
        stale[:4] = getattr(self, "last", payload[:4])
        return super().decode(stale, n, out)


class ForgetsWarmStart(PowerSGD):
    """PowerSGD whose state dict leaves out the warm-start factors."""

    name = "broken-state"

    def state_dict(self):
        return {}


#: each broken compressor, the property it breaks, and the fewest ranks that show it (on
#: one rank a rank-dependent encode is the replay's, and a stale scale is the rank's own)
BROKEN = [(ExtraByteOnZeros, "bytes as declared", 1),
          (LastElementUnwritten, "decode fills out", 1),
          (GlobalRandomness, "encode is pure", 1),
          (UndeclaredRange, "finite within its range", 1),
          (UndeclaredRange, "non-finite refused", 1),
          (ClaimsUnbiased, "unbiased", 1),
          (JoinDropsOwn, "hop rule as declared", 1),
          (AddKeepsFirst, "hop rule as declared", 1),
          (RankSalted, "hop composition", 2),
          (StaleScale, "error feedback's invariant", 2),
          (GlobalRandomness, "error feedback's invariant", 1),
          (ForgetsWarmStart, "state dict round trip", 1)]


@contextlib.contextmanager
def registered(cls):
    """``cls`` in the compressor registry while the block runs."""
    REGISTRY[cls.name] = cls
    try:
        yield cls.name
    finally:
        REGISTRY.pop(cls.name, None)
