"""The network study: every algorithm and compressor on rate-limited emulated links (root).

For each rate, one emulated cluster (``ringcomp.netns``) runs

1. ``ringcomp.bench`` across its hosts; rows gain the line-rate bound 2(p-1)/p·N/B of exact
   all-reduces, the speedup over the exact ring of the same size and rate, and the
   performance model's prediction (``sched.costs``: the measured per-message start-up, this
   machine's codec costs) with its error;
2. training steps of the replay models under every method (``network_steps``), measured
   and predicted from a profile taken on those links.

Break-even rates (where a compressed method's time crosses the exact baseline's) are found
on the measured points and on the model's, printed side by side and marked on the plots.
Not run under mpiexec: it launches the testbeds itself.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile

from ringcomp.cli import format_rate, out_path, parse_list
from ringcomp.cluster import run
from ringcomp.compression import get_compressor
from ringcomp.experiments import add_testbed_options, check_testbed_hosts, network_steps
from ringcomp.experiments.network_tables import break_evens, crossing, summarize
from ringcomp.experiments.validate import METHODS
from ringcomp.netns import Testbed, TestbedError
from ringcomp.results.record import machine_load, provenance, write
from ringcomp.sched.costs import Network, compressed_cost, exact_cost
from ringcomp.sched.planners import check_spec
from ringcomp.training.measure import measure_codec
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)

PREDICTED = ("ring", "tree", "allgather")  # algorithms with a cost formula


def bench_rows(testbed: Testbed, rate: float, args, folder: str) -> list[dict]:
    """``ringcomp.bench`` on the testbed at ``rate``; its JSON rows."""
    path = os.path.join(folder, f"bench-{int(rate)}.jsonl")
    command = ["python", "-m", "ringcomp.bench", "--sizes", args.sizes, "--algorithms",
               args.algorithms, "--compressors", args.compressors, "--iters",
               str(args.iters), "--json", path]
    status, _ = run(testbed, 1, command, args.timeout)
    if status != 0:
        raise SystemExit(f"ringcomp.bench failed on the {format_rate(rate)} testbed "
                         f"(exit {status})")
    with open(path) as f:
        return [{**json.loads(line), "rate_bps": rate} for line in f if line.strip()]


#: the largest exact ring whose time the model takes for start-ups alone (its bytes a
#: small part of it on every rate studied)
STARTUP_FROM_BYTES = 64 << 10


def startup_seconds(rows: list[dict], p: int) -> float | None:
    """alpha from the smallest exact ring: its time over its 2(p-1) messages; None where
    the smallest size is past ``STARTUP_FROM_BYTES`` (its time is mostly bytes: no model)."""
    ring = [r for r in rows if r["algorithm"] == "ring" and r["compressor"] == "none"]
    smallest = min(ring, key=lambda r: r["size_bytes"])
    if smallest["size_bytes"] > STARTUP_FROM_BYTES:
        return None
    return smallest["time_s"] / (2 * (p - 1))


def predict(row: dict, p: int, alpha: float, codecs: dict, cores: int) -> float | None:
    if row["algorithm"] not in PREDICTED:
        return None
    net = Network.of(row["rate_bps"], alpha)
    if row["compressor"] == "none":
        return exact_cost(row["algorithm"], p, row["size_bytes"], net)
    codec = codecs[row["compressor"]]
    share = max(1.0, p / cores)  # p ranks share this machine's cores
    return compressed_cost(row["algorithm"], p, row["size_bytes"], net,
                           get_compressor(row["compressor"]),
                           codec.scaled(share))


def annotate(rows: list[dict], p: int) -> None:
    codecs = {spec: measure_codec(get_compressor(spec))
              for spec in {r["compressor"] for r in rows} - {"none"}}
    alpha = {rate: startup_seconds([r for r in rows if r["rate_bps"] == rate], p)
             for rate in {r["rate_bps"] for r in rows}}
    ring = {(r["rate_bps"], r["size_bytes"]): r["time_s"] for r in rows
            if r["algorithm"] == "ring" and r["compressor"] == "none"}
    if None in alpha.values():
        log.warning(f"no model column: the smallest --sizes is past "
                    f"{STARTUP_FROM_BYTES >> 10} KB, so no exact ring measures the start-up "
                    "alone (add a small size, e.g. 4K)")
    for r in rows:
        r["bound_s"] = 2 * (p - 1) / p * r["size_bytes"] * 8 / r["rate_bps"]
        r["of_bound"] = r["bound_s"] / r["time_s"] if r["compressor"] == "none" else None
        r["vs_ring"] = ring[(r["rate_bps"], r["size_bytes"])] / r["time_s"]
        r["predicted_s"] = (None if alpha[r["rate_bps"]] is None else
                            predict(r, p, alpha[r["rate_bps"]], codecs, os.cpu_count() or 1))
        r["error"] = (r["predicted_s"] / r["time_s"] - 1) if r["predicted_s"] else None


def main(args) -> int:
    before = machine_load()
    rows, steps = [], []
    runs = f"{args.out}-runs"  # the training runs' metrics, for ringcomp.report train
    if args.models:
        os.makedirs(runs, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ringcomp-network-") as folder:
        for rate in args.rates:
            log.info(f"{format_rate(rate)}: {args.hosts} hosts x 1 rank")
            try:
                with Testbed(args.hosts, rate) as testbed:
                    if args.sizes:
                        rows += bench_rows(testbed, rate, args, folder)
                    if args.models:
                        steps += network_steps.step_rows(testbed, rate, args, runs)
            except TestbedError as err:  # not root, no namespaces: say so, no traceback
                raise SystemExit(f"ringcomp.experiments network: {err}") from None
    result: dict = {"hosts": args.hosts, "iters": args.iters}
    if rows:
        annotate(rows, args.hosts)
        result.update(rows=rows, break_even=break_evens(rows))
    if steps:
        network_steps.annotate(steps)
        result.update(steps=steps, steps_break_even=network_steps.break_evens(steps, crossing),
                      steps_plan=args.plan,
                      steps_base=network_steps.base_options("<model>", args))
    written = summarize(result, args.out)
    prov = provenance(["sudo", ".venv/bin/python", *args.command_line[1:]],
                      mpi_facts()["mpi_library"], before, ranks=args.hosts,
                      placement=f"{args.hosts} emulated hosts x 1 rank (network "
                                "namespaces on one machine, rate-limited veth links)")
    write(f"{args.out}.json", "network", prov, result)
    for path in written + [f"{args.out}.json"]:
        log.info(f"wrote {path}")
    return 0


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("network", help="every algorithm and compressor on emulated "
                                       "rate-limited links (root; not under mpiexec)")
    add_testbed_options(p, "100mbit,1gbit,10gbit")
    p.add_argument("--sizes", default="4K,256K,4M,64M", help="default: %(default)s")
    p.add_argument("--algorithms", default="ring,tree,auto,mpi,allgather",
                   help="the exact ring, every row's baseline, is always added (default: "
                        "%(default)s)")
    p.add_argument("--compressors", default="marsit,fp16,topk,sign",
                   help="default: %(default)s")
    p.add_argument("--iters", type=int, default=5,
                   help="timed repetitions; the tables give their median, min and max "
                        "(default: %(default)s)")
    p.add_argument("--models", type=parse_list, default=list(network_steps.MODELS),
                   help="replay models whose training steps are timed on every rate ('' "
                        "for none; default: %(default)s)")
    p.add_argument("--train-methods", type=parse_list, default=list(network_steps.METHODS),
                   help="validate's methods for the training steps; 'none' (the "
                        "uncompressed overlapped baseline) is always added (default: "
                        "%(default)s)")
    p.add_argument("--plan", default="mgwfbp",
                   help="fusion plan of every training run (default: %(default)s)")
    p.add_argument("--replay-scale", type=float, default=0.1,
                   help="fraction of every replay tensor and its compute (default: "
                        "%(default)s; 1 = the published sizes)")
    p.add_argument("--batch-size", type=int, default=32, help="default: %(default)s")
    p.add_argument("--replay-tflops", type=float, default=10.0,
                   help="emulated compute speed per rank (default: %(default)s)")
    p.add_argument("--steps", type=int, default=8,
                   help="training steps per run; the first 3 are warm-up (default: 8)")
    p.add_argument("--timeout", type=float, default=5400,
                   help="seconds before a command on a testbed (one bench, one model's "
                        "training jobs) is killed (default: 5400; the 100 Mbit/s bench, "
                        "out of place and in place, takes about 40 minutes)")
    p.add_argument("--out", type=out_path, default="network", help="output path prefix")
    p.set_defaults(run=main, mpi=False, check=check_args)


def check_args(args, parser) -> None:
    """What the options cannot say alone (parser.error on a bad combination)."""
    check_testbed_hosts(args, parser)
    algorithms = parse_list(args.algorithms)  # the exact ring is every row's baseline
    args.algorithms = ",".join(["ring"] + [a for a in algorithms if a != "ring"])
    if args.models:
        args.train_methods = ["none"] + [m for m in args.train_methods if m != "none"]
        unknown = sorted(set(args.train_methods) - set(METHODS))
        if unknown:
            parser.error(f"unknown --train-methods {unknown}; known: "
                         f"{', '.join(METHODS)}")
        unknown = sorted(set(args.models) - set(network_steps.MODELS))
        if unknown:
            parser.error(f"unknown --models {unknown}; known: "
                         f"{', '.join(network_steps.MODELS)}")
        if args.steps < 4:
            parser.error("--steps must be >= 4 (3 warm-up steps + at least one timed)")
        try:
            check_spec(args.plan)
        except ValueError as err:
            parser.error(f"--plan: {err}")
