"""reduce_scatter, allgather and broadcast against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank

import ringcomp
from ringcomp.partition import block_bounds

LENGTHS = [0, 1, 2, 5, 6, 97, 4096 + 7]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_reduce_scatter(comm, dtype):
    for n in LENGTHS:
        x = (np.arange(n) * (comm.rank + 1)).astype(dtype)
        mine = ringcomp.reduce_scatter(x, segment_bytes=1024)
        lo, hi = block_bounds(n, comm.size)[comm.rank]
        total = np.arange(n) * (comm.size * (comm.size + 1) // 2)
        assert every_rank(comm, mine.shape == (hi - lo,) and np.array_equal(mine,
                                                                            total[lo:hi]))


@pytest.mark.mpi(min_size=1)
def test_allgather(comm):
    for n in LENGTHS:
        x = np.full((n,), comm.rank, np.float64) + np.arange(n)
        rows = ringcomp.allgather(x, segment_bytes=512)
        expected = np.stack([np.full((n,), r, np.float64) + np.arange(n)
                             for r in range(comm.size)])
        assert every_rank(comm, rows.shape == (comm.size, n) and np.array_equal(rows, expected))


@pytest.mark.mpi(min_size=1)
def test_allgather_2d(comm):
    x = np.full((3, 2), comm.rank, np.int32)
    rows = ringcomp.allgather(x)
    assert every_rank(comm, rows.shape == (comm.size, 3, 2)
                      and all(np.all(rows[r] == r) for r in range(comm.size)))


@pytest.mark.mpi(min_size=1)
def test_broadcast_from_every_root(comm):
    for root in range(comm.size):
        for n in (0, 1, 33, 10000):
            x = np.arange(n, dtype=np.float32) + (100 if comm.rank == root else -1)
            out = ringcomp.broadcast(x, root=root)
            assert out is x
            assert every_rank(comm, np.array_equal(x, np.arange(n, dtype=np.float32) + 100))


@pytest.mark.mpi(min_size=1)
def test_algorithms_listing():
    names = ringcomp.algorithms()
    assert {"ring", "tree", "dbtree", "rd", "rabenseifner", "mpi", "auto"} <= set(names)
