"""``auto``: pick the algorithm per size and p from a measured alpha-beta-gamma model."""

from __future__ import annotations

import json
import logging
import os
import time

import numpy as np

from ringcomp import alphabeta
from ringcomp.collectives import executor
from ringcomp.collectives.base import REGISTRY, Ctx, register

log = logging.getLogger(__name__)

DEFAULT_CANDIDATES = ("ring", "tree", "dbtree", "rd", "rabenseifner", "mpi")
#: candidates without a formula: their calibration times are the model (``Measured``)
MEASURED = ("mpi",)
#: every algorithm ``auto`` can model, so may choose
KNOWN_CANDIDATES = (*sorted(alphabeta.MODELS), *MEASURED)
COSTS_ENV = "RINGCOMP_AUTO_COSTS"
CALIBRATION_SIZES = (8, 4 << 10, 64 << 10, 1 << 20, 16 << 20)
#: MPI's own Allreduce is kept unless another candidate is modelled this much faster:
#: calibration medians of near-equal algorithms on shared cores swap places by up to
#: about that much from run to run (4 ranks here: tree 45-50 us against MPI's 41-43 us
#: at 4 KB, once measured faster), and a tie goes to the library call
PREFER_NATIVE = 1.10


#: untimed rounds before each size's timed ones: a job's first few calls of a size are
#: slower (MPI's first 1 MB all-reduces took 1.5x their later time at 4 ranks here, long
#: enough to make Rabenseifner look 20% faster than MPI's own where they tie)
WARMUP = 3


def _time_candidates(transport, candidates, buf, reps: int) -> list[float]:
    """Median seconds of each candidate on ``buf``, timed round-robin after a warm-up.

    Interleaving the candidates repetition by repetition spreads the drift of a shared
    machine evenly over them, so their comparison stays fair.
    """
    times = [[] for _ in candidates]
    src = buf.copy()  # out of place, as a call without ``out=x`` runs (MPICH's in-place
    # Allreduce of 1 MB took 1.7x its out-of-place time at 4 ranks here)
    for i in range(reps + WARMUP):
        for j, name in enumerate(candidates):
            algorithm = REGISTRY[name]
            transport.barrier()
            t0 = time.perf_counter()
            executor.run(Ctx(transport, buf, "sum", name, dict(algorithm.options), None,
                             "auto calibration", src), name)
            if i >= WARMUP:
                times[j].append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in times]


def calibrate(transport, candidates=DEFAULT_CANDIDATES, sizes=CALIBRATION_SIZES,
              reps: int = 7) -> dict[str, alphabeta.Costs]:
    """Measure every candidate and fit its own alpha, beta, gamma (collective).

    Each algorithm gets its own constants: on a real network they would be shared, but
    here (shared memory, Python per-message overhead, oversubscribed cores) algorithms
    differ in how well they overlap copies, reductions and scheduling, and one global fit
    mispredicts which bandwidth-bound algorithm wins.

    Steps:
      1. Time every candidate at every calibration size on this very world (median of
         ``reps`` round-robin repetitions after a warm-up, fewer for the largest size;
         each sample is the slowest rank's time).
      2. Rank 0 fits (alpha, beta, gamma) per algorithm to its samples (``fit_for_choice``:
         non-negative relative least squares, Hockney-style where that mispredicts the
         largest size) and broadcasts them, so every rank holds identical constants and
         therefore chooses identical algorithms. MPI's own Allreduce has no formula (the
         library switches algorithms by size): its samples themselves are its model
         (``alphabeta.Measured``). The others keep their samples beside their constants
         (``alphabeta.Calibrated``): within the calibrated sizes the measurements rank
         them, beyond the largest the fitted formula extrapolates.
    """
    samples = []
    for nbytes in sizes:
        buf = np.zeros(max(1, nbytes // 4), np.float32)
        # latency-bound sizes are cheap and noisy (oversubscribed cores): five times the
        # repetitions up to 64 KB, three times up to 1 MB; the largest, half
        count = (5 * reps if nbytes <= (64 << 10) else 3 * reps if nbytes <= (1 << 20)
                 else reps if nbytes < (4 << 20) else max(3, reps // 2))
        medians = _time_candidates(transport, candidates, buf, count)
        samples += [(name, buf.nbytes, t) for name, t in zip(candidates, medians, strict=True)]
    slowest = transport.allgather_obj([s[2] for s in samples])
    samples = [(n, b, max(ts[i] for ts in slowest)) for i, (n, b, _) in enumerate(samples)]
    costs = None
    if transport.rank == 0:
        costs = {}
        for name in candidates:
            mine = [s for s in samples if s[0] == name]
            sizes, seconds = tuple(float(s[1]) for s in mine), tuple(s[2] for s in mine)
            costs[name] = (alphabeta.Measured(sizes, seconds) if name in MEASURED else
                           alphabeta.Calibrated(fit_for_choice(mine, transport.size), sizes,
                                                seconds))
    return transport.bcast_obj(costs)


#: the relative least-squares fit is kept while it predicts the largest calibration size
#: within this factor (on shared memory it stays within 1.7x at 3-8 ranks)
LARGEST_SIZE_FACTOR = 2.0


def fit_for_choice(samples, p: int) -> alphabeta.Costs:
    """Relative least squares (``alphabeta.fit``), unless it mispredicts the largest size
    by more than LARGEST_SIZE_FACTOR: then Hockney-style (``alphabeta.fit_large``).

    Why: on a rate-limited link small messages pass within the link's burst allowance at
    memory speed, the relative fit lets them set the per-byte cost, and the model then
    calls a tree 4x faster than possible at 64 MB (measured on the 1 Gbit/s testbed:
    ``auto`` took 1.3x the ring's time there)."""
    costs = alphabeta.fit(samples, p)
    name, nbytes, seconds = max(samples, key=lambda s: s[1])
    ratio = alphabeta.predict(name, p, nbytes, costs) / seconds
    if not 1 / LARGEST_SIZE_FACTOR <= ratio <= LARGEST_SIZE_FACTOR:
        return alphabeta.fit_large(samples, p)
    return costs


def load_costs(path: str, candidates=DEFAULT_CANDIDATES) -> dict:
    """Read constants from JSON: ``{"alpha":..,"beta":..,"gamma":..}`` for every algorithm
    with a formula, or ``{"ring": {"alpha":..}, ..., "mpi": {"sizes": [..], "seconds":
    [..]}}`` per algorithm (what ``--verbose`` or ``RINGCOMP_LOG=debug`` logs)."""
    with open(path) as f:
        data = json.load(f)
    if "alpha" in data:
        shared = alphabeta.Costs(data["alpha"], data["beta"], data["gamma"])
        return dict.fromkeys((c for c in candidates if c not in MEASURED), shared)
    return {name: _constants(c) for name, c in data.items()}


def _constants(c: dict):
    if "sizes" not in c:
        return alphabeta.Costs(c["alpha"], c["beta"], c["gamma"])
    sizes, seconds = tuple(c["sizes"]), tuple(c["seconds"])
    if "alpha" not in c:
        return alphabeta.Measured(sizes, seconds)
    return alphabeta.Calibrated(alphabeta.Costs(c["alpha"], c["beta"], c["gamma"]), sizes,
                                seconds)


#: constants by the world ranks measured: another communicator over them (a torch group, a
#: Dup) reuses them, not resending the ~800 MB at 4 ranks (86 s on 100 Mbit/s links)
_CALIBRATED: dict[tuple, dict] = {}


def costs_for(transport) -> dict[str, alphabeta.Costs]:
    """The world's constants: from ``RINGCOMP_AUTO_COSTS`` (JSON) if set, else measured once
    per set of processes (its ranks all find them, or none does and all calibrate)."""
    costs = transport.kept.auto_costs
    if costs is None:
        path = os.environ.get(COSTS_ENV, "")
        ranks = transport.world_ranks()
        if path:
            costs = load_costs(path)
        elif ranks in _CALIBRATED:
            costs = _CALIBRATED[ranks]
        else:
            costs = _CALIBRATED[ranks] = calibrate(transport)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("auto constants: " + json.dumps(
                    {name: c.as_dict() for name, c in costs.items()}))
        transport.kept.auto_costs = costs
    return costs


def choose(p: int, nbytes: int, costs: dict, candidates=None) -> str:
    """The candidate with the smallest modelled time (ties: first listed), or MPI's own
    Allreduce where it is within PREFER_NATIVE of that; ``None``: the default candidates
    (``_usable``)."""
    if candidates is None:
        candidates = _usable(DEFAULT_CANDIDATES, costs, default=True)
    missing = [name for name in candidates if name not in costs]
    if missing:
        raise ValueError(f"auto: no constants for {missing}")
    times = {name: alphabeta.predict(name, p, nbytes, costs[name]) for name in candidates}
    best = min(candidates, key=times.__getitem__)
    if "mpi" in times and times["mpi"] <= PREFER_NATIVE * times[best]:
        return "mpi"
    return best


def _candidates(ctx) -> tuple[str, ...]:
    raw = ctx.options.get("candidates", DEFAULT_CANDIDATES)
    names = tuple(raw.split(",")) if isinstance(raw, str) else tuple(raw)
    bad = [n for n in names if n not in KNOWN_CANDIDATES]
    if bad:
        raise ValueError(f"auto: no cost model for {bad}; choose from {list(KNOWN_CANDIDATES)}")
    return names


def _usable(candidates, costs, default: bool) -> tuple[str, ...]:
    """The default candidates leave out those without constants (MPI's own, where they came
    from a file with one shared alpha-beta-gamma); candidates named by the user are all
    required (``choose`` says which constants are missing)."""
    if default:
        return tuple(c for c in candidates if c in costs)
    return candidates


def choice_key(nbytes: int, options: dict) -> tuple:
    """What auto's choice for a call of ``nbytes`` is kept under (``Kept.auto_choices``):
    the candidates option as given (parsed once: a repeated call pays two dictionary
    lookups on top of the algorithm it runs)."""
    raw = options.get("candidates", DEFAULT_CANDIDATES)
    return nbytes, raw if isinstance(raw, str) else tuple(raw)


def settled(transport, key: tuple) -> str | None:
    """The algorithm auto runs for every call under ``key`` from now on, or None while
    it has not decided yet or is still trying its finalists (``auto_allreduce``)."""
    decided = transport.kept.auto_choices.get(key)
    return decided if type(decided) is str else None


@register("auto", options={"candidates": ",".join(DEFAULT_CANDIDATES)}, binds="choice",
          summary="per size and p, the algorithm with the least modelled time")
def auto_allreduce(ctx) -> None:
    """Choose once per (bytes, p), then run the chosen algorithm.

    Steps:
      1. The first call of a size asks the model (``choose``, constants agreed across
         ranks). Its choice is final when it is MPI's own Allreduce or MPI is no candidate.
      2. Otherwise the next ``2 * TRIAL_CALLS`` calls of that size alternate between the
         model's choice and MPI's own, each timed where it runs (the user's own calls:
         every result is complete and correct), and the ranks keep the model's choice only
         where its calls, paired with MPI's, are PREFER_NATIVE faster (``_Trial``):
         calibration conditions are not a job's (at 1 MB the model took Rabenseifner where
         MPI's own was 20% faster in the job).
    Every rank takes the same steps on the same calls, so all run the same algorithm.
    """
    if ctx.size == 1 or ctx.buf.size == 0:
        ctx.materialize()
        return
    key = choice_key(ctx.buf.nbytes, ctx.options)
    decided = ctx.t.kept.auto_choices.get(key)
    if decided is None:  # 1.
        candidates = _candidates(ctx)
        costs = costs_for(ctx.t)
        default = ctx.options.get("candidates") == ",".join(DEFAULT_CANDIDATES)
        usable = _usable(candidates, costs, default)
        decided = choose(ctx.size, ctx.buf.nbytes, costs, usable)
        if decided != "mpi" and "mpi" in usable:
            decided = _Trial((decided, "mpi"))
        ctx.t.kept.auto_choices[key] = decided
    trial = decided if isinstance(decided, _Trial) else None
    name = trial.next() if trial else decided
    ctx.chosen = ctx.t.kept.auto_last = name
    ctx.options = dict(REGISTRY[name].options)  # the chosen algorithm runs with its defaults
    if trial is None:
        executor.run(ctx, name)
        return
    t0 = time.perf_counter()  # 2.
    executor.run(ctx, name)
    trial.record(name, time.perf_counter() - t0)
    if trial.complete():
        ctx.t.kept.auto_choices[key] = trial.verdict(ctx.t)


#: timed calls of each finalist that settle a size in a trial (``auto_allreduce`` step 2)
TRIAL_CALLS = 7


class _Trial:
    """The model's choice against MPI's own, on a job's real calls of one size."""

    def __init__(self, finalists: tuple[str, str]):
        self.finalists = finalists
        self.times: dict[str, list[float]] = {name: [] for name in finalists}
        self.calls = 0

    def next(self) -> str:
        return self.finalists[self.calls % 2]

    def record(self, name: str, seconds: float) -> None:
        self.times[name].append(seconds)
        self.calls += 1

    def complete(self) -> bool:
        return self.calls >= 2 * TRIAL_CALLS

    def verdict(self, transport) -> str:
        """The model's choice if it is PREFER_NATIVE faster than MPI's own, else MPI's own
        (one tiny Allreduce, made by every rank on the same call). Compared pair by pair
        (call 2i, the model's, against call 2i + 1, MPI's, made right after it): the
        median of the pairs' ratios, on the rank where it is worst. Single calls scatter
        widely on shared cores and the load drifts while a trial runs; a pair sees one
        load, so drift cancels where medians of each side apart let it decide (a 1 MB
        trial kept Rabenseifner that then ran 1.2x MPI's time), and a near tie costs
        nothing either way."""
        model, native = (np.asarray(self.times[name]) for name in self.finalists)
        ratio = float(np.median(model / np.maximum(native, 1e-12)))
        _, worst = transport.agree([int(ratio * 1e6)])
        faster = worst[0] * PREFER_NATIVE < 1e6
        return self.finalists[0] if faster else self.finalists[1]
