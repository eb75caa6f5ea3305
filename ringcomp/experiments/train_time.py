"""``python -m ringcomp.experiments train-time``: a training job's wall time per method.

Does a compressed run of ``ringcomp.train`` take longer than the exact one, and where does
its time go? Each repetition launches ``mpiexec -n RANKS python -m ringcomp.train`` once per
method (the same model, data, steps and seed; only ``--compressor`` and its options
differ), the methods interleaved repetition by repetition, so each repetition gives a
paired ratio to the exact run that a change of the machine's load moves alike. From each
job's summary record: the training loop's wall time (the job's start-up and the kernels'
loading before the first step are not in it), the time in collectives, the part of it the
steps waited for, and the bytes a rank sent. Not under mpiexec: it launches its jobs.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from ringcomp.checks import probe_writable
from ringcomp.cli import out_path, parse_list
from ringcomp.log import Heartbeat
from ringcomp.results.blocks import renderer
from ringcomp.results.record import machine_load, provenance, write
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)

#: what each method adds to the training command (the exact ring first: the ratios' base)
METHODS = {"exact": "", "marsit": "--compressor marsit", "sign": "--compressor sign",
           "sign+ef": "--compressor sign --error-feedback", "qsgd": "--compressor qsgd",
           "topk+ef": "--compressor topk:ratio=0.01 --error-feedback"}
#: what the summary record says, kept per repetition
KEPT = ("wall_s", "comm_s", "exposed_comm_s", "compute_s", "wire_bytes")


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("train-time", help="ringcomp.train's wall time per method, paired "
                                          "with the exact run (launches its own jobs)")
    p.add_argument("--ranks", type=int, default=4, help="ranks per job (default: 4)")
    p.add_argument("--methods", type=parse_list, default=["exact", "marsit", "sign"],
                   help=f"of {', '.join(METHODS)} (default: exact,marsit,sign; exact is "
                        "always run, first)")
    p.add_argument("--repeats", type=int, default=5,
                   help="jobs per method, interleaved (default: 5)")
    p.add_argument("--train-args", default="--steps 200",
                   help="the training job's options besides the method's (default: "
                        "'--steps 200': the default MLP on its synthetic data)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per job")
    p.add_argument("--out", type=out_path, default=None,
                   help="write OUT.json, a record (default: print only)")
    p.set_defaults(run=main, mpi=False, check=check_args)


def check_args(args, parser) -> None:
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; known: {', '.join(METHODS)}")
    if args.ranks < 1 or args.repeats < 1:
        parser.error("--ranks and --repeats must be at least 1")
    if "--compressor" in args.train_args or "--metrics" in args.train_args:
        parser.error("--train-args: the study sets --compressor (per method) and --metrics "
                     "itself")
    args.methods = ["exact"] + [m for m in dict.fromkeys(args.methods) if m != "exact"]


def run_job(args, method: str, folder: str, rep: int) -> dict:
    """One training job; its summary record's ``KEPT`` values."""
    metrics = os.path.join(folder, f"{method}-{rep}.jsonl")
    command = [shutil.which("mpiexec") or "mpiexec", "-n", str(args.ranks), sys.executable,
               "-m", "ringcomp.train", *shlex.split(args.train_args),
               *shlex.split(METHODS[method]), "--metrics", metrics]
    log.info(shlex.join(command))
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode:
        raise SystemExit(f"train-time: {shlex.join(command)} failed (exit {done.returncode})"
                         f":\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    with open(metrics) as f:
        summary = [r for r in map(json.loads, f) if r.get("summary")][-1]
    return {key: summary[key] for key in KEPT}


def paired(runs: dict, method: str) -> dict:
    """``method``'s wall time over the exact run's of the same repetition: median, min,
    max."""
    ratios = np.array([r["wall_s"] for r in runs[method]]) / np.array(
        [r["wall_s"] for r in runs["exact"]])
    return {"median": float(np.median(ratios)), "min": float(ratios.min()),
            "max": float(ratios.max())}


def main(args) -> int:
    if args.out:  # the record is written after minutes of jobs: fail before the first
        try:
            probe_writable(f"{args.out}.json")
        except OSError as err:
            raise SystemExit(f"train-time: --out: {err}") from None
    before = machine_load()
    runs: dict = {m: [] for m in args.methods}
    beat = Heartbeat(log, "train-time: jobs run")
    with tempfile.TemporaryDirectory(prefix="ringcomp-train-time-") as folder:
        for rep in range(args.repeats):
            for method in args.methods:
                runs[method].append(run_job(args, method, folder, rep))
                beat(f"{method} #{rep + 1}")
    rows = [{"method": m, "train_args": METHODS[m], "runs": runs[m],
             "vs_exact": paired(runs, m)} for m in args.methods]
    data = {"ranks": args.ranks, "train_args": args.train_args, "repeats": args.repeats,
            "rows": rows}
    print(render(data), end="")
    if args.out:
        prov = provenance(args.command_line, mpi_facts()["mpi_library"], before,
                          ranks=args.ranks, placement="one node")
        write(f"{args.out}.json", "train-time", prov, data)
        log.info(f"wrote {args.out}.json")
    return 0


def _spread(values: list[float], scale: float = 1.0, digits: str = ".3g") -> str:
    """'median [min-max]' of ``values`` times ``scale``."""
    v = np.array(values) * scale
    return f"{np.median(v):{digits}} [{v.min():{digits}}-{v.max():{digits}}]"


@renderer("train-time")
def render(record: dict) -> str:
    """One row per method: the training loop's wall time, its ratio to the exact run of the
    same repetition, the time in collectives and the part the steps waited for (median
    [min-max] over the repetitions), and the bytes a rank sent."""
    lines = [f"`ringcomp.train {record['train_args']}` at {record['ranks']} ranks, "
             f"{record['repeats']} jobs per method, interleaved; median [min-max] over them:",
             "", "| method | options | wall s | vs exact | in collectives s | waited for s "
             "| MB sent per rank |", "|---|---|---:|---:|---:|---:|---:|"]
    for row in record["rows"]:
        runs, ratio = row["runs"], row["vs_exact"]
        lines.append(
            f"| {row['method']} | {row['train_args'] or '-'} | "
            f"{_spread([r['wall_s'] for r in runs])} | "
            f"{ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}] | "
            f"{_spread([r['comm_s'] for r in runs])} | "
            f"{_spread([r['exposed_comm_s'] for r in runs])} | "
            f"{np.median([r['wire_bytes'] for r in runs]) / 1e6:.3g} |")
    return "\n".join(lines) + "\n"
