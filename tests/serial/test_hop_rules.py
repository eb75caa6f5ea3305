"""The three hop rules against their definitions, independently of any collective."""

from __future__ import annotations

import numpy as np
import pytest

from ringcomp.compression import REGISTRY, Key, get_compressor
from ringcomp.compression.rules import Cascade, Linear, SignMerge

CASCADES = ["sign", "topk:ratio=0.1", "qsgd", "terngrad"]
LINEARS = ["fp16", "bf16", "randomk:ratio=0.2", "countsketch:ratio=0.5:keep=1"]
KEY = Key(seed=3, step=7, bucket=2, hop=0, offset=64)
N = 300


def values(i, dtype=np.float32):
    return np.random.default_rng(i).standard_normal(N).astype(dtype)


def decoded(comp, payload, dtype=np.float32):
    return comp.decode(payload, N, np.empty(N, dtype))


def test_every_compressor_has_exactly_one_hop_rule_or_wraps_an_exact_algorithm():
    """A new compressor must pick a rule (or say it aggregates over exact algorithms):
    collectives call the rule's operations and never ask which rule it is."""
    for name, cls in REGISTRY.items():
        rules = [rule for rule in (Cascade, Linear, SignMerge) if issubclass(cls, rule)]
        if name == "none" or cls.wraps_exact:
            assert rules == [], name
            comp = cls()
            with pytest.raises(TypeError, match=f"compressor {name!r} has no hop rule"):
                comp.join(np.zeros(8, np.uint8), values(0), 1, KEY)
        else:
            assert len(rules) == 1, name
            assert cls.cascades == (rules[0] is Cascade)
            assert cls.linear == (rules[0] is Linear)
            assert cls.signs_only == (rules[0] is SignMerge)


@pytest.mark.parametrize("spec", CASCADES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cascade_decodes_adds_and_reencodes(spec, dtype):
    comp = get_compressor(spec)
    x, y, hop = values(1, dtype), values(2, dtype), KEY.at(4, 64)
    incoming = comp.encode(y, KEY)
    # a ring hop: decode, add the own raw values, re-encode from the hop's stream
    expected = comp.encode(decoded(comp, incoming, dtype) + x, hop)
    assert np.array_equal(comp.join(incoming, x, 1, hop, np.empty(N, dtype)), expected)
    # a tree node: raw sums, never written in place, encoded once when finished
    agg = comp.start(x, KEY)
    assert agg is x
    before = x.copy()
    agg = comp.combine(agg, incoming, N, 1, 1, hop, np.empty(N, dtype))
    assert np.array_equal(x, before) and agg.dtype == dtype
    assert np.array_equal(agg, x + decoded(comp, incoming, dtype))
    assert np.array_equal(comp.finish(agg, hop), comp.encode(agg, hop))
    # a two-stage owner starts from no rank at all
    first = comp.combine(None, incoming, N, 0, 1, hop, np.empty(N, dtype))
    assert np.array_equal(first, decoded(comp, incoming, dtype))


@pytest.mark.parametrize("spec", CASCADES)
def test_cascade_finish_carries_what_its_encoding_lost(spec):
    """Server error feedback: the carry is added before encoding and then holds exactly
    corrected - decode(payload) (the invariant x == decode(encode(x)) + residual)."""
    comp = get_compressor(spec)
    agg, carry = values(3), 0.1 * values(4)
    corrected = agg + carry
    payload = comp.finish(agg, KEY, carry)
    assert np.array_equal(payload, comp.encode(corrected, KEY))
    assert np.array_equal(carry, corrected - decoded(comp, payload))
    assert np.abs(carry).max() > 0


@pytest.mark.parametrize("spec", LINEARS)
def test_linear_adds_payloads_and_finishes_unchanged(spec):
    comp = get_compressor(spec)
    x, y = values(5), values(6)
    own, incoming = comp.encode(x, KEY), comp.encode(y, KEY)
    joined = comp.join(incoming, x, 1, KEY.at(3, 64))
    assert np.array_equal(joined, comp.add(incoming, own, N))
    if spec.startswith("countsketch"):  # the tables add (the median decode is not linear)
        assert np.array_equal(comp.body(joined), comp.body(own) + comp.body(incoming))
    else:  # the payloads stand for the sum of what each stands for (up to the wire's rounding)
        np.testing.assert_allclose(decoded(comp, joined),
                                   decoded(comp, own) + decoded(comp, incoming), atol=2e-2)
    agg = comp.start(x, KEY)
    assert np.array_equal(agg, own)
    assert comp.combine(None, incoming, N, 0, 1, KEY, None) is incoming
    carry = np.zeros(N, np.float32)
    assert comp.finish(agg, KEY, carry) is agg and not carry.any()  # nothing re-encoded


def bits(payload):
    return np.unpackbits(payload.view(np.uint8), bitorder="little")[:N * 64]


@pytest.mark.parametrize("have, joining", [(1, 1), (3, 1), (2, 6)])
def test_signmerge_keeps_each_side_in_proportion_to_its_ranks(have, joining):
    """Marsit: the merged bit is the joining side's with probability joining/(have+joining),
    so the final bit is the sign of a uniformly chosen rank."""
    comp, n = get_compressor("marsit"), 64 * 1024
    ones, zeros = np.ones(n, np.float32), -np.ones(n, np.float32)
    agg = comp.start(zeros, KEY)  # have's bits are all 0 (negative), joining's all 1
    merged = comp.combine(agg, comp.encode(ones, KEY), n, have, joining, KEY.at(5, 0),
                          None)
    share = comp.decode(merged, n, np.empty(n, np.float32)).mean() / 2 + 0.5
    assert share == pytest.approx(joining / (have + joining), abs=0.01)
    # a ring hop: one rank joins an aggregate of ``have``
    joined = comp.join(comp.encode(zeros, KEY), ones, have, KEY.at(6, 0))
    share = comp.decode(joined, n, np.empty(n, np.float32)).mean() / 2 + 0.5
    assert share == pytest.approx(1 / (have + 1), abs=0.01)
    assert comp.finish(merged, KEY) is merged


def test_signmerge_settles_an_allgather_by_majority_vote_and_others_keep_the_sum():
    total = np.array([3.0, -1.0, 0.0, -5.0], np.float32)
    voted = total.copy()
    get_compressor("marsit").settle(voted)
    assert voted.tolist() == [1, -1, 1, -1]  # ties go to +1, as the kernels' x >= 0
    for spec in CASCADES + LINEARS:
        kept = total.copy()
        get_compressor(spec).settle(kept)
        assert np.array_equal(kept, total)
