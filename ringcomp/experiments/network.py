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
import math
import os
import tempfile

from ringcomp.cli import format_rate, human_bytes, out_path, parse_list
from ringcomp.cluster import run
from ringcomp.compression import get_compressor
from ringcomp.experiments import add_testbed_options, check_testbed_hosts, network_steps
from ringcomp.experiments.validate import METHODS
from ringcomp.netns import Testbed, TestbedError
from ringcomp.plots import legend_beside, method_style, pyplot, save_figure
from ringcomp.results.blocks import renderer
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


def table(rows: list[dict]) -> str:
    lines = [f"{'rate':<12}{'size':>10}  {'method':<20}{'ms':>10}{'of bound':>10}"
             f"{'vs ring':>9}{'model ms':>10}{'error':>8}"]
    for r in rows:
        method = r["algorithm"] + ("" if r["compressor"] == "none" else f"+{r['compressor']}")
        bound = "-" if r["of_bound"] is None else f"{100 * r['of_bound']:.0f}%"
        model = "-" if r["predicted_s"] is None else f"{1e3 * r['predicted_s']:.1f}"
        error = "-" if r["error"] is None else f"{100 * r['error']:+.0f}%"
        lines.append(f"{format_rate(r['rate_bps']):<12}{r['size_bytes']:>10}  {method:<20}"
                     f"{1e3 * r['time_s']:>10.1f}{bound:>10}{r['vs_ring']:>8.2f}x{model:>10}"
                     f"{error:>8}")
    return "\n".join(lines)


def break_even(method: list[tuple], ring: list[tuple]) -> list[float]:
    """Rates where a method's measured time crosses the ring's: (rate, seconds) points at
    the same rates, interpolated linearly in log-log between neighbours."""
    rings = dict(ring)
    gaps = [(math.log(b), math.log(t / rings[b])) for b, t in method if b in rings]
    found = [math.exp(x) for x, d in gaps if d == 0]  # equal at a measured rate
    found += [math.exp(x0 + (x1 - x0) * d0 / (d0 - d1))
              for (x0, d0), (x1, d1) in zip(gaps, gaps[1:], strict=False) if d0 * d1 < 0]
    return sorted(found)


def crossing(points: list[tuple], baseline: list[tuple]) -> dict:
    """Where ``points`` (rate, seconds) cross ``baseline``, and what that means."""
    rates = break_even(points, baseline)
    base = dict(baseline)
    faster = [t < base[b] for b, t in points if b in base]
    if rates:
        side = "pays off above" if faster[-1] and not faster[0] else "pays off below"
        text = f"{side} {' and '.join(format_rate(r) for r in rates)}"
    else:
        text = "faster at every rate" if all(faster) else "slower at every rate"
    return {"rates_bps": rates, "text": text}


def largest(rows: list[dict]) -> tuple[int, dict, dict]:
    """At the largest size: per method, measured and predicted (rate, seconds) points."""
    size = max(r["size_bytes"] for r in rows)
    measured: dict[tuple, list] = {}
    modelled: dict[tuple, list] = {}
    for r in sorted(rows, key=lambda r: r["rate_bps"]):
        if r["size_bytes"] == size:
            method = (r["algorithm"], r["compressor"])
            measured.setdefault(method, []).append((r["rate_bps"], r["time_s"]))
            if r["predicted_s"] is not None:
                modelled.setdefault(method, []).append((r["rate_bps"], r["predicted_s"]))
    return size, measured, modelled


def break_evens(rows: list[dict]) -> list[dict]:
    """Per compressed method at the largest size: crossings with the exact ring."""
    size, measured, modelled = largest(rows)
    ring = ("ring", "none")
    return [{"method": "+".join(m), "size_bytes": size,
             "measured": crossing(pts, measured[ring]),
             "model_says": crossing(modelled[m], modelled[ring]) if m in modelled else None}
            for m, pts in measured.items() if m[1] != "none"]


def plot(rows: list[dict], out: str) -> list[str]:
    """Time against bandwidth per method at the largest size, measured (markers) and
    modelled (thin dashed); where a compressed method crosses the exact ring, its
    break-even is marked: dotted measured, dash-dot model."""
    plt = pyplot()
    size, measured, modelled = largest(rows)
    ring = ("ring", "none")
    compressors = list(dict.fromkeys(c for _, c in measured))
    colours = plt.get_cmap("tab10").colors  # colour = compressor, line = algorithm
    fig, ax = plt.subplots(figsize=(11, 6))
    for i, ((algorithm, compressor), pts) in enumerate(measured.items()):
        style = {**method_style(f"{algorithm}+{compressor}", i),
                 "color": colours[compressors.index(compressor) % len(colours)]}
        ax.loglog([b / 1e9 for b, _ in pts], [1e3 * t for _, t in pts], **style,
                  label=f"{algorithm}+{compressor}" if compressor != "none" else algorithm)
        model_pts = modelled.get((algorithm, compressor), [])
        ax.loglog([b / 1e9 for b, _ in model_pts], [1e3 * t for _, t in model_pts],
                  color=style["color"], lw=0.8, ls="--")
        if compressor == "none":
            continue
        for points, base, ls in ((pts, measured[ring], ":"),
                                 (model_pts, modelled.get(ring, []), "-.")):
            for rate in break_even(points, base) if points and base else []:
                ax.axvline(rate / 1e9, color=style["color"], lw=0.9, ls=ls)
    ax.set(xlabel="link rate (Gbit/s)", ylabel=f"ms per all-reduce of {size >> 20} MB",
           title="time versus bandwidth (thin dashed: model)\nbreak-even with the exact "
                 "ring: dotted measured, dash-dot model")
    ax.grid(alpha=0.3, which="both")
    legend_beside(ax, fontsize=7)
    return save_figure(fig, out)


def describe(found: list[dict], what: str) -> str:
    lines = [f"# break-even with {what}: measured | model"]
    for b in found:
        name = " ".join(str(b[k]) for k in ("model", "method") if k in b)
        model = b["model_says"]["text"] if b["model_says"] else "-"
        lines.append(f"{name:<24}{b['measured']['text']:<36}| {model}")
    return "\n".join(lines)


def summarize(result: dict, out: str) -> list[str]:
    """Print the study's tables and break-evens, draw its plots; the paths written.
    Shared by the study and ``python -m ringcomp.report network`` (redraw from JSON)."""
    written = []
    if result.get("rows"):
        print(f"# ringcomp.experiments network: {result['hosts']} hosts, iters "
              f"{result.get('iters', '?')}")
        print(table(result["rows"]))
        print(describe(result["break_even"], "the exact ring"))
        written += plot(result["rows"], out)
    if result.get("steps"):
        print(f"# training steps: {result['hosts']} hosts, plan {result['steps_plan']}, "
              f"{result['steps_base']}")
        print(network_steps.table(result["steps"]))
        print(describe(result["steps_break_even"], "'none' (uncompressed, overlapped)"))
        written += network_steps.plot(result["steps"], f"{out}-steps", break_even)
    return written


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


def _method(row: dict) -> str:
    return row["algorithm"] + ("" if row["compressor"] == "none" else f" + {row['compressor']}")


def _ms(seconds: float) -> str:
    """Milliseconds to about three significant figures, never in exponent form."""
    ms = 1e3 * seconds
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def _spread_ms(median: float, low: float | None, high: float | None) -> str:
    """``median [min-max]`` in ms."""
    return _ms(median) if low is None else f"{_ms(median)} [{_ms(low)}-{_ms(high)}]"


def _allreduce_table(record: dict) -> list[str]:
    """At the largest size: per method and rate, median ms [min-max] over the repetitions,
    and % of the line-rate bound (exact) or the speedup over the exact ring (compressed)."""
    size = max(r["size_bytes"] for r in record["rows"])
    rows = [r for r in record["rows"] if r["size_bytes"] == size]
    rates = sorted({r["rate_bps"] for r in rows})
    cells: dict = {}
    for r in rows:
        times = r.get("times_s")
        text = _spread_ms(r["time_s"], min(times) if times else None,
                          max(times) if times else None)
        text += (f" ({100 * r['of_bound']:.0f}%)" if r["of_bound"] is not None
                 else f" ({r['vs_ring']:.2f}x)")
        if r["algorithm"] == "auto":
            text += f", chose {r['chosen']}"
        cells.setdefault(_method(r), {})[r["rate_bps"]] = text
    out = [f"**All-reduce of {human_bytes(size)}B** on {record['hosts']} hosts: ms, median "
           f"[min-max] over {record['iters']} repetitions; exact rows: % of the line-rate "
           "bound 2(p-1)/p·N/B; compressed rows: speedup over the exact ring's median.", "",
           "| method | " + " | ".join(format_rate(b) for b in rates) + " |",
           "|---|" + "---:|" * len(rates)]
    out += [f"| {method} | " + " | ".join(by_rate.get(b, "-") for b in rates) + " |"
            for method, by_rate in cells.items()]
    return out


def _steps_table(record: dict) -> list[str]:
    """Per replay model and method: median step ms [min-max], the speedup over 'none' and
    the model's prediction error."""
    rates = sorted({r["rate_bps"] for r in record["steps"]})
    cells: dict = {}
    for r in record["steps"]:
        text = _spread_ms(r["wall_s"], r.get("wall_min_s"), r.get("wall_max_s"))
        if r["method"] != network_steps.BASELINE:
            text += f", {r['vs_none']:.2f}x"
        cells.setdefault((r["model"], r["method"]), {})[r["rate_bps"]] = \
            f"{text}; model {100 * r['error']:+.0f}%"
    timed = {r.get("timed_steps") for r in record["steps"]}
    out = [f"**Training steps** (plan {record['steps_plan']}; `{record['steps_base']}`): ms "
           "per step, median [min-max] over "
           + (f"{timed.pop()} timed steps" if len(timed) == 1 and None not in timed
              else "the timed steps")
           + "; x = speedup over `none`, the uncompressed overlapped step; model = the "
             "performance model's prediction error.", "",
           "| model | method | " + " | ".join(format_rate(b) for b in rates) + " |",
           "|---|---|" + "---:|" * len(rates)]
    out += [f"| {model} | {method} | " + " | ".join(by_rate.get(b, "-") for b in rates)
            + " |" for (model, method), by_rate in cells.items()]
    return out


def _break_even_table(found: list[dict], what: str) -> list[str]:
    out = [f"**Break-even with {what}** (measured | model):", "",
           "| method | measured | model |", "|---|---|---|"]
    for b in found:
        name = " ".join(str(b[k]) for k in ("model", "method") if k in b)
        model = b["model_says"]["text"] if b["model_says"] else "-"
        out.append(f"| {name} | {b['measured']['text']} | {model} |")
    return out


@renderer("network")
def render(record: dict) -> str:
    """The all-reduce table at the largest size, the training-step table and both
    break-even tables, from a network study's record."""
    out: list[str] = []
    if record.get("rows"):
        out += [*_allreduce_table(record), "",
                *_break_even_table(record["break_even"], "the exact ring"), ""]
    if record.get("steps"):
        out += [*_steps_table(record), "",
                *_break_even_table(record["steps_break_even"], "`none`"), ""]
    return "\n".join(out)
