"""``auto``: pick the algorithm per size and p from a measured alpha-beta-gamma model."""

from __future__ import annotations

import json
import os
import time

import numpy as np

from ringcomp import perfmodel
from ringcomp.collectives.base import REGISTRY, Ctx, register

DEFAULT_CANDIDATES = ("ring", "tree", "dbtree", "rd", "rabenseifner")
_ENV_FILE = "RINGCOMP_AUTO_COSTS"
CALIBRATION_SIZES = (8, 16 << 10, 256 << 10, 2 << 20)


def _time_algorithm(transport, name: str, buf, reps: int) -> float:
    """Median seconds of ``reps`` runs of a registered algorithm on ``buf`` (after a warm-up)."""
    algorithm = REGISTRY[name]
    times = []
    for i in range(reps + 1):
        transport.barrier()
        t0 = time.perf_counter()
        algorithm.run(Ctx(transport, buf, "sum", name, dict(algorithm.options), None,
                          "auto calibration"))
        if i:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def calibrate(transport, candidates=DEFAULT_CANDIDATES, sizes=CALIBRATION_SIZES,
              reps: int = 5) -> perfmodel.Costs:
    """Measure the candidates and fit alpha, beta, gamma to them (collective).

    Steps:
      1. Time every candidate algorithm at every calibration size on this very world
         (median of ``reps`` after a warm-up; each sample is the slowest rank's time).
      2. Rank 0 fits the three constants to all samples (``perfmodel.fit``: non-negative,
         relative least squares) and broadcasts them, so every rank holds identical
         constants and therefore chooses identical algorithms.
    """
    samples = []
    for nbytes in sizes:
        buf = np.zeros(max(1, nbytes // 4), np.float32)
        for name in candidates:
            samples.append((name, buf.nbytes, _time_algorithm(transport, name, buf, reps)))
    slowest = transport.allgather_obj([s[2] for s in samples])
    samples = [(n, b, max(ts[i] for ts in slowest)) for i, (n, b, _) in enumerate(samples)]
    costs = perfmodel.fit(samples, transport.size) if transport.rank == 0 else None
    return transport.bcast_obj(costs)


def costs_for(transport) -> perfmodel.Costs:
    """The world's constants: from ``RINGCOMP_AUTO_COSTS`` (JSON) if set, else measured once."""
    costs = transport.cache.get("auto-costs")
    if costs is None:
        path = os.environ.get(_ENV_FILE, "")
        if path and os.path.exists(path):
            with open(path) as f:
                data = json.load(f)
            costs = perfmodel.Costs(data["alpha"], data["beta"], data["gamma"])
        else:
            costs = calibrate(transport)
            if transport.rank == 0 and os.environ.get("RINGCOMP_AUTO_VERBOSE"):
                print(f"# auto: fitted {costs}", flush=True)
        transport.cache["auto-costs"] = costs
    return costs


def choose(p: int, nbytes: int, costs: perfmodel.Costs, candidates=DEFAULT_CANDIDATES) -> str:
    """The candidate with the smallest modelled time (ties: first listed)."""
    return min(candidates, key=lambda name: perfmodel.predict(name, p, nbytes, costs))


def _candidates(ctx) -> tuple[str, ...]:
    raw = ctx.options.get("candidates", DEFAULT_CANDIDATES)
    names = tuple(raw.split(",")) if isinstance(raw, str) else tuple(raw)
    bad = [n for n in names if n not in perfmodel.MODELS]
    if bad:
        raise ValueError(f"auto: no cost model for {bad}; choose from {sorted(perfmodel.MODELS)}")
    return names


@register("auto", options={"candidates": ",".join(DEFAULT_CANDIDATES)},
          summary="per size and p, the algorithm with the least modelled time")
def auto_allreduce(ctx) -> None:
    """Choose once per (bytes, p) from measured constants, then run the chosen algorithm.

    The constants are agreed across ranks, so every rank runs the same algorithm.
    """
    if ctx.size == 1 or ctx.buf.size == 0:
        return
    candidates = _candidates(ctx)
    key = ("auto-choice", ctx.buf.nbytes, candidates)
    name = ctx.t.cache.get(key)
    if name is None:
        name = choose(ctx.size, ctx.buf.nbytes, costs_for(ctx.t), candidates)
        ctx.t.cache[key] = name
    ctx.chosen = ctx.t.cache["auto-last"] = name
    ctx.options = dict(REGISTRY[name].options)  # the chosen algorithm runs with its defaults
    REGISTRY[name].run(ctx)
