"""When a run has reached a target accuracy for good, and how two methods' times to it
compare seed by seed: the time-to-accuracy study's measures.

A first crossing of a target is a first-passage time of a noisy curve: one lucky
evaluation ends it. The study judges instead the *sustained crossing*:

1. The moving average of ``WINDOW`` consecutive evaluations (from the ``WINDOW``-th on).
2. The sustained crossing is the first evaluation from which that average stays at or
   above the target through the run's last evaluation; the steps taken there are the
   steps to the target (None: the last average is below it).
3. Invariant: it needs the whole run; a run cut at its sustained step (the timing runs)
   takes the same steps and computes the same numbers up to it.

Two methods are compared by the ratio of their times to the target on the same seed (same
data order, same initial weights): the geometric mean of the ratios and its 95% Student-t
interval (on the logs), a verdict only where the interval leaves out 1.
"""

from __future__ import annotations

import math

import numpy as np

from ringcomp.runs import ci95

#: evaluations averaged (every 16 steps in the study: 48 steps)
WINDOW = 3


def moving_average(accuracies: list[float], window: int = WINDOW) -> list[float]:
    """The mean of every ``window`` consecutive accuracies (len - window + 1 of them)."""
    values = np.asarray(accuracies, dtype=float)
    if len(values) < window:
        return []
    return list(np.convolve(values, np.ones(window) / window, mode="valid"))


def sustained_step(evaluations: list, target: float, window: int = WINDOW) -> int | None:
    """Steps taken at the sustained crossing of ``target`` (step 2) by ``evaluations``
    ([steps taken, accuracy] in order); None when the last average is below it."""
    averages = moving_average([acc for _, acc in evaluations], window)
    if not averages or averages[-1] < target:
        return None
    first = len(averages) - 1
    while first > 0 and averages[first - 1] >= target:
        first -= 1
    return int(evaluations[first + window - 1][0])


def final_level(evaluations: list, window: int = WINDOW) -> float | None:
    """The run's final accuracy level: the mean of its last ``window`` evaluations."""
    averages = moving_average([acc for _, acc in evaluations], window)
    return float(averages[-1]) if averages else None


def target_below(levels: list[float], near: float) -> tuple[float, float]:
    """(target, margin) below seed-to-seed final ``levels``: the mean minus the larger of
    ``near`` and the 95% half-width, and at least ``near / 2`` below the lowest seed, so
    that every seed's plateau lies clear above it (a target inside the seeds' spread is
    crossed by some seeds only by luck)."""
    mean = float(np.mean(levels))
    target = min(mean - max(near, ci95(levels)), min(levels) - near / 2)
    return target, mean - target


def paired_ratio(times: list[float | None], reference: list[float | None]) -> dict | None:
    """``times`` over ``reference`` seed by seed (the same seeds in the same order): the
    geometric mean ratio and its 95% interval; None unless every pair has both."""
    if not times or len(times) != len(reference) or None in times or None in reference:
        return None
    logs = [math.log(a / b) for a, b in zip(times, reference, strict=True)]
    mean, half = float(np.mean(logs)), ci95(logs)
    return {"ratio": math.exp(mean), "low": math.exp(mean - half),
            "high": math.exp(mean + half), "pairs": len(logs)}


def verdict(ratio: dict | None) -> str:
    """``faster``/``slower`` where the interval leaves out 1, else ``no difference shown``
    (``not comparable`` where a seed of either never got there)."""
    if ratio is None:
        return "not comparable"
    if ratio["high"] < 1:
        return "faster"
    if ratio["low"] > 1:
        return "slower"
    return "no difference shown"
