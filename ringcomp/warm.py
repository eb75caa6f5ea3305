"""``python -m ringcomp.warm``: compile every Numba kernel and compiled walk ahead of time."""

from __future__ import annotations

import sys
import time

import numpy as np

from ringcomp import cli

#: below and above the sign kernels' parallel split (``signs_blocks.BLOCK`` words of 32)
SIZES = (1024, 3 * 32 * 2048 + 5)


def steps() -> list[tuple[str, object]]:
    """What a warm-up compiles, in order, as (label, callable): the rings' walks first,
    float32 (a job's own warm-up loads it) before float64, then every compressor's codec
    and hop rule and the finite check in float32 and float64, below and above the size
    where the kernels split the work into parallel blocks. Imported here: they load
    Numba, which ``--help`` does without."""
    from ringcomp.checks import check_finite
    from ringcomp.collectives import compressed_ring_native, ring_native
    from ringcomp.compression import compressors, get_compressor

    todo = [("exact ring's walk, float32", lambda: ring_native.compile_walks([np.float32])),
            ("compressed ring's walks, float32",
             lambda: compressed_ring_native.compile_walks([np.float32])),
            ("compressed ring's walks, float64",
             lambda: compressed_ring_native.compile_walks([np.float64])),
            ("exact ring's walk, other dtypes", ring_native.compile_walks)]
    for dtype in (np.float32, np.float64):
        name = np.dtype(dtype).name
        todo.append((f"finite check, {name}", lambda d=dtype: [
            check_finite(np.ones(n, d)) for n in SIZES]))
        for spec in compressors():
            comp = get_compressor(spec)
            if comp is not None:  # "none"
                todo.append((f"{spec}, {name}", lambda c=comp, d=dtype: [
                    c.warm_up(np, d, n) for n in SIZES]))
    return todo


def warm(todo: list, quiet: bool = False) -> tuple[int, str, float]:
    """Run ``todo`` (``steps()``), a line on stderr before each unless ``quiet``; (kernel
    signatures compiled rather than loaded, Numba's cache directory, seconds)."""
    from ringcomp.kernels import backends

    t0 = time.perf_counter()
    for done, (label, step) in enumerate(todo, 1):
        if not quiet:
            print(f"[{done}/{len(todo)}] {label}", file=sys.stderr, flush=True)
        step()
    compiled, where = backends.numba_compiled()
    return compiled, where, time.perf_counter() - t0


def parser() -> cli.Parser:
    return cli.Parser(
        prog="python -m ringcomp.warm",
        description="Compile every Numba kernel and compiled walk ringcomp runs on a CPU "
                    "into Numba's on-disk cache (NUMBA_CACHE_DIR moves it), so that no job "
                    "compiles on its first call: a machine's first run otherwise compiles "
                    "for tens of seconds to minutes. Run it once per machine, Python and "
                    "Numba version, without mpiexec; a second run loads everything and "
                    "takes seconds.")


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    quiet = getattr(args, "quiet", False)
    compiled, where, seconds = warm(steps(), quiet)
    print(f"ringcomp.warm: compiled {compiled} kernel signature(s) in {seconds:.1f} s into "
          f"{where or 'the cache (nothing new: everything was there)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
