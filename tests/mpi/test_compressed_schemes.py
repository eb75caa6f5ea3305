"""The two-stage scheme's server error buffer, and the exact two-stage algorithm."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank

import ringcomp
from ringcomp.compression import ErrorFeedback, Key, get_compressor
from ringcomp.testing.replay import SEG_BYTES, simulate_twostage


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


def lowrank_input(comm, m, k, true_rank, dtype=np.float64):
    """Each rank's m x k matrix has its columns in one shared true_rank-dim space."""
    basis = np.random.default_rng(0).standard_normal((m, true_rank))
    coeff = np.random.default_rng(10 + comm.rank).standard_normal((true_rank, k))
    return (basis @ coeff).reshape(-1).astype(dtype)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ["ring", "tree", "rabenseifner", "mpi", "auto"])
def test_powersgd_recovers_low_rank_sums_on_any_algorithm(comm, algorithm):
    x = lowrank_input(comm, 45, 45, 3)  # 2025 elements: the 45 x 45 view of the compressor
    exact = comm.allreduce(x)
    y = ringcomp.allreduce(x, algorithm=algorithm, compressor="powersgd:rank=3:warm=0")
    assert every_rank(comm, np.allclose(y, exact, rtol=1e-9, atol=1e-9))
    blobs = comm.allgather(y.tobytes())
    assert all(b == blobs[0] for b in blobs)


@pytest.mark.mpi(min_size=1)
def test_powersgd_is_the_projection_on_the_summed_power_step(comm):
    """Random data: the output is P P^T (sum M) with P = orth((sum M) Q0), as in float64
    by NumPy's QR (columns up to sign)."""
    comp = get_compressor("powersgd:rank=2:warm=0")
    x = np.random.default_rng(comm.rank).standard_normal(1000)
    y = ringcomp.allreduce(x, compressor=comp, step=4)
    total = comp.matrix(comm.allreduce(x))
    basis, _ = np.linalg.qr(total @ comp.initial_q(1000, Key(0, 4, 0), np.float64))
    expected = (basis @ (basis.T @ total)).reshape(-1)[:1000]
    assert every_rank(comm, np.allclose(y, expected, rtol=1e-8, atol=1e-8))
    if comm.size == 1:  # one rank: the collective is the compressor's own round trip
        x32 = x.astype(np.float32)
        y32 = ringcomp.allreduce(x32, compressor=comp, step=4)
        assert np.array_equal(y32, comp.decode(comp.encode(x32, Key(0, 4, 0)), 1000,
                                               np.empty(1000, np.float32)))


@pytest.mark.mpi(min_size=1)
def test_powersgd_warm_start_runs_a_power_iteration_and_error_feedback(comm):
    from ringcomp.compression import ErrorFeedback

    x = np.random.default_rng(comm.rank).standard_normal(2500)
    exact = comm.allreduce(x)
    errors = []
    for step in range(8):
        y = ringcomp.allreduce(x, compressor="powersgd:rank=4", bucket=9, step=step)
        errors.append(np.linalg.norm(y - exact) / np.linalg.norm(exact))
    # the same matrix every step: warm starts refine the subspace towards the top-4 one
    best = np.linalg.svd(get_compressor("powersgd").matrix(exact), compute_uv=False)
    svd_error = np.sqrt((best[4:] ** 2).sum() / (best ** 2).sum())
    assert every_rank(comm, errors[-1] < errors[0] and errors[-1] < svd_error + 0.05), errors
    memory = ErrorFeedback()
    y = ringcomp.allreduce(x, compressor="powersgd:rank=4:warm=0", error_feedback=memory)
    residual = memory.residuals[(0, 2500, "<f8", "worker")]
    # the residuals of all ranks add up to what the collective lost of the sum
    assert every_rank(comm, np.allclose(comm.allreduce(residual), exact - y, atol=1e-9))
