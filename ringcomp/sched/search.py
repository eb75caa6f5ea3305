"""MergeComp's online search, improved: measured step times pick the number of groups.

MergeComp (SEEDS.md, seed 3) splits the backward-ordered gradients into Y contiguous groups
and searches the partition by timing real iterations (its code: Y = 2, a binary search
over the split point, ~20 timed iterations per probe, SGD swapped in for the user's
optimizer). Here:

1. any Y from 1 to ``max_groups``, boundaries byte-balanced (``balanced:Y``);
2. the first guess is the Y the timeline model predicts best, so a good model needs one
   probe to confirm and a poor one a few;
3. a probe is ``steps`` training steps (the first after a change is not counted: it pays
   for new buffers), timed as the median of the slowest rank's step times - every rank
   feeds the same agreed numbers, so every rank takes the same decisions;
4. descent: probe the unmeasured neighbours (Y - 1, Y + 1) of the best Y measured so far
   until neither improves or ``max_probes`` are spent, then keep the best;
5. training goes on throughout with the user's optimizer: probes are real steps.
"""

from __future__ import annotations

import numpy as np

from ringcomp.sched.planners import balanced
from ringcomp.sched.timeline import Group, Problem, iteration_time


class MergeCompSearch:
    def __init__(self, problem: Problem, steps: int = 5, max_probes: int = 6,
                 max_groups: int = 16, chosen: int | None = None):
        self.problem, self.steps, self.max_probes = problem, max(1, steps), max_probes
        self.max_groups = max(1, min(max_groups, len(problem)))
        self.modelled = {y: iteration_time(problem, balanced(problem, y))
                         for y in range(1, self.max_groups + 1)}
        self.current = chosen or min(self.modelled, key=self.modelled.get)
        self.measured: dict[int, float] = {}
        self.samples: list[float] = []
        self.done = chosen is not None  # a choice from an earlier run (resume): no search

    def plan(self) -> list[Group]:
        return balanced(self.problem, self.current)

    def record(self, seconds: float) -> bool:
        """Feed one step's agreed time; True when the plan changes (call ``plan``)."""
        if self.done:
            return False
        self.samples.append(seconds)
        if len(self.samples) <= self.steps:
            return False
        self.measured[self.current] = float(np.median(self.samples[1:]))
        self.samples = []
        best = min(self.measured, key=self.measured.get)
        if len(self.measured) < self.max_probes:
            for y in (best - 1, best + 1):
                if 1 <= y <= self.max_groups and y not in self.measured:
                    self.current = y
                    return True
        self.done = True
        changed, self.current = best != self.current, best
        return changed
