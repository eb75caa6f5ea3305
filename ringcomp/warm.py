"""``python -m ringcomp.warm``: compile every Numba kernel and compiled walk ahead of time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

from ringcomp import cli

#: below and above the sign kernels' parallel split (``signs_blocks.BLOCK`` words of 32)
SIZES = (1024, 3 * 32 * 2048 + 5)
#: past this many processes nothing is gained (the steps fall in three element types, and
#: ``shares`` keeps a type's steps together) and each holds Numba's compiler (a few hundred MB)
MAX_JOBS = 3


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


def shares(labels: list[str], jobs: int) -> list[list[int]]:
    """Step indices for up to ``jobs`` processes: the steps of one element type (a label's
    last part: ``float32``, ``float64``, ``other dtypes``) in one process, the types dealt
    round-robin. A compiled walk compiles the codecs it inlines for its element type, so
    steps of one type in two processes would compile the same code twice, while types
    share little: on 2 cores the whole warm-up took 106 s in one process, 61 s in two
    (119 s of CPU: about what one process compiles, once)."""
    kinds = list(dict.fromkeys(label.rpartition(", ")[2] for label in labels))
    out = [[] for _ in range(min(jobs, len(kinds)))]
    for i, label in enumerate(labels):
        out[kinds.index(label.rpartition(", ")[2]) % len(out)].append(i)
    return out


def _run_share(indices: list[int], quiet: bool) -> None:
    """One process's share of ``steps()`` (by index: the steps are closures); prints its
    ``warm`` result as JSON, the last line of its stdout."""
    todo = steps()
    compiled, where, _ = warm([todo[i] for i in indices], quiet)
    print(json.dumps([compiled, where]))


def warm_parallel(jobs: int, quiet: bool = False) -> tuple[int, str, float]:
    """``warm(steps())`` in ``jobs`` processes (``shares``), as ``warm``'s result; in this
    process when ``jobs`` is 1. Each share is a fresh ``python -c`` (not multiprocessing:
    its spawned children run the caller's ``__main__`` again, which a script without a
    main guard does not survive, and a fork of a process that loaded Numba is unsafe)."""
    todo = steps()
    jobs = max(1, min(jobs, len(todo)))
    if jobs == 1:
        return warm(todo, quiet)
    t0 = time.perf_counter()
    parts = shares([label for label, _ in todo], jobs)
    children = [subprocess.Popen(
        [sys.executable, "-c", f"from ringcomp import warm; warm._run_share({part}, {quiet})"],
        stdout=subprocess.PIPE, text=True) for part in parts]
    outs = [child.communicate()[0] for child in children]  # every one ended, then judged
    failed = [f"{part} (exit {child.returncode})" for part, child in
              zip(parts, children, strict=True) if child.returncode != 0]
    if failed:
        raise RuntimeError(f"warm-up processes failed, their errors above; the steps they "
                           f"ran: {', '.join(failed)}")
    done = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    return (sum(n for n, _ in done), next((w for _, w in done if w), ""),
            time.perf_counter() - t0)


def default_jobs() -> int:
    """The cores this process may run on, at most ``MAX_JOBS``."""
    return max(1, min(MAX_JOBS, len(os.sched_getaffinity(0))))


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
    parser = cli.Parser(
        prog="python -m ringcomp.warm",
        description="Compile every Numba kernel and compiled walk ringcomp runs on a CPU "
                    "into Numba's on-disk cache (NUMBA_CACHE_DIR moves it), so that no job "
                    "compiles on its first call: a machine's first run otherwise compiles "
                    "for tens of seconds to minutes. Run it once per machine, Python and "
                    "Numba version, without mpiexec; a second run loads everything and "
                    "takes seconds.")
    parser.add_argument("--jobs", "-j", type=cli.positive_int, default=None,
                        help=f"processes compiling at once (default: the usable cores, at "
                             f"most {MAX_JOBS}; each holds Numba's compiler, a few hundred "
                             f"MB)")
    return parser


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    quiet = getattr(args, "quiet", False)
    jobs = args.jobs or default_jobs()
    compiled, where, seconds = warm_parallel(jobs, quiet)
    print(f"ringcomp.warm: compiled {compiled} kernel signature(s) in {seconds:.1f} s into "
          f"{where or 'the cache (nothing new: everything was there)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
