"""``python -m ringcomp.report {hops,train,network,docs}``: error per hop from shadow traces; loss,
accuracy and time breakdown of training runs from their metrics files; the docs' generated
blocks from their records."""

from __future__ import annotations

import glob
import json
import logging
import os
import sys

from ringcomp import cli, runs
from ringcomp.cli import out_path, parse_list
from ringcomp.experiments import (  # noqa: F401 - they register their record renderers
    codecs,
    convergence,
    convergence_tables,
    hop_error,
    kernels,
    resnet50,
    time_to_accuracy,
    torch_tables,
    train_time,
    validate,
)
from ringcomp.experiments.network_tables import summarize
from ringcomp.plots import plot_hops
from ringcomp.results import (  # noqa: F401 - the tools' tables register their renderers
    benchtable,
    blocks,
    perftable,
    simtable,
)
from ringcomp.results.record import ROOT
from ringcomp.trace import format_shadow, shadow_table

log = logging.getLogger("ringcomp.report")  # not __name__: "__main__" under python -m


def load_records(directory: str) -> list[dict]:
    """Every record of every ``rank-*.jsonl`` in a trace directory."""
    paths = sorted(glob.glob(os.path.join(directory, "rank-*.jsonl")))
    if not paths:
        raise SystemExit(f"no rank-*.jsonl in {directory!r}: run with --trace DIR --shadow")
    records = []
    for path in paths:
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records


def report_train(args) -> int:
    labels = args.labels or [os.path.splitext(os.path.basename(p))[0] for p in args.files]
    if len(labels) != len(args.files):
        raise SystemExit(f"--labels names {len(labels)} runs but {len(args.files)} files "
                         f"were given")
    groups: dict[str, list[dict]] = {}
    for label, path in zip(labels, args.files, strict=True):
        try:
            groups.setdefault(label, []).append(runs.load_run(path))
        except (OSError, ValueError) as err:
            raise SystemExit(str(err)) from None
    rows = runs.summarize(groups, args.target)
    print(runs.format_rows(rows, args.target))
    for path in runs.plot_runs(groups, rows, args.out, args.target):
        log.info(f"wrote {path}")
    return 0


def report_docs(check: bool) -> int:
    differ = []
    for doc in blocks.documents():
        try:
            found = blocks.update_blocks(doc, check)
        except (OSError, ValueError, KeyError) as err:
            raise SystemExit(f"{os.path.relpath(doc, ROOT)}: {err}") from None
        differ += [f"{os.path.relpath(doc, ROOT)}: {path}" for path in found]
    for line in differ:
        print(("differs from its record: " if check else "re-rendered: ") + line)
    return 1 if check and differ else 0


def main(argv=None) -> int:
    parser = cli.Parser(
        prog="python -m ringcomp.report",
        description="Reports from ringcomp traces and metrics. `hops DIR...`: the shadow-mode "
                    "error after every hop, per method. `train FILE...`: loss and accuracy "
                    "curves and the time breakdown of training runs (table on stdout, plots "
                    "as PNG and SVG). `network FILE`: the network study's tables and plots "
                    "again from its JSON. `docs`: every generated block of README.md and "
                    "docs/ again from its record.")
    sub = parser.add_subparsers(dest="command", required=True)
    hops = sub.add_parser("hops", help="error versus hop from --trace DIR --shadow runs")
    hops.add_argument("dirs", nargs="+", metavar="DIR", help="trace directories")
    hops.add_argument("--out", type=out_path, default="hops",
                      help="output path without extension")
    hops.add_argument("--metric", default="rel_err",
                      choices=("rel_err", "cosine", "rel_err_signs", "sign_agree"))
    train = sub.add_parser("train", help="curves and time breakdown from train --metrics files")
    train.add_argument("files", nargs="+", metavar="FILE", help="JSONL from train --metrics")
    train.add_argument("--labels", type=parse_list,
                       help="comma-separated run names (default: file names); files with "
                            "the same label are seeds of one run, averaged")
    train.add_argument("--target", type=float, default=0.9,
                       help="test accuracy for the steps-to-target column (default: 0.9)")
    train.add_argument("--out", type=out_path, default="train",
                       help="output path without extension")
    network = sub.add_parser("network", help="tables and plots again from the JSON of "
                                             "experiments network")
    network.add_argument("file", metavar="FILE", help="PREFIX.json of experiments network")
    network.add_argument("--out", type=out_path, default="network",
                         help="output path without extension")
    docs = sub.add_parser("docs", help="re-render the generated blocks of README.md and docs/ "
                                       "from their records")
    docs.add_argument("--check", action="store_true",
                      help="change nothing; exit 1 listing every block that differs from "
                           "what its record renders")
    args = parser.parse_args(argv)
    if args.command == "docs":
        return report_docs(args.check)
    if args.command == "train":
        return report_train(args)
    if args.command == "network":
        with open(args.file) as f:
            for path in summarize(json.load(f), args.out):
                log.info(f"wrote {path}")
        return 0
    tables = {}
    for directory in args.dirs:
        rows = shadow_table(load_records(directory))
        if not rows:
            raise SystemExit(f"{directory!r} holds no shadow records: run with --shadow")
        p = max(r["contributors"] for r in rows)
        tables[f"{os.path.basename(os.path.normpath(directory))} (p = {p})"] = rows
        print(f"# {directory} (p = {p})")
        print(format_shadow(rows))
    for path in plot_hops(tables, args.out, args.metric):
        log.info(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
