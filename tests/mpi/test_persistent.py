"""Persistent plans (allreduce_init): the same bits as allreduce, and bad calls still fail
on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank, exact_walk_spy
from test_errors import same_error_everywhere

import ringcomp
from ringcomp.compression import ErrorFeedback
from ringcomp.errors import ArgumentMismatchError

CASES = [
    ("ring", None, {}),
    ("mpi", None, {}),
    ("tree", None, {}),
    ("ring", "marsit", {}),
    ("ring", "sign", {"segment_bytes": 256}),
    ("ring", "qsgd", {}),
    ("ring", "topk:ratio=0.1", {}),
    ("tree", "countsketch", {}),
    ("twostage", "sign", {}),
    ("ring", "powersgd", {}),
]


def _sent(transport, call):
    """``call()``'s result and the (bytes, messages) ``transport`` sent during it."""
    before = transport.bytes_sent, transport.messages_sent
    result = call()
    return result, (transport.bytes_sent - before[0], transport.messages_sent - before[1])


def _inputs(comm, n, steps):
    rng = np.random.default_rng(100 + comm.rank)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(steps)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm,compressor,options", CASES)
@pytest.mark.parametrize("n", [1, 1000, 4099])
def test_a_plan_gives_allreduces_bits(comm, algorithm, compressor, options, n):
    """Every call of a plan returns bit for bit what ``allreduce`` with the same arguments
    and step returns: on the plan's own array (its values changed between calls), on
    other arrays of the same shape, in place, into an ``out`` of the caller's."""
    if compressor == "powersgd" and n < 64:
        pytest.skip("PowerSGD needs a matrix")
    xs = _inputs(comm, n, 3)
    mine = xs[0].copy()
    # a stateful compressor (PowerSGD's warm start) gets one instance per sequence of calls
    stateful = compressor == "powersgd"
    ours, theirs = ((ringcomp.get_compressor(compressor), ringcomp.get_compressor(compressor))
                    if stateful else (compressor, compressor))
    plan = ringcomp.allreduce_init(mine, algorithm=algorithm, compressor=ours,
                                   bucket=2, seed=5, **options)
    ok = True
    for step, x in enumerate(xs):
        want = ringcomp.allreduce(x, algorithm=algorithm, compressor=theirs, bucket=2,
                                  seed=5, step=step, **options)
        mine[...] = x  # the plan's own array, new values
        ok &= np.array_equal(plan(step=step), want)
        if stateful:
            continue
        ok &= np.array_equal(plan(x.copy(), step=step), want)
        out = np.empty_like(x)
        ok &= plan(x, out=out, step=step) is out and np.array_equal(out, want)
    if stateful:
        assert every_rank(comm, ok)
        return
    inplace = xs[1].copy()
    in_plan = ringcomp.allreduce_init(inplace, out=inplace, algorithm=algorithm,
                                      compressor=compressor, bucket=2, seed=5, **options)
    want = ringcomp.allreduce(xs[1], algorithm=algorithm, compressor=compressor, bucket=2,
                              seed=5, step=7, **options)
    ok &= in_plan(step=7) is inplace and np.array_equal(inplace, want)
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compressor", ["topk:ratio=0.05", "sign"])
def test_a_plan_keeps_error_feedback_as_allreduce_does(comm, compressor):
    """With error feedback a plan's calls compensate and update the same residual as the
    same calls of ``allreduce`` (two memories, fed the same inputs, end equal)."""
    xs = _inputs(comm, 3000, 4)
    ours, theirs = ErrorFeedback(), ErrorFeedback()
    plan = ringcomp.allreduce_init(xs[0], compressor=compressor, error_feedback=ours, bucket=1)
    ok = True
    for step, x in enumerate(xs):
        got = plan(x, step=step)
        want = ringcomp.allreduce(x, compressor=compressor, error_feedback=theirs, bucket=1,
                                  step=step)
        ok &= np.array_equal(got, want)
    mine, other = ours.state_dict(), theirs.state_dict()
    ok &= len(mine) == 1 and mine.keys() == other.keys() and all(
        np.array_equal(mine[k], other[k]) for k in mine)
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_a_bad_call_of_a_plan_fails_on_every_rank(comm):
    """What can differ per call is checked per call and refused on every rank: another
    shape or dtype on one rank, NaN on one rank (compressed), a step that differs across
    ranks, a step that is no integer; the plan works again afterwards."""
    x = np.ones(64, np.float32)
    plan = ringcomp.allreduce_init(x, compressor="marsit")
    exact = ringcomp.allreduce_init(x, algorithm="ring")
    last = comm.size - 1
    wrong = np.ones(65 if comm.rank == last else 64, np.float32)
    same_error_everywhere(comm, lambda: exact(wrong), ValueError,
                          f"rank {last} passed bad arguments", "persistent plan")
    doubles = np.ones(64, np.float64 if comm.rank == last else np.float32)
    same_error_everywhere(comm, lambda: plan(doubles), ValueError, "persistent plan")
    poisoned = x.copy()
    poisoned[3] = np.nan if comm.rank == last else 1.0
    same_error_everywhere(comm, lambda: plan(poisoned), FloatingPointError,
                          f"rank {last}", "NaN")
    same_error_everywhere(comm, lambda: plan(step=comm.rank), ArgumentMismatchError,
                          f"step (min 0, max {last})")
    same_error_everywhere(comm, lambda: plan(step=1.5 if comm.rank == last else 1),
                          ValueError, "bad option value")
    frozen = np.ones(64, np.float32)
    frozen.flags.writeable = comm.rank != last
    same_error_everywhere(comm, lambda: exact(x, out=frozen), ValueError, "read-only")
    want = ringcomp.allreduce(x, compressor="marsit", step=3)
    assert every_rank(comm, np.array_equal(plan(step=3), want) and np.all(exact() == comm.size))


@pytest.mark.mpi(min_size=2)
def test_a_plan_is_agreed_when_made(comm):
    """Making a plan is collective and checked like a call: arguments that differ across
    ranks, or a bad one on one rank, raise on every rank there."""
    n = 10 if comm.rank == 0 else 11
    same_error_everywhere(comm, lambda: ringcomp.allreduce_init(np.ones(n)),
                          ArgumentMismatchError, "length (min 10, max 11)")
    same_error_everywhere(
        comm, lambda: ringcomp.allreduce_init(np.ones(8), compressor="nope" if comm.rank
                                              else "sign"), ValueError, "compressor")
    same_error_everywhere(comm, lambda: ringcomp.allreduce_init(np.ones(8, np.int32),
                                                                compressor="sign"),
                          TypeError, "int32")


@pytest.mark.mpi(min_size=2)
def test_a_plan_agrees_once_per_call_and_without_check_not_at_all(comm, monkeypatch):
    """A checked plan's call makes one agreement (allreduce's own call makes one too, a
    compressed one below 4 MB included); ``check=False`` makes none, exact or
    compressed (a compressed call then agrees only on its input's finiteness, once, as
    ``allreduce(check=False)`` does) - with the same bits every time."""
    x = _inputs(comm, 500, 1)[0]
    transport = ringcomp.get_transport(None)
    counted = []
    agree_into = transport.agree_into  # every agreement's one call
    monkeypatch.setattr(transport, "agree_into",
                        lambda mine, agreed: counted.append(1) or agree_into(mine, agreed))

    def agreements(fn):
        counted.clear()
        result = fn()
        return result, len(counted)

    want, _ = agreements(lambda: ringcomp.allreduce(x, algorithm="ring"))
    checked = ringcomp.allreduce_init(x, algorithm="ring")
    unchecked = ringcomp.allreduce_init(x, algorithm="ring", check=False)
    compressed = ringcomp.allreduce_init(x, compressor="sign", check=False)
    got1, n1 = agreements(checked)
    got2, n2 = agreements(unchecked)
    got3, n3 = agreements(compressed)
    want3 = ringcomp.allreduce(x, compressor="sign", check=False)
    assert every_rank(comm, np.array_equal(got1, want) and np.array_equal(got2, want)
                      and np.array_equal(got3, want3) and (n1, n2, n3) == (1, 0, 1))


#: every hop rule: Marsit's bit merge, cascades (sign, QSGD, top-k), linear (Count-Sketch)
RIDDEN = ["marsit", "sign", "qsgd", "topk:ratio=0.1", "countsketch"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compressor", RIDDEN)
@pytest.mark.parametrize("n,m,segment", [(8842, 778, 1 << 20), (1001, 3, 256), (17, 1, 64),
                                         (0, 10, 1 << 20), (300, 0, 1 << 20)])
def test_an_exact_rider_gives_both_calls_bits(comm, compressor, n, m, segment):
    """``plan.with_rider(x, exact_plan, y)`` - the exact ring of y travelling in the
    compressed ring's walk of x, one call - returns bit for bit what the two plans' own
    calls return, over two steps, with error feedback too: each chunk's several segments,
    a rider shorter than the ring (empty chunks), an empty rider or compressed buffer."""
    rng = np.random.default_rng(comm.rank + 7 * n + m)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    ys = [rng.standard_normal(m).astype(np.float32) for _ in range(2)]
    # Marsit compensates globally (its optimizer rule), the others keep residuals
    memories = [ErrorFeedback(), ErrorFeedback()] if compressor != "marsit" else [False] * 2
    plans = [ringcomp.allreduce_init(xs[0], compressor=compressor, seed=3, bucket=0,
                                     segment_bytes=segment, error_feedback=memory)
             for memory in memories]
    exact = ringcomp.allreduce_init(ys[0], algorithm="ring", bucket=1)
    ok = True
    for step, (x, y) in enumerate(zip(xs, ys, strict=True)):
        alone = plans[0](x, step=step), exact(y, step=step)
        riding = plans[1].with_rider(x, exact, y, step=step)
        ok &= all(a.tobytes() == b.tobytes() for a, b in zip(alone, riding, strict=True))
    if memories[0]:
        ok &= all(memories[0].residuals[k].tobytes() == v.tobytes()
                  for k, v in memories[1].residuals.items())
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_a_rider_is_refused_where_no_ring_walk_carries_it(comm):
    """Only a compressed ring of two or more ranks carries an exact ring's sum; anything
    else is refused on every rank (a tree, PowerSGD's factors, an exact carrier, one
    rank), and nothing is left in flight."""
    x, y = np.ones(64, np.float32), np.ones(8, np.float32)
    exact = ringcomp.allreduce_init(y, algorithm="ring")
    carriers = [ringcomp.allreduce_init(x, algorithm="tree", compressor="sign"),
                ringcomp.allreduce_init(x, compressor="powersgd"),
                ringcomp.allreduce_init(x, algorithm="ring")]
    if comm.size == 1:
        carriers.append(ringcomp.allreduce_init(x, compressor="sign"))
    for carrier in carriers:
        same_error_everywhere(comm, lambda c=carrier: c.with_rider(x, exact, y), ValueError,
                              "compressed ring plan and an exact ring sum plan")
    assert every_rank(comm, np.all(exact() == comm.size))


BOUND = [("mpi", None, {}), ("ring", None, {}), ("ring", "marsit", {}),
         ("ring", "sign", {"segment_bytes": 8192}), ("ring", "qsgd", {}),
         ("ring", "topk:ratio=0.1", {})]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm,compressor,options", BOUND)
def test_a_small_host_plan_replays_its_bound_call(comm, algorithm, compressor, options):
    """A plan of a small host all-reduce binds its MPI call or compiled walk once
    (``ringcomp.plans.bind``) and each call replays it: the bits, bytes and messages of
    ``allreduce`` with the same arguments and step, in place through another view of the
    same memory, and an ``out`` overlapping the input in part left to the general path."""
    import numba  # noqa: F401 - the exact ring's walk is compiled once a process has Numba

    from ringcomp.transport.cache import get_transport

    transport = get_transport(None)
    xs = [x.reshape(61, 41) for x in _inputs(comm, 61 * 41, 3)]
    plan = ringcomp.allreduce_init(xs[0], algorithm=algorithm, compressor=compressor,
                                   bucket=3, seed=9, **options)
    ok = plan._call is not None

    for step, x in enumerate(xs):
        want, want_sent = _sent(transport, lambda x=x, step=step: ringcomp.allreduce(
            x, algorithm=algorithm, compressor=compressor, bucket=3, seed=9, step=step,
            **options))
        got, got_sent = _sent(transport, lambda x=x, step=step: plan(x, step=step))
        ok &= np.array_equal(got, want) and got_sent == want_sent
        same = x.copy()
        ok &= plan(same, out=same.reshape(-1).reshape(61, 41), step=step) is not None
        ok &= np.array_equal(same, want)
        room = np.empty(x.size + 1, x.dtype)
        room[:-1] = x.reshape(-1)
        ok &= np.array_equal(plan(room[:-1].reshape(61, 41), out=room[1:].reshape(61, 41),
                                  step=step), want)
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm,compressor,options", BOUND[:3])
@pytest.mark.parametrize("in_place", [False, True])
def test_a_plan_called_on_its_own_arrays_reads_their_values_now(comm, algorithm, compressor,
                                                                 options, in_place):
    """A bound plan called without arrays works on its own ``x`` and ``out`` (whose views
    it worked out once): each call reduces the values ``x`` holds then, as ``allreduce``
    would; once an out-of-place plan lets ``x`` go (``plan.x = None``) nothing keeps it
    alive (in place, ``x`` is also the plan's ``out``, which it keeps)."""
    import gc
    import weakref

    import numba  # noqa: F401 - the exact ring's walk is compiled once a process has Numba

    xs = _inputs(comm, 1000, 3)
    x = xs[0].copy()
    out = x if in_place else np.empty_like(x)
    plan = ringcomp.allreduce_init(x, out=out, algorithm=algorithm, compressor=compressor,
                                   **options)
    ok = plan._call is not None
    for step, values in enumerate(xs):
        want = ringcomp.allreduce(values, algorithm=algorithm, compressor=compressor,
                                  step=step, **options)
        x[...] = values
        ok &= plan(step=step) is out and np.array_equal(out, want)
    gone = weakref.ref(x)
    plan.x = None
    del x, out
    gc.collect()
    ok &= in_place or gone() is None
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compressor", ["marsit", "sign", "topk:ratio=0.1"])
def test_an_unchecked_compressed_plan_replays_its_walk_around_the_finiteness_verdict(
        comm, compressor):
    """Without ``check`` a compressed plan's input is checked as its walk reads it: the
    plan replays the compiled walk's two halves around the one agreement on every rank's
    finiteness - the bits, bytes and messages of ``allreduce(check=False)`` - and NaN on
    one rank is still refused on every rank (that call takes the general path)."""
    import numba  # noqa: F401

    from ringcomp.transport.cache import get_transport

    transport = get_transport(None)
    xs = _inputs(comm, 3000, 3)
    plan = ringcomp.allreduce_init(xs[0], compressor=compressor, check=False, bucket=2)
    ok = plan._call is not None and plan._call.as_read is not None

    for step, x in enumerate(xs):
        want, want_sent = _sent(transport, lambda x=x, step=step: ringcomp.allreduce(
            x, compressor=compressor, check=False, bucket=2, step=step))
        got, got_sent = _sent(transport, lambda x=x, step=step: plan(x, step=step))
        ok &= np.array_equal(got, want) and got_sent == want_sent
    assert every_rank(comm, ok)
    poisoned = xs[0].copy()
    poisoned[7] = np.inf if comm.rank == comm.size - 1 else 0.5
    same_error_everywhere(comm, lambda: plan(poisoned, step=4), FloatingPointError,
                          f"rank {comm.size - 1}")
    assert every_rank(comm, np.array_equal(plan(xs[1], step=1),
                                           ringcomp.allreduce(xs[1], compressor=compressor,
                                                              check=False, bucket=2, step=1)))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm,compressor", [("ring", None), ("mpi", None),
                                                  ("ring", "marsit")])
def test_a_plans_own_arrays_changed_in_place_are_refused_on_every_rank(comm, algorithm,
                                                                       compressor):
    """The plan's own ``x`` and ``out`` are checked on every call, as any other array:
    their dtype or shape changed in place on one rank (a walk bound to the old layout
    would sum wrong bits or write past the end) is refused on every rank, and once put
    back the plan gives ``allreduce``'s bits again."""
    import numba  # noqa: F401 - the exact ring's walk is bound once Numba is loaded

    last = comm.size - 1
    x = _inputs(comm, 1000, 1)[0]
    out = np.empty_like(x)
    plan = ringcomp.allreduce_init(x, out=out, algorithm=algorithm, compressor=compressor)
    want = ringcomp.allreduce(x, algorithm=algorithm, compressor=compressor)
    ok = np.array_equal(plan(), want)
    for array, change in ((x, ("dtype", np.int32)), (x, ("shape", (10, 100))),
                          (out, ("dtype", np.uint32)), (out, ("shape", (100, 10)))):
        before = getattr(array, change[0])
        if comm.rank == last:
            setattr(array, *change)
        same_error_everywhere(comm, plan, ValueError, f"rank {last} passed bad arguments")
        setattr(array, change[0], before)
        ok &= plan() is out and np.array_equal(out, want)
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compressor", [None, "sign"])
def test_plan_x_takes_an_array_like_the_plans_or_refuses_it(comm, compressor):
    """``plan.x = y`` re-points the plan at ``y`` (its calls then reduce ``y``, in place
    when the plan is) for an array of the plan's shape, dtype and kind, and refuses any
    other - another size, dtype or a read-only array for an in-place plan - with a
    ValueError on the rank that set it, keeping the old array."""
    import numba  # noqa: F401

    xs = _inputs(comm, 600, 2)
    x = xs[0].copy()
    plan = ringcomp.allreduce_init(x, out=x, compressor=compressor)
    frozen = xs[1].copy()
    frozen.flags.writeable = False
    ok = True
    for bad in (np.zeros(599, np.float32), np.zeros(601, np.float32),
                np.zeros(600, np.float64), frozen):
        with pytest.raises(ValueError, match="plan.x"):
            plan.x = bad
        ok &= plan.x is x
    y = xs[1].copy()
    plan.x = y
    want = ringcomp.allreduce(xs[1], compressor=compressor, step=3)
    ok &= plan(step=3) is y and np.array_equal(y, want) and np.array_equal(x, xs[0])
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compressor", [None, "marsit"])
def test_an_in_place_plan_honours_out(comm, compressor):
    """An in-place plan called with ``out=z`` writes the sum into ``z`` and returns it,
    leaving its input as it was (it used to overwrite the input and ignore ``z``); an
    ``out`` of another shape is refused on every rank."""
    import numba  # noqa: F401

    xs = _inputs(comm, 500, 2)
    x = xs[0].copy()
    plan = ringcomp.allreduce_init(x, out=x, compressor=compressor)
    y, z = xs[1].copy(), np.zeros_like(xs[1])
    want = ringcomp.allreduce(xs[1], compressor=compressor, step=1)
    ok = plan(y, out=z, step=1) is z and np.array_equal(z, want) and np.array_equal(y, xs[1])
    z = np.zeros_like(x)
    ok &= plan(out=z, step=1) is z and np.array_equal(x, xs[0])
    wrong = np.zeros(501 if comm.rank == 0 else 500, np.float32)
    same_error_everywhere(comm, lambda: plan(y, out=wrong), ValueError, "rank 0", "out")
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compressor", ["marsit", "sign", "fp16"])
def test_a_plan_can_be_made_for_a_buffer_not_yet_filled(comm, compressor):
    """A plan made for a buffer still holding garbage (NaN, values past fp16's range)
    is made: values are checked per call, so its first call after the buffer is filled
    gives ``allreduce``'s bits, and a call while the garbage is still there is refused
    on every rank."""
    import numba  # noqa: F401

    x = np.empty(800, np.float32)
    x[::7] = np.nan
    x[3] = 1e30
    plan = ringcomp.allreduce_init(x, compressor=compressor)
    same_error_everywhere(comm, plan, FloatingPointError, "rank 0")
    x[...] = _inputs(comm, 800, 1)[0]
    want = ringcomp.allreduce(x, compressor=compressor)
    assert every_rank(comm, np.array_equal(plan(), want))


@pytest.mark.mpi(min_size=2)
def test_plans_called_from_threads_in_another_order_are_refused(comm):
    """Two plans made on the main thread, called from two threads in another order on
    each rank: with ``check`` the calling thread is agreed per call (as ``allreduce``
    agrees it), so each call raises on every rank instead of returning the other
    thread's sum; called in the same order, each thread's call gives its sum."""
    import threading

    from ringcomp.errors import ArgumentMismatchError

    a = np.full(100, 1.0 + comm.rank, np.float32)
    b = np.full(100, 10.0 * (comm.rank + 1), np.float32)
    plans = {"A": ringcomp.allreduce_init(a), "B": ringcomp.allreduce_init(b)}
    results = {}

    def call(name):
        try:
            results[name] = plans[name]().copy()
        except ArgumentMismatchError as exc:
            results[name] = str(exc)

    def in_threads(order):
        for name in order:
            thread = threading.Thread(target=call, args=(name,), name=name)
            thread.start()
            thread.join()

    in_threads("AB" if comm.rank == 0 else "BA")
    ok = all(isinstance(v, str) and "calling thread" in v for v in results.values())
    in_threads("AB")
    p = comm.size
    ok &= np.all(results["A"] == p * (p + 1) / 2) and np.all(results["B"] == 5 * p * (p + 1))
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("candidates", ["mpi", "ring", "ring,mpi"])
def test_plain_calls_run_through_kept_plans_and_auto_binds_what_it_settled(comm, candidates,
                                                                           monkeypatch):
    """Every plain ``allreduce`` runs through a plan made on its first call and kept on
    the transport: the next calls of the same arguments find it (one plan, not one a
    call). ``auto``'s plan binds the algorithm auto settled on once it has (MPI's call,
    or the ring's compiled walk), so an ``auto`` call ends where a plan of that
    algorithm's would: the same bits as the algorithm named outright, every call,
    through the trial of its finalists too (``ring,mpi``: 14 calls alternate)."""
    import numba  # noqa: F401 - the exact ring's walk is compiled once a process has Numba

    from ringcomp.plans.bind import Auto, Replay

    ran = exact_walk_spy(monkeypatch)
    t = ringcomp.Transport(comm)
    try:
        ok = True
        for step in range(20):
            x = np.random.default_rng(step * 7 + comm.rank).standard_normal(1000)
            x = x.astype(np.float32)
            got = ringcomp.allreduce(x, algorithm="auto", comm=t, candidates=candidates)
            want = np.empty_like(x)
            comm.Allreduce(x, want)
            ok &= np.allclose(got, want, rtol=1e-5, atol=1e-5)
            ok &= got.tobytes() == ringcomp.allreduce(x, algorithm=t.kept.auto_last,
                                                      comm=t).tobytes()
        plans = [p for p in t.kept.plans.values() if p.algorithm == "auto"]
        ok &= len(plans) == 1 and isinstance(plans[0]._call, Auto)
        settled = t.kept.auto_last
        bound = plans[0]._call.bound.get(settled)
        ok &= isinstance(bound, Replay) and bound.algorithm == settled
        before = len(ran)
        ringcomp.allreduce(np.ones(1000, np.float32), algorithm="auto", comm=t,
                           candidates=candidates)
        ok &= (len(ran) == before + 1) == (settled == "ring")
    finally:
        t.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_plain_calls_keep_one_plan_per_shape_and_numpy_steps_find_it(comm, monkeypatch):
    """A loop's plain calls find the plan their first call made: one per shape (and per
    compressor), a NumPy integer step as the integer it stands for, the same bits as a
    plan made outright; at most MAX_CACHED_PLANS are kept, the least recently used going
    first."""
    from ringcomp.plans import call
    from ringcomp.plans.call import MAX_CACHED_PLANS

    made = []
    real = call.AllreducePlan
    monkeypatch.setattr(call, "AllreducePlan", lambda *a, **k: made.append(1) or real(*a, **k))
    t = ringcomp.Transport(comm)
    try:
        x = np.random.default_rng(comm.rank).standard_normal(300).astype(np.float32)
        plan = ringcomp.allreduce_init(x, comm=t, compressor="qsgd", seed=5)
        ok = True
        for step in range(4):
            for s in (step, np.int64(step)):
                got = ringcomp.allreduce(x, comm=t, compressor="qsgd", seed=5, step=s)
                ok &= got.tobytes() == plan(step=step).tobytes()
        ok &= len(made) == 1  # the first call's, found by every later one
        ringcomp.allreduce(x[:100], comm=t)
        ok &= len(t.kept.plans) == 2 and len(made) == 2
        for n in range(1, MAX_CACHED_PLANS + 2):
            ringcomp.allreduce(np.ones(n, np.float32), comm=t)
        ok &= len(t.kept.plans) == MAX_CACHED_PLANS
    finally:
        t.close()
    assert every_rank(comm, ok)
