"""The ring's schedule as data: which chunk a rank sends and receives at every step, and
its neighbours. The Python walk, the compiled walks, the bench's bare mpi4py ring and the
message counts read it from here; none restates the index arithmetic."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ringcomp.partition import block_bounds, even_segments

PHASE_RS, PHASE_AG = 0, 1


@lru_cache(maxsize=256)
def ring_layout(n: int, p: int, seg_elems: int):
    """The ring's chunks of ``n`` elements over ``p`` ranks and their segments of at most
    ``seg_elems``: ``(chunks, segments_per_chunk, max_chunk)``."""
    chunks = block_bounds(n, p)
    segments = [even_segments(lo, hi, seg_elems) for lo, hi in chunks]
    return chunks, segments, max(hi - lo for lo, hi in chunks)


def ring_chunk(rank: int, step: int, p: int, phase: int, shift: int = 0) -> int:
    """The chunk ``rank`` receives at ``step`` of ``phase`` on a ring of ``p``.

    Reduce-scatter (``PHASE_RS``): step s brings chunk (rank - s - 1 + shift) % p, a partial
    aggregate of s + 1 ranks, which ``rank`` joins; step -1 names the chunk it sends first
    (its own). All-gather (``PHASE_AG``): step s brings chunk (rank - s + shift) % p; step -1
    names the chunk ``rank`` owns when the all-gather starts, (rank + 1 + shift) % p.
    """
    return (rank - step - 1 + shift) % p if phase == PHASE_RS else (rank - step + shift) % p


def ring_position(rank: int, size: int, group=None) -> tuple[int, int, int, int]:
    """``(p, r, right, left)``: the ring's length, ``rank``'s position on it and its
    neighbours' ranks. ``group``: the communicator ranks forming the ring, in ring order
    (a row or a column of a torus); None: all ``size`` ranks in rank order."""
    if group is None:
        return size, rank, (rank + 1) % size, (rank - 1) % size
    p, r = len(group), group.index(rank)
    return p, r, group[(r + 1) % p], group[(r - 1) % p]


class RingSchedule(NamedTuple):
    """Rank ``r``'s part of a ring of ``p`` over all ranks in rank order (``ring``).

    ``order``: a read-only int64 array of shape (2, p), as the compiled walks take it:
    ``order[PHASE_RS]`` = [the chunk sent first (its own), the chunk received and joined at
    step 0, ..., at step p - 2]; ``order[PHASE_AG]`` = [the chunk owned when the
    all-gather starts, the chunk received at step 0, ..., at step p - 2]. Sends go
    ``right``, receives come from ``left``. Invariant: a phase sends its first chunk, then
    each chunk it receives but the last step's (which it keeps)."""

    order: np.ndarray
    right: int
    left: int

    def sent(self) -> tuple[list[int], list[int]]:
        """The chunks sent, in order, in the reduce-scatter and in the all-gather."""
        return ([int(c) for c in self.order[PHASE_RS, :-1]],
                [int(c) for c in self.order[PHASE_AG, :-1]])


@lru_cache(maxsize=1024)
def ring(p: int, r: int, shift: int = 0) -> RingSchedule:
    """The schedule of position ``r`` on a ring of ``p`` (``ring_chunk``'s, made once)."""
    order = np.array([[ring_chunk(r, step, p, phase, shift) for step in range(-1, p - 1)]
                      for phase in (PHASE_RS, PHASE_AG)], np.int64)
    order.flags.writeable = False
    return RingSchedule(order, (r + 1) % p, (r - 1) % p)
