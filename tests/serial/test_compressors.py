"""Compressors on their own: registry, specs, exact wire sizes, round trips, cascading error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ringcomp
from ringcomp.checks import LocalError, check_finite
from ringcomp.compression import Key, compressors, get_compressor


def test_registry_and_specs():
    assert {"none", "fp16", "sign", "marsit", "randomk", "topk", "qsgd", "terngrad",
            "countsketch", "powersgd", "bf16"} <= set(compressors())
    assert (get_compressor("countsketch:rows=3:ratio=0.5").spec()
            == "countsketch:keep=0.01:ratio=0.5:rows=3")
    for bad in ("countsketch:rows=0", "countsketch:ratio=0", "countsketch:keep=2"):
        with pytest.raises(ValueError, match="countsketch: "):
            get_compressor(bad)
    assert get_compressor("qsgd:levels=8").spec() == "qsgd:bucket=512:levels=8"
    assert get_compressor("terngrad").spec() == "terngrad"
    with pytest.raises(ValueError, match="levels must be"):
        get_compressor("qsgd:levels=0")
    assert get_compressor("randomk:ratio=0.25").spec() == "randomk:ratio=0.25"
    with pytest.raises(ValueError, match="ratio must be in"):
        get_compressor("randomk:ratio=2")
    assert ringcomp.compressors() == compressors()
    assert get_compressor(None) is None and get_compressor("none") is None
    assert get_compressor("marsit").spec() == "marsit"
    with pytest.raises(ValueError, match="unknown compressor 'signn'"):
        get_compressor("signn")
    with pytest.raises(ValueError, match="takes no parameters"):
        get_compressor("sign:ratio=0.1")
    with pytest.raises(ValueError, match="key=value"):
        get_compressor("sign:oops")
    with pytest.raises(ValueError, match="separated by ':'"):
        get_compressor("countsketch:ratio=0.3,keep=0.1")
    with pytest.raises(ValueError, match="bad parameters in compressor spec"):
        get_compressor("topk:ratio=abc")
    with pytest.raises(ValueError, match="bad parameters in compressor spec"):
        get_compressor("topk:ratoi=0.1")
    with pytest.raises(TypeError):
        get_compressor(3)


@pytest.mark.parametrize("name", ["fp16", "bf16", "sign", "marsit", "randomk:ratio=0.25",
                                  "topk:ratio=0.25", "countsketch:ratio=10:rows=3:keep=1"])
@pytest.mark.parametrize("n", [1, 31, 32, 33, 1000])
def test_payload_size_is_exact_and_round_trip(name, n):
    comp = get_compressor(name)
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    payload = comp.encode(x, Key(seed=1))
    assert payload.dtype == np.uint8 and payload.nbytes == comp.nbytes(n)
    out = comp.decode(payload, n, np.empty(n, np.float32))
    if name == "fp16":
        assert np.array_equal(out, x.astype(np.float16).astype(np.float32))
    elif name == "bf16":  # 8 significant bits, round to nearest
        assert np.allclose(out, x, rtol=2**-8, atol=0)
        assert (out.view(np.uint32) & 0xFFFF).max() == 0
    elif name.startswith("topk"):
        kept = np.flatnonzero(out)
        k = comp.k(n)
        assert kept.size == k and np.array_equal(out[kept], x[kept])
        assert np.abs(x[kept]).min() >= np.sort(np.abs(x))[::-1][k - 1]
    elif name.startswith("randomk"):
        kept = np.flatnonzero(out)
        assert kept.size <= comp.k(n) and np.array_equal(out[kept], x[kept])
        assert np.count_nonzero(out) == np.count_nonzero(x[kept])
    elif name.startswith("countsketch"):  # 3.3n columns a row: most elements exact
        assert np.mean(out == x) > 0.6 and np.allclose(np.median(out - x), 0)
    elif name == "sign":
        scale = np.float32(np.abs(x).mean())
        assert np.allclose(out, np.where(x >= 0, scale, -scale))
    else:
        assert np.array_equal(out, np.where(x >= 0, 1.0, -1.0))


def cascade(comp, xs):
    """Single-process cascade along a chain: decode, add, re-encode at every hop."""
    n = xs[0].size
    payload = comp.encode(xs[0], Key(hop=0))
    for hop, x in enumerate(xs[1:], start=1):
        partial = comp.decode(payload, n, np.empty(n, np.float32)) + x
        payload = comp.encode(partial, Key(hop=hop))
    return comp.decode(payload, n, np.empty(n, np.float32))


def test_cascading_sign_error_grows_with_hops():
    rng = np.random.default_rng(0)
    comp = get_compressor("sign")
    errors = []
    for p in (2, 4, 8, 16):
        xs = [rng.standard_normal(20_000).astype(np.float32) for _ in range(p)]
        exact = np.sum(xs, axis=0)
        errors.append(np.linalg.norm(cascade(comp, xs) - exact) / np.linalg.norm(exact))
    assert errors == sorted(errors) and errors[-1] > errors[0] + 0.1, errors


def test_twostage_error_is_flat_in_p_while_the_ring_cascade_grows():
    """Scaled sign: two-stage encodes every contribution twice whatever p; the ring's chain
    re-encodes p times, so its error grows with p and overtakes the two-stage error."""
    from ringcomp.testing.replay import simulate_ring, simulate_twostage

    comp, rng = get_compressor("sign"), np.random.default_rng(1)
    errors = {"ring": [], "twostage": []}
    for p in (2, 4, 8, 16):
        xs = [rng.standard_normal(4096).astype(np.float32) for _ in range(p)]
        exact = np.sum(xs, axis=0, dtype=np.float64)
        for name, simulate in (("ring", simulate_ring), ("twostage", simulate_twostage)):
            y = simulate(comp, xs, Key(seed=3))
            errors[name].append(np.linalg.norm(y - exact) / np.linalg.norm(exact))
    assert max(errors["twostage"]) <= errors["twostage"][0] + 0.01, errors  # no growth
    assert errors["ring"] == sorted(errors["ring"]), errors
    assert errors["ring"][0] < errors["twostage"][0] and errors["ring"][-1] > errors[
        "twostage"][-1], errors


def test_powersgd_shapes_and_one_rank_round_trip():
    comp = get_compressor("powersgd:rank=2")
    assert comp.spec() == "powersgd:rank=2:warm=1" and comp.aggregation == "lowrank"
    assert comp.shape(2025) == (45, 45, 2) and comp.shape(2026) == (46, 45, 2)
    assert comp.shape(1) == (1, 1, 1) and comp.nbytes(2025) == 4 * 90 * 2
    for bad in ("powersgd:rank=0", "powersgd:warm=2"):
        with pytest.raises(ValueError, match="powersgd: "):
            get_compressor(bad)
    rng = np.random.default_rng(0)
    low = (rng.standard_normal((45, 2)) @ rng.standard_normal((2, 45))).astype(np.float32)
    payload = comp.encode(low.reshape(-1), Key(seed=1))
    assert payload.nbytes == comp.nbytes(2025)
    out = comp.decode(payload, 2025, np.empty(2025, np.float32))
    assert np.allclose(out, low.reshape(-1), atol=1e-4)  # rank 2 data: recovered
    noisy = rng.standard_normal(2000).astype(np.float32)
    approx = comp.decode(comp.encode(noisy, Key()), 2000, np.empty(2000, np.float32))
    assert 0.5 < np.linalg.norm(approx - noisy) / np.linalg.norm(noisy) < 1


def test_fp16_is_linear():
    comp = get_compressor("fp16")
    a, b = np.float32([1.5, -2.25, 3.0]), np.float32([0.5, 0.25, -1.0])
    total = comp.add(comp.encode(a, Key()), comp.encode(b, Key()), 3)
    assert np.array_equal(comp.decode(total, 3, np.empty(3, np.float32)), a + b)


def test_randomk_is_shared_and_linear():
    comp = get_compressor("randomk:ratio=0.1")
    a, b = np.arange(1, 101, dtype=np.float32), np.full(100, 0.5, np.float32)
    # every rank and hop picks the same coordinates: payloads add in the compressed domain
    pa, pb = comp.encode(a, Key(1, 2, 3, hop=0, offset=7)), comp.encode(b, Key(1, 2, 3, 5, 7))
    total = comp.decode(comp.add(pa, pb, 100), 100, np.empty(100, np.float32))
    kept = np.flatnonzero(total)
    assert kept.size == 10 and np.array_equal(total[kept], a[kept] + b[kept])
    other = comp.encode(a, Key(1, 3, 3, 0, 7))  # another step: other coordinates
    with pytest.raises(ValueError, match="different seeds"):
        comp.add(pa, other, 100)


def test_topk_selection_matches_a_stable_sort_with_ties():
    from ringcomp.compression.topk import TopK

    rng = np.random.default_rng(3)
    for n, k in ((10, 3), (1000, 10), (5, 5), (7, 1), (50, 0)):
        magnitude = np.abs(rng.standard_normal(n)).round(1)  # many ties
        expected = np.sort(np.argsort(-magnitude, kind="stable")[:k])
        assert np.array_equal(TopK.select(magnitude, k), expected), (n, k)


def test_countsketch_is_linear_and_recovers_heavy_hitters():
    comp = get_compressor("countsketch:ratio=0.2:rows=5:keep=0.01")
    n = 10_000
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(n).astype(np.float32) * 0.01 for _ in range(3)]
    xs[0][[3, 4000]] += 10.0
    xs[2][9999] -= 10.0
    key = Key(1, 2, 3, hop=0, offset=64)
    payloads = [comp.encode(x, Key(1, 2, 3, hop=h, offset=64)) for h, x in enumerate(xs)]
    total = comp.add(comp.add(payloads[0], payloads[1], n), payloads[2], n)
    # linear: the sum of sketches is the sketch of the sum (to float32 rounding)
    direct = comp.encode(xs[0] + xs[1] + xs[2], key)
    assert np.array_equal(total[:16], direct[:16])
    assert np.allclose(total[16:].view(np.float32), direct[16:].view(np.float32), atol=1e-5)
    out = comp.decode(total, n, np.empty(n, np.float32))
    assert np.count_nonzero(out) == comp.keep * n  # keep: only the largest estimates
    assert {3, 4000, 9999} <= set(np.flatnonzero(out).tolist())
    assert np.allclose(out[[3, 4000, 9999]], (xs[0] + xs[1] + xs[2])[[3, 4000, 9999]],
                       atol=0.1)
    with pytest.raises(ValueError, match="different seeds"):
        comp.add(total, comp.encode(xs[0], Key(1, 3, 3, 0, 64)), n)


@pytest.mark.parametrize("bits", [1, 2, 3, 5, 8])
def test_code_packing_round_trip(bits):
    from ringcomp.kernels.quant_ref import pack_codes, unpack_codes

    codes = np.random.default_rng(bits).integers(0, 2**bits, 1001).astype(np.uint8)
    packed = pack_codes(codes, bits)
    assert packed.size == (1001 * bits + 7) // 8
    assert np.array_equal(unpack_codes(packed, 1001, bits), codes)


@pytest.mark.parametrize("spec", ["qsgd", "qsgd:levels=4:bucket=0", "terngrad",
                                  "terngrad:bucket=100"])
def test_stochastic_quantizers_are_unbiased(spec):
    comp = get_compressor(spec)
    x = np.random.default_rng(0).standard_normal(2000).astype(np.float32)
    trials = 300
    total = np.zeros(x.size)
    for step in range(trials):
        payload = comp.encode(x, Key(0, step, 0, 0, 0))
        assert payload.nbytes == comp.nbytes(x.size)
        total += comp.decode(payload, x.size, np.empty(x.size, np.float32))
    single = comp.decode(comp.encode(x, Key()), x.size, np.empty(x.size, np.float32))
    # the average over trials approaches x at the rate of the per-sample error
    sigma = np.linalg.norm(single - x) / np.sqrt(x.size * trials)
    assert abs(np.mean(total / trials - x)) < 5 * sigma
    assert np.sqrt(np.mean((total / trials - x) ** 2)) < 3 * sigma * np.sqrt(1 + 0.5)
    levels, (size, count) = comp.levels, comp._buckets(x.size)
    assert payload.nbytes == 4 * count + (x.size * comp.bits + 7) // 8
    blocks = np.abs(x.astype(np.float64))[:, None].reshape(count, -1) if x.size % size == 0 \
        else [np.abs(x[i:i + size].astype(np.float64)) for i in range(0, x.size, size)]
    scale = np.repeat([np.sqrt(b @ b) if spec.startswith("qsgd") else b.max() for b in blocks],
                      size)[:x.size].astype(np.float32)
    steps = np.round(single / (scale / levels))
    assert np.allclose(single, steps * scale / levels, atol=1e-4)  # on the bucket's grid
    assert np.abs(steps).max() <= levels


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_finite_check_finds_every_nan_and_inf_and_accepts_overflowing_sums(dtype):
    """What every compressed call runs on its input (no payload can carry NaN/Inf): one
    pass (a dot product; float16: a float32 sum); one that overflows from finite values
    falls back to counting, with no warning; any NaN/Inf is refused."""
    big = np.full(1000, np.finfo(dtype).max / 2, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_finite(big)
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones(1001, dtype)
        x[700] = bad
        with pytest.raises(LocalError, match="1 of 1001 values are NaN or Inf"):
            check_finite(x)
