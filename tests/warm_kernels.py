"""Compile the CPU kernels once, into Numba's on-disk cache, before the suite's stages.

On a fresh clone every process that first needs a kernel compiles it (each rank of every
``mpiexec`` in the tests, each at once); run first, this one process compiles what most of
them need - every compressor's codec and hop rule in float32 and float64, below and above
the size where the kernels split the work into parallel blocks, the finite check and the
exact and compressed rings' compiled walks - so
they load it instead. Correctness is not its business (the tests check every kernel);
``tests/run_suite.py`` runs it beside the system tests, which keep under a core busy.
"""

import time

import numpy as np

import ringcomp
from ringcomp.checks import check_finite
from ringcomp.collectives import compressed_ring_native, ring_native
from ringcomp.compression import get_compressor
from ringcomp.kernels import backends

#: below and above the sign kernels' parallel split (``signs_numba.BLOCK`` words of 32)
SIZES = (1024, 3 * 32 * 2048 + 5)

t0 = time.perf_counter()
# the rings' walks first, float32 (a job's warm-up loads them) before float64: the system
# tests' first jobs start beside this process and load what it has saved by then
ring_native.compile_walks([np.float32])
compressed_ring_native.compile_walks([np.float32])
compressed_ring_native.compile_walks([np.float64])
ring_native.compile_walks()  # the exact ring's other dtypes
for dtype in (np.float32, np.float64):
    for elements in SIZES:
        check_finite(np.ones(elements, dtype=dtype))
        for name in ringcomp.compressors():
            compressor = get_compressor(name)
            if compressor is not None:  # "none"
                compressor.warm_up(np, dtype, elements)
compiled, where = backends.numba_compiled()
print(f"compiled {compiled} kernel signature(s) in {time.perf_counter() - t0:.1f} s "
      f"into {where or 'the cache (nothing new)'}")
