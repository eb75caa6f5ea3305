"""The convergence study's design: the rate grid grows past an edge where the best rate sits."""

from __future__ import annotations

import math

import pytest

from ringcomp.experiments import convergence


@pytest.mark.parametrize("optimum, grown", [
    (0.03, []),                    # inside the grid: nothing more to sweep
    (0.001, [[0.00333], [0.00111]]),  # below it: two geometric steps down, then EXTEND stops
    (1.0, [[0.9], [2.7]]),         # above it: up to 0.9, and one more step shows 0.9 inside
])
def test_the_grid_grows_past_an_edge_where_the_best_rate_sits(monkeypatch, optimum, grown):
    calls = []

    def fake_sweep(transport, base, method, lrs, seeds):
        calls.append(list(lrs))
        return {lr: [-abs(math.log(lr / optimum)) - 0.01 * s for s in range(len(seeds))]
                for lr in lrs}

    monkeypatch.setattr(convergence, "sweep", fake_sweep)
    scores = convergence.sweep_until_inside(None, [], "ring", [0.01, 0.03, 0.1, 0.3], [1, 2])
    assert calls == [[0.01, 0.03, 0.1, 0.3], *grown]
    assert list(scores) == sorted(scores)  # the rates in order, the new ones among them
    assert convergence.EXTEND == 2


def test_a_rate_that_diverges_past_the_edge_ends_the_growth(monkeypatch):
    def fake_sweep(transport, base, method, lrs, seeds):  # better and better, until NaN
        return {lr: [None if lr > 0.5 else lr] for lr in lrs}

    monkeypatch.setattr(convergence, "sweep", fake_sweep)
    scores = convergence.sweep_until_inside(None, [], "ring", [0.01, 0.03, 0.1, 0.3], [1])
    assert sorted(scores) == [0.01, 0.03, 0.1, 0.3, 0.9]
    assert convergence.best_rate(convergence.mean_scores(scores)) == 0.3
