"""``python -m ringcomp.bench``: nccl-tests/OSU-style all-reduce tables against MPI."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from ringcomp import cli, hostshare
from ringcomp.api import algorithm_options, algorithms
from ringcomp.bare_ring import BARE, BareRing
from ringcomp.checks import (
    SUPPORTED_DTYPES,
    LocalError,
    parse_torus,
    probe_directory,
    probe_writable,
)

# ring_native loads Numba: the exact ring's small sums then run their compiled walk in every
# row, with compressors among the rows or not (ring.compiled_walk)
from ringcomp.collectives import REGISTRY, compressed_algorithms, ring_native  # noqa: F401
from ringcomp.collectives.auto import TRIAL_CALLS
from ringcomp.compression import get_compressor
from ringcomp.devices import device, standin
from ringcomp.devices.placement import gpu_placement, gpu_unavailable, share_host_cores
from ringcomp.errors import EverywhereError
from ringcomp.kernelbench import format_rows, kernel_rows
from ringcomp.kernels.arrays import to_numpy
from ringcomp.plans.call import allreduce
from ringcomp.plans.plan import allreduce_init
from ringcomp.results import record
from ringcomp.results.benchtable import (
    average_busbw,
    format_row,
    header,
    record_data,
    slowdown_note,
)
from ringcomp.trace import (
    Tracer,
    call_split,
    format_shadow,
    format_split,
    format_summary,
    shadow_table,
    split_table,
)
from ringcomp.transport.agree import everywhere
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger("ringcomp.bench")  # not __name__: "__main__" under python -m

DEFAULT_SIZES = "8,4K,64K,1M,16M,64M"
DEFAULT_ALGORITHMS = "ring,tree,dbtree,rd,rabenseifner,torus,auto,mpi"


def parse_args(argv=None):
    parser = cli.Parser(
        prog="python -m ringcomp.bench", parents=[cli.common_parser()],
        description="Time all-reduce algorithms over a sweep of sizes (run under mpiexec). "
                    "Rank 0 prints nccl-tests' columns (size, count, type, redop; out of "
                    "place and in place: median time, algbw, busbw = algbw*2(p-1)/p, #wrong "
                    "= elements off MPI's result), OSU's min/avg/max time, wire bytes per "
                    "rank, vs_mpi (time / MPI Allreduce's in the same run) and, for a "
                    "compressor, rel_err; and the average bus bandwidth per algorithm.")
    parser.add_argument("--sizes", type=cli.parse_sizes, default=cli.parse_sizes(DEFAULT_SIZES),
                        help=f"message sizes in bytes, K/M/G suffixes (default {DEFAULT_SIZES})")
    parser.add_argument("--algorithms", type=cli.parse_list,
                        default=cli.parse_list(DEFAULT_ALGORITHMS),
                        help=f"comma-separated algorithms (default {DEFAULT_ALGORITHMS})")
    parser.add_argument("--compressors", type=cli.parse_list, default=[],
                        help="also run these compressors (names or specs, e.g. "
                             "fp16,sign,marsit) on every algorithm that supports them")
    parser.add_argument("--dtypes", type=cli.parse_list, default=["float32"],
                        help="comma-separated dtypes (default float32)")
    parser.add_argument("--op", default="sum", choices=("sum", "max", "min", "prod"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu", "standin"),
                        help="where the buffers live: NumPy (cpu) or CuPy on one GPU per rank "
                             "(gpu; staged through host unless MPI is CUDA-aware); standin: "
                             "the device path without a GPU, its kernels skipped, so the "
                             "times are its host cost alone (needs NUMBA_ENABLE_CUDASIM=1; "
                             "results are not computed: not checked)")
    parser.add_argument("--iters", type=int, default=0,
                        help="timed repetitions per row (default: 0 = adapt to the size)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed repetitions per row")
    parser.add_argument("--segment-bytes", type=cli.parse_size, default=None,
                        help="segment size for ring, dbtree and rabenseifner "
                             "(default: each one's own)")
    parser.add_argument("--torus", default=None, metavar="RxC",
                        help="shape of the torus algorithm, rows x columns (default: one row "
                             "per node, or the squarest shape on one node)")
    parser.add_argument("--raw-mpi", action="store_true",
                        help=f"also time mpi4py's comm.Allreduce called directly (row {RAW!r}) "
                             f"and the ring written straight on mpi4py (rows {BARE!r}: exact, "
                             "and with each compressor the ring runs, when ring is among "
                             "--algorithms): no ringcomp in the path - no argument "
                             "agreement, checks or Python around it - so the table shows "
                             "what the library adds")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the per-call argument agreement (one tiny Allreduce), as a "
                             "training loop does after validating its buckets once")
    parser.add_argument("--persistent", action="store_true",
                        help="time each ringcomp row through a persistent plan "
                             "(ringcomp.allreduce_init, made before the row's warm-up): "
                             "checked and agreed once, one small agreement per call (none "
                             "with --no-check)")
    parser.add_argument("--split", action="store_true",
                        help="also print where a call's time goes (median per call, over "
                             "every rank's calls): its checks and agreement, the codec, "
                             "waiting for messages, the rest of the collective - from a "
                             "trace of the timed calls with --trace, else of as many "
                             "untimed calls made again traced (tracing adds its own cost "
                             "to the rest; the table's times stay untraced)")
    parser.add_argument("--shadow", action="store_true",
                        help="with --compressors and --trace: carry exact partial sums beside "
                             "the compressed ring's and print the error after every hop")
    parser.add_argument("--kernels", action="store_true",
                        help="instead: time the compression kernels of every host backend against "
                             "single-core memcpy, or with --device gpu the CUDA kernels against "
                             "a device-to-device copy (one process, no mpiexec needed)")
    parser.add_argument("--kernel-elements", type=cli.parse_size, default=1 << 24,
                        help="vector length for --kernels (default 16M elements)")
    parser.add_argument("--json", metavar="PATH", type=cli.out_path, default=None,
                        help="write one JSON record per row to PATH")
    parser.add_argument("--record", metavar="PATH", type=cli.out_path, default=None,
                        help="write the table as a record with its provenance (what docs/ "
                             "renders its tables from: python -m ringcomp.report docs)")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    problem = check_args(args, parser)
    if problem:
        parser.error(problem)
    return args


#: options that mean nothing with --kernels (one process timing kernels, no collective)
_COLLECTIVE_ONLY = ("sizes", "algorithms", "compressors", "dtypes", "op", "iters",
                    "warmup", "segment_bytes", "torus", "no_check", "shadow", "trace",
                    "raw_mpi", "record", "persistent", "split")
#: the row of MPI's Allreduce called straight through mpi4py (``--raw-mpi``)
RAW = "mpi4py"
#: the dtypes a compressed row runs at (the others time the exact rows only)
COMPRESSED_DTYPES = ("float32", "float64")
_MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}


def check_args(args, parser) -> str:
    """The first nonsense value, or option that would not act, as one line; '' if none.
    Every rank parses the same command line, so every rank reaches the same verdict."""
    if args.device == "gpu" and (why := gpu_unavailable()):
        return f"--device gpu: {why}"
    if args.device == "standin":
        if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
            return ("--device standin: set NUMBA_ENABLE_CUDASIM=1 (the CUDA kernels' modules "
                    "load under Numba's simulator; the stand-in skips their launches)")
        if args.kernels or args.raw_mpi or args.shadow:
            return ("--device standin times the collectives' host path: drop --kernels, "
                    "--raw-mpi and --shadow")
    if args.kernels:
        given = [name for name in _COLLECTIVE_ONLY
                 if getattr(args, name) != parser.get_default(name)]
        if given:
            return (f"--{given[0].replace('_', '-')} does not act with --kernels (which times "
                    "the compression kernels in one process)")
        return "" if args.kernel_elements >= 1 else "--kernel-elements must be >= 1"
    if args.kernel_elements != parser.get_default("kernel_elements"):
        return "--kernel-elements acts only with --kernels"
    bad = [d for d in args.dtypes if d not in SUPPORTED_DTYPES]
    if bad:
        return f"--dtypes {','.join(bad)}: not supported (supported: {', '.join(SUPPORTED_DTYPES)})"
    if not args.sizes:
        return "--sizes is empty"
    itemsize = max(np.dtype(d).itemsize for d in args.dtypes)
    small = [n for n in args.sizes if n < itemsize]
    if small:
        return (f"--sizes {small[0]}: smaller than one element ({itemsize} bytes of "
                f"{max(args.dtypes, key=lambda d: np.dtype(d).itemsize)})")
    if args.iters < 0 or args.warmup < 0:
        return "--iters and --warmup must be >= 0 (--iters 0 = adapt to the size)"
    if args.segment_bytes is not None and args.segment_bytes < itemsize:
        return f"--segment-bytes {args.segment_bytes}: smaller than one element"
    if args.torus is not None and "torus" not in args.algorithms:
        return "--torus acts only with torus among --algorithms"
    compressed = []
    for spec in args.compressors:
        try:
            if get_compressor(spec) is not None:
                compressed.append(spec)
        except (ValueError, TypeError) as exc:
            return f"--compressors {spec}: {exc}"
    if compressed and args.op != "sum":
        return (f"--op {args.op} with --compressors {compressed[0]}: a compressed all-reduce "
                f"only sums (drop --compressors, or --op sum)")
    if compressed and not set(args.dtypes) & set(COMPRESSED_DTYPES):
        return (f"--compressors {compressed[0]}: compression needs float32 or float64 among "
                f"--dtypes (got {','.join(args.dtypes)})")
    segmenting = sorted(a for a, spec in REGISTRY.items() if "segment_bytes" in spec.options)
    if (args.segment_bytes is not None and not compressed
            and not set(args.algorithms) & set(segmenting)):
        return (f"--segment-bytes acts on the algorithms that pipeline segments "
                f"({', '.join(segmenting)}) and on compressed rows: none among --algorithms "
                f"{','.join(args.algorithms)}")
    if args.record and 0 < args.iters < 3:
        return "--record needs --iters >= 3 (a median with a range) or 0 (adapt to the size)"
    if args.raw_mpi and args.device == "gpu":
        return "--raw-mpi times host buffers only (drop --device gpu)"
    if args.shadow and not (args.trace and args.compressors):
        return "--shadow acts only with --trace DIR and --compressors"
    if args.split and args.shadow:
        return ("--split splits the timed calls; --shadow adds an untimed one carrying exact "
                "partials beside the payloads: run them apart")
    return ""


def check_writable(transport, path: str | None) -> None:
    """Fail on every rank, before any measurement, if rank 0 (which writes the rows)
    cannot write ``path``."""
    everywhere(transport, lambda: probe_writable(path) if path and transport.rank == 0
               else None)


def _iters(nbytes: int, requested: int) -> int:
    if requested > 0:
        return requested
    return int(max(20, min(200, (256 << 20) // max(nbytes, 1))))


def _options(algorithm: str, args) -> dict:
    """The options given that ``algorithm`` takes (a segment, a torus's shape)."""
    given = {"segment_bytes": args.segment_bytes, "torus": args.torus}
    takes = algorithm_options(algorithm)
    return {k: v for k, v in given.items() if v and k in takes}


def _on_device(x: np.ndarray, where: str):
    """``x`` itself for ``cpu``; a CuPy copy on this rank's GPU for ``gpu``; a stand-in
    device array (host memory the device path takes for a GPU's) for ``standin``."""
    if where == "standin":
        return standin.DeviceArray.of(x)
    return x if where == "cpu" else gpu_placement().put(x)


def _count_wrong(transport, x, y, ref, dtype) -> int:
    """Elements of ``y`` farther from MPI's ``ref`` than summation-order rounding allows."""
    if np.issubdtype(dtype, np.integer):
        wrong = int(np.count_nonzero(y != ref))
    else:
        magnitude = allreduce(np.abs(x).astype(np.float64), algorithm="mpi",
                              comm=transport)
        tol = 4 * transport.size * np.finfo(dtype).eps * magnitude + np.finfo(dtype).tiny
        wrong = int(np.count_nonzero(~(np.abs(y.astype(np.float64) - ref) <= tol)))
    total = np.array([wrong], np.int64)
    return int(allreduce(total, algorithm="mpi", comm=transport)[0])


def bench_size(transport, x, configs, args, tracer, split=None) -> dict:
    """Time every (algorithm, compressor) on ``x`` out of place and in place (as nccl-tests
    does), interleaved repetition by repetition.

    Round-robin order spreads the drift of a shared, oversubscribed machine evenly over the
    configurations, so the ratios in one table are fair. An in-place call first gets a
    fresh copy of ``x`` (untimed: it overwrites its buffer). Returns, per configuration,
    every repetition's time of the slowest rank out of place (``times``, for the median,
    min, mean and max and for ratios paired repetition by repetition) and in place
    (``inplace_times``), the wire bytes sent per rank and out-of-place call, the algorithm
    ``auto`` chose, and the last results of both forms. Only out-of-place calls are traced.
    """
    check = not args.no_check
    xp = device.array_module(x)
    outs = {c: xp.empty_like(x) for c in configs}
    ins = {c: xp.empty_like(x) for c in configs}  # in place: reduced where they are

    plans = {}  # --persistent: (config, in place, traced, shadow) -> its plan
    bare = {c: BareRing(transport.comm, get_compressor(c) if c else None, args.op)
            for a, c in configs if a == BARE}  # made on every rank alike (collective)

    def call(config, trace, shadow=False, in_place=False):
        algorithm, compressor = config
        buf = ins[config] if in_place else outs[config]
        if algorithm == RAW:
            transport.comm.Allreduce(MPI.IN_PLACE if in_place else x, buf,
                                     op=_MPI_OPS[args.op])
            return
        if algorithm == BARE:
            bare[compressor](buf if in_place else x, buf)
            return
        key = (config, in_place, trace is not None, shadow)
        plan = plans.get(key) if args.persistent else None
        if plan is not None:  # the timed call itself, and nothing of the bench's around it
            plan()
            return
        arguments = dict(algorithm=algorithm, comm=transport, out=buf, op=args.op,
                         check=check, tracer=trace, compressor=compressor, shadow=shadow,
                         **_options(algorithm, args))
        if not args.persistent:
            allreduce(buf if in_place else x, **arguments)
            return
        # made at the same call on every rank (collective), then called
        plan = plans[key] = allreduce_init(buf if in_place else x, **arguments)
        plan()

    def timed(config, in_place: bool) -> float:
        """One repetition on this rank (an in-place buffer refilled first, untimed)."""
        if in_place:
            ins[config][...] = x
        transport.barrier()
        t0 = time.perf_counter()
        call(config, None if in_place else tracer, in_place=in_place)
        return time.perf_counter() - t0

    for config in configs:
        # auto settles a new size on its first 2 x TRIAL_CALLS calls (alternating its
        # model's choice with MPI's own): those are warm-up too, so the timed calls are
        # the algorithm it settled on
        settling = 2 * TRIAL_CALLS if config[0] == "auto" else 0
        for _ in range(args.warmup + settling):
            call(config, None)
        ins[config][...] = x
        call(config, None, in_place=True)
    reps = _iters(x.nbytes, args.iters)
    times = np.empty((len(configs), reps))
    inplace = np.empty((len(configs), reps))
    sent = np.zeros(len(configs))
    for i in range(reps):
        for j, config in enumerate(configs):
            sent0 = transport.bytes_sent
            times[j, i] = timed(config, in_place=False)
            sent[j] += transport.bytes_sent - sent0
            inplace[j, i] = timed(config, in_place=True)
    if split is not None:  # --split without --trace: as many traced calls again, untimed,
        for _ in range(reps):  # so that tracing's own cost stays out of the table
            for config in configs:
                transport.barrier()
                call(config, split)
    if args.shadow:  # one extra, untimed call: shadow traffic must not count as the method's
        for config in configs:
            comp = get_compressor(config[1]) if config[1] else None
            if comp is not None and not comp.wraps_exact:
                call(config, tracer, shadow=True)
    for ring in bare.values():
        ring.close()
    # the slowest rank defines each repetition's time
    times = allreduce(times, algorithm="mpi", op="max", comm=transport)
    inplace = allreduce(inplace, algorithm="mpi", op="max", comm=transport)
    sent = allreduce(sent / reps, algorithm="mpi", comm=transport) / transport.size
    result = {}
    for j, config in enumerate(configs):
        algorithm = config[0]
        chosen = transport.kept.auto_last if algorithm == "auto" else algorithm
        # MPI's own Allreduce moves bytes the transport cannot count
        wire = None if chosen in ("mpi", RAW, BARE) else float(sent[j])
        result[config] = {"times": times[j].tolist(), "inplace_times": inplace[j].tolist(),
                          "wire": wire, "chosen": chosen, "out": outs[config],
                          "inplace_out": ins[config]}
    return result


def _configs(args, transport) -> list[tuple[str, str | None]]:
    """MPI first (the reference), then every algorithm, then every meaningful
    (algorithm, compressor) pair; rank 0 lists the pairs it skips."""
    configs = [("mpi", None)] + [(a, None) for a in args.algorithms if a != "mpi"]
    if args.raw_mpi:
        configs += [(RAW, None), (BARE, None)]
    skipped = []
    for spec in args.compressors:
        comp = get_compressor(spec)
        if comp is None:
            continue
        for algorithm in args.algorithms:
            if algorithm in compressed_algorithms():
                configs.append((algorithm, spec))
            else:
                skipped.append(f"{algorithm}+{spec}")
        if args.raw_mpi and "ring" in args.algorithms and not comp.wraps_exact:
            configs.append((BARE, spec))
    exact_only = [d for d in args.dtypes if d not in COMPRESSED_DTYPES]
    if exact_only and any(compressor for _, compressor in configs):
        skipped.append(f"compressed rows at {','.join(exact_only)} (float32 and float64 "
                       f"only)")
    if skipped and transport.rank == 0:
        log.info(f"not meaningful, skipped: {', '.join(skipped)}")
    return configs


def _equals_host(transport, x: np.ndarray, out, algorithm: str, compressor, args):
    """Whether a device result has the bytes of the same call on host buffers (on every
    rank; one untimed host call); None for PowerSGD, whose matrix products (cuBLAS against
    the host's BLAS) are not expected to match, and whose warm start is per device."""
    comp = get_compressor(compressor) if compressor else None
    if comp is not None and comp.wraps_exact:
        return None
    host = allreduce(x, algorithm=algorithm, comm=transport, op=args.op,
                     compressor=compressor, **_options(algorithm, args))
    same = np.array([to_numpy(out).tobytes() == host.tobytes()], np.int64)
    return bool(allreduce(same, algorithm="mpi", op="min", comm=transport)[0])


def _errors(transport, out, ref) -> tuple[float, float]:
    """Relative L2 error and cosine of ``out`` against the exact sum (the same on all ranks,
    since results are bit-identical)."""
    y = to_numpy(out).astype(np.float64)
    norm = float(np.linalg.norm(ref)) or 1.0
    cos = float(y @ ref / ((np.linalg.norm(y) or 1.0) * norm))
    return float(np.linalg.norm(y - ref) / norm), cos


def _start(args, transport) -> tuple:
    """Refuse what cannot run (every rank alike), share the host's cores, print the
    run's header line; (the tracer or None, the configurations to time)."""
    check_writable(transport, args.json)
    check_writable(transport, args.record)
    p = transport.size
    # each rank's share of the node's cores for NumPy's BLAS (PowerSGD's products): with a
    # pool per core in every rank the pools spun against one another, PowerSGD's 1 MB
    # call took 240 ms instead of 13 at 4 ranks on 2 cores, and the MPI call timed after
    # it 3-10x its own time (as ringcomp.train already shares them)
    blas = share_host_cores(transport.local_size)
    tracer = Tracer(args.trace) if args.trace else None
    if tracer is not None:  # every rank writes its own file there at the end
        everywhere(transport, lambda: probe_directory(tracer.directory,
                                                      tracer.outputs(transport.rank)))
    unknown = sorted(set(args.algorithms) - set(algorithms()))
    if unknown:
        raise SystemExit(f"unknown algorithm(s) {unknown}; known: {algorithms()}")
    try:
        parse_torus(args.torus, p)
    except LocalError as exc:  # the same command line on every rank: the same verdict
        raise SystemExit(f"--torus: {exc}") from None
    if transport.rank == 0:
        facts = mpi_facts()
        print(f"# ringcomp.bench: {p} ranks, {facts['mpi_library']}, thread level "
              f"{facts['thread_level']}, op {args.op}, check "
              f"{'off' if args.no_check else 'on'}, device {args.device}"
              f"{' (kernels skipped: the host path alone)' if args.device == 'standin' else ''}"
              f", cuda-aware "
              f"{transport.cuda_aware}, BLAS threads per rank "
              f"{blas if blas is not None else 'as set by the environment'}")
    configs = _configs(args, transport)
    if transport.rank == 0:
        print(header(gpu=args.device == "gpu"), flush=True)
    return tracer, configs


def _input(transport, dtype, count: int):
    """This rank's input: small integers, or standard normal floats."""
    rng = np.random.default_rng(1000 + transport.rank)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-8, 8, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def _size_rows(transport, args, configs, dtype_name: str, size: int, tracer,
               split=None) -> list[dict]:
    """Every configuration timed at one size and dtype, each a table row checked against
    MPI's own ``Allreduce`` (exact rows: elements wrong; compressed: the error)."""
    p, dtype = transport.size, np.dtype(dtype_name)
    count = max(1, size // dtype.itemsize)
    x = _input(transport, dtype, count)
    ref = allreduce(x, algorithm="mpi", comm=transport, op=args.op)
    ref = ref.astype(np.float64) if dtype.kind == "f" else ref
    usable = [c for c in configs if c[1] is None or dtype.name in COMPRESSED_DTYPES]
    measured = bench_size(transport, _on_device(x, args.device), usable, args, tracer, split)
    t_mpi = float(np.median(measured["mpi", None]["times"]))
    rows = []
    for algorithm, compressor in usable:
        if algorithm == "mpi" and "mpi" not in args.algorithms:
            continue
        got = measured[algorithm, compressor]
        out, reps = got["out"], got["times"]
        t, t_in = float(np.median(reps)), float(np.median(got["inplace_times"]))
        exact = compressor is None
        # the stand-in's kernels did nothing: there is no result to check
        computed = args.device != "standin"
        wrong = _count_wrong(transport, x, to_numpy(out), ref, dtype) if (
            exact and computed) else None
        wrong_in = _count_wrong(transport, x, to_numpy(got["inplace_out"]), ref,
                                dtype) if exact and computed else None
        rel_err, cosine = (_errors(transport, out, ref) if dtype.kind == "f" else (0, 1)) \
            if computed else (None, None)
        algbw = x.nbytes / t / 1e9 if t > 0 else 0.0
        algbw_in = x.nbytes / t_in / 1e9 if t_in > 0 else 0.0
        bus = 2 * (p - 1) / p  # nccl-tests' bus bandwidth factor for all-reduce
        rows.append({
            "size_bytes": int(x.nbytes), "count": int(count), "dtype": dtype_name,
            "algorithm": algorithm, "chosen": got["chosen"], "op": args.op,
            "compressor": compressor or "none", "p": p, "time_s": t,
            "time_min_s": min(reps), "time_avg_s": float(np.mean(reps)),
            "time_max_s": max(reps), "algbw_GBps": algbw, "busbw_GBps": algbw * bus,
            "inplace_time_s": t_in, "inplace_algbw_GBps": algbw_in,
            "inplace_busbw_GBps": algbw_in * bus, "inplace_wrong": wrong_in,
            "wire_bytes": got["wire"], "vs_mpi": t / t_mpi if t_mpi > 0 else None,
            "wrong": wrong, "rel_err": rel_err, "cosine": cosine,
            "check": not args.no_check, "times_s": reps,
            "inplace_times_s": got["inplace_times"],
            "cpu_equal": _equals_host(transport, x, out, algorithm, compressor,
                                      args) if args.device == "gpu" else None})
        if transport.rank == 0:
            print(format_row(rows[-1]), flush=True)
    return rows


def _trace_summary(transport, args, tracer) -> str | None:
    """Write the trace; print (and return) rank 0's hop summary, and the shadow errors."""
    summary = None
    merged = tracer.write(transport)
    if merged:
        summary = format_summary(tracer.summary())
        print(f"# trace: {merged} (open in https://ui.perfetto.dev); rank 0's hops:")
        print(summary)
    if args.shadow:
        everyone = [r for part in transport.allgather_obj(tracer.records) for r in part]
        if transport.rank == 0:
            print("# shadow: error of the compressed partial aggregate after each hop, "
                  "against the exact sum of the same ranks (mean over hops and ranks)")
            print(format_shadow(shadow_table(everyone)))
    return summary


def _split(transport, tracer) -> list[dict]:
    """``--split``: every rank's timed calls split into their parts, grouped per
    configuration and size (rank 0 prints the table); the rows on every rank."""
    calls = [c for part in transport.allgather_obj(call_split(tracer.records)) for c in part]
    rows = split_table(calls)
    if transport.rank == 0:
        print("# where a call's time goes (us, median per call over every rank's calls; "
              "traced again, untimed, unless --trace): checks = argument checks and the "
              "agreement; codec = encode, merge, decode; wait = blocked on messages; rest = "
              "the rest of the collective")
        print(format_split(rows))
    return rows


def run(args) -> list[dict]:
    """1. check and announce; 2. time every configuration at every dtype and size against
    MPI's own ``Allreduce``; 3. the trace's summary; 4. the rows as JSON lines and a record
    (rank 0)."""
    transport = get_transport()
    # the machine's load as the run starts: the record says under which load it was timed
    before = record.machine_load() if args.record and transport.rank == 0 else None
    # and how much the ranks slow each other's host work: per-call costs stretch with it
    slowdown = hostshare.rank_slowdown(transport) if args.record else None
    if slowdown is not None and transport.rank == 0:
        print(slowdown_note(transport.size, slowdown))
    tracer, configs = _start(args, transport)
    # --split reads the timed calls' trace with --trace, else that of untimed calls again
    splitting = Tracer() if args.split and tracer is None else None
    with (standin.skipped_launches() if args.device == "standin"
          else contextlib.nullcontext()):
        rows = [row for dtype_name in args.dtypes for size in args.sizes
                for row in _size_rows(transport, args, configs, dtype_name, size, tracer,
                                      splitting)]
    if transport.rank == 0:
        print(average_busbw(rows))
    summary = _trace_summary(transport, args, tracer) if tracer is not None else None
    split = _split(transport, tracer or splitting) if args.split else None
    if args.json and transport.rank == 0:
        with open(args.json + ".tmp", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        os.replace(args.json + ".tmp", args.json)
    if args.record and transport.rank == 0:
        p = transport.size
        # (under python -m ringcomp.testbed, provenance names the testbed's command)
        command = ["mpiexec", "-n", str(p), "python", "-m", "ringcomp.bench", *args.argv]
        prov = record.provenance(command, mpi_facts()["mpi_library"], before, ranks=p,
                                 placement="one node", device=args.device)
        record.write(args.record, "bench", prov,
                     record_data(rows, p, summary, split, slowdown))
        log.info(f"wrote {args.record}")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    cli.apply_common(args)
    if args.kernels:
        if args.json:
            probe_writable(args.json)
        rows = kernel_rows(args.kernel_elements, device=args.device)
        print(format_rows(rows))
        if args.json:
            with open(args.json, "w") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
        return 0
    try:
        run(args)
    except EverywhereError as exc:
        return cli.failed_everywhere("python -m ringcomp.bench", exc, get_transport().rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
