"""Alpha-beta-gamma cost model of the exact all-reduce algorithms, and its fitting.

alpha: seconds per message (start-up, including Python's per-message overhead here),
beta: seconds per byte on the wire, gamma: seconds per byte of local reduction. Every
formula is linear in (alpha, beta, gamma), so each returns its three coefficients and the
constants can be fitted to measured times by non-negative least squares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ringcomp.partition import ceil_log2, largest_power_of_two_at_most


@dataclass(frozen=True)
class Costs:
    """Constants of one machine and world size."""

    alpha: float
    beta: float
    gamma: float

    def as_dict(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta, "gamma": self.gamma}


@dataclass(frozen=True)
class Measured:
    """An algorithm without a formula: MPI's own Allreduce, which switches algorithms by
    size inside the library. Its times at the calibration sizes, interpolated linearly in
    log-log between them, below the smallest its time; above the largest it is unknown
    (infinite: not chosen), since the library may switch again (MPICH's 64 MB all-reduce
    took 6x its 16 MB time here, where the bandwidth alone says 4x)."""

    sizes: tuple[float, ...]
    seconds: tuple[float, ...]

    def at(self, nbytes: float) -> float:
        if nbytes > self.sizes[-1]:
            return math.inf
        logs = np.log(np.maximum(np.asarray(self.sizes, float), 1.0))
        return float(np.exp(np.interp(math.log(max(nbytes, 1.0)), logs,
                                      np.log(np.asarray(self.seconds, float)))))

    def as_dict(self) -> dict:
        return {"sizes": list(self.sizes), "seconds": list(self.seconds)}


@dataclass(frozen=True)
class Calibrated:
    """An algorithm with a formula, calibrated on this world: within the calibrated sizes
    its own measured times decide (interpolated as ``Measured``), outside them its fitted
    constants ``costs``. One fitted curve through noisy points mis-ranked near-equal
    algorithms where they were measured (4 ranks here: rd chosen at 4 KB, tree at 64 KB,
    Rabenseifner at 1 MB, each 5-20% slower than MPI's own Allreduce)."""

    costs: Costs
    sizes: tuple[float, ...]
    seconds: tuple[float, ...]

    def measured(self, nbytes: float) -> float | None:
        """The interpolated measurement, or None outside the calibrated sizes."""
        if not self.sizes[0] <= nbytes <= self.sizes[-1]:
            return None
        return Measured(self.sizes, self.seconds).at(nbytes)

    def as_dict(self) -> dict:
        return {**self.costs.as_dict(), "sizes": list(self.sizes),
                "seconds": list(self.seconds)}


def _fold(p: int, nbytes: float) -> tuple[float, float, float]:
    """Folding a non-power-of-two world: one hop in, one hop out, one add."""
    if p == largest_power_of_two_at_most(p):
        return (0.0, 0.0, 0.0)
    return (2.0, 2.0 * nbytes, nbytes)


def ring(p: int, nbytes: float):
    """2(p-1) hops of n/p bytes each. Segments inside a hop are pipelined, so the start-up
    cost is paid per hop, not per segment."""
    if p == 1:
        return (0.0, 0.0, 0.0)
    return (2 * (p - 1), 2 * (p - 1) / p * nbytes, (p - 1) / p * nbytes)


def tree(p: int, nbytes: float):
    """Binomial reduce + broadcast: 2 ceil(log2 p) rounds of the full vector."""
    rounds = ceil_log2(p)
    return (2 * rounds, 2 * rounds * nbytes, rounds * nbytes)


def rd(p: int, nbytes: float):
    """log2(p2) full-vector exchanges plus the fold."""
    rounds = ceil_log2(largest_power_of_two_at_most(p))
    fa, fb, fg = _fold(p, nbytes)
    return (rounds + fa, rounds * nbytes + fb, rounds * nbytes + fg)


def rabenseifner(p: int, nbytes: float):
    """2 log2(p2) hops moving 2(p2-1)/p2 of the vector, plus the fold."""
    p2 = largest_power_of_two_at_most(p)
    rounds = ceil_log2(p2)
    fa, fb, fg = _fold(p, nbytes)
    return (2 * rounds + fa, 2 * (p2 - 1) / p2 * nbytes + fb, (p2 - 1) / p2 * nbytes + fg)


def dbtree(p: int, nbytes: float, segment_bytes: float = 256 << 10):
    """Pipelined double binary tree: each half crosses depth ~log2 p in S segments.

    A node sends each segment to up to three peers (parent, two children) and both halves
    share its link, so one pipeline stage costs about three segment transfers.
    """
    if p == 1:
        return (0.0, 0.0, 0.0)
    depth = ceil_log2(p + 1)
    half = nbytes / 2
    segments = max(1, math.ceil(half / segment_bytes))
    seg = half / segments
    stages = 2 * (depth + segments - 1)
    return (2 * stages, 3 * seg * stages, seg * stages)


def allgather(p: int, nbytes: float):
    """p - 1 hops of the full vector (each rank's input to every other), each added."""
    return (p - 1, (p - 1) * nbytes, (p - 1) * nbytes)


#: the algorithms auto chooses among by these formulas (``collectives.auto``)
MODELS = {"ring": ring, "tree": tree, "rd": rd, "rabenseifner": rabenseifner, "dbtree": dbtree}
#: every algorithm's formula, the one table of them: the registry's entries
#: (``Algorithm.cost``) and the planners (``sched/costs``) read it. Exact two-stage moves
#: the ring's bytes (a reduce-scatter, then an all-gather)
COSTS = {**MODELS, "allgather": allgather, "twostage": ring}


def coefficients(algorithm: str, p: int, nbytes: float) -> tuple[float, float, float]:
    """(alpha, beta, gamma) coefficients of one all-reduce of ``nbytes`` over ``p`` ranks."""
    if algorithm not in COSTS:
        raise ValueError(f"no cost formula for algorithm {algorithm!r}; known: "
                         f"{', '.join(sorted(COSTS))}")
    return COSTS[algorithm](p, nbytes)


def predict(algorithm: str, p: int, nbytes: float, c: Costs | Measured | Calibrated) -> float:
    """Modelled seconds of one exact all-reduce of ``nbytes`` over ``p`` ranks (``Measured``
    constants, and ``Calibrated`` ones within their sizes: interpolated from the times
    measured on this world)."""
    if isinstance(c, Measured):
        return c.at(nbytes)
    if isinstance(c, Calibrated):
        seconds = c.measured(nbytes)
        if seconds is not None:
            return seconds
        c = c.costs
    ca, cb, cg = coefficients(algorithm, p, nbytes)
    return ca * c.alpha + cb * c.beta + cg * c.gamma


def fit(samples, p: int) -> Costs:
    """Fit (alpha, beta, gamma) >= 0 to measured ``(algorithm, nbytes, seconds)`` samples.

    Minimises the *relative* squared error (small and large messages count alike) by
    non-negative least squares (``scipy.optimize.nnls``).
    """
    # imported here, not at the top: scipy.optimize costs 0.6 s per process, and every rank
    # of every job imports this module while few ever fit (auto's first call, studies)
    from scipy.optimize import nnls

    rows = [[c / max(seconds, 1e-9) for c in coefficients(algorithm, p, nbytes)]
            for algorithm, nbytes, seconds in samples]
    if not rows:
        return Costs(0.0, 0.0, 0.0)
    solution, _ = nnls(np.asarray(rows, dtype=float), np.ones(len(rows)))
    return Costs(*map(float, solution))


def fit_large(samples, p: int) -> Costs:
    """Hockney-style constants of one algorithm's ``(algorithm, nbytes, seconds)`` samples:
    the per-byte cost from the two largest sizes (gamma folded into beta), alpha from
    what remains of the smallest size's time. Exact at those sizes whatever the curve
    does in between (a link's burst allowance, protocol switches)."""
    ordered = sorted(samples, key=lambda s: s[1])
    if len(ordered) < 3:
        return fit(samples, p)
    (name, m0, t0), (_, m1, t1), (_, m2, t2) = ordered[0], ordered[-2], ordered[-1]
    a0, b0, _ = coefficients(name, p, m0)
    b1, b2 = coefficients(name, p, m1)[1], coefficients(name, p, m2)[1]
    # the alpha term's growth between the two (pipeline segments) is charged to beta
    beta = max(0.0, (t2 - t1) / (b2 - b1)) if b2 > b1 else 0.0
    alpha = max(0.0, (t0 - b0 * beta) / a0) if a0 > 0 else 0.0
    return Costs(alpha, beta, 0.0)
