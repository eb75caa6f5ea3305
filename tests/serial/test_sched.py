"""Planners on the timeline model: valid plans, MG-WFBP's rule, the optimum, closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from ringcomp.sched import PLANNERS, Group, Problem, iteration_time, make_plan, timeline
from ringcomp.sched.planners import all_plans
from ringcomp.sched.search import MergeCompSearch
from ringcomp.sched.timeline import check_plan

SPECS = ["layerwise", "modelwise", "fixed:0.001", "fixed", "mgwfbp", "layerfusion", "optimal"]


def linear(a: float, b: float):
    return lambda m: a + b * m


def random_problem(seed: int, n: int, compressor: bool = True) -> Problem:
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.choice([64, 4096, 1 << 16, 1 << 20], n)]
    ready = np.cumsum(rng.exponential(1e-3, n)).tolist()
    a, b = float(rng.uniform(1e-5, 1e-3)), float(rng.uniform(1e-10, 1e-8))
    return Problem(sizes, ready, linear(a, b),
                   linear(3 * a, b / 10 + 1e-10) if compressor else None, startup=a,
                   small=1024)


@pytest.mark.parametrize("seed", range(12))
def test_every_planner_gives_a_valid_plan_and_optimal_is_never_worse(seed):
    problem = random_problem(seed, n=5 + seed * 7, compressor=seed % 3 != 0)
    best = iteration_time(problem, make_plan("optimal", problem))
    for spec in SPECS:
        plan = make_plan(spec, problem)
        check_plan(problem, plan)  # contiguous, covering, compression only where allowed
        assert plan == make_plan(spec, problem)  # deterministic: every rank plans alike
        assert best <= iteration_time(problem, plan) * (1 + 1e-12), spec


@pytest.mark.parametrize("seed", range(6))
def test_optimal_equals_brute_force_on_small_problems(seed):
    problem = random_problem(100 + seed, n=7)
    brute = min(iteration_time(problem, plan) for plan in all_plans(problem))
    assert iteration_time(problem, make_plan("optimal", problem)) == pytest.approx(brute)


def test_mgwfbp_rule_on_a_hand_made_timeline():
    """a = 1 s per message, no bandwidth cost. Ready: 0, 0.5, 3, 3.2.
    Tensor 1 is ready (0.5) before group {0} starts (0) + a: merged; the group starts at 0.5,
    ends 1.5. Tensor 2 (3.0) is not ready before 0.5 + 1: a new group, starting at 3.0;
    tensor 3 (3.2) is ready before 3.0 + 1: merged. Ends at 3.2 + 1 = 4.2 (WFBP: 5.0)."""
    problem = Problem([4, 4, 4, 4], [0, 0.5, 3, 3.2], linear(1, 0), startup=1)
    plan = make_plan("mgwfbp", problem)
    assert plan == [Group(0, 1), Group(2, 3)]
    assert timeline(problem, plan) == [(0.5, 1.5), (3.2, 4.2)]
    assert iteration_time(problem, make_plan("layerwise", problem)) == 5.0
    assert iteration_time(problem, make_plan("optimal", problem)) == 4.2


def test_mgwfbp_extremes():
    sizes = [1000] * 6
    at_once = Problem(sizes, [0.0] * 6, linear(1e-3, 1e-6), startup=1e-3)
    assert make_plan("mgwfbp", at_once) == [Group(0, 5)]  # all ready: one message
    slow = Problem(sizes, [i * 1.0 for i in range(6)], linear(1e-3, 1e-6), startup=1e-3)
    assert make_plan("mgwfbp", slow) == make_plan("layerwise", slow)  # nothing to merge


def test_closed_forms():
    """All gradients ready at 0: layer-wise pays n start-ups, model-wise one."""
    problem = Problem([100, 200, 300], [0.0, 0.0, 0.0], linear(2.0, 0.01))
    assert iteration_time(problem, make_plan("layerwise", problem)) == pytest.approx(
        3 * 2.0 + 0.01 * 600)
    assert iteration_time(problem, make_plan("modelwise", problem)) == pytest.approx(
        2.0 + 0.01 * 600)
    assert make_plan("fixed:0.0002", problem) == [Group(0, 1), Group(2, 2)]  # >= 209.7 B


def test_compression_is_chosen_by_cost_and_never_for_small_messages():
    # compressed: 5 s start-up, a tenth of the per-byte cost; exact: 1 s + 1 s/byte
    problem = Problem([100, 2, 100], [0.0, 0.0, 0.0], linear(1, 1), linear(5, 0.1), small=10)
    plan = make_plan("optimal", problem)
    assert iteration_time(problem, plan) == pytest.approx(5 + 0.1 * 202)  # one, compressed
    assert plan == [Group(0, 2, True)]
    assert make_plan("layerwise", problem) == [Group(0, 0, True), Group(1, 1, False),
                                               Group(2, 2, True)]  # 2 bytes < small
    with pytest.raises(ValueError, match="compresses a tensor"):
        check_plan(problem, [Group(0, 0), Group(1, 1, True), Group(2, 2)])
    exact_only = Problem([100, 2], [0.0, 0.0], linear(1, 1))
    assert not any(g.compressed for g in make_plan("optimal", exact_only))


def test_bad_input_is_refused():
    problem = Problem([1, 2], [0.0, 1.0], linear(1, 0))
    with pytest.raises(ValueError, match="unknown plan"):
        make_plan("wfbpp", problem)
    with pytest.raises(ValueError, match="positive size"):
        make_plan("fixed:-1", problem)
    with pytest.raises(ValueError, match="must not decrease"):
        Problem([1, 2], [1.0, 0.0], linear(1, 0))
    with pytest.raises(ValueError, match="as long as each other"):
        Problem([1, 2], [0.0], linear(1, 0))
    with pytest.raises(ValueError, match="contiguous cover"):
        check_plan(problem, [Group(1, 1)])
    with pytest.raises(ValueError, match="covers 1 of 2"):
        check_plan(problem, [Group(0, 0)])
    assert set(PLANNERS) >= {"layerwise", "modelwise", "fixed", "mgwfbp", "layerfusion",
                             "optimal"}


def test_mergecomp_search_descends_from_the_model_guess_to_the_measured_best():
    problem = Problem([1 << 20] * 12, [i * 1e-3 for i in range(12)], linear(1e-3, 1e-9))
    search = MergeCompSearch(problem, steps=2, max_probes=8, max_groups=12)
    guess = search.current
    assert guess == min(search.modelled, key=search.modelled.get)
    measured_time = {y: 1.0 + (y - 7) ** 2 for y in range(1, 13)}  # the machine's truth
    probes, steps = [search.current], 0
    while not search.done:
        steps += 1
        # the first step after a change is not counted: feed it a wild value
        changed = search.record(99.0 if steps == 1 else measured_time[search.current])
        if changed:
            steps = 0
            probes.append(search.current)
        assert search.plan() == make_plan(f"balanced:{search.current}", problem)
    assert search.current == 7 and search.measured[7] == 1.0  # found the true best
    assert probes[0] == guess and len(search.measured) <= 8
    # it walked from the guess to 7 and looked one step to either side of each best so far
    assert sorted(search.measured) == list(range(max(1, min(guess, 7) - 1), max(guess, 7) + 2))
    again = MergeCompSearch(problem, chosen=4)  # a resumed run reuses the choice
    assert again.done and again.current == 4 and not again.record(1.0)


def test_balanced_groups_split_bytes_evenly():
    problem = Problem([100] * 10, [0.0] * 10, linear(1, 0))
    assert make_plan("balanced:2", problem) == [Group(0, 4), Group(5, 9)]
    assert make_plan("balanced:3", problem) == [Group(0, 3), Group(4, 6), Group(7, 9)]
    assert len(make_plan("balanced:40", problem)) == 10  # at most one group per tensor
    assert make_plan("mergecomp", problem) == [Group(0, 9)]  # no overlap to win: one


def test_linear_fit_takes_the_slope_of_large_sizes():
    from ringcomp.sched.profile_record import BENCH_BYTES, linear_fit

    sizes = np.array(BENCH_BYTES, float)
    a, b = linear_fit(sizes, 2e-4 + 8e-8 * sizes)  # a straight line: recovered exactly
    assert a == pytest.approx(2e-4) and b == pytest.approx(8e-8)
    # a link with a burst allowance: 4 KB and 64 KB pass at memory speed (measured shape on
    # the 100 Mbit/s testbed); a 2 MB bucket must still be predicted at the line rate
    times = [2.9e-4, 3.4e-4, 4.39e-2, 1.76e-1]
    a, b = linear_fit(sizes, times)
    assert a + b * (2 << 20) == pytest.approx(times[-1], rel=0.01)
    assert b == pytest.approx((times[-1] - times[-2]) / (sizes[-1] - sizes[-2]))
    assert linear_fit(sizes, times[::-1])[1] == 0.0  # never a negative slope
