"""What the tune-for-target study decides between its runs, from their steps alone: the
next rate to bisect toward (step 3), each family's fastest variant, the methods that go
on, and the configurations each family swept. Pure functions of the tuned results."""

from __future__ import annotations

import itertools
import math

from ringcomp.experiments.convergence import best_rate, marsit_ratio, mean_scores, ring_momentum

BASELINE = "ring"
#: the narrowest gap between two rates (their ratio) that step 3 still bisects: halving
#: a narrower one gives rates under 10% apart, whose steps to the target a few sweep
#: seeds do not tell apart here (the default grid's 3.3x gaps are halved twice, to 1.35x)
MIN_GAP = 1.2


def tuned_of(scores: dict) -> dict:
    """A method's tuning from its negated steps per rate: the rate with the fewest mean
    steps, whether it reached the target, the steps per rate and per seed."""
    scores = dict(sorted(scores.items()))
    means = mean_scores(scores)
    lr = best_rate(means)
    return {"lr": lr, "reached": means[lr] is not None,
            "steps": {str(k): None if v is None else -v for k, v in means.items()},
            "steps_seeds": {str(k): [None if s is None else -s for s in v]
                            for k, v in scores.items()}}


def negated(tuned: dict) -> dict:
    """A tuning's per-seed steps back as the sweep's gives them."""
    return {float(lr): [None if s is None else -s for s in seeds]
            for lr, seeds in tuned["steps_seeds"].items()}


def refine_rate(steps: dict) -> float | None:
    """Step 3: the next rate to sweep for a variant whose mean steps per rate (str or
    float keys; None: missed) are ``steps`` - a bisection around its best rate (the middle
    rate swept when none reached). Of the geometric midpoints between rates swept side by
    side at least ``MIN_GAP`` apart (3 significant digits) and not swept yet: the one
    splitting the wider of the two gaps beside the best rate, then the one nearest it (in
    log); a tie goes toward the pair with the faster end, then the smaller rate. A single
    rate swept: half a decade either side. None when no such gap is left."""
    rates = sorted(float(r) for r in steps)
    mean = {float(r): s for r, s in steps.items()}
    reached = {r: s for r, s in mean.items() if s is not None}
    centre = (min(reached, key=lambda r: (reached[r], r)) if reached
              else rates[len(rates) // 2])
    pairs = (list(itertools.pairwise(rates))
             or [(centre / 10, centre), (centre, centre * 10)])

    def faster_end(a, b):  # of the pair's ends other than the best
        return min((mean[r] for r in (a, b) if r != centre and mean.get(r) is not None),
                   default=math.inf)

    candidates = []
    for a, b in pairs:
        mid = float(f"{math.sqrt(a * b):.3g}")
        # rates closer than MIN_GAP apart are not told apart by a few sweep seeds:
        # bisecting further would chase their noise, so the budget goes elsewhere
        if mid not in mean and b / a >= MIN_GAP:
            beside = a <= centre <= b  # a gap next to the best: the wider first
            order = -math.log(b / a) if beside else abs(math.log(mid / centre))
            candidates.append((not beside, round(order, 9), faster_end(a, b), mid))
    return min(candidates)[3] if candidates else None


def is_marsit_variant(method: str) -> bool:
    """``ring+marsit`` or a ``ring+marsit-s<r>``: one method, its second rate apart."""
    return method == "ring+marsit" or marsit_ratio(method) is not None


def is_exact_variant(method: str) -> bool:
    """``ring`` or a ``ring-m<momentum>``: the exact ring, its momentum apart."""
    return method == BASELINE or ring_momentum(method) is not None


#: the families of step 3: one variant of each goes on
FAMILIES = {"exact": is_exact_variant, "marsit": is_marsit_variant}


def fastest(tuned: dict, family) -> str | None:
    """Step 3: the variant of ``family`` (a predicate on names) with the fewest steps at
    its rate; None when none was asked for or none reached the target."""
    found = {m: t["steps"][str(t["lr"])] for m, t in tuned.items()
             if family(m) and t["reached"]}
    return min(found, key=lambda m: (found[m], m)) if found else None


def best_marsit(tuned: dict) -> str | None:
    return fastest(tuned, is_marsit_variant)


def going_on(tuned: dict) -> list[str]:
    """Step 3: the methods timed, the exact ring's fastest variant first; the others in
    the order tuned."""
    best = {name: fastest(tuned, family) for name, family in FAMILIES.items()}
    rest = [m for m in tuned if not any(family(m) for family in FAMILIES.values())
            and tuned[m]["reached"]]
    marsits = [m for m in tuned if m == best["marsit"] or m == "ring+marsit"]
    return [m for m in (best["exact"], *rest, *marsits) if m is not None]


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
