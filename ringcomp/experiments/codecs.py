"""``experiments codecs``: codecs at memory speed? compressed rings faster than the exact one?

Three measurements, one record (not under mpiexec: it launches its own jobs):
  1. ``bench --kernels``: every host kernel on one thread against single-core memcpy.
  2. ``bench`` at ``--ranks`` on this node: the exact ring, ring+marsit and ring+sign at
     the large sizes, interleaved repetition by repetition, so each repetition gives a paired
     ratio to the exact ring (median, min, max over repetitions); beside the memory-traffic
     bound of a compressed ring (every rank reads its input and writes its output once;
     the bits are 1/32 of that): ``p / min(p, cores)`` single-core memcpy times of the vector.
  3. ``bench``: the exact ``auto`` against MPI's own Allreduce from small to large sizes,
     paired the same way.
  4. Where each rank's time goes in the exact and compressed rings at 4 and 16 ranks
     (``bench --trace``, every rank, every call): codec (encode, merge, decode), blocked in
     MPI waits, and the rest (the Python path around them, MPI progress outside waits).
  5. ``mpiexec -n 16 python -m ringcomp.train --steps 1``: launch to exit, the start-up.
  6. As root, on an emulated cluster (``ringcomp.testbed``, one rank per host): the exact,
     Marsit and sign rings at the rate given, against the line rate and the wire bounds.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from ringcomp.cli import out_path, parse_list, parse_rate, parse_size, parse_sizes
from ringcomp.experiments.codecs_tables import render
from ringcomp.results.record import load, machine_load, provenance, write
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)



def _run(command: list[str], timeout: float) -> None:
    log.info(" ".join(command))
    done = subprocess.run(command, timeout=timeout, text=True, capture_output=True)
    if done.returncode:
        raise SystemExit(f"ringcomp.experiments codecs: {' '.join(command)} failed "
                         f"(exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _bench(args, folder: str, name: str, options: list[str], ranks: int = 0) -> list[dict]:
    path = os.path.join(folder, f"{name}.jsonl")
    mpiexec = shutil.which("mpiexec") or "mpiexec"
    _run([mpiexec, "-n", str(ranks or args.ranks), sys.executable, "-m", "ringcomp.bench",
          "--no-check", "--iters", str(args.iters), "--json", path, *options], args.timeout)
    return _jsonl(path)


CODEC = ("encode", "merge", "decode")


def split(directory: str) -> list[dict]:
    """Per method, the mean over calls and ranks of a call's time, its codec time, its time
    blocked in MPI waits, and the rest, from a ``--trace`` directory."""
    calls, parts = {}, {}
    for path in glob.glob(os.path.join(directory, "rank-*.jsonl")):
        for rec in _jsonl(path):
            key = (rec["rank"], rec["op"])
            if rec["type"] == "op" and rec["alg"] != "mpi":
                calls[key] = (rec["alg"], rec["bytes"], rec["size"], rec["t1"] - rec["t0"])
            elif rec["type"] == "hop":
                codec, wait = parts.get(key, (0.0, 0.0))
                parts[key] = (codec + (rec["t1"] - rec["t0"] if rec["kind"] in CODEC else 0),
                              wait + rec["wait"])
    rows: dict = {}
    for key, (alg, nbytes, p, total) in calls.items():
        codec, wait = parts.get(key, (0.0, 0.0))
        rows.setdefault((alg, nbytes, p), []).append((total, codec, wait))
    return [{"method": alg, "size_bytes": nbytes, "p": p, "calls": len(v),
             "op_s": float(np.mean([t for t, _, _ in v])),
             "codec_s": float(np.mean([c for _, c, _ in v])),
             "wait_s": float(np.mean([w for _, _, w in v])),
             "rest_s": float(np.mean([t - c - w for t, c, w in v]))}
            for (alg, nbytes, p), v in sorted(rows.items())]


def splits(args, folder: str) -> list[dict]:
    found = []
    for ranks in args.split_ranks:
        trace = os.path.join(folder, f"trace-p{ranks}")
        _bench(args, folder, f"split-p{ranks}", [
            "--sizes", str(args.split_size), "--algorithms", "ring", "--compressors",
            ",".join(args.compressors), "--trace", trace], ranks)
        found += split(trace)
    return found


def startup(args) -> list[float]:
    """Seconds from launch to exit of a one-step training job, ``args.startup_runs`` times."""
    mpiexec = shutil.which("mpiexec") or "mpiexec"
    times = []
    for _ in range(args.startup_runs):
        t0 = time.perf_counter()
        _run([mpiexec, "-n", str(args.startup_ranks), sys.executable, "-m", "ringcomp.train",
              "--steps", "1"], args.timeout)
        times.append(time.perf_counter() - t0)
    return times


def testbed(args, folder: str) -> dict:
    """The rings on an emulated cluster (root); ``{"skipped": why}`` where it cannot run."""
    if not args.testbed_hosts:
        return {"skipped": "not asked for (--testbed-hosts 0)"}
    if os.geteuid() != 0:
        return {"skipped": "needs root (network namespaces and tc)"}
    path = os.path.join(folder, "testbed.jsonl")
    _run([sys.executable, "-m", "ringcomp.testbed", "--hosts", str(args.testbed_hosts),
          "--rate", repr(args.testbed_rate), "--timeout", str(args.timeout), "--", "python", "-m",
          "ringcomp.bench", "--sizes", str(args.testbed_size), "--algorithms", "ring",
          "--compressors", ",".join(args.compressors), "--iters", str(args.testbed_iters),
          "--no-check", "--json", path], args.timeout + 120)
    rate = args.testbed_rate
    rows = _jsonl(path)
    for row in rows:  # what the wire alone needs: this rank's bytes at the line rate
        row["wire_bound_s"] = row["wire_bytes"] * 8 / rate
        row["of_wire_bound"] = row["wire_bound_s"] / row["time_s"]
    return {"hosts": args.testbed_hosts, "rate_bps": rate, "rows": rows,
            "paired": paired(rows, {"algorithm": "ring"}, {"algorithm": "ring",
                                                            "compressor": "none"})}


def paired(rows: list[dict], method: dict, base: dict) -> dict:
    """The ratio of ``method``'s time to ``base``'s of the same size, repetition by
    repetition (both ran in one job, interleaved): median, min and max over repetitions."""
    out = []
    for row in rows:
        if all(row.get(k) == v for k, v in method.items()):
            ref = next(r for r in rows if r["size_bytes"] == row["size_bytes"]
                       and all(r.get(k) == v for k, v in base.items()))
            ratios = np.array(row["times_s"]) / np.array(ref["times_s"])
            out.append({"size_bytes": row["size_bytes"], "time_s": row["time_s"],
                        "base_s": ref["time_s"], "median": float(np.median(ratios)),
                        "min": float(ratios.min()), "max": float(ratios.max()),
                        "reps": len(ratios), "algorithm": row["algorithm"],
                        "compressor": row["compressor"], "chosen": row.get("chosen")})
    return out


def _with_raw(rows: list[dict], raw: list[dict]) -> list[dict]:
    """``rows`` (auto against ringcomp's MPI path) with the same calls against mpi4py's
    ``comm.Allreduce`` called directly: ``raw_s`` and the paired ratio to it."""
    by_size = {r["size_bytes"]: r for r in raw}
    return [{**r, "raw_s": by_size[r["size_bytes"]]["base_s"],
             "raw_median": by_size[r["size_bytes"]]["median"],
             "raw_min": by_size[r["size_bytes"]]["min"],
             "raw_max": by_size[r["size_bytes"]]["max"]} for r in rows]


def rings(rows: list[dict], memcpy_gbps: float, p: int, cores: int) -> list[dict]:
    """Compressed rings against the exact ring, with their memory-traffic bound."""
    found = []
    for compressor in sorted({r["compressor"] for r in rows} - {"none"}):
        for row in paired(rows, {"algorithm": "ring", "compressor": compressor},
                          {"algorithm": "ring", "compressor": "none"}):
            bound = p / min(p, cores) * row["size_bytes"] / (memcpy_gbps * 1e9)
            found.append({**row, "bound_s": bound, "of_bound": bound / row["time_s"]})
    return found


def main(args) -> int:
    cores = os.cpu_count() or 1
    before = machine_load()
    with tempfile.TemporaryDirectory(prefix="ringcomp-codecs-") as folder:
        kernel_path = os.path.join(folder, "kernels.jsonl")
        _run([sys.executable, "-m", "ringcomp.bench", "--kernels", "--kernel-elements",
              str(args.kernel_elements), "--json", kernel_path], args.timeout)
        kernels = _jsonl(kernel_path)
        ring_rows = _bench(args, folder, "rings", [
            "--sizes", ",".join(map(str, args.sizes)), "--algorithms", "ring",
            "--compressors", ",".join(args.compressors)])
        auto_rows = _bench(args, folder, "auto", [
            "--sizes", ",".join(map(str, args.auto_sizes)), "--algorithms", "auto,mpi",
            "--raw-mpi"])
        memcpy = next(r["GBps"] for r in kernels if r["kernel"] == "memcpy")
        data = {"ranks": args.ranks, "kernels": kernels,
                "rings": rings(ring_rows, memcpy, args.ranks, cores),
                "auto": _with_raw(paired(auto_rows, {"algorithm": "auto"},
                                         {"algorithm": "mpi"}),
                                  paired(auto_rows, {"algorithm": "auto"},
                                         {"algorithm": "mpi4py"})),
                "split": splits(args, folder), "startup_s": startup(args),
                "startup_ranks": args.startup_ranks, "testbed": testbed(args, folder)}
    prov = provenance(["python", "-m", "ringcomp.experiments", "codecs", *args.argv],
                      mpi_facts()["mpi_library"], before, ranks=args.ranks,
                      placement="one node")
    write(f"{args.out}.json", "codecs", prov, data)
    print(render(load(os.path.abspath(f"{args.out}.json"))))
    log.info(f"wrote {args.out}.json")
    return 0


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("codecs", help="host kernels against memcpy, compressed rings against "
                                      "the exact ring, auto against MPI (not under mpiexec)")
    p.add_argument("--ranks", type=int, default=4, help="ranks of the ring jobs (default: 4)")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("16M,64M"),
                   help="sizes of the ring comparison (default: 16M,64M)")
    p.add_argument("--compressors", type=parse_list, default=["marsit", "sign"],
                   help="default: marsit,sign")
    p.add_argument("--auto-sizes", type=parse_sizes,
                   default=parse_sizes("4K,64K,1M,16M,64M"),
                   help="sizes of the auto/MPI comparison (default: 4K,64K,1M,16M,64M)")
    p.add_argument("--iters", type=int, default=11,
                   help="timed repetitions per size (default: 11)")
    p.add_argument("--kernel-elements", type=parse_size, default=1 << 24,
                   help="vector length of the kernel table (default: 16M)")
    p.add_argument("--split-ranks", type=lambda t: [int(v) for v in parse_list(t)],
                   default=[4, 16], help="rank counts of the time split (default: 4,16)")
    p.add_argument("--split-size", type=parse_size, default=16 << 20,
                   help="size of the time split (default: 16M)")
    p.add_argument("--startup-ranks", type=int, default=16, help="default: 16")
    p.add_argument("--startup-runs", type=int, default=3, help="default: 3")
    p.add_argument("--testbed-hosts", type=int, default=4,
                   help="emulated hosts for the testbed table (root; 0 = skip; default: 4)")
    p.add_argument("--testbed-rate", type=parse_rate, default=parse_rate("1gbit"),
                   help="link rate of every emulated host (default: 1gbit)")
    p.add_argument("--testbed-size", type=parse_size, default=64 << 20,
                   help="default: 64M")
    p.add_argument("--testbed-iters", type=int, default=5, help="default: 5")
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds before one job is killed (default: 1800)")
    p.add_argument("--out", type=out_path, default="results/codecs-p4", help="output path prefix")
    p.set_defaults(run=main, mpi=False, check=check_args)


def check_args(args, parser) -> None:
    """What the options cannot say alone (parser.error on a bad value)."""
    if args.ranks < 2:
        parser.error(f"--ranks must be at least 2 (a ring), got {args.ranks}")
    for name in ("iters", "testbed_iters", "startup_runs"):
        if getattr(args, name) < 3:
            parser.error(f"--{name.replace('_', '-')} must be at least 3 (a median with a "
                         f"range), got {getattr(args, name)}")
    if any(r < 2 for r in args.split_ranks) or args.startup_ranks < 1:
        parser.error("--split-ranks need at least 2 ranks each, --startup-ranks at least 1")
    args.argv = [a for a in sys.argv[1:] if a != "codecs"]
