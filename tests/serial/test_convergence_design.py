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


def test_marsit_second_rate_methods_take_any_ratio():
    assert convergence.marsit_ratio("ring+marsit-s0.003") == 0.003
    assert convergence.marsit_ratio("ring+marsit-s1e-05") == 1e-05
    for name in ("ring+marsit", "ring+marsit-s0", "ring+marsit-s-1", "ring+marsit-sx",
                 "tree+marsit-s0.1", "ring+marsit-s0.1x"):
        assert convergence.marsit_ratio(name) is None
        assert (name in convergence.METHODS) == (name == "ring+marsit")
    assert "ring+marsit-s0.003" in convergence.METHODS
    assert convergence.METHODS["ring+marsit-s0.003"] == ["--compressor", "marsit"]
    with pytest.raises(KeyError):
        convergence.METHODS["ring+nothing"]


def _chosen(best_by_ratio: dict) -> dict:
    """run_task's record of the Marsit methods: their best mean validation per ratio."""
    def name(ratio):
        return "ring+marsit" if ratio == 0.1 else f"ring+marsit-s{ratio:g}"
    return {name(r): (0.1, {0.03: None if acc is None else acc - 0.01, 0.1: acc}, {})
            for r, acc in best_by_ratio.items()}


@pytest.mark.parametrize("best_by_ratio, more", [
    ({0.01: 0.95, 0.03: 0.94, 0.1: 0.93, 0.3: 0.90}, "ring+marsit-s0.00333"),  # below
    ({0.01: 0.90, 0.03: 0.94, 0.1: 0.93, 0.3: 0.91}, None),                     # inside
    ({0.01: 0.90, 0.03: 0.91, 0.1: 0.92, 0.3: 0.95}, "ring+marsit-s0.9"),      # above
    ({0.1: 0.93}, None),                  # ring+marsit alone: no second-rate study asked
    ({0.1: 0.93, 0.03: None}, "ring+marsit-s0.333"),  # 0.03 diverged: 0.1 is best, at the top
    ({0.1: None, 0.03: None}, None),      # nothing trained: no edge to look past
])
def test_the_second_rate_grid_grows_past_its_edge(best_by_ratio, more):
    assert convergence.next_ratio(_chosen(best_by_ratio)) == more


def test_the_study_runs_the_grown_ratio(monkeypatch):
    """run_task appends the ratio next_ratio names and runs it like any method, at most
    EXTEND times (here the best stays at the smallest ratio: two more are swept)."""
    ran = []

    def fake_sweep(transport, base, method, lrs, seeds):
        ran.append(method)
        ratio = convergence.marsit_ratio(method) or 0.1
        return {lr: [1 - ratio] for lr in lrs}  # the smaller eta_s, the better

    monkeypatch.setattr(convergence, "sweep", fake_sweep)
    monkeypatch.setattr(convergence, "sweep_length", lambda base, ranks: [])
    monkeypatch.setattr(convergence, "_train", lambda transport, options: 0.5)
    args = __import__("types").SimpleNamespace(
        methods=["ring+marsit", "ring+marsit-s0.03"], lrs=[0.1], sweep_seeds=[1], seeds=[],
        target=0.9)
    transport = __import__("types").SimpleNamespace(size=2, rank=1)
    assert convergence.run_task(transport, args, "mlp", [], "unused") == []
    assert ran == ["ring+marsit", "ring+marsit-s0.03", "ring+marsit-s0.009",
                   "ring+marsit-s0.0027"]
