"""What the tune-for-target study decides between its runs, from their steps alone: each
rate's score, the next rate to refine toward (step 3), each family's fastest variant, the
methods that go on. Pure functions of the tuned results.

A rate scores (sweep seeds that reached the target, minus the mean steps of those that
did): more seeds reaching it first, then fewer steps. So a method that reaches the target
on some seeds only (Marsit at the trainer's default ratio) is timed at the rate where it
does most often, not at an arbitrary one."""

from __future__ import annotations

import math

from ringcomp.experiments.convergence import marsit_ratio, ring_momentum

BASELINE = "ring"
#: the resolution every timed method's rate grid is refined to around its best rate: the
#: rates beside it at most this factor apart (the default grid's 3.3x gaps halved twice,
#: to 1.35x); closer rates' steps are noise apart for a few sweep seeds
RESOLUTION = 1.4
#: rates one method's refinement may add at most (a best that keeps moving stops there)
MAX_REFINED = 8


def rate_key(steps: list) -> tuple | None:
    """A rate's score from its sweep seeds' steps to the target (None: missed or
    diverged): (seeds reached, -mean steps of those), higher is better; None: none did."""
    reached = [s for s in steps if s is not None]
    return (len(reached), -sum(reached) / len(reached)) if reached else None


def rate_keys(scores: dict) -> dict:
    """Every rate's ``rate_key`` (``grow_past_edges``' ``mean``)."""
    return {lr: rate_key(steps) for lr, steps in scores.items()}


def best_of(scores: dict) -> float:
    """The rate with the best key (the smaller on a tie); the smallest when none reached."""
    keys = {lr: k for lr, k in rate_keys(scores).items() if k is not None}
    return max(sorted(keys), key=lambda lr: keys[lr]) if keys else min(scores)


def tuned_of(scores: dict) -> dict:
    """A method's tuning from its steps per rate and sweep seed: the best rate, whether
    every sweep seed reached the target there and how many did, the mean steps of those
    that did per rate, and every seed's steps."""
    scores = {float(k): v for k, v in sorted(scores.items(), key=lambda kv: float(kv[0]))}
    lr = best_of(scores)
    return {"lr": lr, "reached": None not in scores[lr],
            "reached_seeds": sum(s is not None for s in scores[lr]),
            "steps": {str(k): None if rate_key(v) is None else -rate_key(v)[1]
                      for k, v in scores.items()},
            "steps_seeds": {str(k): v for k, v in scores.items()}}


def swept(tuned: dict) -> dict:
    """A tuning's steps per rate and seed, as the sweep gives them."""
    return {float(lr): list(seeds) for lr, seeds in tuned["steps_seeds"].items()}


def _pairs_beside(scores: dict) -> list[tuple[float, float]]:
    """The (lower, higher) pairs of the best rate and each rate swept beside it."""
    rates = sorted(scores)
    i = rates.index(best_of(scores))
    return ([(rates[i - 1], rates[i])] if i > 0 else []) + (
        [(rates[i], rates[i + 1])] if i + 1 < len(rates) else [])


def gaps_beside(scores: dict) -> list[float]:
    """The ratios between the best rate and the rates swept beside it (one at an edge):
    the resolution it was tuned to."""
    return [b / a for a, b in _pairs_beside(scores)]


def refine_rate(scores: dict) -> float | None:
    """Step 3: the next rate toward ``RESOLUTION`` around the best rate of ``scores`` (rate
    -> steps per seed): the geometric midpoint (3 significant digits) of the wider gap
    beside it while that gap is wider than ``RESOLUTION``; None once both are as narrow
    (or no rate reached the target on any seed: nothing to refine around)."""
    if all(rate_key(v) is None for v in scores.values()):
        return None
    wide = [(b / a, a, b) for a, b in _pairs_beside(scores) if b / a > RESOLUTION]
    if not wide:
        return None
    _, a, b = max(wide)
    return float(f"{math.sqrt(a * b):.3g}")


def is_marsit_variant(method: str) -> bool:
    """``ring+marsit`` or a ``ring+marsit-s<r>``: one method, its second rate apart."""
    return method == "ring+marsit" or marsit_ratio(method) is not None


def is_exact_variant(method: str) -> bool:
    """``ring`` or a ``ring-m<momentum>``: the exact ring, its momentum apart."""
    return method == BASELINE or ring_momentum(method) is not None


#: the families whose fastest variant alone goes on
FAMILIES = {"exact": is_exact_variant, "marsit": is_marsit_variant}


def _key(t: dict) -> tuple:
    steps = t["steps"][str(t["lr"])]
    return (t["reached_seeds"], -steps if steps is not None else -math.inf)


def fastest(tuned: dict, family) -> str | None:
    """The variant of ``family`` (a predicate on names) whose best rate scores best (most
    sweep seeds reached, then fewest steps); None when none reached the target on any."""
    found = [m for m, t in tuned.items() if family(m) and t["reached_seeds"]]
    return max(sorted(found), key=lambda m: _key(tuned[m])) if found else None


def best_marsit(tuned: dict) -> str | None:
    return fastest(tuned, is_marsit_variant)


def going_on(tuned: dict) -> list[str]:
    """The methods timed: the exact ring's fastest variant first (every sweep seed must
    reach the target there: it is what the others are timed against), every other method
    that reached it on a sweep seed, Marsit's fastest variant, and ``ring+marsit`` at the
    trainer's default ratio when asked for, reached or not (its time is part of the
    claim)."""
    exact = fastest(tuned, is_exact_variant)
    exact = exact if exact is not None and tuned[exact]["reached"] else None
    rest = [m for m in tuned if not any(family(m) for family in FAMILIES.values())
            and tuned[m]["reached_seeds"]]
    marsit = best_marsit(tuned)
    marsits = [m for m in tuned if m == marsit or m == "ring+marsit"]
    return [m for m in (exact, *rest, *marsits) if m is not None]


def family_of(method: str) -> str:
    """The family a method's configurations count toward: ``exact``, ``marsit``, or the
    method itself."""
    return next((name for name, member in FAMILIES.items() if member(method)), method)


def configurations(tuned: dict) -> dict:
    """Per family (and per other method): the (variant, rate) configurations swept."""
    counts = {}
    for method, t in tuned.items():
        family = family_of(method)
        counts[family] = counts.get(family, 0) + len(t["steps"])
    return counts


def describe(result: dict) -> str:
    """The tuning's outcome in a few lines (the study prints them)."""
    base, n = result["baseline"], len(result["sweep_seeds"])
    lines = [f"# exact ring tuned for accuracy: lr {base['lr']:g}, final test level "
             f"{base['test_acc']:.4f} (lowest seed {base['test_acc_min']:.4f}); test target "
             f"{result['target_test']:.4f}, validation target "
             f"{result['target_validation']:.4f}"]
    for method, t in result["tuned"].items():
        steps = t["steps"][str(t["lr"])]
        lines.append(f"# {method}: lr {t['lr']:g}, " + (
            f"{steps:.0f} steps to the validation target on {t['reached_seeds']}/{n} sweep "
            "seeds" if steps is not None else "never reached the validation target")
            + ("" if method in result["methods"] else " (not run on)"))
    return "\n".join(lines)
