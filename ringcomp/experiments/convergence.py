"""The convergence study: the same training run under every aggregation scheme, over seeds.

Each method is a set of ``ringcomp.train`` options on top of a common base (by default the
MLP on digits, 20 epochs, batch 8 per rank, evaluation every 5 steps). Every (method, seed)
run writes its metrics to ``<out>-runs/<method>-seed<s>.jsonl`` (so ``python -m
ringcomp.report train`` can redraw any subset), and rank 0 prints the table of final test
accuracy (mean ± std over seeds), steps to the target accuracy and wire bytes per step,
and writes the plot and a JSON of the rows. A run that diverges (NaN/Inf: every rank stops
at the same step) is reported as such and the study goes on.
"""

from __future__ import annotations

import json
import os
import shlex

from ringcomp import runs
from ringcomp.cli import common_parser, parse_list
from ringcomp.experiments import start_runs
from ringcomp.train import run
from ringcomp.training.config import parse
from ringcomp.training.trainer import NonFinite
from ringcomp.transports import get_transport

#: name: training options. Names read algorithm+compressor[+ef] so plots colour them alike.
METHODS = {
    "ring": [],
    "ring+sign": ["--compressor", "sign"],  # cascading: decode, add, re-encode every hop
    "allgather+sign+ef": ["--algorithm", "allgather", "--compressor", "sign",
                          "--error-feedback"],  # EF-signSGD: scaled signs, summed
    "allgather+marsit": ["--algorithm", "allgather", "--compressor", "marsit"],  # majority
    "ring+marsit": ["--compressor", "marsit"],  # Marsit, K = infinity
    "ring+marsit-k100": ["--compressor", "marsit", "--marsit-k", "100"],
    "ring+topk+ef": ["--compressor", "topk", "--error-feedback"],
    "ring+countsketch": ["--compressor", "countsketch"],
    "ring+countsketch+ef": ["--compressor", "countsketch", "--error-feedback"],
    "twostage+sign+ef": ["--algorithm", "twostage", "--compressor", "sign",
                         "--error-feedback"],  # DeepSpeed's 1-bit all-reduce
}
DEFAULT_BASE = ("--model mlp --dataset digits --epochs 20 --batch-size 8 --lr 0.1 "
                "--eval-every 5")


def main(args) -> int:
    transport = get_transport()
    folder = start_runs(transport, args, METHODS)
    groups: dict[str, list[dict]] = {}
    for method in args.methods:
        for seed in args.seeds:
            path = os.path.join(folder, f"{method}-seed{seed}.jsonl")
            options = parse([*shlex.split(args.base), *METHODS[method], "--seed", str(seed),
                             "--metrics", path, "--no-progress"])
            try:
                summary = run(options, transport)
                outcome = (f"test accuracy {summary['test_acc']:.4f}, "
                           f"{summary['wall_s']:.1f} s")
            except NonFinite as err:  # raised on every rank at the same step: go on
                outcome = f"diverged: {err}"
            if transport.rank == 0:
                print(f"# {method} seed {seed}: {outcome}", flush=True)
                groups.setdefault(method, []).append(runs.load_run(path))
    if transport.rank != 0:
        return 0
    rows = runs.summarize(groups, args.target)
    print(f"# ringcomp.experiments convergence: {transport.size} ranks, seeds "
          f"{','.join(map(str, args.seeds))}, base: {args.base}")
    print(runs.format_rows(rows, args.target))
    written = runs.plot_runs(groups, rows, args.out, args.target)
    with open(f"{args.out}.json", "w") as f:
        json.dump({"ranks": transport.size, "seeds": args.seeds, "base": args.base,
                   "target": args.target, "rows": rows}, f, indent=1)
    for path in written + [f"{args.out}.json"]:
        print(f"# wrote {path}")
    return 0


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("convergence", parents=[common_parser()],
                       help="train the same model under every aggregation scheme, over seeds")
    p.add_argument("--methods", type=parse_list, default=list(METHODS),
                   help="method names (default: all: %(default)s)")
    p.add_argument("--seeds", type=lambda s: [int(x) for x in parse_list(s)],
                   default=[0, 1, 2], help="seeds per method (default: 0,1,2)")
    p.add_argument("--base", default=DEFAULT_BASE,
                   help="training options every method shares (default: %(default)r)")
    p.add_argument("--target", type=float, default=0.9,
                   help="test accuracy for the steps-to-target column (default: 0.9)")
    p.add_argument("--out", default="convergence",
                   help="output path prefix (default: %(default)s)")
    p.set_defaults(run=main, mpi=True)
