"""Time to accuracy's measures: a sustained crossing of the target, the target clear below
every exact seed, seed-paired ratios with intervals as the verdict, and findings only where
every repeat agrees."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ringcomp.experiments.crossing import (
    WINDOW,
    final_level,
    moving_average,
    paired_ratio,
    sustained_step,
    target_below,
    verdict,
)
from ringcomp.experiments.time_to_accuracy_tables import findings, render, summarize


def evaluations(accuracies, every=16):
    return [[every * (i + 1), a] for i, a in enumerate(accuracies)]


def test_a_lucky_evaluation_is_no_crossing_a_sustained_one_is():
    """One evaluation above the target, then a fall back: not there yet; the crossing is
    the first evaluation from which the mean of the last three stays above to the end."""
    assert WINDOW == 3
    curve = evaluations([0.1, 0.7, 0.2, 0.3, 0.6, 0.65, 0.7, 0.66, 0.7])
    # the averages end at evaluations 3..9
    assert moving_average([a for _, a in curve]) == pytest.approx(
        [0.3333333, 0.4, 0.3666667, 0.5166667, 0.65, 0.67, 0.6866667])
    assert sustained_step(curve, 0.6) == 16 * 7  # 0.517 at the 6th, 0.65 from the 7th on
    assert sustained_step(curve, 0.66) == 16 * 8  # 0.65 at the 7th, 0.67 from the 8th on
    # (a first crossing would have said step 32: 0.7 at the 2nd evaluation)
    assert sustained_step(curve, 0.69) is None  # the last average 0.687 is below it
    assert final_level(curve) == pytest.approx((0.7 + 0.66 + 0.7) / 3)
    # a dip of the average after a crossing moves it to after the dip
    dip = evaluations([0.8, 0.8, 0.8, 0.2, 0.8, 0.8, 0.8])
    assert sustained_step(dip, 0.7) == 16 * 7  # 0.8 at the 3rd, 0.6 at the 4th-6th
    assert sustained_step(evaluations([0.9, 0.9]), 0.1) is None  # under one window
    assert final_level(evaluations([0.9])) is None


def test_the_target_lies_clear_below_every_exact_seed():
    """Mean minus the larger of --near and the 95% half-width, and at least near/2 below
    the lowest seed: a seed ending below mean - near moves the target under it."""
    target, margin = target_below([0.70, 0.70, 0.70], 0.01)
    assert target == pytest.approx(0.69) and margin == pytest.approx(0.01)
    levels = [0.68, 0.684, 0.6836, 0.6673, 0.6844]  # the record's seeds at 3f8ee10
    target, margin = target_below(levels, 0.01)
    half = stats.t.ppf(0.975, 4) * np.std(levels, ddof=1) / math.sqrt(5)
    assert half < 0.01 + (np.mean(levels) - min(levels))  # the lowest seed decides
    assert target == pytest.approx(min(levels) - 0.005)
    assert all(level - target >= 0.005 - 1e-12 for level in levels)
    assert margin == pytest.approx(np.mean(levels) - target)


def test_paired_ratios_are_geometric_means_with_t_intervals_on_the_logs():
    times, exact = [2.0, 3.0, 4.5], [4.0, 5.0, 9.0]
    logs = np.log(np.array(times) / np.array(exact))
    half = stats.t.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    r = paired_ratio(times, exact)
    assert r["ratio"] == pytest.approx(math.exp(logs.mean()))
    assert (r["low"], r["high"]) == pytest.approx((math.exp(logs.mean() - half),
                                                   math.exp(logs.mean() + half)))
    assert verdict(r) == "faster" and r["pairs"] == 3
    assert verdict(paired_ratio([5, 6, 7], [4, 5, 6])) == "slower"
    assert verdict(paired_ratio([3, 6, 7], [4, 5, 6])) == "no difference shown"
    # a seed that never got there: no ratio, no verdict
    assert paired_ratio([1, None], [2, 3]) is None and verdict(None) == "not comparable"
    assert paired_ratio([1, 2], [2]) is None


def _rows(rate, repeat, seconds_by_method, steps=100):
    return [{"rate_bps": rate, "repeat": repeat, "method": m, "seed": s, "lr": 0.1,
             "steps": steps if t is not None else None, "seconds": t,
             "step_s": None if t is None else t / steps, "steps_agree": True}
            for m, ts in seconds_by_method.items() for s, t in enumerate(ts)]


def test_a_verdict_is_a_finding_only_where_every_repeat_gives_it():
    """Two passes: the sign faster than exact in both (a finding); Marsit faster in one,
    no difference in the other (unstable); a method that never got there is not
    comparable in both."""
    found = (_rows(1e9, 0, {"ring": [10, 11, 12], "ring+sign": [6, 7, 7.5],
                            "ring+marsit": [7, 8, 8.5], "ring+marsit-s0.1": [None] * 3})
             + _rows(1e9, 1, {"ring": [10, 11, 12], "ring+sign": [6.5, 7, 8],
                              "ring+marsit": [7, 12, 9], "ring+marsit-s0.1": [None] * 3}))
    rows = summarize(found, "ring")
    by = {(r["repeat"], r["method"]): r for r in rows}
    assert by[(0, "ring")]["vs_exact"]["ratio"] == pytest.approx(1.0)
    assert by[(0, "ring+marsit")]["verdict"] == "faster"
    assert by[(1, "ring+marsit")]["verdict"] == "no difference shown"
    # the split: equal steps, so the time ratio is the time-per-step ratio
    assert by[(0, "ring+sign")]["steps_ratio"]["ratio"] == pytest.approx(1.0)
    assert by[(0, "ring+sign")]["step_time_ratio"]["ratio"] == pytest.approx(
        by[(0, "ring+sign")]["vs_exact"]["ratio"])
    assert findings(rows) == {(1e9, "ring"): "no difference shown",
                              (1e9, "ring+sign"): "faster", (1e9, "ring+marsit"): "unstable",
                              (1e9, "ring+marsit-s0.1"): "not comparable"}
    tuning = {"provenance": {"command": "c", "commit": "0" * 40, "date": "d"},
              "baseline": {"lr": 0.1, "test_acc": 0.7, "test_acc_min": 0.69, "margin": 0.02},
              "window": 3, "near": 0.01, "target_validation": 0.7, "sweep_seeds": [1, 2],
              "resolution": 1.4, "exact": "ring",
              "methods": ["ring", "ring+sign", "ring+marsit", "ring+marsit-s0.1"],
              "tuned": {m: {"lr": 0.1, "steps": {"0.1": 50.0}, "steps_seeds": {"0.1": [50, 50]}}
                        for m in ("ring", "ring+sign", "ring+marsit", "ring+marsit-s0.1")},
              "gaps": {"ring": [1.35, 1.35]}}
    text = render({"repeats": 2, "tuning": tuning, "rows": rows, "seeds": [0, 1, 2],
                   "hosts": 4, "ranks_per_host": 1, "base": "b", "target": 0.68})
    assert "| 1 Gbit/s | faster | unstable | not comparable |" in text
    assert "| 1 Gbit/s | 2 | ring+marsit (lr 0.1) | 3/3 |" in text
