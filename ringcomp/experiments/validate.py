"""The model against the machine: predicted versus measured step time of ``train --plan``.

For every (method, plan) the training job profiles itself (forward/backward times, fitted
all-reduce costs), plans its buckets and predicts a step as forward + the plan's modelled
backward-and-communication time; then it trains ``--steps`` steps. The measured step is the
median wall time of the steps after the first three (warm-up). The model leaves out the
optimizer update and the step's small statistics all-reduce, so they are shown apart.
"""

from __future__ import annotations

import logging
import os
import shlex

import numpy as np

from ringcomp import runs
from ringcomp.cli import common_parser, out_path, parse_list
from ringcomp.experiments import start_runs
from ringcomp.log import Heartbeat
from ringcomp.results.blocks import renderer
from ringcomp.results.record import machine_load, provenance, write
from ringcomp.runner import run
from ringcomp.training.config import parse
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)

#: name: training options (on the default ring: ``sign`` and ``topk`` cascade hop by hop)
METHODS = {"none": [], "fp16": ["--compressor", "fp16"], "marsit": ["--compressor", "marsit"],
           "sign": ["--compressor", "sign"],
           "sign+ef": ["--compressor", "sign", "--error-feedback"],
           "qsgd": ["--compressor", "qsgd"],
           "topk+ef": ["--compressor", "topk", "--error-feedback"]}
DEFAULT_BASE = ("--model replay:resnet50 --replay-scale 0.1 --replay-tflops 0.5 "
                "--steps 20 --batch-size 8")


def measured(path: str, skip: int = 3) -> dict:
    """Medians over the steps after the first ``skip`` (warm-up), and the spread of the
    step time over them."""
    records = runs.load_run(path)["records"][skip:]
    walls = [r["wall_s"] for r in records]
    return {**{key: float(np.median([r[key] for r in records]))
               for key in ("wall_s", "compute_s", "exposed_comm_s", "update_s")},
            "wall_min_s": min(walls), "wall_max_s": max(walls), "timed_steps": len(walls)}


def main(args) -> int:
    transport = get_transport()
    before = machine_load() if transport.rank == 0 else None
    folder = start_runs(transport, args, METHODS)
    rows = []
    progress = Heartbeat(log, "validate: runs", len(args.methods) * len(args.plans))
    for method in args.methods:
        for plan in args.plans:
            path = os.path.join(folder, f"{method}-{plan.replace(':', '_')}.jsonl")
            options = parse([*shlex.split(args.base), *METHODS[method], "--plan", plan,
                             "--metrics", path, "--no-progress"])
            summary = run(options, transport)
            if transport.rank == 0:
                got = measured(path)
                rows.append({"method": method, "plan": plan, "buckets": summary["buckets"],
                             "compressed_buckets": summary["compressed_buckets"],
                             "predicted_s": summary["predicted_step_s"], **got,
                             "error": summary["predicted_step_s"] / got["wall_s"] - 1})
            progress(f"{method} {plan}")
    if transport.rank != 0:
        return 0
    print(f"# ringcomp.experiments validate: {transport.size} ranks, base: {args.base}")
    print(format_table(rows))
    prov = provenance(["mpiexec", "-n", str(transport.size), *args.command_line],
                      mpi_facts()["mpi_library"], before, ranks=transport.size,
                      placement="one node")
    write(f"{args.out}.json", "validate", prov,
                  {"ranks": transport.size, "base": args.base, "rows": rows})
    log.info(f"wrote {args.out}.json")
    return 0


def format_table(rows: list[dict]) -> str:
    """Predicted against measured step time per (method, plan), how many of its buckets
    the plan compressed, and the mean error."""
    lines = [f"{'method':<10}{'plan':<13}{'buckets':>8}{'compressed':>11}{'predicted ms':>14}"
             f"{'measured ms':>13}{'[min-max]':>15}{'error':>8}{'compute':>9}{'exp.comm':>10}"
             f"{'update':>8}"]
    for r in rows:
        spread = (f"[{r['wall_min_s'] * 1e3:.1f}-{r['wall_max_s'] * 1e3:.1f}]"
                  if "wall_min_s" in r else "-")
        # how many buckets the plan compressed (a planner may send every group exact)
        compressed = r.get("compressed_buckets", "-")
        lines.append(f"{r['method']:<10}{r['plan']:<13}{r['buckets']:>8}{compressed:>11}"
                     f"{r['predicted_s'] * 1e3:>14.1f}{r['wall_s'] * 1e3:>13.1f}{spread:>15}"
                     f"{100 * r['error']:>7.0f}%{r['compute_s'] * 1e3:>9.1f}"
                     f"{r['exposed_comm_s'] * 1e3:>10.1f}{r['update_s'] * 1e3:>8.1f}")
    errors = np.abs([r["error"] for r in rows])
    timed = {r.get("timed_steps") for r in rows}
    count = timed.pop() if len(timed) == 1 else None
    lines.append(f"# measured: median over {count or 'the'} timed steps (after 3 warm-up "
                 f"steps); mean |error| {100 * errors.mean():.0f}%, "
                 f"max {100 * errors.max():.0f}%")
    return "\n".join(lines)


@renderer("validate")
def render_one(record: dict) -> str:
    return (f"{record['ranks']} ranks, base: `{record['base']}`\n\n```text\n"
            f"{format_table(record['rows'])}\n```\n")


@renderer("validate", many=True)
def render_several(records: list[dict]) -> str:
    """One record: its table; several (one of them on 1 rank): the scaling table."""
    if len(records) == 1:
        return render_one(records[0])
    return (f"base: `{records[0]['base']}`\n\n```text\n{format_scaling(records)}\n```\n")


#: the single worker every scaling factor is measured against: exact, one message
SINGLE_WORKER = ("none", "modelwise")


def format_scaling(records: list[dict]) -> str:
    """Weak-scaling factors: one worker's step over the step at p workers (the batch per
    worker fixed; 100% = no cost of being distributed), measured and predicted.

    1. The single worker is the 1-rank record's exact model-wise row (nothing crosses a
       link); its measured and its predicted step are the numerators.
    2. For every (method, plan) of the other records: measured factor T1 / Tp, with the
       range T1 / Tp's slowest to T1 / Tp's fastest timed step, and the performance
       model's factor P1 / Pp from the same rows' predictions (the timeline
       ``ringcomp.simulate`` sweeps, fed each job's own profile and the all-reduce costs
       it fitted on its links).
    Invariant: every record shares one base (model, batch, steps), else nothing is
    compared.
    """
    bases = {r["base"] for r in records}
    if len(bases) != 1:
        raise ValueError(f"scaling compares runs of one base; these records hold {bases}")
    by_ranks = {r["ranks"]: r for r in records}
    if len(by_ranks) != len(records) or 1 not in by_ranks:
        raise ValueError("scaling needs one record per rank count, one of them on 1 rank; "
                         f"these have ranks {[r['ranks'] for r in records]}")
    single = {(r["method"], r["plan"]): r for r in by_ranks.pop(1)["rows"]}
    if SINGLE_WORKER not in single:
        raise ValueError(f"the 1-rank record has no {' '.join(SINGLE_WORKER)} row: the "
                         f"single worker scaling is measured against")
    one = single[SINGLE_WORKER]
    sizes = sorted(by_ranks)
    header = f"{'method':<10}{'plan':<13}" + "".join(
        f"{f'p={p}: step ms':>15}{'measured':>9}{'[range]':>12}{'model':>7}{'compr.':>8}"
        for p in sizes)
    lines = [header]
    rows = {p: {(r["method"], r["plan"]): r for r in by_ranks[p]["rows"]} for p in sizes}
    for key in dict.fromkeys(k for p in sizes for k in rows[p]):
        cells = []
        for p in sizes:
            r = rows[p].get(key)
            if r is None:
                cells.append(f"{'-':>15}{'-':>9}{'-':>12}{'-':>7}{'-':>8}")
                continue
            compressed = f"{r.get('compressed_buckets', '?')}/{r['buckets']}"
            spread = (f"[{100 * one['wall_s'] / r['wall_max_s']:.0f}-"
                      f"{100 * one['wall_s'] / r['wall_min_s']:.0f}]")
            cells.append(f"{r['wall_s'] * 1e3:>15.1f}{100 * one['wall_s'] / r['wall_s']:>8.0f}%"
                         f"{spread:>12}{100 * one['predicted_s'] / r['predicted_s']:>6.0f}%"
                         f"{compressed:>8}")
        lines.append(f"{key[0]:<10}{key[1]:<13}" + "".join(cells))
    for p in sizes:  # LayerFusion's claim: its scalability over layer-wise's, per method
        ratios = [f"{method} {rows[p][(method, 'layerwise')]['wall_s'] / r['wall_s']:.1f}x"
                  for (method, plan), r in rows[p].items()
                  if plan == "layerfusion" and (method, "layerwise") in rows[p]]
        if ratios:
            lines.append(f"# p={p}: layerfusion's factor over layerwise's (their steps' "
                         f"ratio): {', '.join(ratios)}")
    lines.append(f"# scaling factor = one worker's step / the step at p workers (weak "
                 f"scaling), in %; one worker: 1 rank, exact, model-wise: "
                 f"{one['wall_s'] * 1e3:.1f} ms measured, {one['predicted_s'] * 1e3:.1f} ms "
                 f"modelled; [range]: over the p-worker run's slowest to fastest timed step; "
                 f"model: the performance model's predicted steps in the same ratio; "
                 f"compr.: the plan's compressed buckets / its buckets")
    return "\n".join(lines)


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("validate", parents=[common_parser()],
                       help="predicted (profile + plan) versus measured train step time")
    p.add_argument("--methods", type=parse_list, default=["none", "marsit", "topk+ef"],
                   help=f"of {', '.join(METHODS)} (default: %(default)s)")
    p.add_argument("--plans", type=parse_list, default=["layerwise", "mgwfbp", "optimal"],
                   help="default: %(default)s")
    p.add_argument("--base", default=DEFAULT_BASE,
                   help="training options every run shares (default: %(default)r)")
    p.add_argument("--out", type=out_path, default="validate", help="output path prefix")
    p.set_defaults(run=main, mpi=True)
