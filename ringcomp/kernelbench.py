"""``python -m ringcomp.bench --kernels``: kernel throughput next to the machine's own copy.

On the host every backend is timed against single-core memcpy (``numpy.copyto``); with
``--device gpu`` the CUDA kernels on CuPy arrays are timed with CUDA events against a
device-to-device copy of the same vector timed the same way. Throughput is always GB/s of
the float32 vector processed (``n`` elements = 4n bytes).
"""

from __future__ import annotations

import time

import numpy as np

from ringcomp.kernels import backends
from ringcomp.kernels.arrays import array_module
from ringcomp.kernels.rng import stream_key, substream


def _best_host(fn, reps: int = 5) -> float:
    fn()  # compile / warm caches
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _best_gpu(fn, reps: int = 20) -> float:
    """Best of ``reps`` runs of ``fn`` between CUDA events on the current stream (seconds),
    after two untimed runs (compilation, caches)."""
    import cupy

    fn()
    fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return min(times)


def _sign_calls(k, x) -> list[tuple[str, object]]:
    xp, n = array_module(x), x.size
    words = k.pack_signs(x)
    other = k.pack_signs(-x[::-1].copy())
    out = xp.empty(n, np.float32)
    merged = xp.empty_like(words)
    scale = xp.empty(1, np.float32)
    key = stream_key(0, 0, 0, 1)
    return [("sign pack", lambda: k.pack_signs(x, words)),
            ("sign unpack", lambda: k.unpack_signs(words, n, out, 1.0)),
            ("marsit merge 1/3", lambda: k.marsit_merge(words, other, n, 1, 3, key, 0, merged)),
            ("sign scale", lambda: k.mean_abs(x, scale)),
            # a ring hop whole: Marsit's encode + merge, the scaled sign's decode + add + encode
            ("marsit join 1/3", lambda: k.marsit_join(other, x, 1, 3, key, 0, merged)),
            ("sign join", lambda: k.sign_join(other, 0.5, x, merged, scale))]


def _sketch_calls(k, x) -> list[tuple[str, object]]:
    xp = array_module(x)
    rows, cols = 5, max(1, x.size // 50)  # the countsketch default: 10% of n in the table
    keys = np.array([substream(1, j) for j in range(rows)], np.uint64)
    table = xp.empty((rows, cols), np.float32)
    out = xp.empty_like(x)
    return [("sketch encode 5x", lambda: k.sketch_encode(x, keys, cols, 0, table)),
            ("sketch decode 5x", lambda: k.sketch_decode(table, keys, x.size, 0, out))]


def _quant_calls(k, x) -> list[tuple[str, object]]:
    xp = array_module(x)
    levels, bits, bucket = 16, 6, 512  # QSGD's defaults
    packed = xp.empty((x.size * bits + 7) // 8, np.uint8)
    out = xp.empty_like(x)
    scales = k.bucket_scales(x, bucket, "l2", xp.empty(-(-x.size // bucket), np.float32))

    def encode():
        k.bucket_scales(x, bucket, "l2", scales)
        k.quantize(x, scales, bucket, levels, bits, 1, 0, packed)

    return [("qsgd encode", encode),
            ("qsgd decode", lambda: k.dequantize(packed, x.size, scales, bucket, levels, bits,
                                                 out))]


def _cast_calls(k, x) -> list[tuple[str, object]]:
    xp = array_module(x)
    half = k.to_fp16(x, xp.empty(x.size, np.uint16))
    other, out, total = half.copy(), xp.empty_like(x), xp.empty_like(half)
    return [("fp16 encode", lambda: k.to_fp16(x, half)),
            ("fp16 decode", lambda: k.from_fp16(half, out)),
            ("fp16 add", lambda: k.add_fp16(half, other, total)),  # as HalfPrecision.add
            ("bf16 encode", lambda: k.to_bf16(x, half))]


def _topk_calls(x) -> list[tuple[str, object]]:
    from ringcomp.compression.base import Key
    from ringcomp.compression.topk import TopK

    topk = TopK(ratio=0.01)
    return [("topk 1% encode", lambda: topk.encode(x, Key()))]


def _finite_calls(k, x) -> list[tuple[str, object]]:
    return [("finite check", lambda: k.nonfinite(x))]


#: kernel family -> the (name, call) pairs timed for one backend module of it
CALLS = {"signs": _sign_calls, "sketch": _sketch_calls, "quant": _quant_calls,
         "cast": _cast_calls, "finite": _finite_calls}


def kernel_rows(n: int = 1 << 24, names=None, device: str = "cpu",
                progress=None) -> list[dict]:
    """Throughput of every kernel in GB/s of the float32 vector processed (``n`` elements
    = 4n bytes): every host backend next to single-core memcpy (``device="cpu"``), or the
    CUDA kernels next to a device-to-device copy (``device="gpu"``). ``progress(label)``
    is called after each row (a ``log.Heartbeat``)."""
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    if device == "gpu":
        return _gpu_rows(x, progress or (lambda label: None))
    progress = progress or (lambda label: None)
    import numba

    y = np.empty_like(x)
    memcpy = x.nbytes / _best_host(lambda: np.copyto(y, x)) / 1e9
    rows = [_row("memcpy", "numpy", 1, memcpy, memcpy)]
    cores = numba.get_num_threads()
    try:
        for family, calls in CALLS.items():
            for name in names or [b for b in backends.available(family) if b in backends.HOST]:
                # Numba's kernels on one thread (the measure: a codec against the
                # copy of its input on one core), then on every thread it was given
                for threads in ((1, cores) if name == "numba" and cores > 1 else (1,)):
                    numba.set_num_threads(threads)
                    for kernel, fn in calls(backends.backend(family, name), x):
                        rows.append(_row(kernel, name, threads,
                                         x.nbytes / _best_host(fn) / 1e9, memcpy * threads))
                        progress(f"{kernel} {name} x{threads}")
    finally:
        numba.set_num_threads(cores)
    for kernel, fn in _topk_calls(x):
        rows.append(_row(kernel, "numpy", 1, x.nbytes / _best_host(fn) / 1e9, memcpy))
        progress(f"{kernel} numpy")
    return rows


def _gpu_rows(host_x: np.ndarray, progress) -> list[dict]:
    import cupy

    x = cupy.asarray(host_x)
    y = cupy.empty_like(x)
    copy = x.nbytes / _best_gpu(lambda: cupy.copyto(y, x)) / 1e9
    rows = [_row("device copy", "cupy", 0, copy, copy)]
    for kernel, backend, fn in _gpu_calls(x):
        rows.append(_row(kernel, backend, 0, x.nbytes / _best_gpu(fn) / 1e9, copy))
        progress(f"{kernel} {backend}")
    return rows


def _gpu_calls(x):
    """(kernel, backend, call) for every CUDA kernel on device vector ``x``, then top-k's
    encode (CuPy around the radix select)."""
    for family, calls in CALLS.items():
        for kernel, fn in calls(backends.backend(family, "cuda"), x):
            yield kernel, "cuda", fn
    for kernel, fn in _topk_calls(x):
        yield kernel, "cupy", fn


#: a ring hop's segment on the GPU: 1 MiB of float32 (issue 31: a merge hop <= 0.1 ms)
HOP_ELEMENTS = 1 << 18
#: calls timed back to back per hop row
HOP_CALLS = 200


def _per_call_gpu(fn, calls: int = HOP_CALLS) -> float:
    """Seconds per call of ``fn`` called ``calls`` times back to back, the host's time
    included (launches, allocations, argument conversion), after two untimed calls: what a
    hop pays when its segment is small enough that launching costs more than running."""
    import cupy

    fn()
    fn()
    stream = cupy.cuda.get_current_stream()
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    stream.synchronize()
    return (time.perf_counter() - t0) / calls


def hop_rows(n: int = HOP_ELEMENTS) -> list[dict]:
    """Every CUDA kernel (and top-k's encode, and a device copy) on a hop-sized vector of
    ``n`` float32: microseconds per call, host time included (``_per_call_gpu``), launched
    as ringcomp launches (``us``) and, in the same run, every launch through Numba's
    dispatcher (``us_dispatcher``: ``cuda_launch.DIRECT`` off) - what ``cuda_direct``
    saves a hop."""
    import cupy

    from ringcomp.kernels import cuda_launch

    x = cupy.asarray(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    y = cupy.empty_like(x)
    rows = [{"kernel": "device copy", "backend": "cupy",
             "us": 1e6 * _per_call_gpu(lambda: cupy.copyto(y, x))}]
    direct = cuda_launch.DIRECT
    for kernel, backend, fn in _gpu_calls(x):
        row = {"kernel": kernel, "backend": backend}
        for key, through_driver in (("us_dispatcher", False), ("us", direct)):
            cuda_launch.DIRECT = through_driver
            try:
                row[key] = 1e6 * _per_call_gpu(fn)
            finally:
                cuda_launch.DIRECT = direct
        rows.append(row)
    return rows


def _row(kernel: str, backend: str, threads: int, gbps: float, scale: float) -> dict:
    """One table row; ``vs_copy`` is the throughput over the copy's (host: per core)."""
    return {"kernel": kernel, "backend": backend, "threads": threads, "GBps": gbps,
            "vs_copy": gbps / scale}


def format_rows(rows: list[dict]) -> str:
    scale = "vs device copy" if rows[0]["backend"] == "cupy" else "per core / memcpy"
    lines = [f"{'kernel':<18}{'backend':<9}{'threads':>8}{'GB/s':>9}{scale:>19}"]
    lines += [f"{r['kernel']:<18}{r['backend']:<9}{r['threads'] or '-':>8}{r['GBps']:>9.2f}"
              f"{r['vs_copy']:>19.2f}" for r in rows]
    return "\n".join(lines)
