"""The profile record the planners read: per-tensor backward times and collective costs.

Measured once by ``ringcomp.training.measure`` (all ranks together, every number agreed by
a max-allreduce so every rank holds the same bytes) and saved as JSON; every planner on
every rank reads the same profile, so all ranks plan identically.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from ringcomp.sched.timeline import Problem

#: message sizes of the micro-benchmark (bytes)
BENCH_BYTES = (4 << 10, 64 << 10, 512 << 10, 2 << 20)


@dataclass
class Profile:
    """What was measured.

    Attributes:
        ranks, algorithm, compressor: the setting it was measured in.
        names, sizes, backward_s: per gradient tensor in backward order: its name, bytes,
            and the backward time that ends with it (its layer's time on the layer's first
            tensor, 0 on the others), agreed across ranks (max of the per-rank medians).
        costs: alpha/beta/gamma of the exact algorithm fitted over ``BENCH_BYTES``.
        exact, compressed: (a, b) of the measured all-reduce time a + b·bytes, exact and
            with the compressor (encode, hops and decode included; None without one).
        codec: (a, b) of one local encode + decode of b bytes (None without a compressor).
        forward_s: seconds of the forward pass (agreed like the backward times).
        update_s: seconds of one step's optimizer work on the whole model (what is sent is
            prepared, the update applied) plus the step's small statistics all-reduce;
            0 in profiles written before it was measured.
        mergecomp_groups: the number of groups MergeComp's online search chose (None
            before a search ran); a resumed run reuses it instead of searching again.
    """

    ranks: int
    algorithm: str
    compressor: str | None
    names: list[str]
    sizes: list[int]
    backward_s: list[float]
    costs: dict
    exact: tuple[float, float]
    compressed: tuple[float, float] | None = None
    codec: tuple[float, float] | None = None
    forward_s: float = 0.0
    mergecomp_groups: int | None = None
    update_s: float = 0.0

    def problem(self, small_bytes: int = 0) -> Problem:
        a, b = self.exact
        compressed = None
        if self.compressed is not None:
            ca, cb = self.compressed
            compressed = lambda m: ca + cb * m  # noqa: E731 - a closure over the fit
        return Problem(self.sizes, np.cumsum(self.backward_s).tolist(),
                       lambda m: a + b * m, compressed, startup=a, small=small_bytes)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)

    @classmethod
    def load(cls, path: str) -> Profile:
        with open(path) as f:
            fields = json.load(f)
        try:
            return cls(**fields)
        except TypeError as err:
            raise ValueError(f"{path} is not a ringcomp profile: {err}") from None


def linear_fit(nbytes, seconds) -> tuple[float, float]:
    """(a, b) >= 0 of seconds ~ a + b·bytes, Hockney-style: b is the slope between the two
    largest sizes (the bandwidth regime that large buckets live in), a what is left of
    the smallest size's time (the start-up).

    Why not least squares: costs are not one straight line (a link's burst allowance,
    eager versus rendezvous protocols, caches), and a fit weighted by relative error let
    the cheap small sizes set the slope - 9x too flat on a 100 Mbit/s link, where a
    64 KB message passes in the burst."""
    order = np.argsort(np.asarray(nbytes, float))
    x, y = np.asarray(nbytes, float)[order], np.asarray(seconds, float)[order]
    b = max(0.0, (y[-1] - y[-2]) / (x[-1] - x[-2])) if len(x) > 1 and x[-1] > x[-2] else 0.0
    return float(max(0.0, y[0] - b * x[0])), float(b)
