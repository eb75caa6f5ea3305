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
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from ringcomp import records
from ringcomp.cli import human_bytes, parse_list, parse_size, parse_sizes
from ringcomp.launch import mpi_facts

#: the source files whose changes make the record stale
CODE = ["ringcomp/kernels/signs_numba.py", "ringcomp/kernels/cast_numba.py",
        "ringcomp/kernels/quant_numba.py", "ringcomp/kernels/sketch_numba.py",
        "ringcomp/compression/sign.py", "ringcomp/compression/marsit.py",
        "ringcomp/compression/rules.py", "ringcomp/collectives/compressed_ring.py",
        "ringcomp/collectives/hops.py", "ringcomp/collectives/ring.py",
        "ringcomp/collectives/auto.py", "ringcomp/comm.py"]


def _run(command: list[str], timeout: float) -> None:
    print("# " + " ".join(command), flush=True)
    done = subprocess.run(command, timeout=timeout, text=True, capture_output=True)
    if done.returncode:
        raise SystemExit(f"ringcomp.experiments codecs: {' '.join(command)} failed "
                         f"(exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _bench(args, folder: str, name: str, options: list[str]) -> list[dict]:
    path = os.path.join(folder, f"{name}.jsonl")
    mpiexec = shutil.which("mpiexec") or "mpiexec"
    _run([mpiexec, "-n", str(args.ranks), sys.executable, "-m", "ringcomp.bench",
          "--no-check", "--iters", str(args.iters), "--json", path, *options], args.timeout)
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


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
                        "reps": len(ratios), **method})
    return out


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
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ringcomp-codecs-") as folder:
        kernel_path = os.path.join(folder, "kernels.jsonl")
        _run([sys.executable, "-m", "ringcomp.bench", "--kernels", "--kernel-elements",
              str(args.kernel_elements), "--json", kernel_path], args.timeout)
        with open(kernel_path) as f:
            kernels = [json.loads(line) for line in f if line.strip()]
        ring_rows = _bench(args, folder, "rings", [
            "--sizes", ",".join(map(str, args.sizes)), "--algorithms", "ring",
            "--compressors", ",".join(args.compressors)])
        auto_rows = _bench(args, folder, "auto", [
            "--sizes", ",".join(map(str, args.auto_sizes)), "--algorithms", "auto,mpi"])
    memcpy = next(r["GBps"] for r in kernels if r["kernel"] == "memcpy")
    data = {"ranks": args.ranks, "kernels": kernels,
            "rings": rings(ring_rows, memcpy, args.ranks, cores),
            "auto": paired(auto_rows, {"algorithm": "auto"}, {"algorithm": "mpi"}),
            "load": [load_before, os.getloadavg()[0]]}
    prov = records.provenance(["python", "-m", "ringcomp.experiments", "codecs", *args.argv],
                              CODE, mpi_facts()["mpi_library"], ranks=args.ranks,
                              placement="one node")
    records.write(f"{args.out}.json", "codecs", prov, data)
    print(render(records.load(os.path.abspath(f"{args.out}.json"))))
    print(f"# wrote {args.out}.json")
    return 0


def _ratio(row: dict) -> str:
    return f"{row['median']:.2f} ({row['min']:.2f}-{row['max']:.2f})"


@records.renderer("codecs")
def render(record: dict) -> str:
    """The record's three tables as markdown."""
    p = record["ranks"]
    lines = ["Kernels on one host thread (GB/s of the float32 input) against single-core "
             "memcpy; Numba's also on every thread:", "",
             "| kernel | backend | threads | GB/s | per core / memcpy |", "|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['backend']} | {r['threads']} | {r['GBps']:.2f} | "
              f"{r['vs_copy']:.2f} |" for r in record["kernels"]]
    lines += ["", f"Compressed rings against the exact ring, {p} ranks on one node (shared "
              "memory): time over the exact ring's, repetition by repetition, median (min-max); "
              "the bound is every rank reading its input and writing its output once at "
              "memcpy speed, its ranks sharing the node's cores:", "",
              "| size | compressor | time ms | exact ring ms | ratio to exact ring | "
              "bound ms | of bound | reps |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {human_bytes(r['size_bytes'])} | {r['compressor']} | {r['time_s'] * 1e3:.2f} "
              f"| {r['base_s'] * 1e3:.2f} | {_ratio(r)} | {r['bound_s'] * 1e3:.2f} | "
              f"{r['of_bound']:.2f} | {r['reps']} |" for r in record["rings"]]
    lines += ["", f"The exact `auto` against MPI's own Allreduce, {p} ranks, paired the same "
              "way:", "", "| size | auto ms | MPI ms | ratio to MPI | reps |",
              "|---|---|---|---|---|"]
    lines += [f"| {human_bytes(r['size_bytes'])} | {r['time_s'] * 1e3:.3f} | "
              f"{r['base_s'] * 1e3:.3f} | {_ratio(r)} | {r['reps']} |" for r in record["auto"]]
    load = record["load"]
    lines += ["", f"Load average before and after: {load[0]:.2f}, {load[1]:.2f}."]
    return "\n".join(lines)


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
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds before one job is killed (default: 1800)")
    p.add_argument("--out", default="results/codecs-p4", help="output path prefix")
    p.set_defaults(run=main, mpi=False, check=check_args)


def check_args(args, parser) -> None:
    """What the options cannot say alone (parser.error on a bad value)."""
    if args.ranks < 2:
        parser.error(f"--ranks must be at least 2 (a ring), got {args.ranks}")
    if args.iters < 3:
        parser.error(f"--iters must be at least 3 (a median with a range), got {args.iters}")
    args.argv = [a for a in sys.argv[1:] if a != "codecs"]
