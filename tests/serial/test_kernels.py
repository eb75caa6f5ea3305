"""Kernels: every backend equals the NumPy reference; the merge's probabilities; sketches."""

from __future__ import annotations

import numpy as np
import pytest

from ringcomp.kernels import backends, signs, signs_ref, sketch_ref
from ringcomp.kernels.rng import call_key, mix, stream_key, substream, threshold, uniform32
from ringcomp.kernels.rng_numba import call_key as compiled_call_key
from ringcomp.kernels.rng_numba import hop_stream

LENGTHS = [0, 1, 2, 31, 32, 33, 63, 64, 65, 1000, 4099]
BACKENDS = backends.available("signs")


def test_bit_layout_is_the_documented_one():
    x = np.array([1.0, -1.0, 0.0, -0.0, np.nan] + [-1.0] * 27 + [2.0], np.float32)
    words = signs_ref.pack_signs(x)
    # element i -> bit i % 32 of word i // 32, set when x >= 0 (+0 and -0 set, NaN clear)
    assert words.tolist() == [0b1101, 0b1]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_backends_equal_reference(name, dtype):
    backend = signs.backend(name)
    rng = np.random.default_rng(0)
    for n in LENGTHS:
        x = rng.standard_normal(n).astype(dtype)
        words = backend.pack_signs(x)
        assert np.array_equal(words, signs_ref.pack_signs(x)), n
        out, ref = np.empty(n, dtype), np.empty(n, dtype)
        backend.unpack_signs(words, n, out, 0.75)
        signs_ref.unpack_signs(words, n, ref, 0.75)
        assert np.array_equal(out, ref), n
        assert np.array_equal(out, np.where(x >= 0, 0.75, -0.75).astype(dtype))
        own = signs_ref.pack_signs(rng.standard_normal(n))
        key = stream_key(7, 3, 1, 2)
        for take, of in ((1, 2), (1, 3), (2, 5), (0, 4), (4, 4)):
            merged = backend.marsit_merge(words, own, n, take, of, key, 123)
            assert np.array_equal(merged, signs_ref.marsit_merge(words, own, n, take, of, key,
                                                                 123)), (n, take, of)


@pytest.mark.parametrize("name", BACKENDS)
def test_merge_probability_and_agreement(name):
    backend = signs.backend(name)
    n = 200_000
    zeros = np.zeros(signs_ref.words_for(n), np.uint32)
    ones = signs_ref.pack_signs(np.ones(n))
    for take, of in ((1, 2), (1, 3), (1, 7), (3, 8)):
        merged = backend.marsit_merge(zeros, ones, n, take, of, stream_key(1, 2, 3, 4), 0)
        frac = np.unpackbits(merged.view(np.uint8))[:n].mean()
        sigma = np.sqrt(take / of * (1 - take / of) / n)
        assert abs(frac - take / of) < 5 * sigma, (take, of, frac)
    # where both inputs agree the output is that bit, whatever the draw
    assert np.array_equal(backend.marsit_merge(ones, ones, n, 1, 3, 99, 0), ones)
    assert np.array_equal(backend.marsit_merge(zeros, zeros, n, 1, 3, 99, 0), zeros)


def test_merge_stream_is_the_documented_bit_slicing():
    key, offset, n = stream_key(3, 1, 4, 1), 77, 70
    values = signs_ref.sliced_uniform32(key, offset, n)
    for j in (0, 5, 31, 32, 69):  # element j: bit i of its value = bit j % 32 of plane i
        w, bit = divmod(j, 32)
        draws = mix(key, np.arange(offset + 32 * w, offset + 32 * w + 16))
        planes = [int(z) >> half & 0xFFFFFFFF for z in draws for half in (0, 32)]
        expect = sum(((plane >> bit) & 1) << i for i, plane in enumerate(planes))
        assert int(values[j]) == expect, j
    many = signs_ref.sliced_uniform32(key, 0, 64_000) / 2.0**32
    assert abs(many.mean() - 0.5) < 0.01 and abs(many.var() - 1 / 12) < 0.005


def test_stream_is_counter_based_and_keyed():
    key = stream_key(0, 1, 2, 3)
    idx = np.arange(1000, dtype=np.uint64)
    whole = uniform32(key, idx)
    assert np.array_equal(whole[500:], uniform32(key, idx[500:]))  # any split, same values
    assert not np.array_equal(whole, uniform32(stream_key(0, 1, 2, 4), idx))
    assert whole.max() < 2**32 and abs(whole.mean() / 2**32 - 0.5) < 0.05
    assert threshold(1, 2) == 2**31 and threshold(0, 5) == 0 and threshold(3, 3) == 2**32
    with pytest.raises(ValueError):
        threshold(4, 3)


def test_backend_selection(monkeypatch):
    monkeypatch.setenv("RINGCOMP_KERNELS", "numpy")
    assert signs.backend() is signs_ref
    with pytest.raises(ValueError, match="unknown kernel backend"):
        signs.backend("fortran")
    with pytest.raises(ValueError, match="unknown kernel family"):
        backends.backend("fft")
    assert BACKENDS == ["numpy", "numba"]  # numba is a dependency: it must import


@pytest.mark.parametrize("name", backends.available("sketch"))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_sketch_backends_equal_reference(name, dtype, rows):
    kernels = backends.backend("sketch", name)
    rng = np.random.default_rng(rows)
    keys = np.array([substream(99, j) for j in range(rows)], np.uint64)
    for n in LENGTHS:
        x = rng.standard_normal(n).astype(dtype)
        cols = max(1, n // 7)
        # the fixed point's shift at its extremes (float64 only reaches them), then x,
        # whose table the decode below takes
        for scaled in (x * (1e-300 if dtype == "float64" else 1e-30),
                       x * (1e300 if dtype == "float64" else 1e30), x):
            table = kernels.sketch_encode(scaled, keys, cols, 5,
                                          np.empty((rows, cols), np.float32))
            ref = sketch_ref.sketch_encode(scaled, keys, cols, 5,
                                           np.empty((rows, cols), np.float32))
            assert np.array_equal(table, ref), n
        out = kernels.sketch_decode(table, keys, n, 5, np.empty(n, dtype))
        assert np.array_equal(out, sketch_ref.sketch_decode(table, keys, n, 5,
                                                            np.empty(n, dtype))), n


@pytest.mark.parametrize("name", backends.available("sketch"))
def test_sketch_sums_are_exact_to_float32_and_do_not_depend_on_the_order(name):
    """The fixed-point sums: within a float32 rounding (plus the fixed point's tiny step)
    of the exact float64 sums, for magnitudes from 1e-30 to 1e30 and float64 inputs; and
    linear across segments (two halves at their own offsets sum to the whole, up to
    their own fixed points)."""
    kernels = backends.backend("sketch", name)
    keys = np.array([substream(11, j) for j in range(3)], np.uint64)
    rng = np.random.default_rng(2)
    for scale in (1e-30, 1.0, 1e30):
        for dtype in (np.float32, np.float64):
            x = (rng.standard_normal(5000) * scale).astype(dtype)
            table = kernels.sketch_encode(x, keys, 64, 0, np.empty((3, 64), np.float32))
            for j, key in enumerate(keys):
                col, sign = sketch_ref.hashes(key, 64, 0, x.size)
                exact = np.zeros(64)
                np.add.at(exact, col, sign * x.astype(np.float64))
                step = np.abs(x).max() * 2.0**-37
                assert np.all(np.abs(table[j] - exact) <= np.abs(exact) * 2**-24
                              + x.size * step), (scale, dtype)
    x = rng.standard_normal(3000).astype(np.float32)
    whole = kernels.sketch_encode(x, keys, 50, 0, np.empty((3, 50), np.float32))
    halves = [kernels.sketch_encode(x[a:b], keys, 50, a, np.empty((3, 50), np.float32))
              for a, b in ((0, 1500), (1500, 3000))]
    assert np.allclose(whole, halves[0] + halves[1], rtol=1e-6, atol=1e-6)


def test_sketch_is_a_count_sketch():
    keys = np.array([substream(7, j) for j in range(3)], np.uint64)
    x = np.zeros(1000)
    x[[10, 500]] = (50.0, -20.0)
    table = sketch_ref.sketch_encode(x, keys, 200, 0, np.empty((3, 200), np.float32))
    for j, key in enumerate(keys):  # every row holds each element once, with its sign
        col, sign = sketch_ref.hashes(key, 200, 0, 1000)
        expect = np.zeros(200)
        np.add.at(expect, col, sign * x)
        assert np.array_equal(table[j], expect.astype(np.float32))
        assert set(np.unique(sign)) == {-1.0, 1.0} and col.min() >= 0 and col.max() < 200
    est = sketch_ref.sketch_decode(table, keys, 1000, 0, np.empty(1000))
    # two heavy hitters in 200 columns x 3 rows: recovered exactly unless all rows collide
    assert est[10] == 50.0 and est[500] == -20.0 and np.count_nonzero(est) < 20
    # the same elements at another offset hash elsewhere (global index)
    moved = sketch_ref.sketch_encode(x, keys, 200, 1, np.empty((3, 200), np.float32))
    assert not np.array_equal(moved, table)


def cast_inputs():
    rng = np.random.default_rng(5)
    scaled = [rng.standard_normal(3000).astype(np.float32) * s
              for s in (1e-8, 6e-8, 1e-5, 1.0, 6e4, 7e4, 1e39 / 1e10)]
    bits = rng.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.99, 65520, 5.96e-8, 2.98e-8,
                      2.9802326e-08, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 1.0 + 2**-8, np.nan],
                     np.float32)
    return np.concatenate([*scaled, bits, edges])


@pytest.mark.parametrize("name", backends.available("cast"))
@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_cast_backends_equal_reference(name, fmt):
    kernels, ref = backends.backend("cast", name), backends.backend("cast", "numpy")
    x = cast_inputs()
    with np.errstate(all="ignore"):
        got = getattr(kernels, f"to_{fmt}")(x, np.empty(x.size, np.uint16))
        want = getattr(ref, f"to_{fmt}")(x, np.empty(x.size, np.uint16))
        back = getattr(kernels, f"from_{fmt}")(want, np.empty(x.size, np.float32))
        back_ref = getattr(ref, f"from_{fmt}")(want, np.empty(x.size, np.float32))
        a, b = want[::2].copy(), want[1::2].copy()
        total = getattr(kernels, f"add_{fmt}")(a, b, np.empty(a.size, np.uint16))
        total_ref = getattr(ref, f"add_{fmt}")(a, b, np.empty(a.size, np.uint16))
    # NaN payloads may differ between conversions; everything else is bit for bit
    finite = ~np.isnan(back_ref)
    assert np.array_equal(got[finite], want[finite]) and np.isnan(back[~finite]).all()
    assert np.array_equal(back.view(np.uint32)[finite], back_ref.view(np.uint32)[finite])
    summed = ~np.isnan(getattr(ref, f"from_{fmt}")(total_ref, np.empty(a.size, np.float32)))
    assert np.array_equal(total[summed], total_ref[summed])
    if fmt == "fp16":  # the reference is NumPy's own float16
        with np.errstate(over="ignore"):
            assert np.array_equal(want[finite], x[finite].astype(np.float16).view(np.uint16))
    else:  # bf16 keeps the top 16 bits, rounded to nearest even
        assert np.array_equal(ref.to_bf16(np.float32([1 + 2**-8, 1 + 3 * 2**-8]),
                                          np.empty(2, np.uint16)), [0x3F80, 0x3F82])


@pytest.mark.parametrize("name", backends.available("quant"))
@pytest.mark.parametrize("bucket", [1, 256, 257, 512, 65536, 2 * 65536 + 5])
def test_l2_scales_are_the_tree_sum_of_squares_on_every_backend(name, bucket):
    """QSGD's bucket norm is sqrt(``tree_sum`` of the float64 squares): within a float32
    rounding of the exact norm, and the same bits on every backend, for buckets of one
    row, several, and more rows than one tree level holds (three levels), a short last
    bucket included."""
    x = np.random.default_rng(bucket).standard_normal(3 * bucket + 5).astype(np.float32)
    x[:2] = (0.0, -0.0)
    count = -(-x.size // bucket)
    got = backends.backend("quant", name).bucket_scales(x, bucket, "l2",
                                                        np.empty(count, np.float32))
    want = [np.sqrt(signs_ref.tree_sum(np.square(x[j * bucket:(j + 1) * bucket],
                                                 dtype=np.float64))) for j in range(count)]
    assert np.array_equal(got, np.float32(want))
    exact = [np.linalg.norm(x[j * bucket:(j + 1) * bucket].astype(np.float64))
             for j in range(count)]
    assert np.allclose(got, exact, rtol=2**-23, atol=0)


@pytest.mark.parametrize("name", backends.available("quant"))
@pytest.mark.parametrize("levels", [1, 2, 3, 8, 16, 127])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_quant_backends_equal_reference(name, levels, dtype):
    kernels, ref = backends.backend("quant", name), backends.backend("quant", "numpy")
    bits = 1 + levels.bit_length()
    rng = np.random.default_rng(levels)
    for n in LENGTHS:
        x = rng.standard_normal(n).astype(dtype)
        if n > 3:
            x[:3] = (0.0, -0.0, -x[3])
        for bucket in (7, 32, max(n, 1)):
            count = max(1, -(-n // bucket))
            for norm in ("l2", "max"):
                scales = kernels.bucket_scales(x, bucket, norm, np.empty(count, np.float32))
                want = ref.bucket_scales(x, bucket, norm, np.empty(count, np.float32))
                assert np.array_equal(scales, want), (n, bucket, norm)
            scales[0] = 0.0  # a zero scale quantizes its bucket to zero
            size = (n * bits + 7) // 8
            codes = kernels.quantize(x, scales, bucket, levels, bits, 99, 13,
                                     np.empty(size, np.uint8))
            want = ref.quantize(x, scales, bucket, levels, bits, 99, 13, np.empty(size, np.uint8))
            assert np.array_equal(codes, want), (n, bucket)
            out = kernels.dequantize(want, n, scales, bucket, levels, bits, np.empty(n, dtype))
            assert np.array_equal(out, ref.dequantize(want, n, scales, bucket, levels, bits,
                                                      np.empty(n, dtype))), (n, bucket)


@pytest.mark.parametrize("name", backends.available("optim"))
@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-3)])
def test_fused_sgd_backends_equal_reference_and_pytorch_formula(name, momentum, weight_decay):
    rng = np.random.default_rng(4)
    x, v, g = (rng.standard_normal(1001).astype(np.float32) for _ in range(3))
    want_x, want_v = x.astype(np.float64), v.astype(np.float64)
    d = g / 3.0 + weight_decay * want_x  # PyTorch's SGD on the mean of 3 ranks' sum
    want_v = momentum * want_v + d if momentum else d
    want_x -= 0.1 * want_v
    ref = [x.copy(), v.copy()]
    backends.backend("optim", "numpy").sgd(*ref, g, 1 / 3, 0.1, momentum, weight_decay)
    got = [x.copy(), v.copy()]
    backends.backend("optim", name).sgd(*got, g, 1 / 3, 0.1, momentum, weight_decay)
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
    assert np.allclose(got[0], want_x, atol=1e-6)
    if momentum:
        assert np.allclose(got[1], want_v, atol=1e-6)
    else:
        assert np.array_equal(got[1], v)  # untouched without momentum


def test_the_array_picks_the_backend_and_never_silently_copies(monkeypatch):
    """Device arrays take the CUDA kernels; a host backend forced on one, or no usable
    CUDA, is a clear error - never a silent trip through host memory."""
    from fakedevice import FakeDeviceArray

    monkeypatch.delenv("RINGCOMP_KERNELS", raising=False)
    dev = FakeDeviceArray.of(np.zeros(4, np.float32))
    assert backends.backend("signs", like=np.zeros(4)).__name__.rsplit("_", 1)[1] in (
        "numba", "ref")  # host arrays: the fastest host backend, never CUDA
    if "cuda" not in backends.available("signs"):
        with pytest.raises(ValueError, match="not usable here"):
            backends.backend("signs", like=dev)
    monkeypatch.setenv("RINGCOMP_KERNELS", "numba")
    with pytest.raises(ValueError, match="run on host memory"):
        backends.backend("quant", like=dev)
    monkeypatch.setenv("RINGCOMP_KERNELS", "fortran")
    with pytest.raises(ValueError, match="unknown kernel backend"):
        backends.backend("cast", like=np.zeros(4))


def _topk_by_sort(magnitude, k):
    """The selection rule spelt out: a stable sort by decreasing value (ties keep index
    order), the first k, in index order."""
    return np.sort(np.argsort(-magnitude.astype(np.float64), kind="stable")[:k])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_topk_selection_takes_the_largest_and_the_first_ties(dtype, monkeypatch):
    """The k largest magnitudes, ties at the threshold to the lower index, in index order:
    against a stable sort, for heavy ties (few distinct values), zeros and k = 0, 1, n;
    ``numba`` asked of this family gets the reference (NumPy's partition is compiled)."""
    from ringcomp.kernels import select_ref

    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 33, 1000, 4099):
        for magnitude in (np.abs(rng.standard_normal(n)).astype(dtype),
                          rng.integers(0, 4, n).astype(dtype)):  # ties everywhere
            for k in sorted({0, 1, n // 3, n - 1, n}):
                got = select_ref.topk_indices(magnitude, k)
                assert got.dtype == np.int64
                assert np.array_equal(got, _topk_by_sort(magnitude, k)), (n, k)
    monkeypatch.setenv("RINGCOMP_KERNELS", "numba")
    assert backends.backend("select", like=np.zeros(1)) is select_ref


def test_small_host_work_runs_the_numpy_reference_unless_told(monkeypatch):
    """Below NUMBA_FROM_ELEMENTS a host family resolves to its NumPy reference (the same
    bits; no Numba start-up per rank); above it, and whenever RINGCOMP_KERNELS names a
    backend, the usual choice."""
    monkeypatch.delenv("RINGCOMP_KERNELS", raising=False)
    small, large = backends.NUMBA_FROM_ELEMENTS - 1, backends.NUMBA_FROM_ELEMENTS
    x = np.zeros(1, np.float32)
    assert backends.for_size("optim", small, like=x) is backends.backend("optim", "numpy")
    assert backends.for_size("optim", large, like=x) is backends.backend("optim", like=x)
    monkeypatch.setenv("RINGCOMP_KERNELS", "numba" if "numba" in backends.available(
        "optim") else "numpy")
    assert backends.for_size("optim", small, like=x) is backends.backend("optim", like=x)


@pytest.mark.parametrize("n", [0, 1, 7, 31, 32, 33, 1000, 4099])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numba_backends_sign_pack_by_byte_multiplies_is_the_reference(n, dtype):
    """The host pack gathers eight signs with one multiply: equal to the reference at
    every length, for -0.0 (a plus) and NaN (a minus), into a fresh, a given and a strided
    output; the big-endian word loop gives the same words."""
    if "numba" not in backends.available("signs"):
        pytest.skip("numba does not import here")
    from ringcomp.kernels import signs_numba

    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    x[1:4] = (-0.0, np.nan, 0.0) if n > 3 else x[1:4]
    expected = signs_ref.pack_signs(x)
    words = (n + 31) // 32
    given = np.full(words, 0xFFFFFFFF, np.uint32)
    strided = np.full(2 * words, 0xFFFFFFFF, np.uint32)[::2]
    loop = np.empty(words, np.uint32)
    signs_numba._pack_words(x, loop)
    for got in (signs_numba.pack_signs(x), signs_numba.pack_signs(x, given),
                signs_numba.pack_signs(x, strided), loop):
        assert np.array_equal(got, expected)


@pytest.mark.parametrize("n", [1, 7, 31, 32, 33, 1000, 4099])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [1.0, 0.75, 0.0, 3.1e-5])
def test_numba_backends_sign_unpack_as_bit_patterns_is_the_reference(n, dtype, scale):
    """The host unpack writes +-scale as integer bit patterns: the same bits as the
    reference (-0.0 for a zero scale's minus), into contiguous and strided outputs."""
    if "numba" not in backends.available("signs"):
        pytest.skip("numba does not import here")
    from ringcomp.kernels import signs_numba

    words = signs_ref.pack_signs(np.random.default_rng(n).standard_normal(n))
    expected = signs_ref.unpack_signs(words, n, np.empty(n, dtype), scale)
    strided = np.empty(2 * n, dtype)[::2]
    for out in (np.empty(n, dtype), strided):
        got = signs_numba.unpack_signs(words, n, out, scale)
        assert np.array_equal(got.view(f"u{got.itemsize}"), expected.view(f"u{got.itemsize}"))


#: lengths around the host kernels' blocks (2048 words = 65536 elements per parallel task,
#: 256 tree rows = 65536 elements) and partial last words and rows
BLOCK_LENGTHS = [255, 257, 65535, 65536, 65537, 2 * 65536 + 33, 200_003]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sign_kernels_across_blocks_and_fused_hops_equal_the_reference(name, dtype):
    """Every sign kernel across block boundaries, and the fused ring hops (``sign_join``:
    decode + add + re-encode; ``marsit_join``: encode + merge) bit for bit equal to the
    reference's separate steps, signed zeros, NaN and an all-taking merge included."""
    backend = signs.backend(name)
    rng = np.random.default_rng(5)
    key = stream_key(3, 1, 4, 1)
    for n in BLOCK_LENGTHS + [1, 33]:
        x = rng.standard_normal(n).astype(dtype)
        x[: min(n, 3)] = [-0.0, np.nan, 0.0][: min(n, 3)]
        inc = signs_ref.pack_signs(rng.standard_normal(n))
        words = backend.pack_signs(x)
        assert np.array_equal(words, signs_ref.pack_signs(x)), n
        got, want = np.empty(1, np.float32), np.empty(1, np.float32)
        assert backend.mean_abs(x[1:], got).tobytes() == signs_ref.mean_abs(x[1:], want).tobytes()
        out, ref = np.empty(n, dtype), np.empty(n, dtype)
        backend.unpack_signs(inc, n, out, 0.5)
        assert np.array_equal(out, signs_ref.unpack_signs(inc, n, ref, 0.5)), n
        for take, of in ((1, 2), (1, 5), (0, 3), (3, 3)):
            want_merge = signs_ref.marsit_merge(inc, words, n, take, of, key, 64)
            assert np.array_equal(backend.marsit_merge(inc, words, n, take, of, key, 64),
                                  want_merge), (n, take, of)
            assert np.array_equal(backend.marsit_join(inc, x, take, of, key, 64),
                                  want_merge), (n, take, of)
        clean = np.nan_to_num(x)
        for scale in (0.5, 0.0, 7e-3):
            got_words, got_scale = np.full(words.size, 7, np.uint32), np.empty(1, np.float32)
            backend.sign_join(inc, scale, clean, got_words, got_scale)
            want_words = signs_ref.unpack_signs(inc, n, np.empty(n, dtype), scale) + clean
            assert np.array_equal(got_words, signs_ref.pack_signs(want_words)), (n, scale)
            assert got_scale.tobytes() == signs_ref.mean_abs(want_words, want).tobytes(), n


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_sign_encode_is_the_scale_and_the_signs(name, dtype):
    """``sign_encode`` (one pass on the host) gives ``mean_abs`` and ``pack_signs``'s bits,
    signed zeros included, across block boundaries."""
    backend = signs.backend(name)
    for n in BLOCK_LENGTHS + [0, 1, 33]:
        x = np.random.default_rng(n).standard_normal(n).astype(dtype)
        x[: min(n, 2)] = [-0.0, 0.0][: min(n, 2)]
        words, scale = np.full(signs_ref.words_for(n), 9, np.uint32), np.empty(1, np.float32)
        backend.sign_encode(x, words, scale)
        assert np.array_equal(words, signs_ref.pack_signs(x)), n
        assert scale.tobytes() == signs_ref.mean_abs(x, np.empty(1, np.float32)).tobytes(), n


@pytest.mark.parametrize("name", backends.available("finite"))
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64"])
def test_finite_backends_find_every_nan_and_inf(name, dtype, monkeypatch):
    """Every NaN and ±Inf is found wherever it sits (first, middle, last element; across
    the Numba kernel's parallel blocks too); finite values - the largest included, whose
    sum overflows - and integer arrays are not flagged."""
    from ringcomp.kernels import finite_numba

    monkeypatch.setattr(finite_numba, "BLOCK", 64)  # several parallel blocks at 300
    k = backends.backend("finite", name)
    for n in (0, 1, 7, 300, 5000):
        x = np.random.default_rng(n).standard_normal(n).astype(dtype)
        assert k.nonfinite(x) is False, n
        if dtype != "int64" and n:
            assert k.nonfinite(np.full(n, np.finfo(dtype).max, dtype)) is False
    if dtype == "int64":
        return
    for n in (1, 7, 300, 5000):
        for i in {0, n // 2, n - 1}:
            for bad in (np.nan, np.inf, -np.inf):
                x = np.ones(n, dtype)
                x[i] = bad
                assert k.nonfinite(x) is True, (n, i, bad)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("n", [1, 65536, 65537, 2 * 65536 + 3])
def test_cast_kernels_below_and_across_a_block_equal_the_reference(fmt, n):
    """One block (the block kernel called directly) and several (the parallel kernel)
    give the reference's bits for every cast and the add."""
    pytest.importorskip("numba")
    from ringcomp.kernels import cast_numba, cast_ref

    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    half = getattr(cast_ref, f"to_{fmt}")(x, np.empty(n, np.uint16))
    other = half[::-1].copy()
    assert np.array_equal(getattr(cast_numba, f"to_{fmt}")(x, np.empty(n, np.uint16)), half)
    assert np.array_equal(getattr(cast_numba, f"from_{fmt}")(half, np.empty(n, np.float32)),
                          getattr(cast_ref, f"from_{fmt}")(half, np.empty(n, np.float32)))
    assert np.array_equal(getattr(cast_numba, f"add_{fmt}")(half, other, np.empty_like(half)),
                          getattr(cast_ref, f"add_{fmt}")(half, other, np.empty_like(half)))


@pytest.mark.parametrize("hardware", [True, False])
def test_numba_fp16_is_the_reference_on_every_bit_pattern(hardware, monkeypatch):
    """Both Numba fp16 forms - the CPU's conversion instructions (x86 F16C, AArch64) and
    the portable bit manipulation - equal NumPy bit for bit, NaN payloads included: every
    binary16 pattern decoded and added, a million random float32 patterns encoded."""
    pytest.importorskip("numba")
    from ringcomp.kernels import cast_numba, cast_ref

    if hardware and not cast_numba.HARDWARE_HALF:
        pytest.skip("this CPU (or NUMBA_CPU_NAME) has no half-float conversion instructions")
    monkeypatch.setattr(cast_numba, "HARDWARE_HALF", hardware)
    halves = np.arange(1 << 16, dtype=np.uint16)
    got = cast_numba.from_fp16(halves, np.empty(halves.size, np.float32))
    want = cast_ref.from_fp16(halves, np.empty(halves.size, np.float32))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    other = np.random.default_rng(1).permutation(halves)
    with np.errstate(all="ignore"):
        want = cast_ref.add_fp16(halves, other, np.empty_like(halves))
        assert np.array_equal(cast_numba.add_fp16(halves, other, np.empty_like(halves)), want)
        in_place = other.copy()  # out over an operand: computed apart, then copied
        assert np.array_equal(cast_numba.add_fp16(halves, in_place, in_place), want)
        bits = np.random.default_rng(0).integers(0, 1 << 32, 1 << 20, dtype=np.uint64)
        x = bits.astype(np.uint32).view(np.float32)
        assert np.array_equal(cast_numba.to_fp16(x, np.empty(x.size, np.uint16)),
                              cast_ref.to_fp16(x, np.empty(x.size, np.uint16)))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
def test_numba_code_packing_is_the_reference_bit_stream(bits):
    """The word-at-a-time packing (groups of eight codes squeezed into 8·bits bits) and
    its eight-byte-read unpacking give NumPy's bit stream at every length - whole words,
    partial last words and partial last groups - and every bit width QSGD uses."""
    pytest.importorskip("numba")
    from ringcomp.kernels import quant_numba, quant_ref

    rng = np.random.default_rng(bits)
    for n in [*range(0, 40), 63, 64, 65, 1000, 4099]:
        codes = rng.integers(0, 1 << bits, n).astype(np.uint8)
        want = quant_ref.pack_codes(codes, bits)
        got = np.empty((n * bits + 7) // 8, np.uint8)
        quant_numba._pack_groups(codes, bits, got)
        assert np.array_equal(got, want), n
        back = np.empty(n, np.uint8)
        quant_numba._unpack_groups(want, bits, back)
        assert np.array_equal(back, codes), n


def test_hop_streams_derived_in_a_compiled_walk_are_the_keys_streams():
    """``rng_numba``'s call key and hop streams (a compiled walk's) are ``rng``'s, for
    negative and extreme int64 keys too."""
    for seed, step, bucket in ((0, 0, 0), (5, 2**40 + 3, 7), (2**63 - 1, 1, 2),
                               (-3, -(2**63), 2**63 - 1)):
        call = compiled_call_key(np.int64(seed), np.int64(step), np.int64(bucket))
        assert int(call) == call_key(seed, step, bucket)
        for hop in range(20):
            assert int(hop_stream(call, hop)) == stream_key(seed, step, bucket, hop)
