"""Bad input fails with the same clear error on every rank, and the next call still works."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank

import ringcomp
from ringcomp.errors import ArgumentMismatchError


def same_error_everywhere(comm, fn, exc_type, *needles):
    """Run ``fn`` on every rank; all must raise ``exc_type`` whose text holds ``needles``."""
    try:
        fn()
    except exc_type as exc:
        text = str(exc)
    else:
        text = None
    texts = comm.allgather(text)
    assert all(t is not None for t in texts), f"some ranks did not raise: {texts}"
    for needle in needles:
        assert all(needle in t for t in texts), f"{needle!r} missing from {texts}"
    # nothing is left in flight: a correct call afterwards works
    y = ringcomp.allreduce(np.ones(5), algorithm="ring")
    assert every_rank(comm, np.all(y == comm.size))
    return texts


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["ring", "tree", "mpi"])
def test_length_mismatch(comm, algorithm):
    n = 10 if comm.rank == 0 else 11
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(n), algorithm=algorithm),
                          ArgumentMismatchError, "length (min 10, max 11)")


@pytest.mark.mpi(min_size=2)
def test_dtype_mismatch(comm):
    dtype = np.float32 if comm.rank == 0 else np.float64
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(4, dtype)),
                          ArgumentMismatchError, "dtype", "float32", "float64")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("field", ["seed", "step", "bucket"])
def test_key_mismatch_of_a_compressed_call(comm, field):
    """A compressed call's key (seed, step, bucket: its random streams) differing across
    ranks is named with its values, compared as integers; a key too large for int64 is
    agreed through the options' hash, and NumPy integers count as the integers they are."""
    mine = {field: 1 if comm.rank == 0 else 2}
    same_error_everywhere(
        comm, lambda: ringcomp.allreduce(np.ones(64, np.float32), compressor="qsgd", **mine),
        ArgumentMismatchError, f"{field} (min 1, max 2)")
    huge = {field: 2**70 + (comm.rank > 0)}
    same_error_everywhere(
        comm, lambda: ringcomp.allreduce(np.ones(64, np.float32), compressor="qsgd", **huge),
        ArgumentMismatchError, "options: key")
    x = np.arange(64, dtype=np.float32)
    plain = ringcomp.allreduce(x, compressor="qsgd", **{field: 3})
    numpy_int = ringcomp.allreduce(x, compressor="qsgd", **{field: np.int64(3)})
    big = ringcomp.allreduce(x, compressor="qsgd", **{field: 2**70})
    assert every_rank(comm, np.array_equal(plain, numpy_int) and np.isfinite(big).all())


@pytest.mark.mpi(min_size=2)
def test_algorithm_mismatch(comm):
    algorithm = "ring" if comm.rank == 0 else "tree"
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(4), algorithm=algorithm),
                          ArgumentMismatchError, "algorithm")


@pytest.mark.mpi(min_size=1)
def test_unknown_algorithm_on_one_rank(comm):
    algorithm = "rign" if comm.rank == comm.size - 1 else "ring"
    texts = same_error_everywhere(
        comm, lambda: ringcomp.allreduce(np.ones(4), algorithm=algorithm), ValueError,
        "unknown algorithm", f"rank {comm.size - 1}")
    assert "'rign'" in texts[-1] and "registered:" in texts[-1]


@pytest.mark.mpi(min_size=1)
def test_unknown_op(comm):
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(4), op="avg"), ValueError,
                          "unknown reduction op")


@pytest.mark.mpi(min_size=1)
def test_non_contiguous_on_one_rank(comm):
    base = np.ones((4, 4))
    x = base[:, 0] if comm.rank == 0 else base[0, :]
    same_error_everywhere(comm, lambda: ringcomp.allreduce(x), ValueError,
                          "not C-contiguous", "rank 0")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("bad", [np.ones(3, complex), np.ones(3, bool), [1.0, 2.0]])
def test_unsupported_input(comm, bad):
    same_error_everywhere(comm, lambda: ringcomp.allreduce(bad), TypeError, "rank 0")


@pytest.mark.mpi(min_size=2)
def test_option_mismatch(comm):
    seg = 4096 if comm.rank == 0 else 8192
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(64), segment_bytes=seg),
                          ArgumentMismatchError, "options")


@pytest.mark.mpi(min_size=1)
def test_unknown_option(comm):
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), algorithm="tree",
                                                           segment_bytes=4096),
                          ValueError, "unknown option")


@pytest.mark.mpi(min_size=1)
def test_bad_out(comm):
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), out=np.empty(7)),
                          ValueError, "`out`")


@pytest.mark.mpi(min_size=1)
def test_bad_root(comm):
    same_error_everywhere(comm, lambda: ringcomp.broadcast(np.ones(3), root=comm.size),
                          ValueError, "root is out of range")


@pytest.mark.mpi(min_size=2)
def test_allgather_shape_mismatch(comm):
    n = 3 if comm.rank == 0 else 4
    same_error_everywhere(comm, lambda: ringcomp.allgather(np.ones(n)), ArgumentMismatchError,
                          "length")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ["ring", "tree", "twostage"])
@pytest.mark.parametrize("plan", [False, True])
def test_fp16_values_past_its_range_are_refused_not_made_inf(comm, algorithm, plan):
    """compressor="fp16" turned values past 65504 into Inf without a word. A value that
    would arrive as Inf is refused on every rank before anything is sent (the input left
    as it was), like a NaN; a sum of finite halves that leaves the range on the way raises
    on every rank; sums within it are as before (against NumPy's float16 sums)."""
    def call(x):
        if plan:
            return ringcomp.allreduce_init(x, algorithm=algorithm, compressor="fp16")(step=0)
        return ringcomp.allreduce(x, algorithm=algorithm, compressor="fp16")

    x = np.full(64, 1.0, np.float32)
    if comm.rank == comm.size - 1:
        x[7] = 70000.0
    before = x.copy()
    texts = same_error_everywhere(comm, lambda: call(x), FloatingPointError,
                                  "past the compressor's range", f"rank {comm.size - 1}")
    assert "1 of 64 values are beyond fp16's range" in texts[-1] and np.array_equal(x, before)
    inside = np.full(64, 60000.0 / comm.size, np.float32)
    assert every_rank(comm, bool(np.isfinite(call(inside)).all()))
    if comm.size > 1:  # every input fine, their sum is not
        same_error_everywhere(comm, lambda: call(np.full(64, 40000.0, np.float32)),
                              FloatingPointError, "fp16 overflowed", "bf16")


@pytest.mark.mpi(min_size=1)
def test_nonfinite_refused_on_request(comm):
    x = np.ones(100, np.float32)
    if comm.rank == comm.size - 1:
        x[[3, 50]] = [np.nan, np.inf]
    texts = same_error_everywhere(comm, lambda: ringcomp.allreduce(x, check_finite=True),
                                  FloatingPointError, "NaN or Inf", f"rank {comm.size - 1}")
    assert "2 of 100 values" in texts[-1]
    # by default they propagate, as with MPI
    y = ringcomp.allreduce(x)
    assert every_rank(comm, np.isnan(y[3]) and np.isinf(y[50]))
