"""The backward-pass timeline every planner optimises: ready times, groups, one FIFO link.

Gradients are indexed in backward order (0 = the output layer's, produced first). Tensor i
is final at ``ready[i]`` seconds after backward starts. A plan cuts them into contiguous
groups; each group is all-reduced as one message as soon as its last tensor is ready, one
message at a time in submission order (the communication thread is a FIFO, like Horovod's
and DDP's). This is MG-WFBP's model with the collective's cost as a function of the
message (and of whether it is compressed).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    """Tensors ``first..last`` (backward order, inclusive) sent as one message."""

    first: int
    last: int
    compressed: bool = False


@dataclass(frozen=True)
class Problem:
    """What a planner needs to know.

    Attributes:
        sizes: bytes of each gradient tensor, backward order.
        ready: seconds after the start of backward at which each tensor is final
            (non-decreasing).
        exact: seconds of one exact all-reduce of a message of ``m`` bytes.
        compressed: seconds of one compressed all-reduce of ``m`` bytes, encode and decode
            included; None when there is no compressor.
        startup: the per-message start-up cost ``a`` (MG-WFBP's merge rule).
        small: messages under this many bytes are never compressed (small tensors inside a
            larger compressed group are compressed with it).
    """

    sizes: Sequence[int]
    ready: Sequence[float]
    exact: Callable[[float], float]
    compressed: Callable[[float], float] | None = None
    startup: float = 0.0
    small: int = 0

    def __post_init__(self):
        if len(self.sizes) != len(self.ready) or not self.sizes:
            raise ValueError(f"sizes and ready times must be non-empty and as long as each "
                             f"other ({len(self.sizes)} vs {len(self.ready)})")
        if any(b < a for a, b in zip(self.ready, self.ready[1:], strict=False)):
            raise ValueError("ready times must not decrease in backward order")
        # prefix sums: a group's bytes in O(1)
        object.__setattr__(self, "_bytes", list(itertools.accumulate(self.sizes, initial=0)))

    def __len__(self) -> int:
        return len(self.sizes)

    def nbytes(self, first: int, last: int) -> int:
        return self._bytes[last + 1] - self._bytes[first]

    def can_compress(self, first: int, last: int) -> bool:
        return self.compressed is not None and self.nbytes(first, last) >= self.small

    def cost(self, group: Group) -> float:
        """Seconds the link is busy with ``group``."""
        nbytes = self.nbytes(group.first, group.last)
        return self.compressed(nbytes) if group.compressed else self.exact(nbytes)


def check_plan(problem: Problem, plan: Sequence[Group]) -> None:
    """Raise ValueError unless ``plan`` is contiguous, in order, covers every tensor once,
    and compresses only what may be compressed."""
    expected = 0
    for group in plan:
        if group.first != expected or group.last < group.first:
            raise ValueError(f"plan is not a contiguous cover: group {group} after tensor "
                             f"{expected - 1}")
        if group.compressed and not problem.can_compress(group.first, group.last):
            raise ValueError(f"group {group} compresses a tensor that may not be (no "
                             f"compressor, or under {problem.small} bytes)")
        expected = group.last + 1
    if expected != len(problem):
        raise ValueError(f"plan covers {expected} of {len(problem)} tensors")


def timeline(problem: Problem, plan: Sequence[Group]) -> list[tuple[float, float]]:
    """(start, end) of each group's communication: start = max(previous end, ready)."""
    spans, free = [], 0.0
    for group in plan:
        start = max(free, problem.ready[group.last])
        free = start + problem.cost(group)
        spans.append((start, free))
    return spans


def iteration_time(problem: Problem, plan: Sequence[Group]) -> float:
    """Seconds from the start of backward until the last gradient is all-reduced."""
    return timeline(problem, plan)[-1][1]
