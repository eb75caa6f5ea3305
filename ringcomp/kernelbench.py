"""``python -m ringcomp.bench --kernels``: kernel throughput next to the machine's memcpy."""

from __future__ import annotations

import time

import numpy as np

from ringcomp.kernels import backends
from ringcomp.kernels.rng import stream_key, substream


def _best(fn, reps: int = 5) -> float:
    fn()  # compile / warm caches
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _sign_calls(k, x: np.ndarray) -> list[tuple[str, object]]:
    n = x.size
    words = k.pack_signs(x)
    other = k.pack_signs(-x[::-1].copy())
    out = np.empty(n, np.float32)
    merged = np.empty_like(words)
    key = stream_key(0, 0, 0, 1)
    return [("sign pack", lambda: k.pack_signs(x, words)),
            ("sign unpack", lambda: k.unpack_signs(words, n, out, 1.0)),
            ("marsit merge 1/3", lambda: k.marsit_merge(words, other, n, 1, 3, key, 0, merged))]


def _sketch_calls(k, x: np.ndarray) -> list[tuple[str, object]]:
    rows, cols = 5, max(1, x.size // 50)  # the countsketch default: 10% of n in the table
    keys = np.array([substream(1, j) for j in range(rows)], np.uint64)
    table = np.empty((rows, cols), np.float32)
    out = np.empty_like(x)
    return [("sketch encode 5x", lambda: k.sketch_encode(x, keys, cols, 0, table)),
            ("sketch decode 5x", lambda: k.sketch_decode(table, keys, x.size, 0, out))]


def _quant_calls(k, x: np.ndarray) -> list[tuple[str, object]]:
    levels, bits, bucket = 16, 6, 512  # QSGD's defaults
    packed = np.empty((x.size * bits + 7) // 8, np.uint8)
    out = np.empty_like(x)
    scales = k.bucket_scales(x, bucket, "l2", np.empty(-(-x.size // bucket), np.float32))

    def encode():
        k.bucket_scales(x, bucket, "l2", scales)
        k.quantize(x, scales, bucket, levels, bits, 1, 0, packed)

    return [("qsgd encode", encode),
            ("qsgd decode", lambda: k.dequantize(packed, x.size, scales, bucket, levels, bits,
                                                 out))]


def _cast_calls(k, x: np.ndarray) -> list[tuple[str, object]]:
    half = k.to_fp16(x, np.empty(x.size, np.uint16))
    other, out = half.copy(), np.empty_like(x)
    return [("fp16 encode", lambda: k.to_fp16(x, half)),
            ("fp16 decode", lambda: k.from_fp16(half, out)),
            ("fp16 add", lambda: k.add_fp16(half, other, other)),
            ("bf16 encode", lambda: k.to_bf16(x, half))]


#: kernel family -> the (name, call) pairs timed for one backend module of it
CALLS = {"signs": _sign_calls, "sketch": _sketch_calls, "quant": _quant_calls,
         "cast": _cast_calls}


def kernel_rows(n: int = 1 << 24, names=None) -> list[dict]:
    """Throughput of every kernel and backend in GB/s of the float32 vector processed
    (``n`` elements = 4n bytes), with single-core memcpy (``numpy.copyto``) for scale."""
    import numba

    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.empty_like(x)
    memcpy = x.nbytes / _best(lambda: np.copyto(y, x)) / 1e9
    rows = [{"kernel": "memcpy", "backend": "numpy", "threads": 1, "GBps": memcpy,
             "per_core_vs_memcpy": 1.0}]
    for family, calls in CALLS.items():
        for name in names or backends.available(family):
            threads = numba.get_num_threads() if name == "numba" else 1
            for kernel, fn in calls(backends.backend(family, name), x):
                gbps = x.nbytes / _best(fn) / 1e9
                rows.append({"kernel": kernel, "backend": name, "threads": threads,
                             "GBps": gbps, "per_core_vs_memcpy": gbps / threads / memcpy})
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'kernel':<18}{'backend':<9}{'threads':>8}{'GB/s':>9}{'per core / memcpy':>19}"]
    lines += [f"{r['kernel']:<18}{r['backend']:<9}{r['threads']:>8}{r['GBps']:>9.2f}"
              f"{r['per_core_vs_memcpy']:>19.2f}" for r in rows]
    return "\n".join(lines)
