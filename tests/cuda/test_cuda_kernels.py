"""Every CUDA kernel equals its NumPy reference bit for bit, random streams included."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SIZES, XP, dev, host
from numba import cuda, int64

from ringcomp.kernels import (
    backends,
    cast_ref,
    finite_ref,
    optim_ref,
    quant_ref,
    select_cuda,
    select_ref,
    signs_ref,
    sketch_ref,
)
from ringcomp.kernels.rng import stream_key, substream


def kernels(family):
    return backends.backend(family, "cuda")


def data(n, dtype="float32", seed=0):
    x = np.random.default_rng(seed + n).standard_normal(n).astype(dtype)
    x[:4] = [0.0, -0.0, 1e-42, -3.0][:min(4, n)]  # signed zeros, a subnormal
    return x


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_signs(dtype):
    k = kernels("signs")
    for n in SIZES:
        x = data(n, dtype)
        words = k.pack_signs(dev(x))
        assert np.array_equal(host(words), signs_ref.pack_signs(x)), n
        out = k.unpack_signs(words, n, XP.empty(n, dtype), 0.75)
        assert np.array_equal(host(out), signs_ref.unpack_signs(signs_ref.pack_signs(x), n,
                                                                np.empty(n, dtype), 0.75)), n
        own = signs_ref.pack_signs(data(n, seed=1) * -1)
        key = stream_key(7, 3, 1, 2)
        for take, of in ((1, 2), (1, 3), (2, 5), (0, 4), (4, 4)):
            merged = k.marsit_merge(words, dev(own), n, take, of, key, 123)
            assert np.array_equal(host(merged), signs_ref.marsit_merge(
                signs_ref.pack_signs(x), own, n, take, of, key, 123)), (n, take, of)
        scale = k.mean_abs(dev(x), XP.empty(1, np.float32))
        assert host(scale).tobytes() == signs_ref.mean_abs(x, np.empty(1, np.float32)).tobytes()
        # the fused ring hops: Marsit's encode + merge, scaled sign's decode + add + encode
        for take, of, offset in ((1, 3, 32), (1, 2, 0), (2, 5, 123), (0, 4, 7), (4, 4, 0)):
            joined = k.marsit_join(dev(own), dev(x), take, of, key, offset)
            assert np.array_equal(host(joined), signs_ref.marsit_join(
                own, x, take, of, key, offset)), (n, take, of, offset)
        words, scale = XP.empty(own.size, np.uint32), XP.empty(1, np.float32)
        k.sign_join(dev(own), 0.25, dev(x), words, scale)
        want_words, want_scale = np.empty(own.size, np.uint32), np.empty(1, np.float32)
        signs_ref.sign_join(own, 0.25, x, want_words, want_scale)
        assert np.array_equal(host(words), want_words), n
        assert host(scale).tobytes() == want_scale.tobytes(), n
        k.sign_encode(dev(x), words, scale)
        signs_ref.sign_encode(x, want_words, want_scale)
        assert np.array_equal(host(words), want_words), n
        assert host(scale).tobytes() == want_scale.tobytes(), n
        # a payload's scale read by the kernels from device memory, as the sign
        # compressor passes it: the same bits as the float
        on_device = XP.asarray(np.array([0.3], np.float32))
        as_float = float(np.float32(0.3))
        out = k.unpack_signs(dev(own), n, XP.empty(n, dtype), on_device)
        assert np.array_equal(host(out), signs_ref.unpack_signs(own, n, np.empty(n, dtype),
                                                                as_float)), n
        k.sign_join(dev(own), on_device, dev(x), words, scale)
        signs_ref.sign_join(own, as_float, x, want_words, want_scale)
        assert np.array_equal(host(words), want_words), n
        assert host(scale).tobytes() == want_scale.tobytes(), n


def test_sign_join_of_float16_rounds_a_device_scale_first():
    """float16 adds the scale rounded to float16 (the reference's order): the kernel that
    reads the scale on the device would add it in float32, so float16 reads it on the host."""
    k = kernels("signs")
    for n in (1, 33, 300):
        x = data(n, "float16")
        own = signs_ref.pack_signs(data(n, seed=2))
        words, scale = XP.empty(own.size, np.uint32), XP.empty(1, np.float32)
        k.sign_join(dev(own), XP.asarray(np.array([0.3], np.float32)), dev(x), words, scale)
        want_words, want_scale = np.empty(own.size, np.uint32), np.empty(1, np.float32)
        signs_ref.sign_join(own, float(np.float32(0.3)), x, want_words, want_scale)
        assert np.array_equal(host(words), want_words), n
        assert host(scale).tobytes() == want_scale.tobytes(), n


@pytest.mark.parametrize("norm,levels,bucket", [("l2", 16, 512), ("l2", 3, 5), ("l2", 2, 0),
                                                ("l2", 2, 300), ("max", 1, 0), ("max", 1, 7)])
def test_quant(norm, levels, bucket):
    k, bits = kernels("quant"), 1 + levels.bit_length()
    for n in SIZES:
        x = data(n)
        size = bucket or max(n, 1)
        count = max(1, -(-n // size))
        if XP is np and count > 64:
            continue  # the simulator runs a Python thread per lane: a warp per bucket
        scales = quant_ref.bucket_scales(x, size, norm, np.empty(count, np.float32))
        got = k.bucket_scales(dev(x), size, norm, XP.empty(count, np.float32))
        assert host(got).tobytes() == scales.tobytes(), n
        nbytes = (n * bits + 7) // 8
        packed = quant_ref.quantize(x, scales, size, levels, bits, 99, 3, np.empty(nbytes,
                                                                                  np.uint8))
        got = k.quantize(dev(x), dev(scales), size, levels, bits, 99, 3,
                         XP.empty(nbytes, np.uint8))
        assert np.array_equal(host(got), packed), n
        want = quant_ref.dequantize(packed, n, scales, size, levels, bits, np.empty(n))
        got = k.dequantize(dev(packed), n, dev(scales), size, levels, bits, XP.empty(n))
        assert host(got).tobytes() == want.tobytes(), n


@cuda.jit
def _scan_values(values, out):
    shared = cuda.shared.array(32, int64)
    t = cuda.threadIdx.x
    out[t] = select_cuda._exclusive_scan(shared, t, values[t])


@pytest.mark.parametrize("threads", [1, 2, 7, 32])
def test_block_scan_of_the_radix_select(threads):
    """The block-wide exclusive scan the selection's kernels share, at block sizes its
    kernels do not take under the simulator (every round of the scan: 5 at 32 threads;
    a block that is not a power of two)."""
    values = np.random.default_rng(threads).integers(0, 1 << 40, threads)
    out = XP.zeros(threads, np.int64)
    _scan_values[1, threads](dev(values), out)
    assert np.array_equal(host(out), np.cumsum(values) - values)


def test_topk_refuses_more_values_than_its_packed_counts_hold():
    """Tile counts travel as two 32-bit halves of an int64: past 2**31 - 1 values the
    selection would be silently wrong, so it is refused (nothing is allocated first)."""
    from types import SimpleNamespace

    with pytest.raises(ValueError, match="at most 2147483647 values"):
        select_cuda._selected(SimpleNamespace(size=2**31), 5, 0x7FFFFFFF)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_topk_radix_select(dtype):
    """The radix select picks the reference's set: ties (few distinct values, zeros),
    values that share their high digits, k = 1, a third, n; of magnitudes, and of signed
    values whose magnitudes it reads from their bits."""
    k = kernels("select")
    rng = np.random.default_rng(3)
    # the simulator runs a Python thread per element and pass: the small sizes there
    for n in [n for n in SIZES[1:] if XP is not np or n < 100 or n == 257]:  # 257: strides
        close = (1 + rng.integers(0, 5, n) * np.finfo(dtype).eps).astype(dtype)
        few = rng.integers(0, 3, n).astype(dtype)  # ties across tiles
        for magnitude in (np.abs(data(n, dtype)), few, close):
            # the same magnitudes with random signs (-0.0 among them), read from x's bits
            signed = (magnitude * rng.choice([-1, 1], n)).astype(dtype)
            for count in sorted({1, -(-n // 3), n}):
                got = k.topk_abs_indices(dev(signed), count)
                assert np.array_equal(host(got), select_ref.topk_abs_indices(signed, count)), (
                    n, count)
            count = -(-n // 3)  # the same passes on magnitudes given as such
            got = k.topk_indices(dev(magnitude), count)
            assert np.array_equal(host(got), select_ref.topk_indices(magnitude, count)), n
            if n == 257 and magnitude is few:
                # scanning blocks of 5 threads (one under the simulator by default): each
                # thread's share of a tile and of the bins, the scan's rounds (1, 2, 4)
                bits = dev(signed).view(select_cuda._BITS[signed.itemsize])
                got = select_cuda._selected(bits, count, (1 << 8 * signed.itemsize - 1) - 1, 5)
                assert np.array_equal(host(got), select_ref.topk_abs_indices(signed, count))


@pytest.mark.parametrize("rows", [1, 4, 5])
def test_sketch(rows):
    k = kernels("sketch")
    keys = np.array([substream(3, j) for j in range(rows)], np.uint64)
    for n in SIZES:
        cols = max(1, n // 7)
        # the fixed point's shift at its extremes: tiny and huge float64 magnitudes
        for x in (data(n), data(n, "float64") * 1e-300, data(n, "float64") * 1e300):
            table = sketch_ref.sketch_encode(x, keys, cols, 5, np.empty((rows, cols),
                                                                      np.float32))
            got = k.sketch_encode(dev(x), keys, cols, 5, XP.empty((rows, cols), np.float32))
            assert host(got).tobytes() == table.tobytes(), n
        x = data(n)
        want = sketch_ref.sketch_decode(table, keys, n, 5, np.empty(n, np.float32))
        got = k.sketch_decode(dev(table), keys, n, 5, XP.empty(n, np.float32))
        assert host(got).tobytes() == want.tobytes(), n


@pytest.mark.parametrize("rows", [8, 9])
def test_sketch_decode_of_many_rows(rows):
    """The decode's estimates in registers up to 8 rows, in local memory past them."""
    k = kernels("sketch")
    keys = np.array([substream(4, j) for j in range(rows)], np.uint64)
    for n in SIZES[:7] + SIZES[9:]:  # not 257 and 1000 (the simulator's slowest)
        cols = max(1, n // 7)
        table = sketch_ref.sketch_encode(data(n), keys, cols, 3, np.empty((rows, cols),
                                                                          np.float32))
        want = sketch_ref.sketch_decode(table, keys, n, 3, np.empty(n, np.float32))
        got = k.sketch_decode(dev(table), keys, n, 3, XP.empty(n, np.float32))
        assert host(got).tobytes() == want.tobytes(), n


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e6, 5.96e-8,
                    2.98e-8, 6.1e-5, 1.0009766, 1.0004883, 3.4e38, 1e-40], np.float32)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_casts(fmt):
    k = kernels("cast")
    for n in SIZES:
        x = np.concatenate([SPECIAL, data(n) * 1e4]).astype(np.float32)
        m = x.size
        want = getattr(cast_ref, f"to_{fmt}")(x, np.empty(m, np.uint16))
        got = getattr(k, f"to_{fmt}")(dev(x), XP.empty(m, np.uint16))
        assert np.array_equal(host(got), want), n
        back = getattr(cast_ref, f"from_{fmt}")(want, np.empty(m, np.float32))
        got = getattr(k, f"from_{fmt}")(dev(want), XP.empty(m, np.float32))
        assert host(got).tobytes() == back.tobytes(), n
        other = want[::-1].copy()
        total = getattr(cast_ref, f"add_{fmt}")(want, other, np.empty(m, np.uint16))
        got = getattr(k, f"add_{fmt}")(dev(want), dev(other), XP.empty(m, np.uint16))
        assert np.array_equal(host(got), total), n


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32"])
def test_finite(dtype):
    k = kernels("finite")
    for n in SIZES:
        x = data(n).astype(dtype)
        assert k.nonfinite(dev(x)) is finite_ref.nonfinite(x) is False, n
        if n == 0 or dtype == "int32":
            continue
        for bad in (np.nan, np.inf, -np.inf):
            for i in {0, n // 2, n - 1}:
                y = x.copy()
                y[i] = bad
                assert k.nonfinite(dev(y)) is finite_ref.nonfinite(y) is True, (n, i)


@pytest.mark.parametrize("momentum,weight_decay", [(0.9, 1e-4), (0.0, 0.0), (0.5, 0.0)])
def test_sgd(momentum, weight_decay):
    k = kernels("optim")
    for n in SIZES:
        x, v, g = data(n), data(n, seed=1), data(n, seed=2)
        dx, dv = dev(x), dev(v)
        optim_ref.sgd(x, v, g, 0.25, 0.1, momentum, weight_decay)
        k.sgd(dx, dv, dev(g), 0.25, 0.1, momentum, weight_decay)
        assert host(dx).tobytes() == x.tobytes() and host(dv).tobytes() == v.tobytes(), n


def test_tree_rows_past_the_last_block_s_warps():
    """Three tree rows in blocks of two (the simulator's) or eight warps: the last block
    has a warp past the rows, which must write nothing (the sign scale, its encode and
    join, and bucket norms)."""
    k = kernels("signs")
    x = data(600)  # rows of 256: 3
    own = signs_ref.pack_signs(data(600, seed=4))
    scale = k.mean_abs(dev(x), XP.empty(1, np.float32))
    assert host(scale).tobytes() == signs_ref.mean_abs(x, np.empty(1, np.float32)).tobytes()
    encode = (lambda w, s: k.sign_encode(dev(x), w, s),
              lambda w, s: signs_ref.sign_encode(x, w, s))
    join = (lambda w, s: k.sign_join(dev(own), 0.5, dev(x), w, s),
            lambda w, s: signs_ref.sign_join(own, 0.5, x, w, s))
    for on_device, reference in (encode, join):
        words, scale = XP.zeros(own.size, np.uint32), XP.zeros(1, np.float32)
        on_device(words, scale)
        want_words, want_scale = np.empty(own.size, np.uint32), np.empty(1, np.float32)
        reference(want_words, want_scale)
        assert np.array_equal(host(words), want_words)
        assert host(scale).tobytes() == want_scale.tobytes()
    scales = kernels("quant").bucket_scales(dev(x), 200, "l2", XP.empty(3, np.float32))
    want = quant_ref.bucket_scales(x, 200, "l2", np.empty(3, np.float32))
    assert host(scales).tobytes() == want.tobytes()


@pytest.mark.skipif(XP is np, reason="26 s in the simulator; its two-pass sizes in "
                    "test_signs run the same kernel and loop")
def test_sign_scale_over_several_tree_levels():
    """More than TREE² elements: three passes of row sums, the last rows partly padded."""
    n = signs_ref.TREE ** 2 + 3
    x = data(n) * 1e3
    scale = kernels("signs").mean_abs(dev(x), XP.empty(1, np.float32))
    assert host(scale).tobytes() == signs_ref.mean_abs(x, np.empty(1, np.float32)).tobytes()


@pytest.mark.parametrize("spec", ["marsit", "sign", "qsgd", "terngrad", "fp16", "bf16",
                                  "topk:ratio=0.1", "randomk:ratio=0.1", "countsketch"])
def test_warm_up_runs_on_device_arrays(spec, monkeypatch):
    """``Compressor.warm_up`` on device arrays (the stand-in under the simulator, CuPy on a
    GPU): every codec and hop operation it runs takes them and stays on the device, so
    ``make_reducer`` can load a GPU job's kernels before its first step (the simulator's
    training tests skip that warm-up for time; this runs it, on a small array)."""
    from fakedevice import DEVICE_NAMESPACE

    from ringcomp.compression import base, get_compressor

    monkeypatch.setattr(base, "WARM_UP_ELEMENTS", 64)
    get_compressor(spec).warm_up(DEVICE_NAMESPACE if XP is np else XP)
