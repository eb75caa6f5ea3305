"""The network study's results from its record: its tables (printed, and rendered into
the docs: the all-reduce at the largest size per rate, the training steps, both
break-even tables), its break-evens and its plots."""

from __future__ import annotations

import math

from ringcomp.cli import format_rate, human_bytes
from ringcomp.experiments import network_steps
from ringcomp.plots import legend_beside, method_style, pyplot, save_figure
from ringcomp.results.blocks import renderer


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
