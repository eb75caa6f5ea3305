"""The two-stage scheme's server error buffer, and the exact two-stage algorithm."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank
from simulate import SEG_BYTES, simulate_twostage

import ringcomp
from ringcomp.compression import ErrorFeedback, Key, get_compressor


def data(rank, n, step=0):
    return np.random.default_rng(1000 * step + rank).standard_normal(n).astype(np.float32)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["sign", "topk:ratio=0.1", "terngrad"])
def test_twostage_error_buffers_follow_deepspeed(comm, name):
    """With error feedback, the two-stage scheme keeps a worker residual on every rank and
    a server residual at every chunk owner; several steps match the simulation bit for bit
    and the owner's residual is what its re-encoding lost."""
    comp, memory, sim_memory = get_compressor(name), ErrorFeedback(), {}
    n = 3001
    for step in range(3):
        xs = [data(q, n, step) for q in range(comm.size)]
        y = ringcomp.allreduce(xs[comm.rank], algorithm="twostage", compressor=name,
                               error_feedback=memory, step=step, bucket=2,
                               segment_bytes=SEG_BYTES)
        expected = simulate_twostage(comp, xs, Key(0, step, 2), sim_memory)
        assert every_rank(comm, np.array_equal(y, expected)), step
    server = [v for k, v in memory.residuals.items() if k[3] == "server"]
    assert every_rank(comm, len(server) == 1
                      and np.array_equal(server[0], sim_memory[("server", comm.rank)]))
    if comm.size > 1:  # with one rank the re-encode of a decoded payload is exact
        assert every_rank(comm, np.abs(server[0]).max() > 0)
