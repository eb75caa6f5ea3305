"""All timing of the training wing: collective and codec micro-benchmarks, agreed across ranks.

Every number a planner reads is measured here (all ranks together, agreed by a
max-allreduce so every rank holds the same bytes); ``ringcomp.sched`` only plans from them.
"""

from __future__ import annotations

import time

import numpy as np

from ringcomp import alphabeta
from ringcomp.compression import get_compressor
from ringcomp.compression.base import Key
from ringcomp.devices.placement import Placement
from ringcomp.plans.call import allreduce
from ringcomp.sched.costs import Codec
from ringcomp.sched.profile_record import BENCH_BYTES, linear_fit

HOST = Placement("cpu", np)


def _agreed_max(transport, values) -> np.ndarray:
    return allreduce(np.asarray(values, np.float64), algorithm="mpi", op="max",
                     comm=transport)


def time_allreduce(transport, nbytes: int, repeats: int, where: Placement = HOST,
                   **kwargs) -> float:
    """Median seconds of an all-reduce of ``nbytes`` float32 bytes in ``where``'s memory,
    the slowest rank's, every call on the same gradient-like input (``gradient_like``)."""
    given = where.put(gradient_like(nbytes, seed=transport.rank))
    x = where.xp.empty_like(given)
    samples = []
    for step in range(-1, repeats):  # step -1: the warm-up (compile, connect)
        x[...] = given  # the result overwrote it: a sum grows p-fold per call
        where.synchronize()
        transport.barrier()
        t0 = time.perf_counter()
        allreduce(x, comm=transport, step=max(step, 0), **kwargs)
        where.synchronize()  # a GPU result is ready only when its last kernel is done
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples[1:]))


def gradient_like(nbytes: int, seed: int = 0) -> np.ndarray:
    """``nbytes`` of float32 drawn from a standard normal (``seed``: one per rank): what the
    codecs are timed on. Not a constant: a data-dependent codec's cost depends on the
    values (top-k's cascading ring on a buffer of ones, its values tied, took several
    times as long as on normal values), and a profile of unrepresentative data misplans."""
    return np.random.default_rng(seed).standard_normal(max(1, nbytes // 4)).astype(np.float32)


def time_codec(compressor, nbytes: int, repeats: int, where: Placement = HOST,
               decode_only: bool = False) -> float:
    """Fastest of ``repeats`` encode + decode calls on ``nbytes`` in ``where``'s memory
    (after one warm-up); with ``decode_only``, of the decode alone."""
    x = where.put(gradient_like(nbytes))
    out = where.xp.empty_like(x)
    samples = []
    for step in range(repeats + 1):
        where.synchronize()
        t0 = time.perf_counter()
        payload = compressor.encode(x, Key(0, step, 0, 0, 0))
        if decode_only:
            where.synchronize()
            t0 = time.perf_counter()
        compressor.decode(payload, x.size, out)
        where.synchronize()
        samples.append(time.perf_counter() - t0)
    return float(np.min(samples[1:]))  # the intrinsic cost: other load only adds time


def time_codecs(compressor, repeats: int, where: Placement = HOST,
                decode_only: bool = False) -> list[float]:
    """``time_codec`` at every size of BENCH_BYTES."""
    return [time_codec(compressor, m, repeats, where, decode_only) for m in BENCH_BYTES]


def measure_costs(transport, algorithm: str, compressor: str | None,
                  repeats: int = 5, where: Placement = HOST) -> dict:
    """The collective and codec parts of a profile, on buffers in ``where``'s memory (the
    training's device); collective, the same result on all ranks."""
    exact = [time_allreduce(transport, m, repeats, where, algorithm=algorithm)
             for m in BENCH_BYTES]
    agreed = _agreed_max(transport, exact)
    fields = {"exact": linear_fit(BENCH_BYTES, agreed), "costs": alphabeta.fit(
        [(algorithm, m, t) for m, t in zip(BENCH_BYTES, agreed, strict=True)],
        transport.size).as_dict() if algorithm in alphabeta.MODELS else {}}
    # an instance of its own, from the spec: timing must not touch the job's compressor
    # (its state: PowerSGD's warm start, a counter-based key's step)
    comp = get_compressor(compressor)
    if comp is not None:
        timed = [time_allreduce(transport, m, repeats, where, algorithm=algorithm,
                                compressor=comp) for m in BENCH_BYTES]
        agreed = _agreed_max(transport, timed + time_codecs(comp, repeats, where))
        fields["compressed"] = linear_fit(BENCH_BYTES, agreed[:len(BENCH_BYTES)])
        fields["codec"] = linear_fit(BENCH_BYTES, agreed[len(BENCH_BYTES):])
    return fields


def agree_medians(transport, per_step: list[list[float]]) -> list[float]:
    """Per column (a pass's part): the median over passes on each rank, then the max over
    ranks, so every rank holds identical numbers."""
    return _agreed_max(transport, np.median(np.asarray(per_step), axis=0)).tolist()


def measure_codec(compressor, repeats: int = 5, speedup: float = 1.0) -> Codec:
    """Encode + decode cost of ``compressor`` on this machine, and its decode alone, each
    fitted over BENCH_BYTES, divided by ``speedup`` (e.g. to stand for a GPU)."""
    elements = [m / 4 for m in BENCH_BYTES]
    both = linear_fit(elements, time_codecs(compressor, repeats))
    decode = linear_fit(elements, time_codecs(compressor, repeats, decode_only=True))
    return Codec(*both, decode).scaled(1 / speedup)
