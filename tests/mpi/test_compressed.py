"""Compressed collectives past the kit's contract (test_compressor_kit.py): keys, bias, traces."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank
from registered import compressed_schemes

import ringcomp
from ringcomp.compression import Key, get_compressor
from ringcomp.partition import block_bounds, even_segments
from ringcomp.testing.replay import SEG_BYTES


def data(rank, n, dtype="float32"):
    return np.random.default_rng(100 + rank).standard_normal(n).astype(dtype)


@pytest.mark.mpi(min_size=1)
def test_reproducible_and_keyed(comm):
    x = data(comm.rank, 3000)
    a = ringcomp.allreduce(x, compressor="marsit", seed=1, step=7)
    b = ringcomp.allreduce(x, compressor="marsit", seed=1, step=7)
    c = ringcomp.allreduce(x, compressor="marsit", seed=1, step=8)
    assert np.array_equal(a, b)
    if comm.size > 2:  # with 1 or 2 ranks there are too few random choices to differ
        assert every_rank(comm, not np.array_equal(a, c))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["ring", "tree", "dbtree", "twostage", "torus"])
def test_marsit_is_unbiased_for_the_mean_of_signs(comm, algorithm):
    """Every rank's sign must be equally likely to survive, whatever its ring position.

    Three blocks of elements: only rank 0 positive, only the middle rank positive, only the
    last rank positive. All have E[v] = (2 - p) / p; unequal survival odds (e.g. 1/2 instead
    of 1/k per hop) would make the blocks disagree.
    """
    p, r = comm.size, comm.rank
    block = 4000
    x = -np.ones(3 * block, np.float32)
    for i, special in enumerate((0, p // 2, p - 1)):
        if r == special:
            x[i * block:(i + 1) * block] = 1.0
    trials = 60
    total = np.zeros(3 * block)
    for step in range(trials):
        total += ringcomp.allreduce(x, algorithm=algorithm, compressor="marsit", seed=11,
                                    step=step)
    mean = total / trials
    expected = (2 - p) / p
    sigma = np.sqrt((1 - expected**2) / (trials * block))  # std of a block's average
    for i in range(3):
        got = mean[i * block:(i + 1) * block].mean()
        assert every_rank(comm, abs(got - expected) < 5 * sigma), (i, got, expected)


@pytest.mark.mpi(min_size=1)
def test_meaningless_combinations_are_refused_everywhere(comm):
    from test_errors import same_error_everywhere

    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), algorithm="rd",
                                                           compressor="sign"),
                          ValueError, "runs on allgather, dbtree, ring, torus, tree, twostage")
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8, np.int32),
                                                           compressor="marsit"),
                          TypeError, "float32 or float64")
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), op="max",
                                                           compressor="fp16"),
                          ValueError, "only sums")
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), compressor="zip"),
                          ValueError, "unknown compressor 'zip'")


@pytest.mark.mpi(min_size=2)
def test_compressor_mismatch_across_ranks(comm):
    from test_errors import same_error_everywhere

    from ringcomp.errors import ArgumentMismatchError

    name = "sign" if comm.rank == 0 else "marsit"
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), compressor=name),
                          ArgumentMismatchError, "options")


@pytest.mark.mpi(min_size=1)
def test_trace_has_encode_merge_decode(comm, mpi_tmp_path):
    tracer = ringcomp.Tracer(mpi_tmp_path / "ctrace")
    ringcomp.allreduce(data(comm.rank, 5000), compressor="sign", tracer=tracer,
                       segment_bytes=SEG_BYTES)
    kinds = {rec["kind"] for rec in tracer.records if rec["type"] == "hop"}
    expected = {"encode", "decode"} | ({"merge", "send", "recv"} if comm.size > 1 else set())
    assert every_rank(comm, expected <= kinds)
    ops = [rec for rec in tracer.records if rec["type"] == "op"]
    assert ops[0]["alg"] == "ring+sign"


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ["ring", "tree", "dbtree", "allgather", "twostage",
                                       "torus"])
@pytest.mark.parametrize("name", ["sign", "fp16", "randomk:ratio=0.2", "topk:ratio=0.1",
                                  "qsgd", "countsketch:ratio=2:rows=3:keep=0.1"])
def test_error_feedback_invariant_and_bounded_error(comm, algorithm, name):
    """corrected == decode(encode(corrected)) + residual, and over T steps the decoded local
    contributions sum to T*x minus the last residual (the error does not accumulate)."""
    from ringcomp.compression import ErrorFeedback

    comp = get_compressor(name)
    memory = ErrorFeedback()
    x = data(comm.rank, 3000)
    decoded_sum = np.zeros(3000, np.float64)
    from ringcomp.collectives import REGISTRY

    segments = REGISTRY[algorithm].segments(3000, comm.size, SEG_BYTES // 4)
    for step in range(6):
        corrected = memory.compensate(x, bucket=3)
        ringcomp.allreduce(x, algorithm=algorithm, compressor=name, error_feedback=memory,
                           bucket=3, step=step, segment_bytes=SEG_BYTES)
        residual = memory.residuals[(3, 3000, "<f4", "worker")]
        own = np.concatenate([comp.decode(comp.encode(corrected[a:b], Key(0, step, 3).at(0, a)),
                                          b - a, np.empty(b - a, np.float32))
                              for a, b in segments])
        assert np.allclose(own + residual, corrected, rtol=1e-6, atol=1e-6 * (1 + abs(own).max()))
        decoded_sum += own
    assert every_rank(comm, np.allclose(decoded_sum, 6 * x.astype(np.float64) - residual,
                                        rtol=1e-4, atol=1e-4))


@pytest.mark.mpi(min_size=1)
def test_error_feedback_refused_where_meaningless(comm):
    from test_errors import same_error_everywhere

    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), error_feedback=True),
                          ValueError, "needs a compressor")
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), compressor="marsit",
                                                           error_feedback=True),
                          ValueError, "global compensation")


def shadow_by_contributors(comm, name):
    tracer = ringcomp.Tracer()
    ringcomp.allreduce(data(comm.rank, 20_000), compressor=name, tracer=tracer, shadow=True,
                       segment_bytes=1 << 14)
    mine = [r for r in tracer.records if r["type"] == "hop" and r["kind"] == "shadow"]
    everyone = [r for part in comm.allgather(mine) for r in part]
    by = {}
    for rec in everyone:
        by.setdefault(rec["contributors"], []).append(rec)
    return mine, by


@pytest.mark.mpi(min_size=2)
def test_shadow_records_every_hop(comm):
    mine, by = shadow_by_contributors(comm, "fp16")
    p = comm.size
    segments = sum(len(even_segments(lo, hi, (1 << 14) // 4))
                   for c, (lo, hi) in enumerate(block_bounds(20_000, p)) if c != comm.rank)
    assert every_rank(comm, len(mine) == segments)  # one per received segment
    assert sorted(by) == list(range(2, p + 1))
    # fp16 sums are near-exact at every hop
    assert all(rec["rel_err"] < 2e-3 and rec["cosine"] > 0.999 for recs in by.values()
               for rec in recs)


@pytest.mark.mpi(min_size=4)
def test_shadow_shows_cascading_sign_error_growing(comm):
    _, by = shadow_by_contributors(comm, "sign")
    mean_err = [np.mean([rec["rel_err"] for rec in by[k]]) for k in sorted(by)]
    assert mean_err[-1] > mean_err[0] + 0.05, mean_err
    assert all(0 < rec["sign_agree"] <= 1 for recs in by.values() for rec in recs)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", compressed_schemes())
def test_shadow_errors_match_the_result_and_one_compression(comm, algorithm):
    """Shadow mode on every scheme, checked where the answer is known independently: the
    record of all p ranks has the error of the returned result against MPI's exact sum;
    a record of one rank has the error of compressing that rank's input once."""
    p, r = comm.size, comm.rank
    x = data(r, 3000)
    tracer = ringcomp.Tracer()
    out = ringcomp.allreduce(x, algorithm=algorithm, compressor="sign", tracer=tracer,
                             shadow=True, segment_bytes=1 << 11)
    exact = comm.allreduce(x.astype(np.float64))
    comp = get_compressor("sign")
    mine = [rec for rec in tracer.records if rec["type"] == "hop" and rec["kind"] == "shadow"]

    def rel(got, want):
        return np.linalg.norm(got - want) / np.linalg.norm(want)

    ok, finals, singles = True, 0, 0
    for rec in mine:
        lo, hi = rec["lo"], rec["hi"]
        if rec["contributors"] == p:
            finals += 1
            ok &= abs(rec["rel_err"] - rel(out[lo:hi], exact[lo:hi])) < 1e-5
        elif rec["contributors"] == 1:
            singles += 1
            once = comp.decode(comp.encode(x[lo:hi], Key(0, 0, 0, 0, lo)), hi - lo,
                               np.empty(hi - lo, np.float32))
            ok &= abs(rec["rel_err"] - rel(once, x[lo:hi])) < 1e-5
    assert every_rank(comm, ok and bool(mine))
    assert comm.allreduce(finals) > 0
    if algorithm not in ("ring", "torus"):  # a ring's first record covers two ranks
        assert comm.allreduce(singles) > 0


@pytest.mark.mpi(min_size=1)
def test_shadow_refused_where_meaningless(comm):
    from test_errors import same_error_everywhere

    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), compressor="sign",
                                                           shadow=True),
                          ValueError, "pass tracer=")
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), shadow=True,
                                                           tracer=ringcomp.Tracer()),
                          ValueError, "uncompressed call")
    same_error_everywhere(comm, lambda: ringcomp.allreduce(np.ones(8), compressor="powersgd",
                                                           shadow=True,
                                                           tracer=ringcomp.Tracer()),
                          ValueError, "not powersgd")


@pytest.mark.mpi(min_size=1)
def test_majority_vote_on_allgather(comm):
    """Sign bits on an all-gather: every element takes the majority sign (ties: +1)."""
    p, r = comm.size, comm.rank
    x = np.where(np.arange(60) % p <= r, 1.0, -1.0).astype(np.float32)  # rank r: r+1 votes
    y = ringcomp.allreduce(x, algorithm="allgather", compressor="marsit")
    votes = np.sum([np.where(np.arange(60) % p <= q, 1, -1) for q in range(p)], axis=0)
    assert every_rank(comm, np.array_equal(y, np.where(votes >= 0, 1.0, -1.0)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["fp16", "sign", "marsit", "topk:ratio=0.1", "qsgd:levels=8",
                                  "countsketch:ratio=0.5:rows=3:keep=1"])
def test_in_place_matches_out_of_place_bit_for_bit(comm, name):
    """In place, the compressed ring reads its input straight from the buffer it writes
    (every read precedes every write; no copy) and must give the out-of-place bytes.
    (PowerSGD, whose warm start makes two calls differ, takes the exact path with a copy.)"""
    for n in (1, comm.size + 1, 5000):
        x = data(comm.rank, n)
        expected = ringcomp.allreduce(x, compressor=name, seed=3, segment_bytes=SEG_BYTES)
        y = ringcomp.allreduce(x, out=x, compressor=name, seed=3, segment_bytes=SEG_BYTES)
        assert every_rank(comm, y is x and np.array_equal(x, expected)), (name, n)
