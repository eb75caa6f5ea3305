"""The step's core alone: a framework binding and an optimizer rule written against the
``Reducer`` as docs/architecture.md's recipes say, checked against mpi4py's Allreduce."""

from __future__ import annotations

import threading
import types
from collections import namedtuple

import numpy as np
import pytest
from conftest import every_rank

from ringcomp.errors import EverywhereError
from ringcomp.training.buckets import plan_buckets
from ringcomp.training.optim import SGD, Optimizer
from ringcomp.training.reducer import Reducer, make_reducer

Info = namedtuple("Info", "offset size")


class SignDescent(Optimizer):
    """The optimizer-rule recipe: one class, ``apply`` over flat slices (x -= lr·sign)."""

    def apply(self, params, reduced, lo, hi, ranks, step, compressed):
        params -= self.lr * np.sign(reduced)


class DictBinding:
    """The binding recipe: a 'framework' keeping named float32 arrays. It lays them out
    flat, says when each bucket is final (here: all at once, in bucket order) and hands
    the reducer the bucket's gradient; the reducer does the rest."""

    def __init__(self, comm, shapes: dict, rule_for, algorithm: str):
        sizes = [int(np.prod(s)) for s in shapes.values()]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
        self.infos = [Info(int(o), n) for o, n in zip(offsets, sizes, strict=True)]
        self.params = np.zeros(sum(sizes), np.float32)
        self.grads = np.zeros_like(self.params)
        options = types.SimpleNamespace(algorithm=algorithm, error_feedback=False, seed=0,
                                        shadow=False, segment_bytes=0, torus=None)
        self.reducer = make_reducer(comm, options, None, plan_buckets(self.infos, 64 * 4),
                                    np, rule=rule_for(self.params.size))

    def step(self, step: int) -> None:
        for b in self.reducer.buckets:  # 1. submit, as each bucket is final
            self.reducer.submit(b, b.gather(self.grads).copy(), self.params, step)
        self.reducer.apply(self.params, self.reducer.synchronize(), step)  # 2. 3.


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("rule", ["sgd", "sign"])
def test_a_binding_and_a_rule_against_the_reducer_match_mpis_allreduce(comm, rule):
    """Three steps of a binding written in a dozen lines: the parameters equal the update
    from MPI's own sum of every rank's gradients, bit for bit for sign descent and to
    float32 rounding for SGD (the ring sums in another order), identical on every rank."""
    make = {"sgd": lambda n: SGD(n, 0.1, momentum=0.0),
            "sign": lambda n: SignDescent(n, 0.01)}[rule]
    binding = DictBinding(comm, {"w": (40, 7), "b": (7,), "v": (300,)}, make,
                          algorithm="ring")
    assert len(binding.reducer.buckets) > 1  # several buckets, in order
    expected = binding.params.copy()
    rng = np.random.default_rng(comm.rank)
    for step in range(3):
        binding.grads[...] = rng.standard_normal(binding.grads.size)
        total = np.empty_like(binding.grads)
        comm.Allreduce(binding.grads, total)
        binding.step(step)
        expected -= (np.float32(0.1) * total / comm.size if rule == "sgd"
                     else np.float32(0.01) * np.sign(total))
    binding.reducer.close()
    close = np.allclose(binding.params, expected, rtol=1e-5, atol=1e-6)
    same = len(set(comm.allgather(binding.params.tobytes()))) == 1
    assert every_rank(comm, close and same)


@pytest.mark.mpi(min_size=2)
def test_discard_keeps_ranks_in_step_and_leaves_the_parameters(comm):
    """A step given up after its buckets left: every rank still completes them (the
    next step's collectives pair up as they should) and nothing is applied."""
    binding = DictBinding(comm, {"w": (50,), "v": (90,)}, lambda n: SGD(n, 0.1, 0.0),
                          algorithm="ring")
    binding.grads[...] = comm.rank + 1.0
    for b in binding.reducer.buckets:
        binding.reducer.submit(b, b.gather(binding.grads).copy(), binding.params, 0)
    binding.reducer.discard()
    ok = not binding.params.any() and not binding.reducer.pending
    binding.step(1)  # the next step's sums are the right ones
    p = comm.size
    ok &= np.allclose(binding.params, -0.1 * (p + 1) / 2)
    binding.reducer.close()
    assert every_rank(comm, ok)


def test_the_schedule_compresses_after_warm_up_and_off_marsit_k_rounds():
    reducer = Reducer(None, [], object(), None, np, warmup_steps=2, marsit_k=4)
    assert [reducer.compresses(s) for s in range(9)] == [False, False, True, False, True,
                                                         True, True, False, True]
    reducer.compressor = None
    assert not any(reducer.compresses(s) for s in range(9))



def _options():
    return types.SimpleNamespace(algorithm="ring", error_feedback=False, seed=0, shadow=False,
                                 segment_bytes=0, torus=None)


def test_the_compressors_kernels_load_before_the_first_bucket(comm, monkeypatch):
    """A reducer with a compressor has run its codec and hop rule (``warm_up``) on the
    engine's thread before it is handed back: the first step's collective is not charged
    with loading (or compiling) the kernels. Nothing runs for an exact reducer."""
    from ringcomp.compression import get_compressor

    comp = get_compressor("marsit")
    threads = []
    monkeypatch.setattr(type(comp), "warm_up",
                        lambda self, xp: threads.append(threading.current_thread().name))
    buckets = plan_buckets([Info(0, 64)], 256)
    make_reducer(comm, _options(), comp, buckets, np).close()
    make_reducer(comm, _options(), None, buckets, np).close()
    assert every_rank(comm, threads == ["ringcomp-comm"])


@pytest.mark.parametrize("algorithm", ["ring", "auto"])
def test_a_start_that_fails_raises_where_the_reducer_is_made(comm, algorithm):
    """``on_start`` raising on one rank (a GPU that cannot be bound, kernels that do not
    load) is raised by ``make_reducer`` itself on every rank, naming that rank - not left
    in a thread that would never take a bucket, nor leaving the other ranks in auto's
    calibration until the deadline."""
    last = comm.size - 1

    def start():
        if comm.rank == last:
            raise RuntimeError("no device 7")

    options = _options()
    options.algorithm = algorithm
    with pytest.raises(EverywhereError, match=f"rank {last}: RuntimeError: no device 7"):
        make_reducer(comm, options, None, plan_buckets([Info(0, 64)], 256), np,
                     on_start=start)
    assert every_rank(comm, True)


def test_the_first_compile_is_said_once(monkeypatch, caplog):
    """Kernels that Numba compiled rather than loaded from its cache are named in one
    message, with where the cache keeps them; a run that loaded them says nothing."""
    from ringcomp.compression import get_compressor
    from ringcomp.kernels import backends
    from ringcomp.training import engine

    counts = iter([(3, "/cache"), (12, "/cache"), (12, "/cache"), (12, "/cache")])
    monkeypatch.setattr(backends, "numba_compiled", lambda: next(counts))
    comp = get_compressor("sign")
    with caplog.at_level("INFO", logger="ringcomp"):
        engine.load_kernels(comp, np)
        engine.load_kernels(comp, np)
    said = [r for r in caplog.records if "compiled" in r.getMessage()]
    assert len(said) == 1 and "9 Numba kernel(s) for sign" in said[0].getMessage()
    assert "/cache" in said[0].getMessage()
    # a script that set up no logging sees it too (Python's default shows warnings)
    from ringcomp import log

    assert said[0].levelname == ("INFO" if log.configured() else "WARNING")
