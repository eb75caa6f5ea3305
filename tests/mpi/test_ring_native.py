"""The ring's compiled walk (a small host sum, its MPI calls from compiled code) gives the
Python walk's bits, bytes and messages, and is taken exactly where it applies."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import both_walks, every_rank, exact_walk_spy, walked_algorithms

import ringcomp
from ringcomp.collectives import ring_native
from ringcomp.devices.standin import DeviceArray
from ringcomp.trace import Tracer

#: empty, fewer elements than ranks, odd, and chunks past 64 KB (still one segment each)
SIZES = [0, 1, 2, 7, 1000, 4099, 70_001]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", walked_algorithms())
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_compiled_walk_has_the_python_walks_bits_bytes_and_messages(comm, algorithm, dtype,
                                                                      monkeypatch):
    ring_native.compile_walks()  # Numba loaded: an exact walk binds only then
    t = ringcomp.Transport(comm)
    walked = []
    try:
        for n in SIZES:
            rng = np.random.default_rng(comm.rank + 31 * n)
            x = (rng.standard_normal(n) * 1000).astype(dtype)
            (want, sent, messages), (got, sent2, messages2) = both_walks(
                t, x, monkeypatch, algorithm, walked)
            inplace = x.copy()
            ringcomp.allreduce(inplace, algorithm=algorithm, comm=t, out=inplace)
            ok = (got.tobytes() == want.tobytes() == inplace.tobytes()
                  and (sent, messages) == (sent2, messages2))
            assert every_rank(comm, ok), (dtype, n)
            exact = np.empty_like(x)
            comm.Allreduce(x, exact)
            if dtype.startswith("int"):  # integers: MPI's own sum, exactly
                assert every_rank(comm, np.array_equal(got, exact)), n
        assert every_rank(comm, comm.size == 1 or any(walked)), "no size bound a walk"
    finally:
        t.close()


@pytest.mark.mpi(min_size=2)
def test_compiled_walk_runs_for_a_small_host_sum_and_not_elsewhere(comm, monkeypatch):
    """Taken for an untraced small host sum; the Python walk for everything else: another
    op, float16, a traced call (its hops are recorded), chunks of several segments. A
    small device sum where MPI is not CUDA-aware runs it too, on one host copy (every call
    runs through a plan: ``plans.bind.Staged``)."""
    ran = exact_walk_spy(monkeypatch)
    t = ringcomp.Transport(comm)
    x = np.arange(1000, dtype=np.float32)
    try:
        ringcomp.allreduce(x, algorithm="ring", comm=t)
        assert every_rank(comm, ran == [1])
        tracer = Tracer()
        for call in (lambda: ringcomp.allreduce(x, algorithm="ring", comm=t, op="max"),
                     lambda: ringcomp.allreduce(x.astype(np.float16), algorithm="ring",
                                                comm=t),
                     lambda: ringcomp.allreduce(x, algorithm="ring", comm=t, tracer=tracer),
                     lambda: ringcomp.allreduce(x, algorithm="ring", comm=t,
                                                segment_bytes=256),
                     lambda: ringcomp.allreduce(DeviceArray.of(x), algorithm="ring",
                                                comm=t)):
            call()
        assert every_rank(comm, ran == [1, 1])
        assert every_rank(comm, any(r.get("kind") == "recv" for r in tracer.records))
    finally:
        t.close()



@pytest.mark.mpi(min_size=2)
def test_messages_past_a_c_int_of_bytes_go_the_python_walk(comm, monkeypatch):
    """MPI's counts are C ints: the walk passed a chunk's bytes as one, so a chunk of
    2-4 GiB raised 'Negative count' and one past 4 GiB wrapped round to a silently wrong
    sum. A chunk past ``MAX_MESSAGE_BYTES`` (2**31 - 1) now goes the Python walk
    (mpi4py's large counts): here with the limit lowered to 1 KB, a 4 KB-a-chunk sum
    runs in Python with MPI's own bits while a 512-byte-a-chunk sum still runs compiled."""
    import ringcomp.transport.mpicalls as mpicalls

    assert ring_native.MAX_MESSAGE_BYTES == mpicalls.MAX_MESSAGE_BYTES == 2**31 - 1
    monkeypatch.setattr(ring_native, "MAX_MESSAGE_BYTES", 1024)
    ran = exact_walk_spy(monkeypatch)
    t = ringcomp.Transport(comm)
    try:
        ok = True
        for per_chunk, walks in ((1024, 0), (128, 1)):  # float32: 4 KB, then 512 B a chunk
            x = np.arange(per_chunk * comm.size, dtype=np.int32) + comm.rank
            want = np.empty_like(x)
            comm.Allreduce(x, want)
            ok &= np.array_equal(ringcomp.allreduce(x.astype(np.float32), comm=t),
                                 want.astype(np.float32))
            ok &= len(ran) == walks
        assert every_rank(comm, ok)
    finally:
        t.close()


@pytest.mark.mpi(min_size=2)
def test_one_function_chooses_every_compiled_walk_however_a_call_comes_in(comm, monkeypatch):
    """``executor.compiled`` is the only choice of a compiled walk: while it says yes a
    plain call, a plan's call, an error-feedback call (the general path), ``auto``'s pick
    and PowerSGD's factors over the ring each run one; made to say no, none does, and
    every result has the same bits (each way on a fresh transport: EF's residuals and
    PowerSGD's warm start live there)."""
    from ringcomp.collectives import compressed_ring_native, executor

    ran = exact_walk_spy(monkeypatch)
    compressed_ring_native.compile_walks([np.float32])
    real = compressed_ring_native._walk
    monkeypatch.setattr(compressed_ring_native, "_walk",
                        lambda *a: ran.append(2) or real(*a))
    x = np.random.default_rng(comm.rank).standard_normal(1000).astype(np.float32)

    def calls(t):
        plan = ringcomp.allreduce_init(x, algorithm="ring", comm=t, compressor="marsit",
                                       out=np.empty_like(x))
        return {
            "plain exact": lambda: ringcomp.allreduce(x, algorithm="ring", comm=t),
            "plain marsit": lambda: ringcomp.allreduce(x, algorithm="ring", comm=t,
                                                       compressor="marsit"),
            "plan marsit": lambda: plan(x, step=3).copy(),
            "sign + EF": lambda: ringcomp.allreduce(x, algorithm="ring", comm=t,
                                                    compressor="sign",
                                                    error_feedback=True),
            "auto's ring": lambda: ringcomp.allreduce(x, algorithm="auto", comm=t,
                                                      candidates="ring"),
            "powersgd": lambda: ringcomp.allreduce(x.reshape(40, 25), algorithm="ring",
                                                   comm=t, compressor="powersgd:rank=2"),
        }

    runs = []
    for chooses in (True, False):
        if not chooses:
            monkeypatch.setattr(executor, "compiled", lambda *a, **k: None)
        t = ringcomp.Transport(comm)
        try:
            walked, results = {}, {}
            for name, call in calls(t).items():
                before = len(ran)
                results[name] = call().tobytes()
                walked[name] = len(ran) > before
        finally:
            t.close()
        runs.append((walked, results))
    (walked_yes, yes), (walked_no, no) = runs
    assert every_rank(comm, all(walked_yes.values())), walked_yes
    assert every_rank(comm, not any(walked_no.values())), walked_no
    assert every_rank(comm, yes == no)
