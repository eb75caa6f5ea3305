"""The 2D-torus all-reduce at every shape: against MPI's Allreduce (exact), the one-process
simulation (compressed), its documented traffic, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank
from mpi4py import MPI
from test_errors import same_error_everywhere

import ringcomp
from ringcomp.compression import Key, get_compressor
from ringcomp.testing.replay import SEG_BYTES, simulate_torus


def shapes(p: int) -> list[tuple[int, int]]:
    """Every R x C with R·C = p (1 x p and p x 1 included)."""
    return [(r, p // r) for r in range(1, p + 1) if p % r == 0]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float64", "max"),
                                      ("int32", "sum"), ("int64", "min")])
def test_every_shape_matches_mpi_allreduce_and_ranks_agree(comm, dtype, op):
    mpi_op = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
    ok = True
    for rows, cols in shapes(comm.size):
        for n in (0, 1, comm.size + 1, 1031, 20_000):
            rng = np.random.default_rng([comm.rank, n, rows])
            x = (rng.standard_normal(n) * 100).astype(dtype)
            want = np.empty_like(x)
            comm.Allreduce(x, want, op=mpi_op)
            for spec in (f"{rows}x{cols}", (rows, cols)):
                got = ringcomp.allreduce(x, algorithm="torus", torus=spec, op=op,
                                         segment_bytes=1024)
                ok &= bool(np.allclose(got, want, rtol=1e-5, atol=1e-3) if dtype[0] == "f"
                           else np.array_equal(got, want))
                ok &= len(set(comm.allgather(got.tobytes()))) == 1
            y = x.copy()
            ringcomp.allreduce(y, algorithm="torus", torus=f"{rows}x{cols}", op=op, out=y)
            ok &= bool(np.array_equal(y, got))
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_traffic_is_a_row_ring_plus_a_column_ring_on_a_cth(comm):
    """Bytes sent per rank: 2(C-1)/C·n + 2(R-1)/R·n/C elements (n divisible by p)."""
    p, n = comm.size, 7 * 8 * 9 * 5 * 4
    from ringcomp.transport.cache import get_transport

    t = get_transport()
    ok = True
    for rows, cols in shapes(p):
        before = t.bytes_sent
        ringcomp.allreduce(np.ones(n, np.float32), algorithm="torus", comm=t,
                           torus=f"{rows}x{cols}", check=False)
        want = 4 * (2 * (cols - 1) * n // cols + 2 * (rows - 1) * n // (cols * rows))
        ok &= t.bytes_sent - before == want
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["sign", "marsit", "fp16", "qsgd:levels=8",
                                  "countsketch:ratio=0.5:rows=3:keep=1"])
def test_compressed_every_shape_matches_the_simulation_bit_for_bit(comm, name):
    comp, ok = get_compressor(name), True
    for shape in shapes(comm.size):
        for n in (1, comm.size + 1, 3000):
            x = np.random.default_rng([comm.rank, n]).standard_normal(n).astype(np.float32)
            y = ringcomp.allreduce(x, algorithm="torus", torus="{}x{}".format(*shape),
                                   compressor=name, seed=3, step=4, bucket=2,
                                   segment_bytes=SEG_BYTES)
            want = simulate_torus(comp, comm.allgather(x), Key(3, 4, 2), shape)
            ok &= bool(np.array_equal(y, want))
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_shadow_records_rows_then_whole_rows(comm):
    """Shadow mode sees every merge: row hops aggregate 2..C ranks, column hops whole
    rows (multiples of C) up to all p; the record of all p has the returned result's
    error against MPI's exact sum."""
    p = comm.size
    x = np.random.default_rng(comm.rank).standard_normal(5000).astype(np.float32)
    exact = comm.allreduce(x.astype(np.float64))
    ok = True
    for rows, cols in shapes(p):
        tracer = ringcomp.Tracer()
        y = ringcomp.allreduce(x, algorithm="torus", torus=f"{rows}x{cols}",
                               compressor="sign", tracer=tracer, shadow=True,
                               segment_bytes=1 << 12)
        mine = [r for r in tracer.records if r["type"] == "hop" and r["kind"] == "shadow"]
        seen = {r["contributors"] for part in comm.allgather(mine) for r in part}
        want = set(range(2, cols + 1)) | {k * cols for k in range(2, rows + 1)}
        ok &= seen == want
        for r in mine:
            if r["contributors"] == p:
                lo, hi = r["lo"], r["hi"]
                err = np.linalg.norm(y[lo:hi] - exact[lo:hi]) / np.linalg.norm(exact[lo:hi])
                ok &= abs(r["rel_err"] - err) < 1e-5
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_bad_shapes_are_refused_on_every_rank(comm):
    p = comm.size
    for bad in (f"{p + 1}x1", "0x0", "axb", (p, 2), "2x2x2", 3.5):
        same_error_everywhere(comm, lambda bad=bad: ringcomp.allreduce(
            np.ones(8), algorithm="torus", torus=bad), ValueError, "torus=")
    same_error_everywhere(comm, lambda: ringcomp.allreduce(
        np.ones(8), algorithm="ring", torus="1x1"), ValueError, "torus")
