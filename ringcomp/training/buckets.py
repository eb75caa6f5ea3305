"""Fusion plans: which gradients (in backward order) travel together as one buffer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ringcomp.kernels.arrays import array_module


@dataclass(frozen=True)
class Bucket:
    """Parameters ``members`` (indices into the store, backward order) travel as one buffer
    made of the flat slices ``pieces`` (contiguous runs, in order); ``compressed`` says
    whether the compressor applies to it. The bucket is ready once parameter ``last`` (its
    highest member) has its gradient."""

    index: int
    members: tuple[int, ...]
    pieces: tuple[tuple[int, int], ...]
    compressed: bool

    @property
    def last(self) -> int:
        return self.members[-1]

    @property
    def size(self) -> int:
        return sum(hi - lo for lo, hi in self.pieces)

    def gather(self, flat: np.ndarray) -> np.ndarray:
        """The bucket's elements of ``flat`` as one contiguous array (a view when it is
        one piece, else a copy: Horovod's fusion buffer)."""
        if len(self.pieces) == 1:
            lo, hi = self.pieces[0]
            return flat[lo:hi]
        return array_module(flat).concatenate([flat[lo:hi] for lo, hi in self.pieces])

    def split(self, buffer: np.ndarray):
        """(lo, hi, part of ``buffer``) for each piece: the inverse of ``gather``."""
        start = 0
        for lo, hi in self.pieces:
            yield lo, hi, buffer[start:start + hi - lo]
            start += hi - lo


def _pieces(infos, members) -> tuple[tuple[int, int], ...]:
    runs: list[list[int]] = []
    for i in members:
        lo, hi = infos[i].offset, infos[i].offset + infos[i].size
        if runs and runs[-1][1] == lo:
            runs[-1][1] = hi
        else:
            runs.append([lo, hi])
    return tuple((lo, hi) for lo, hi in runs)


def plan_buckets(infos, bucket_bytes: float | None, small_elements: int = 0,
                 itemsize: int = 4) -> list[Bucket]:
    """Cut the parameters into buckets.

    1. Tensors with fewer than ``small_elements`` elements (biases, norms) all go into one
       uncompressed bucket, ready when the last of them is (near the end of backward).
    2. The others are grouped in backward order: ``bucket_bytes`` None = one bucket for all,
       0 = one per tensor (layer-wise), else close a bucket once it holds at least that many
       bytes (fusion as Horovod's and DDP's, whose buckets instead stay under the size).
    3. Buckets are numbered in the order they become ready (by ``last``), which is the order
       the trainer submits them.

    Invariant: every parameter is in exactly one bucket; compressed and exact tensors never
    share one; with no small tensors the buckets are contiguous slices of the flat vector.
    """
    small = [i for i, info in enumerate(infos) if info.size < small_elements]
    groups, current, filled = [], [], 0
    for i, info in enumerate(infos):
        if info.size < small_elements:
            continue
        current.append(i)
        filled += info.size * itemsize
        if bucket_bytes is not None and filled >= bucket_bytes:
            groups.append((current, True))
            current, filled = [], 0
    if current:
        groups.append((current, True))
    if small:
        groups.append((small, False))
    groups.sort(key=lambda group: group[0][-1])
    return [Bucket(index, tuple(members), _pieces(infos, members), compressed)
            for index, (members, compressed) in enumerate(groups)]


def buckets_from_plan(infos, plan) -> list[Bucket]:
    """Buckets of a scheduler's plan (contiguous groups of tensors, each compressed or not;
    see ringcomp.sched)."""
    return [Bucket(index, tuple(range(g.first, g.last + 1)),
                   _pieces(infos, range(g.first, g.last + 1)), g.compressed)
            for index, g in enumerate(plan)]
