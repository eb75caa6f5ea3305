"""Fusion planners: layer-wise, model-wise, fixed buckets, MG-WFBP, LayerFusion, optimal.

Every planner maps a ``Problem`` (sizes, ready times, costs; see timeline.py) to a plan: a
list of contiguous groups in backward order, each marked compressed or exact. Planners are
deterministic functions of the problem, so ranks that share a profile share the plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ringcomp.sched.timeline import Group, Problem, check_plan, iteration_time

PLANNERS: dict[str, Callable] = {}


def register(name: str):
    def wrap(fn):
        PLANNERS[name] = fn
        return fn
    return wrap


def make_plan(spec: str, problem: Problem) -> list[Group]:
    """The plan of ``spec`` (``name`` or ``name:arg``, e.g. ``fixed:25``), checked."""
    name, _, arg = spec.partition(":")
    if name not in PLANNERS:
        raise ValueError(f"unknown plan {spec!r}; known: {', '.join(PLANNERS)}")
    plan = PLANNERS[name](problem, arg or None)
    check_plan(problem, plan)
    return plan


def check_spec(spec: str) -> None:
    """Raise ValueError for an unknown plan name or a bad argument (``fixed:-1``) before
    any profile or problem exists: the spec is tried on a one-tensor problem."""
    make_plan(spec, Problem([4], [0.0], float))


def _wanted(problem: Problem, first: int, last: int) -> Group:
    """The group compressed whenever it may be (what a user who chose a compressor asked)."""
    return Group(first, last, problem.can_compress(first, last))


def _cheapest(problem: Problem, first: int, last: int) -> tuple[Group, float]:
    """The group compressed or exact, whichever the model says is faster, and its cost."""
    exact = Group(first, last, False)
    options = [exact] + ([Group(first, last, True)]
                         if problem.can_compress(first, last) else [])
    costs = [problem.cost(g) for g in options]
    best = min(range(len(options)), key=costs.__getitem__)
    return options[best], costs[best]


@register("layerwise")
def layerwise(problem: Problem, arg=None) -> list[Group]:
    """One message per tensor (plain WFBP)."""
    return [_wanted(problem, i, i) for i in range(len(problem))]


@register("modelwise")
def modelwise(problem: Problem, arg=None) -> list[Group]:
    """One message for the whole model, after backward (no overlap)."""
    return [_wanted(problem, 0, len(problem) - 1)]


@register("fixed")
def fixed(problem: Problem, arg=None) -> list[Group]:
    """Horovod/DDP buckets: close a group once it holds at least ``arg`` MB (default 25)."""
    limit = float(arg or 25) * (1 << 20)
    if limit <= 0:
        raise ValueError(f"fixed:<MB> needs a positive size, got {arg!r}")
    plan, first, filled = [], 0, 0
    for i, size in enumerate(problem.sizes):
        filled += size
        if filled >= limit or i == len(problem) - 1:
            plan.append(_wanted(problem, first, i))
            first, filled = i + 1, 0
    return plan


@register("balanced")
def balanced(problem: Problem, arg=None) -> list[Group]:
    """``balanced:Y``: Y contiguous groups of about equal bytes (MergeComp's partition
    shape); a group closes once the bytes so far reach its share of the total."""
    groups = int(arg or 2)
    if groups < 1:
        raise ValueError(f"balanced:<Y> needs Y >= 1, got {arg!r}")
    total, plan, first = problem.nbytes(0, len(problem) - 1), [], 0
    for i in range(len(problem)):
        share = total * (len(plan) + 1) / groups
        if problem.nbytes(0, i) >= share or i == len(problem) - 1:
            plan.append(_wanted(problem, first, i))
            first = i + 1
    return plan


@register("mergecomp")
def mergecomp(problem: Problem, arg=None) -> list[Group]:
    """What MergeComp's search converges to, found on the model instead of by timing: the
    best byte-balanced partition into Y = 1..``arg`` (default 8) groups."""
    plans = [balanced(problem, y) for y in range(1, int(arg or 8) + 1)]
    return min(plans, key=lambda plan: iteration_time(problem, plan))


@register("mgwfbp")
def mgwfbp(problem: Problem, arg=None) -> list[Group]:
    """MG-WFBP's merge rule (Shi, Chu, Li), walking from the output side.

    1. Start with the first tensor as the open group.
    2. The open group's message would start at tau = max(link free, its ready time).
    3. The next tensor joins it iff it is ready before tau + a (so waiting for it costs
       less than the start-up a a separate message would pay); else the open group is
       closed (the link is busy until tau + its cost) and the tensor opens a new one.
    Invariant: groups before the open one never change, so the link's free time is exact.
    """
    groups, free = [[0, 0]], 0.0
    for i in range(1, len(problem)):
        first, last = groups[-1]
        tau = max(free, problem.ready[last])
        if problem.ready[i] < tau + problem.startup:
            groups[-1][1] = i
        else:
            free = tau + problem.cost(_wanted(problem, first, last))
            groups.append([i, i])
    return [_wanted(problem, first, last) for first, last in groups]


@register("layerfusion")
def layerfusion(problem: Problem, arg=None) -> list[Group]:
    """Sketch-fusion's LayerFusion (reconstructed): greedy fusion by the cost model.

    Walking from the output side, the next tensor joins the open group iff the modelled
    time at which both are all-reduced is no later merged than apart; every group is sent
    compressed or exact, whichever the model says is cheaper (compressed size and
    encode/decode included). No size threshold to tune.
    """
    groups, free = [[0, 0]], 0.0
    for i in range(1, len(problem)):
        first, last = groups[-1]
        open_end = max(free, problem.ready[last]) + _cheapest(problem, first, last)[1]
        apart = max(open_end, problem.ready[i]) + _cheapest(problem, i, i)[1]
        merged = max(free, problem.ready[i]) + _cheapest(problem, first, i)[1]
        if merged <= apart:
            groups[-1][1] = i
        else:
            free = open_end
            groups.append([i, i])
    return [_cheapest(problem, first, last)[0] for first, last in groups]


@register("optimal")
def optimal(problem: Problem, arg=None) -> list[Group]:
    """The plan with the least modelled iteration time, by dynamic programming.

    1. best[i] = the earliest time the link can have all-reduced tensors 0..i-1, over every
       contiguous partition of them and every compressed/exact choice per group.
    2. best[i] = min over j < i of max(best[j], ready[i-1]) + cheapest cost of group j..i-1.
    Invariant (why the recursion is exact): a group's end time never decreases when the
    link frees up later, so an optimal plan's prefix is itself optimal. O(n^2) costs.
    """
    n, exact, compressed = len(problem), problem.exact, problem.compressed
    prefix = [problem.nbytes(0, i) for i in range(n)]
    prefix.insert(0, 0)
    best, choice = [0.0] + [float("inf")] * n, [None] * (n + 1)
    small = problem.small
    for i in range(1, n + 1):  # the inner loop inlines _cheapest (and max): n^2/2 times
        ready, total = problem.ready[i - 1], prefix[i]
        for j in range(i):
            m = total - prefix[j]
            cost, packed = exact(m), False
            if compressed is not None and m >= small:
                squeezed = compressed(m)
                if squeezed < cost:
                    cost, packed = squeezed, True
            start = best[j]
            end = (start if start > ready else ready) + cost
            if end < best[i]:
                best[i], choice[i] = end, (j, packed)
    plan, i = [], n
    while i > 0:
        j, packed = choice[i]
        plan.append(Group(j, i - 1, packed))
        i = j
    return plan[::-1]


def all_plans(problem: Problem):
    """Every contiguous partition with every compression choice (for tests on tiny
    problems: 2^(n-1) partitions)."""
    n = len(problem)
    for cuts in itertools.product((False, True), repeat=n - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        spans = list(zip(bounds, bounds[1:], strict=False))
        choices = [(False, True) if problem.can_compress(a, b - 1) else (False,)
                   for a, b in spans]
        for flags in itertools.product(*choices):
            yield [Group(a, b - 1, f) for (a, b), f in zip(spans, flags, strict=True)]
