"""Where a Numba CUDA launch's host time goes on a GPU: each launch path timed on one small
kernel (a diagnostic, printed and written to $OUT/launch-probe.json; not a record).

Paths: CuPy's copy and element-wise add (the floor), Numba's dispatcher given CuPy arrays
(converted on every launch) or cached Numba views (what ``cuda_launch.launch`` passes), the
compiled kernel's own ``launch`` (no type dispatch), the argument packing alone, CuPy's
``RawKernel``, ringcomp's ``cuda_launch.launch`` (straight to the driver after the first
launch, ``cuda_direct``) and ``cuda_direct`` alone, and ten Numba launches captured as one
CUDA graph on a CuPy stream.
Each row: microseconds per call, host time to enqueue and total after a synchronise.
"""

import importlib.metadata
import json
import os
import sys
import time
import traceback

import cupy as cp
import numba
import numpy as np
from numba import cuda

try:  # numba-cuda
    from numba.cuda.core import config
except ImportError:
    from numba.core import config
config.CUDA_ARRAY_INTERFACE_SYNC = False  # as ringcomp launches (cuda_launch.py)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ringcomp.kernels import cuda_direct, cuda_launch  # noqa: E402 - the checkout's

N, THREADS, REPS = 262144, 256, 2000  # a ring hop's 1 MiB float32 segment


@cuda.jit
def add1(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = x[i] + np.float32(1)


def main() -> None:
    out = {"numba": numba.__version__, "numba_cuda": importlib.metadata.version("numba-cuda"),
           "cupy": cp.__version__, "elements": N}
    x, blocks = cp.zeros(N, cp.float32), (N + THREADS - 1) // THREADS
    y = cp.empty_like(x)
    stream = cp.cuda.get_current_stream()
    nstream = cuda.external_stream(stream.ptr) if stream.ptr else cuda.default_stream()
    nx, ny = (cuda.from_cuda_array_interface(a.__cuda_array_interface__, owner=None,
                                             sync=False) for a in (x, y))

    def timed(name, call):
        try:
            call()
            stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(REPS):
                call()
            host = time.perf_counter() - t0
            stream.synchronize()
            total = time.perf_counter() - t0
            out[name] = {"host_us": 1e6 * host / REPS, "total_us": 1e6 * total / REPS}
        except Exception as err:  # a path this Numba or CuPy lacks: say so, go on
            out[name] = f"error: {type(err).__name__}: {err}"[:300]
        print(name, out[name], flush=True)

    timed("cupy copy", lambda: cp.copyto(y, x))
    timed("cupy add scalar", lambda: cp.add(x, np.float32(1), out=y))
    timed("numba dispatcher, cupy args", lambda: add1[blocks, THREADS, nstream](x, y))
    timed("numba dispatcher, numba views", lambda: add1[blocks, THREADS, nstream](nx, ny))
    kernel = next(iter(add1.overloads.values()))
    timed("numba kernel.launch", lambda: kernel.launch(
        [nx, ny], (blocks, 1, 1), (THREADS, 1, 1), nstream, 0))

    def pack():
        packed, writeback = [], []
        for kind, value in zip(kernel.argument_types, (nx, ny), strict=True):
            kernel._prepare_args(kind, value, nstream, writeback, packed)

    timed("numba argument packing alone", pack)
    raw = cp.RawKernel(r'''extern "C" __global__ void add1(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] + 1.0f; }''',
                       "add1")
    timed("ringcomp cuda_launch.launch", lambda: cuda_launch.launch(add1, N, x, y,
                                                                     threads=THREADS))
    out["direct layouts kept"] = sum(v is not None for v in cuda_direct.LAUNCHER.layouts.values())
    out["direct refused"] = dict(cuda_direct.LAUNCHER.refused)
    timed("cuda_direct alone", lambda: cuda_direct.LAUNCHER.launch(add1, blocks, THREADS,
                                                                   stream.ptr, (x, y)))
    timed("cupy RawKernel", lambda: raw((blocks,), (THREADS,), (x, y, np.int32(N))))
    try:  # ten Numba launches captured once, replayed as one graph
        side = cp.cuda.Stream(non_blocking=True)
        nside = cuda.external_stream(side.ptr)
        with side:
            side.begin_capture()
            for _ in range(10):
                add1[blocks, THREADS, nside](nx, ny)
            graph = side.end_capture()
        y.fill(0)
        graph.launch(side)
        side.synchronize()
        t0 = time.perf_counter()
        for _ in range(REPS // 10):
            graph.launch(side)
        side.synchronize()
        out["cuda graph of 10 numba launches, per launch"] = {
            "total_us": 1e6 * (time.perf_counter() - t0) / REPS,
            "result_right": bool(cp.all(y == x + 1))}
    except Exception:
        out["cuda graph of 10 numba launches, per launch"] = traceback.format_exc()[-600:]
    print(json.dumps(out, indent=1))
    with open(os.path.join(os.environ.get("OUT", "."), "launch-probe.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
