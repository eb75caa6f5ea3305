"""The compressed ring's compiled walk (a small host buffer: Marsit, the scaled sign, QSGD,
TernGrad, top-k) gives the Python walk's bits, bytes and messages, refuses what it refuses,
and is taken exactly where it applies."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import both_walks, every_rank, walked_algorithms

import ringcomp
from ringcomp.collectives import compressed_ring_native as native
from ringcomp.trace import Tracer

#: one element a rank, odd, several chunk widths, and chunks of a whole kernel block
SIZES = [1, 7, 1000, 4099, 70_001]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", walked_algorithms(compressed=True))
@pytest.mark.parametrize("compressor", ["marsit", "sign", "qsgd", "terngrad", "topk"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_walk_has_the_python_walks_bits_bytes_and_messages(comm, algorithm,
                                                                      compressor, dtype,
                                                                      monkeypatch):
    """Every size, two steps and seeds (the random merge's streams), checked before the
    call and as the hops read (``check=False``: the walk's halves with the agreement
    between), and in place."""
    t = ringcomp.Transport(comm)
    walked = []
    try:
        for n in [comm.size * k for k in SIZES]:
            x = np.random.default_rng(comm.rank + 31 * n).standard_normal(n).astype(dtype)
            for options in ({"step": 3, "seed": 5}, {"step": 4, "seed": 6, "check": False}):
                python, compiled = [(y.tobytes(), sent, messages) for y, sent, messages
                                    in both_walks(t, x, monkeypatch, algorithm, walked,
                                                  compressor=compressor, **options)]
                inplace = x.copy()
                ringcomp.allreduce(inplace, algorithm=algorithm, comm=t, out=inplace,
                                   compressor=compressor, **options)
                ok = python == compiled and compiled[0] == inplace.tobytes()
                assert every_rank(comm, ok), (n, options)
        assert every_rank(comm, comm.size == 1 or any(walked)), "no size bound a walk"
    finally:
        t.close()


@pytest.mark.mpi(min_size=2)
def test_compiled_walk_with_error_feedback_keeps_the_python_walks_residuals(comm,
                                                                           monkeypatch):
    """Three steps of sign + EF: the outputs and the residuals carried between steps are
    those of the Python walk."""
    x = np.random.default_rng(comm.rank).standard_normal(1000).astype(np.float32)
    runs = []
    for enabled in (False, True):
        monkeypatch.setattr(native, "ENABLED", enabled)
        t = ringcomp.Transport(comm)
        try:
            outs = [ringcomp.allreduce(x, algorithm="ring", comm=t, compressor="sign",
                                       error_feedback=True, step=step).tobytes()
                    for step in range(3)]
        finally:
            t.close()
        runs.append(outs)
    assert every_rank(comm, runs[0] == runs[1])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", [True, False])
def test_non_finite_input_is_refused_on_every_rank(comm, check):
    """A NaN on the last rank: every rank raises, checked before the call or as the hops
    read it (the walk then leaves the call to the Python walk, which refuses it)."""
    t = ringcomp.Transport(comm)
    x = np.ones(1000, np.float32)
    if comm.rank == comm.size - 1:
        x[17] = np.nan
    try:
        with pytest.raises(FloatingPointError, match="NaN or Inf"):
            ringcomp.allreduce(x, algorithm="ring", comm=t, compressor="marsit", check=check)
        y = ringcomp.allreduce(np.ones(1000, np.float32), algorithm="ring", comm=t,
                               compressor="marsit")  # and the next call is right
        assert every_rank(comm, bool((y == 1).all()))
    finally:
        t.close()


@pytest.mark.mpi(min_size=2)
def test_compiled_walk_runs_where_it_applies_and_not_elsewhere(comm, monkeypatch):
    """Taken for Marsit, the scaled sign, QSGD and top-k on a small host buffer; the
    Python walk for another compressor, a traced or shadowed call, chunks of several
    segments or of no element, and an exact buffer riding along in chunks of several
    segments (one of one segment a chunk rides in the compiled walk)."""
    native.compile_walks([np.float32])  # before the spies stand in for the dispatchers
    ran = []
    for name in ("_walk", "_reduce_scatter"):
        real = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, real=real: ran.append(1) or real(*a))
    t = ringcomp.Transport(comm)
    x = np.arange(1000, dtype=np.float32) - 500
    try:
        for compressor in ("marsit", "sign", "qsgd", "topk"):
            ringcomp.allreduce(x, algorithm="ring", comm=t, compressor=compressor)
        assert every_rank(comm, ran == [1] * 4)
        tracer = Tracer()
        for call in (
                lambda: ringcomp.allreduce(x, algorithm="ring", comm=t,
                                           compressor="countsketch"),
                lambda: ringcomp.allreduce(x, algorithm="ring", comm=t, compressor="marsit",
                                           tracer=tracer),
                lambda: ringcomp.allreduce(x, algorithm="ring", comm=t, compressor="marsit",
                                           tracer=Tracer(), shadow=True),
                lambda: ringcomp.allreduce(x, algorithm="ring", comm=t, compressor="marsit",
                                           segment_bytes=256),
                lambda: ringcomp.allreduce(x[:comm.size - 1], algorithm="ring", comm=t,
                                           compressor="marsit")):
            call()
        plan = ringcomp.allreduce_init(x, algorithm="ring", comm=t, compressor="marsit",
                                       out=np.empty_like(x))
        rider = ringcomp.allreduce_init(x[:100], algorithm="ring", comm=t, segment_bytes=8,
                                        out=np.empty(100, np.float32))
        plan.with_rider(x, rider, x[:100])  # a rider of several segments a chunk
        assert every_rank(comm, ran == [1] * 4)
        rider = ringcomp.allreduce_init(x[:10], algorithm="ring", comm=t,
                                        out=np.empty(10, np.float32))
        plan.with_rider(x, rider, x[:10])
        assert every_rank(comm, ran == [1] * 5)  # one of one segment rides in the walk
        assert every_rank(comm, any(r.get("kind") == "merge" for r in tracer.records))
    finally:
        t.close()



@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compressor", ["marsit", "sign", "qsgd", "topk"])
@pytest.mark.parametrize("check", [True, False])
def test_a_rider_in_the_compiled_walk_has_the_python_walks_bits_bytes_and_messages(
        comm, compressor, check, monkeypatch):
    """A compressed plan's call carrying an exact rider (``with_rider``, as the trainer's
    last bucket does): both results, the bytes and the messages are those of the Python
    walk, for riders shorter than the ring (empty chunks send nothing), of one element
    and of many, checked before the call or as the hops read; the rider's sum is its own
    exact ring's, bit for bit."""
    t = ringcomp.Transport(comm)
    try:
        for n, m in [(7 * comm.size, 1), (1000, comm.size - 1 or 1), (1000, 10),
                     (4099, 1001)]:
            rng = np.random.default_rng(comm.rank + 7 * m)
            x = rng.standard_normal(n).astype(np.float32)
            y = rng.standard_normal(m).astype(np.float32)
            runs = []
            for enabled in (False, True):
                monkeypatch.setattr(native, "ENABLED", enabled)
                plan = ringcomp.allreduce_init(x, algorithm="ring", comm=t, seed=3,
                                               compressor=compressor, check=check)
                rider = ringcomp.allreduce_init(y, algorithm="ring", comm=t, check=check)
                sent, messages = t.bytes_sent, t.messages_sent
                out, rider_out = plan.with_rider(x, rider, y, step=2)
                runs.append((out.tobytes(), rider_out.tobytes(), t.bytes_sent - sent,
                             t.messages_sent - messages))
            exact = ringcomp.allreduce(y, algorithm="ring", comm=t)
            ok = runs[0] == runs[1] and runs[1][1] == exact.tobytes()
            assert every_rank(comm, ok), (n, m)
    finally:
        t.close()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compressor", ["sign", "marsit"])
@pytest.mark.parametrize("way", ["compiled", "python", "plan"])
def test_unchecked_lengths_of_equal_payload_bytes_are_refused_on_every_rank(
        comm, compressor, way, monkeypatch):
    """Without the argument agreement (``check=False``), 1000 elements on one rank and
    1001 on the others: sign bits are packed 32 to a word, so every payload has the same
    bytes and no receive can tell - the ring used to return on every rank. The agreement
    on the input's finiteness, between the reduce-scatter and the all-gather, compares
    the lengths too: ArgumentMismatchError on every rank, naming them, before anything
    is written (``out`` keeps its contents)."""
    from test_errors import same_error_everywhere

    from ringcomp.errors import ArgumentMismatchError

    monkeypatch.setattr(native, "ENABLED", way != "python")
    n = 1000 if comm.rank == 0 else 1001
    x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
    out = np.full(n, 7.0, np.float32)
    if way == "plan":
        plan = ringcomp.allreduce_init(x, out=out, compressor=compressor, check=False)
        call = plan
    else:
        def call():
            return ringcomp.allreduce(x, out=out, compressor=compressor, check=False)
    same_error_everywhere(comm, call, ArgumentMismatchError, "length (min 1000, max 1001)")
    assert every_rank(comm, np.all(out == 7.0))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["tree", "dbtree", "torus", "allgather", "twostage"])
def test_unchecked_other_schemes_agree_on_lengths_first(comm, algorithm):
    """The other compressed schemes have no agreement between their hops: without the
    argument agreement (``check=False``) sign's equal-byte payloads of 1000 and 1001
    elements used to pass unseen. They agree on the length and item size first (one tiny
    Allreduce), so other lengths raise ArgumentMismatchError on every rank before anything
    is written; equal lengths give what the checked call gives."""
    from test_errors import same_error_everywhere

    from ringcomp.errors import ArgumentMismatchError

    n = 1000 if comm.rank == 0 else 1001
    x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
    out = np.full(n, 7.0, np.float32)
    same_error_everywhere(comm, lambda: ringcomp.allreduce(
        x, out=out, algorithm=algorithm, compressor="sign", check=False),
        ArgumentMismatchError, "length (min 1000, max 1001)")
    ok = bool(np.all(out == 7.0))
    y = x[:1000]
    ok &= np.array_equal(ringcomp.allreduce(y, algorithm=algorithm, compressor="sign",
                                            check=False),
                         ringcomp.allreduce(y, algorithm=algorithm, compressor="sign"))
    assert every_rank(comm, ok)
