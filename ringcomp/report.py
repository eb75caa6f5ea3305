"""``python -m ringcomp.report {hops,train}``: error per hop from shadow traces; loss, accuracy
and time breakdown of training runs from their metrics files."""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from ringcomp.trace import format_shadow, shadow_table


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


_LINESTYLES = {"ring": "-", "tree": "--", "dbtree": "-.", "twostage": ":", "allgather": (0, (1, 4))}
_MARKERS = "osD^vP*X<>"


def method_style(method: str, index: int) -> dict:
    """Matplotlib style of ``algorithm+compressor``: colour by compressor, line by
    algorithm, so a method reads the same in every figure."""
    import matplotlib.pyplot as plt

    algorithm, _, compressor = method.partition("+")
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = palette[sum(map(ord, compressor)) % len(palette)]
    return {"color": colour, "linestyle": _LINESTYLES.get(algorithm, "-"),
            "marker": _MARKERS[index % len(_MARKERS)]}


def save_figure(fig, out: str) -> list[str]:
    """Write ``fig`` as ``out``.png and ``out``.svg, close it, return the paths."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    written = []
    for ext in ("png", "svg"):
        fig.savefig(f"{out}.{ext}", dpi=110)
        written.append(f"{out}.{ext}")
    plt.close(fig)
    return written


def plot_hops(tables: dict[str, list[dict]], out: str, metric: str = "rel_err") -> list[str]:
    """One panel per trace directory: ``metric`` against the number of ranks aggregated so
    far, a line per method and size. Writes ``out``.png and ``out``.svg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tables), figsize=(6.5 * len(tables), 4.8), squeeze=False)
    for ax, (name, rows) in zip(axes[0], tables.items(), strict=True):
        for i, key in enumerate(sorted({(r["alg"], r["bytes"]) for r in rows})):
            pts = sorted((r["contributors"], r[metric]) for r in rows
                         if (r["alg"], r["bytes"]) == key)
            ax.plot([k for k, _ in pts], [v for _, v in pts], **method_style(key[0], i),
                    label=f"{key[0]} ({key[1] // 1024} KiB)")
        ax.set_xlabel("ranks aggregated (hops + 1)")
        ax.set_ylabel({"rel_err": "relative L2 error vs exact partial sum",
                       "cosine": "cosine with exact partial sum",
                       "error": "rel. L2 error vs exact partial sum\n(mean of signs for "
                                "sign bits)"}.get(metric, metric))
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, out)


def report_train(args) -> int:
    from ringcomp import runs

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
        print(f"# wrote {path}")
    return 0


def main(argv=None) -> int:
    from ringcomp.cli import parse_list

    parser = argparse.ArgumentParser(
        prog="python -m ringcomp.report",
        description="Reports from ringcomp traces and metrics. `hops DIR...`: the shadow-mode "
                    "error after every hop, per method. `train FILE...`: loss and accuracy "
                    "curves and the time breakdown of training runs (table on stdout, plots "
                    "as PNG and SVG). `network FILE`: the network study's tables and plots "
                    "again from its JSON.")
    sub = parser.add_subparsers(dest="command", required=True)
    hops = sub.add_parser("hops", help="error versus hop from --trace DIR --shadow runs")
    hops.add_argument("dirs", nargs="+", metavar="DIR", help="trace directories")
    hops.add_argument("--out", default="hops", help="output path without extension")
    hops.add_argument("--metric", default="rel_err",
                      choices=("rel_err", "cosine", "rel_err_signs", "sign_agree"))
    train = sub.add_parser("train", help="curves and time breakdown from train --metrics files")
    train.add_argument("files", nargs="+", metavar="FILE", help="JSONL from train --metrics")
    train.add_argument("--labels", type=parse_list,
                       help="comma-separated run names (default: file names); files with "
                            "the same label are seeds of one run, averaged")
    train.add_argument("--target", type=float, default=0.9,
                       help="test accuracy for the steps-to-target column (default: 0.9)")
    train.add_argument("--out", default="train", help="output path without extension")
    network = sub.add_parser("network", help="tables and plots again from the JSON of "
                                             "experiments network")
    network.add_argument("file", metavar="FILE", help="PREFIX.json of experiments network")
    network.add_argument("--out", default="network", help="output path without extension")
    args = parser.parse_args(argv)
    if args.command == "train":
        return report_train(args)
    if args.command == "network":
        from ringcomp.experiments.network import summarize

        with open(args.file) as f:
            for path in summarize(json.load(f), args.out):
                print(f"# wrote {path}")
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
        print(f"# wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
