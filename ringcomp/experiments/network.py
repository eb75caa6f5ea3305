"""The network study: every algorithm and compressor on rate-limited emulated links (root).

For each rate, an emulated cluster (``ringcomp.netns``) runs ``ringcomp.bench`` across its
hosts; rows gain the line-rate bound 2(p-1)/p·N/B of exact all-reduces, the speedup over
the exact ring of the same size and rate, and the performance model's prediction
(``sched.costs``: the measured per-message start-up, this machine's codec costs) with its
error. Not run under mpiexec: it launches the testbeds itself.
"""

from __future__ import annotations

import json
import math
import os
import tempfile

from ringcomp.compression import get_compressor
from ringcomp.model import format_rate
from ringcomp.netns import Testbed
from ringcomp.sched.costs import Codec, Network, compressed_cost, exact_cost
from ringcomp.sched.workload import measure_codec
from ringcomp.testbed import run

PREDICTED = ("ring", "tree", "allgather")  # algorithms with a cost formula


def bench_rows(hosts: int, rate: float, args) -> list[dict]:
    """``ringcomp.bench`` on a fresh testbed at ``rate``; its JSON rows."""
    with tempfile.TemporaryDirectory(prefix="ringcomp-network-") as tmp, \
            Testbed(hosts, rate) as testbed:
        path = os.path.join(tmp, "bench.jsonl")
        command = ["python", "-m", "ringcomp.bench", "--sizes", args.sizes, "--algorithms",
                   args.algorithms, "--compressors", args.compressors, "--iters",
                   str(args.iters), "--json", path]
        status, _ = run(testbed, 1, command, args.timeout)
        if status != 0:
            raise SystemExit(f"ringcomp.bench failed on the {format_rate(rate)} testbed "
                             f"(exit {status})")
        with open(path) as f:
            return [{**json.loads(line), "rate_bps": rate} for line in f if line.strip()]


def startup_seconds(rows: list[dict], p: int) -> float:
    """alpha from the smallest exact ring: its time over its 2(p-1) messages."""
    ring = [r for r in rows if r["algorithm"] == "ring" and r["compressor"] == "none"]
    smallest = min(ring, key=lambda r: r["size_bytes"])
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
                           Codec(codec.a * share, codec.b * share))


def annotate(rows: list[dict], p: int) -> None:
    codecs = {spec: measure_codec(get_compressor(spec))
              for spec in {r["compressor"] for r in rows} - {"none"}}
    alpha = {rate: startup_seconds([r for r in rows if r["rate_bps"] == rate], p)
             for rate in {r["rate_bps"] for r in rows}}
    ring = {(r["rate_bps"], r["size_bytes"]): r["time_s"] for r in rows
            if r["algorithm"] == "ring" and r["compressor"] == "none"}
    for r in rows:
        r["bound_s"] = 2 * (p - 1) / p * r["size_bytes"] * 8 / r["rate_bps"]
        r["of_bound"] = r["bound_s"] / r["time_s"] if r["compressor"] == "none" else None
        r["vs_ring"] = ring[(r["rate_bps"], r["size_bytes"])] / r["time_s"]
        r["predicted_s"] = predict(r, p, alpha[r["rate_bps"]], codecs, os.cpu_count() or 1)
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
    return [math.exp(x0 + (x1 - x0) * d0 / (d0 - d1))
            for (x0, d0), (x1, d1) in zip(gaps, gaps[1:], strict=False) if d0 * d1 < 0]


def plot(rows: list[dict], out: str) -> list[str]:
    """Time against bandwidth per method at the largest size; where a compressed method's
    measured line crosses the exact ring's, its break-even is marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ringcomp.report import method_style, save_figure

    size = max(r["size_bytes"] for r in rows)
    at = [r for r in rows if r["size_bytes"] == size]
    methods = list(dict.fromkeys((r["algorithm"], r["compressor"]) for r in at))
    ring = sorted((r["rate_bps"], r["time_s"]) for r in at
                  if (r["algorithm"], r["compressor"]) == ("ring", "none"))
    compressors = list(dict.fromkeys(c for _, c in methods))
    colours = plt.get_cmap("tab10").colors  # colour = compressor, line = algorithm
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (algorithm, compressor) in enumerate(methods):
        pts = sorted((r["rate_bps"], r["time_s"]) for r in at
                     if (r["algorithm"], r["compressor"]) == (algorithm, compressor))
        style = {**method_style(f"{algorithm}+{compressor}", i),
                 "color": colours[compressors.index(compressor) % len(colours)]}
        ax.loglog([b / 1e9 for b, _ in pts], [1e3 * t for _, t in pts], **style,
                  label=f"{algorithm}+{compressor}" if compressor != "none" else algorithm)
        if compressor != "none":
            for rate in break_even(pts, ring):
                ax.axvline(rate / 1e9, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="link rate (Gbit/s)", ylabel=f"ms per all-reduce of {size >> 20} MB",
           title="time versus bandwidth (dotted: a compressor breaks even with the ring)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, out)


def main(args) -> int:
    rows = []
    for rate in args.rates:
        print(f"# {format_rate(rate)}: {args.hosts} hosts x 1 rank", flush=True)
        rows += bench_rows(args.hosts, rate, args)
    annotate(rows, args.hosts)
    print(f"# ringcomp.experiments network: {args.hosts} hosts, iters {args.iters}")
    print(table(rows))
    written = plot(rows, args.out)
    with open(f"{args.out}.json", "w") as f:
        json.dump({"hosts": args.hosts, "rows": rows}, f, indent=1)
    for path in written + [f"{args.out}.json"]:
        print(f"# wrote {path}")
    return 0
