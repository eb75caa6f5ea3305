"""Every algorithm against MPI's Allreduce and a NumPy reduction, at awkward sizes and dtypes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank
from hypothesis import given, settings
from hypothesis import strategies as st
from registered import exact_algorithms

import ringcomp

ALGORITHMS = exact_algorithms()
DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]
NP_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def lengths(p: int) -> list[int]:
    """0, 1, p-1, p, p+1, primes, 2^k and a size that spans several ring segments."""
    return sorted({0, 1, max(p - 1, 1), p, p + 1, 7, 97, 1024, 4099, (1 << 15) + 3})


def local_data(rank: int, n: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(7919 * rank + n)
    if dtype == "uint8":
        return rng.integers(0, 40, n).astype(dtype)  # sums stay below 256 up to 6 ranks
    if dtype.startswith("int"):
        return rng.integers(-1000, 1000, n).astype(dtype)
    return rng.standard_normal(n).astype(dtype)


def reference(comm, x: np.ndarray, op: str) -> np.ndarray:
    """NumPy reduction of every rank's data (float64 for floats)."""
    everyone = np.stack(comm.allgather(x)) if x.size else np.zeros((comm.size, 0), x.dtype)
    if x.dtype.kind == "f":
        everyone = everyone.astype(np.float64)
    return NP_OPS[op].reduce(everyone, axis=0)


def close_enough(y, ref, x_all_abs, dtype, p) -> bool:
    if np.dtype(dtype).kind != "f":
        return bool(np.array_equal(y, ref))
    tol = 2 * p * np.finfo(dtype).eps * x_all_abs + np.finfo(dtype).tiny
    return bool(np.all(np.abs(y.astype(np.float64) - ref) <= tol))


def identical_everywhere(comm, y) -> bool:
    blobs = comm.allgather(np.ascontiguousarray(y).tobytes())
    return all(b == blobs[0] for b in blobs)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_sum_matches_mpi_and_numpy(comm, algorithm, dtype):
    p = comm.size
    for n in lengths(p):
        x = local_data(comm.rank, n, dtype)
        keep = x.copy()
        y = ringcomp.allreduce(x, algorithm=algorithm, segment_bytes=4096) \
            if algorithm in ("ring", "dbtree", "rabenseifner") \
            else ringcomp.allreduce(x, algorithm=algorithm)
        mpi = np.empty_like(x)
        comm.Allreduce(x, mpi)
        ref = reference(comm, x, "sum")
        mag = reference(comm, np.abs(x.astype(np.float64)), "sum") if x.dtype.kind == "f" else 0
        assert y.shape == x.shape and y.dtype == x.dtype, (n, y.shape, y.dtype)
        assert np.array_equal(x, keep), f"input modified (n={n})"
        assert every_rank(comm, close_enough(y, ref, mag, dtype, p)), f"wrong sum at n={n}"
        assert every_rank(comm, close_enough(y, mpi.astype(np.float64) if x.dtype.kind == "f"
                                             else mpi, mag * 2, dtype, p)), f"!= MPI at n={n}"
        assert identical_everywhere(comm, y), f"ranks differ at n={n}"


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_max_min_exact(comm, algorithm, op):
    for dtype in ("float32", "int64", "float16"):
        for n in lengths(comm.size):
            x = local_data(comm.rank, n, dtype)
            y = ringcomp.allreduce(x, algorithm=algorithm, op=op)
            assert every_rank(comm, np.array_equal(y, reference(comm, x, op).astype(dtype))), \
                f"{op} wrong for {dtype} n={n}"


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_in_place_and_out(comm, algorithm):
    x = local_data(comm.rank, 1000, "float64").reshape(10, 100)
    expected = ringcomp.allreduce(x, algorithm="mpi")
    out = np.empty_like(x)
    returned = ringcomp.allreduce(x, algorithm=algorithm, out=out)
    assert returned is out and out.shape == (10, 100)
    y = x.copy()
    returned = ringcomp.allreduce(y, algorithm=algorithm, out=y)
    assert returned is y
    assert every_rank(comm, np.allclose(out, expected) and np.allclose(y, expected))
    assert identical_everywhere(comm, y)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "auto"])
def test_larger_than_2_to_the_28_bytes(comm, algorithm):
    """A 2^28 + 12 byte float32 vector (small integers, so the sum is exact)."""
    if comm.size > 3:
        pytest.skip("memory and time: run at 2 and 3 ranks")
    n = (1 << 26) + 3
    # 0..6 repeated, from an int32 arange: int64's remainder took 3.5 s a rank here (a
    # 64-bit division per element), int32's 0.3 s (np.resize, a concatenation, 3 s)
    base = (np.arange(n, dtype=np.int32) % 7).astype(np.float32)
    x = base + np.float32(comm.rank)
    y = ringcomp.allreduce(x, algorithm=algorithm, out=x)
    p = comm.size
    base *= p
    base += p * (p - 1) // 2
    ok = np.array_equal(y, base)
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_repeated_calls_do_not_drift(comm):
    """Many back-to-back calls on one buffer stay identical across ranks (no replica drift)."""
    x = local_data(comm.rank, 777, "float32")
    for i in range(40):
        algorithm = ALGORITHMS[i % len(ALGORITHMS)]
        x = ringcomp.allreduce(x, algorithm=algorithm) / comm.size
    assert identical_everywhere(comm, x)


@pytest.mark.mpi(min_size=2)
@settings(derandomize=True, max_examples=25, deadline=None, database=None)
@given(n=st.integers(0, 3000), seg=st.integers(8, 4096),
       algorithm=st.sampled_from(["ring", "dbtree", "rabenseifner"]),
       dtype=st.sampled_from(["float32", "int64"]))
def test_property_any_length_and_segment(n, seg, algorithm, dtype):
    """Derandomized hypothesis: every rank draws the same examples, so all call together."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    x = local_data(comm.rank, n, dtype)
    y = ringcomp.allreduce(x, algorithm=algorithm, segment_bytes=seg)
    ref = reference(comm, x, "sum")
    mag = reference(comm, np.abs(x.astype(np.float64)), "sum") if dtype == "float32" else 0
    assert every_rank(comm, close_enough(y, ref, mag, dtype, comm.size))
    assert identical_everywhere(comm, y)
