"""Compressor state objects: error-feedback residuals and PowerSGD's warm start travel
through state_dict()/load_state_dict(), and error feedback runs in one place."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI

import ringcomp
from ringcomp.api import MAX_RESOLVED_SPECS
from ringcomp.compression import ErrorFeedback, Key, get_compressor


def test_error_feedback_around_compensates_runs_and_keeps_what_was_lost():
    """compensate -> collective -> update: the collective sees x + residual, and the new
    residual is exactly what the compressor's own encoding of that lost
    (x == decode(encode(x)) + residual)."""
    comp, memory, key = get_compressor("topk:ratio=0.1"), ErrorFeedback(), Key(1, 2, 3)
    x = np.random.default_rng(0).standard_normal(200).astype(np.float32)
    segments = [(0, 120), (120, 200)]
    seen = []
    for _ in range(2):
        before = memory.residuals.get(ErrorFeedback.key(3, 200))
        memory.around(x, 3, seen.append, comp, key, segments)
        corrected = seen[-1]
        assert np.array_equal(corrected, x if before is None else x + before)
        residual = memory.residuals[ErrorFeedback.key(3, 200)]
        sent = np.empty(200, np.float32)
        for a, b in segments:
            comp.decode(comp.encode(corrected[a:b], key.at(0, a)), b - a, sent[a:b])
        assert np.array_equal(corrected, sent + residual)
    assert seen[0] is not x  # the input itself is never modified nor handed on


def test_error_feedback_state_round_trips_as_copies():
    memory = ErrorFeedback()
    memory.remember(np.arange(4, dtype=np.float32), bucket=1)
    memory.remember(np.ones(3, np.float32), bucket=1, side="server")
    state = memory.state_dict()
    state[ErrorFeedback.key(1, 4)][0] = 99  # a copy: the memory is untouched
    assert memory.residuals[ErrorFeedback.key(1, 4)][0] == 0
    other = ErrorFeedback()
    other.load_state_dict(memory.state_dict())
    assert other.residuals.keys() == memory.residuals.keys()
    assert all(np.array_equal(other.residuals[k], v) for k, v in memory.residuals.items())


def test_powersgd_warm_start_is_its_state():
    """The warm start lives on the compressor: a call starts from the state it was given,
    a fresh instance (or an emptied one) starts from the shared seed again."""
    x = np.random.default_rng(1).standard_normal(900).astype(np.float32)
    comp = get_compressor("powersgd:rank=2")
    first = ringcomp.allreduce(x, comm=None, compressor=comp, bucket=4)
    saved = comp.state_dict()
    assert list(saved) == [(4, 900, "<f4", 2)]
    second = ringcomp.allreduce(x, compressor=comp, bucket=4)
    restored = get_compressor("powersgd:rank=2")
    restored.load_state_dict(saved)
    assert np.array_equal(ringcomp.allreduce(x, compressor=restored, bucket=4), second)
    fresh = get_compressor("powersgd:rank=2")
    assert np.array_equal(ringcomp.allreduce(x, compressor=fresh, bucket=4), first)
    comp.load_state_dict({})
    assert comp.state_dict() == {}


def test_a_spec_string_names_one_instance_per_communicator():
    """Calls that name PowerSGD by string keep its warm start between them, as an instance
    passed in would (the string resolves to the same object on the same communicator)."""
    x = np.random.default_rng(2).standard_normal(900).astype(np.float32)
    comp = get_compressor("powersgd:rank=3")
    by_string = [ringcomp.allreduce(x, compressor="powersgd:rank=3", bucket=9)
                 for _ in range(3)]
    by_object = [ringcomp.allreduce(x, compressor=comp, bucket=9) for _ in range(3)]
    assert all(np.array_equal(a, b) for a, b in zip(by_string, by_object, strict=True))
    assert not np.array_equal(by_string[0], by_string[2])  # the warm start acted


def test_a_stateless_compressor_refuses_state():
    get_compressor("sign").load_state_dict({})
    with pytest.raises(ValueError, match="compressor 'sign' keeps no state"):
        get_compressor("sign").load_state_dict({(1,): np.zeros(2)})


def _growth_over(calls: int, call) -> int:
    """Bytes still allocated after ``calls`` more calls than before them (after a warm-up
    that fills the bounded caches of segment layouts)."""
    for i in range(calls // 2):
        call(i)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(calls // 2, calls):
            call(i)
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


#: calls per check: the second half is measured, where keeping every compressor (>= 0.4 KB)
#: or residual (4.4 KB) would grow by >= 600 KB, twice the bound
CALLS = 3000
#: what the measured half may leave allocated: bounded caches (segment layouts, keyed by
#: length) refilled with new keys count in full, since their evicted entries were made
#: before tracing began: 130-200 KB here whatever the number of calls (1000 to 9000)
BOUND = 300_000


def test_memory_stays_bounded_over_thousands_of_distinct_specs_and_lengths():
    """A long job naming a new spec string per call, or error feedback on ever-changing
    lengths, used to keep every resolved compressor (about 0.4-27 KB each) and every
    length's residual (4.4 KB a call here) for ever."""
    comm = MPI.COMM_SELF.Dup()
    x = np.ones(64, np.float32)
    grown = _growth_over(CALLS, lambda i: ringcomp.allreduce(
        x, comm=comm, compressor=f"topk:ratio={0.5 + i * 1e-6:.7f}"))
    transport = ringcomp.get_transport(comm)
    assert len(transport.kept.compressors) == MAX_RESOLVED_SPECS and grown < BOUND
    memory = ErrorFeedback()
    with pytest.warns(RuntimeWarning, match="bucket 0 held a worker residual of 10 float32"):
        grown = _growth_over(CALLS, lambda i: ringcomp.allreduce(
            np.ones(10 + i, np.float32), comm=comm, compressor="sign",
            error_feedback=memory))
    assert list(memory.residuals) == [ErrorFeedback.key(0, 10 + CALLS - 1)]
    assert grown < BOUND
    comm.Free()


def test_a_dropped_stateful_spec_says_so():
    """Past MAX_RESOLVED_SPECS distinct specs the oldest is dropped; PowerSGD's warm start
    going with it is said, not lost in silence."""
    comm = MPI.COMM_SELF.Dup()
    x = np.ones(900, np.float32)
    ringcomp.allreduce(x, comm=comm, compressor="powersgd:rank=3")
    with pytest.warns(RuntimeWarning, match="'powersgd:rank=3' .* warm start"):
        for i in range(MAX_RESOLVED_SPECS):
            ringcomp.allreduce(x, comm=comm, compressor=f"topk:ratio=0.{i + 1:03d}")
    comm.Free()
