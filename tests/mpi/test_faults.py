"""Fault injection on the collective API: every class of bad input, at every entry point,
gives a clear error on every rank (or a correct result) - never a hang, never a silent
wrong answer. Oracles: MPI's own Allreduce and NumPy."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import every_rank
from mpi4py import MPI
from registered import all_compressors, compressed_schemes
from test_errors import same_error_everywhere

import ringcomp
from ringcomp.errors import ArgumentMismatchError, ClosedTransportError, ConcurrentCallError

COMPRESSED_ALGORITHMS = compressed_schemes()
COMPRESSORS = all_compressors()


def entry_points(x, out=None):
    """Each public collective called on ``x`` (with ``out`` where it takes one)."""
    return {
        "allreduce": lambda: ringcomp.allreduce(x, out=out),
        "allreduce[mpi]": lambda: ringcomp.allreduce(x, algorithm="mpi", out=out),
        "reduce_scatter": lambda: ringcomp.reduce_scatter(x),
        "allgather": lambda: ringcomp.allgather(x),
        "broadcast": lambda: ringcomp.broadcast(x),
    }


# -- buffers that look right but are not ---------------------------------------------------
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["allreduce", "allreduce[mpi]", "reduce_scatter", "allgather",
                                   "broadcast"])
def test_byte_order_differing_between_ranks_is_refused(comm, entry):
    """'>f8' and '<f8' are both float64: before the fix they met and summed garbage."""
    x = np.arange(1.0, 4.0).astype(">f8" if comm.rank == 0 else "<f8")
    same_error_everywhere(comm, entry_points(x)[entry], ValueError, "native byte order",
                          "rank 0")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["allreduce", "allreduce[mpi]", "reduce_scatter", "allgather"])
def test_unaligned_buffer_on_one_rank_is_refused(comm, entry):
    raw = np.zeros(8 * 5 + 1, np.uint8)
    x = raw[1:].view(np.float64) if comm.rank == comm.size - 1 else np.zeros(5)
    same_error_everywhere(comm, entry_points(x)[entry], ValueError, "not aligned",
                          f"rank {comm.size - 1}")


@pytest.mark.mpi(min_size=2)
def test_read_only_broadcast_input_is_refused_on_every_rank(comm):
    """The root does not write, but its verdict must match the others' (no raw BufferError)."""
    for culprit in (0, comm.size - 1):
        x = np.ones(4)
        x.flags.writeable = comm.rank != culprit
        same_error_everywhere(comm, lambda x=x: ringcomp.broadcast(x), ValueError, "read-only",
                              f"rank {culprit}")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["allreduce", "allreduce[mpi]"])
def test_read_only_out_is_refused(comm, entry):
    out = np.empty(4)
    out.flags.writeable = comm.rank != 0
    same_error_everywhere(comm, entry_points(np.ones(4), out)[entry], ValueError, "read-only")


# -- aliasing --------------------------------------------------------------------------
def _overlap_case(comm):
    """Rank r holds (r + 1) * arange(20); the sum of the first ten, exactly."""
    buf = np.arange(20, dtype=np.float32) * (comm.rank + 1)
    expected = np.arange(10, dtype=np.float32) * sum(r + 1 for r in range(comm.size))
    return buf, buf[:10], expected


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ringcomp.algorithms())
def test_out_partially_overlapping_the_input_gives_the_right_sum(comm, algorithm):
    """The issue's case: out=buf[5:15] over x=buf[:10] returned 18 and 22 for 21 and 24."""
    buf, x, expected = _overlap_case(comm)
    y = ringcomp.allreduce(x, out=buf[5:15], algorithm=algorithm)
    assert every_rank(comm, np.array_equal(y, expected))
    below = np.arange(5, dtype=np.float32) * (comm.rank + 1)
    assert every_rank(comm, np.array_equal(buf[:5], below))  # nothing outside out written


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ringcomp.algorithms())
def test_out_is_x_reduces_in_place(comm, algorithm):
    x = np.arange(1000, dtype=np.float64) * (comm.rank + 1)
    ref = np.empty_like(x)
    comm.Allreduce(x, ref)
    same = x.reshape(10, 100)[:, :]  # the same memory through another array object
    ringcomp.allreduce(x, out=same.reshape(-1), algorithm=algorithm)
    assert every_rank(comm, np.array_equal(x, ref))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", COMPRESSED_ALGORITHMS)
@pytest.mark.parametrize("compressor", ["sign", "marsit", "qsgd", "topk:ratio=0.1",
                                        "countsketch"])
def test_compressed_in_place_and_overlapping_equal_out_of_place(comm, algorithm, compressor):
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal(3000).astype(np.float32)
    ref = ringcomp.allreduce(x, algorithm=algorithm, compressor=compressor, seed=3, step=1)
    y = x.copy()
    ringcomp.allreduce(y, out=y, algorithm=algorithm, compressor=compressor, seed=3, step=1)
    assert every_rank(comm, np.array_equal(y, ref))
    buf = np.zeros(4000, np.float32)
    buf[:3000] = x
    z = ringcomp.allreduce(buf[:3000], out=buf[1000:], algorithm=algorithm,
                           compressor=compressor, seed=3, step=1)
    assert every_rank(comm, np.array_equal(z, ref))


@pytest.mark.mpi(min_size=1)
def test_reduce_scatter_and_allgather_into_overlapping_out(comm):
    p, r = comm.size, comm.rank
    buf = np.arange(40, dtype=np.float64) + r
    ref = np.empty(20)
    comm.Allreduce(buf[:20].copy(), ref)
    lo, hi = ringcomp.partition.block_bounds(20, p)[r]
    got = ringcomp.reduce_scatter(buf[:20], out=buf[5:5 + hi - lo])
    assert every_rank(comm, np.array_equal(got, ref[lo:hi]))
    flat = np.zeros(3 * (p + 1))
    flat[:3] = [r, r + 1, r + 2]
    rows = ringcomp.allgather(flat[:3], out=flat[:3 * p].reshape(p, 3))
    expect = np.array([[q, q + 1, q + 2] for q in range(p)], float)
    assert every_rank(comm, np.array_equal(rows, expect))


# -- option values and mismatches -------------------------------------------------------
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("segment_bytes", [0, -4, 3, 1.5, True, "64"])
@pytest.mark.parametrize("algorithm", ["ring", "dbtree", "rabenseifner"])
def test_nonsense_segment_bytes_is_refused(comm, algorithm, segment_bytes):
    same_error_everywhere(
        comm, lambda: ringcomp.allreduce(np.ones(10, np.float32), algorithm=algorithm,
                                         segment_bytes=segment_bytes),
        ValueError, "segment_bytes")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("candidates", ["ring,bogus", "", 5, "auto", []])
def test_nonsense_auto_candidates_are_refused(comm, candidates):
    same_error_everywhere(
        comm, lambda: ringcomp.allreduce(np.ones(4), algorithm="auto", candidates=candidates),
        ValueError, "candidates=")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("root", [-1, "0", 1.0, 99])
def test_nonsense_root_is_refused(comm, root):
    same_error_everywhere(comm, lambda: ringcomp.broadcast(np.ones(3), root=root), ValueError,
                          "root")


@pytest.mark.mpi(min_size=2)
def test_option_mismatch_names_the_option_and_values(comm):
    """Not hashes: compressor, its parameters and segment_bytes by name, value per rank."""
    last = comm.size - 1
    texts = same_error_everywhere(
        comm, lambda: ringcomp.allreduce(
            np.ones(100, np.float32), compressor="qsgd:levels=4" if comm.rank == last else "qsgd",
            segment_bytes=128 if comm.rank == last else 64),
        ArgumentMismatchError, "compressor", "levels=4", "levels=16", "segment_bytes",
        f"rank {last}: 128")
    assert all("hash" not in t for t in texts)


# -- non-finite input with compression --------------------------------------------------
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", COMPRESSED_ALGORITHMS)
@pytest.mark.parametrize("compressor", COMPRESSORS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_input_with_a_compressor_fails_on_every_rank(comm, algorithm, compressor,
                                                               bad):
    """A sign bit, an index or a sketch cannot carry NaN/Inf: refused on every rank (before
    the fix topk crashed and marsit/randomk/countsketch/terngrad dropped it silently)."""
    x = np.arange(1000, dtype=np.float32)
    if comm.rank == 1:
        x[3] = bad
    same_error_everywhere(
        comm, lambda: ringcomp.allreduce(x, algorithm=algorithm, compressor=compressor),
        FloatingPointError, "NaN or Inf", "rank 1")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["ring", "tree", "dbtree", "rd", "rabenseifner", "mpi"])
def test_nonfinite_input_without_compression_propagates_like_mpi(comm, algorithm):
    x = np.arange(10, dtype=np.float32)
    if comm.rank == 1:
        x[3], x[5] = np.nan, np.inf
    y = ringcomp.allreduce(x, algorithm=algorithm)
    ref = np.empty_like(x)
    comm.Allreduce(x, ref)
    assert every_rank(comm, np.isnan(y[3]) and np.isinf(y[5]) and np.array_equal(
        np.delete(y, [3, 5]), np.delete(ref, [3, 5])))


# -- communicators ----------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_freed_and_recreated_communicator_gets_a_fresh_transport(comm):
    """The issue's case: a freed COMM_SELF duplicate's handle came back for a world
    duplicate, and ringcomp reduced over the old (one-rank) group."""
    s = MPI.COMM_SELF.Dup()
    assert ringcomp.allreduce(np.ones(3), comm=s)[0] == 1
    s.Free()
    d = MPI.COMM_WORLD.Dup()
    assert every_rank(comm, np.all(ringcomp.allreduce(np.ones(3), comm=d) == comm.size))
    d.Free()


@pytest.mark.mpi(min_size=1)
def test_create_use_free_in_a_loop(comm):
    """Dup, Split and COMM_SELF duplicates created, used and freed 150 times: always the
    right group, no communicator leaked (MPICH has a few thousand context ids)."""
    ok = True
    for i in range(150):
        kind = i % 3
        if kind == 0:
            c = comm.Dup()
        elif kind == 1:
            c = comm.Split(comm.rank % 2, comm.rank)
        else:
            c = MPI.COMM_SELF.Dup()
        x = np.full(5, float(comm.rank + 1))
        y = ringcomp.allreduce(x, comm=c, algorithm=("ring", "tree", "rd")[i % 3])
        ranks = c.allgather(comm.rank)
        ok &= bool(np.all(y == sum(r + 1 for r in ranks)))
        c.Free()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_a_transport_whose_communicator_was_freed_refuses_calls(comm):
    c = comm.Dup()
    t = ringcomp.get_transport(c)
    ringcomp.allreduce(np.ones(2), comm=t)
    c.Free()
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(2), comm=t),
                          ClosedTransportError, "freed")
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(2), comm=c), ValueError,
                          "COMM_NULL")


@pytest.mark.mpi(min_size=2)
def test_intercommunicator_is_refused_with_a_message(comm):
    half = comm.Split(comm.rank % 2, comm.rank)  # even ranks led by 0, odd ones by 1
    inter = half.Create_intercomm(0, comm, 1 if comm.rank % 2 == 0 else 0, tag=7)
    try:
        same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(2), comm=inter),
                              ValueError, "intercommunicator")
    finally:
        inter.Free()
        half.Free()


@pytest.mark.mpi(min_size=1)
def test_comm_null_and_bad_timeouts_are_refused(comm):
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(2), comm=MPI.COMM_NULL),
                          ValueError, "COMM_NULL")
    for bad in (-1, float("nan"), float("inf"), "soon"):
        same_error_everywhere(comm, lambda bad=bad: ringcomp.Transport(comm, timeout=bad),
                              ValueError, "timeout")


# -- threads ----------------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_a_second_thread_on_a_busy_communicator_is_refused(comm):
    """Deterministic: thread A is inside a collective section on the transport when the
    main thread calls; the main thread is refused, A's call raises when it ends, and the
    transport refuses every later call (its pairing across ranks can no longer be trusted).
    The job-level scenario (two threads looping) is in tests/serial/test_faults_cli.py."""
    c = comm.Dup()
    t = ringcomp.get_transport(c)
    inside, release, seen = threading.Event(), threading.Event(), []

    def hold():
        try:
            with t.exclusive("allreduce"):
                inside.set()
                release.wait(30)
        except ConcurrentCallError as exc:
            seen.append(str(exc))

    a = threading.Thread(target=hold, name="holder")
    a.start()
    inside.wait(30)
    try:
        with pytest.raises(ConcurrentCallError, match="two threads"):
            ringcomp.allreduce(np.ones(3), comm=t)
    finally:
        release.set()
        a.join(30)
    assert seen and "holder" in seen[0] and "comm.Dup()" in seen[0]
    with pytest.raises(ClosedTransportError):
        ringcomp.allreduce(np.ones(3), comm=t)
    c.Free()


@pytest.mark.mpi(min_size=1)
def test_two_threads_starting_on_one_communicator_share_one_transport(comm):
    """The transport is made on the first call; two threads making it at the same moment
    used to make one each (two duplicates of the communicator, two guards that never saw
    each other). Now one is made per rank and both threads get it."""
    c = comm.Dup()
    go, got = threading.Barrier(2), []

    def first_call():
        go.wait(30)
        got.append(ringcomp.get_transport(c))

    threads = [threading.Thread(target=first_call, name=f"starter-{k}") for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert every_rank(comm, len(got) == 2 and got[0] is got[1])
    c.Free()


@pytest.mark.mpi(min_size=1)
def test_threads_with_their_own_communicators_are_fine(comm):
    """The documented way: one communicator per thread, made before the threads start."""
    comms = [comm.Dup() for _ in range(2)]
    results: dict[int, bool] = {}

    def loop(k):
        ok = True
        for _ in range(10):
            y = ringcomp.allreduce(np.full(50000, k + 1.0, np.float32), comm=comms[k])
            ok &= bool(np.all(y == comm.size * (k + 1)))
        results[k] = ok

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert every_rank(comm, results == {0: True, 1: True})
    for c in comms:
        c.Free()


@pytest.mark.mpi(min_size=2)
def test_calls_from_differently_named_threads_never_pair_up(comm):
    """Rank 0 calls from one thread, the others from another: the agreement compares the
    calling threads' names, so the calls fail on every rank instead of mixing data (the
    first calls of two threads sharing a communicator can cross this way on any rank)."""
    c = comm.Dup()
    texts = []

    def call():
        try:
            ringcomp.allreduce(np.ones(3), comm=c)
        except ArgumentMismatchError as exc:
            texts.append(str(exc))

    th = threading.Thread(target=call, name="loader" if comm.rank == 0 else "trainer")
    th.start()
    th.join(60)
    assert every_rank(comm, len(texts) == 1 and "calling thread" in texts[0]
                      and "rank 0: 'loader'" in texts[0] and "comm.Dup()" in texts[0])
    c.Free()


@pytest.mark.mpi(min_size=1)
def test_one_thread_after_another_is_fine(comm):
    """Sequential use from alike-named threads (one at a time) is not concurrent use."""
    out = []
    for k in range(3):
        th = threading.Thread(target=lambda k=k: out.append(
            ringcomp.allreduce(np.full(4, k + 1.0))[0]), name=f"worker-{k}")
        th.start()
        th.join(60)
    assert every_rank(comm, out == [comm.size * (k + 1.0) for k in range(3)])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compressor", [c for c in COMPRESSORS if c != "powersgd"])
@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("as_read_from", [0, None], ids=["as-read", "default"])
def test_the_compressed_ring_refuses_nonfinite_input_as_it_reads_it(comm, compressor, where,
                                                                    check, as_read_from,
                                                                    monkeypatch):
    """The compressed ring checks each segment as its hops read it (no pass over the input
    first; a bad segment reaches the codecs as zeros, so none crashes on it - top-k did)
    and agrees before writing anything: in place, the input survives the refusal,
    whichever segment the NaN sits in (the owner's first one, or the last one joined), and
    with check=False as well; the next call on the communicator works. Below
    ``CHECK_AS_READ_FROM_BYTES`` (this 12 KB input, "default") one pass checks the input
    first and the call's agreement carries the verdict: the same error, the same input
    kept. (PowerSGD sums its factors exactly: its input is checked before the call, as on
    the other algorithms.)"""
    if as_read_from is not None:
        monkeypatch.setattr("ringcomp.api.CHECK_AS_READ_FROM_BYTES", as_read_from)
    n, culprit = 3000, comm.size - 1
    x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
    if comm.rank == culprit:
        x[0 if where == "first" else n - 1] = np.nan
    before = x.copy()
    texts = same_error_everywhere(
        comm, lambda: ringcomp.allreduce(x, out=x, compressor=compressor, check=check,
                                         segment_bytes=1024),
        FloatingPointError, "NaN or Inf", f"rank {culprit}")
    assert "1 of 3000 values" in texts[culprit]
    assert every_rank(comm, np.array_equal(x, before, equal_nan=True))
