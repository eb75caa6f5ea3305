"""The time-to-accuracy study's results from its record: the rows per method (median
time to the target, paired with the exact ring's run seed by seed), the table printed and
rendered into the docs, and the plot."""

from __future__ import annotations

import os
import shlex

import numpy as np

from ringcomp import runs
from ringcomp.cli import format_rate
from ringcomp.plots import legend_beside, method_style, pyplot, save_figure
from ringcomp.results.blocks import renderer

#: the timed variant every method's time is paired with, seed by seed
BASELINE = "ring"
WARMUP_STEPS = 1  # not timed: one-time start-up costs (the study's step 3)


def summarize(found: list[dict], exact: str = BASELINE) -> list[dict]:
    """Per rate x method: the time to the target over the seeds that reached it (median,
    min, max, mean and its 95% interval), and the speedup of the median over the exact
    ring's (the timed variant ``exact``) at the same rate (only where every seed of both
    reached it)."""
    rows = []
    for rate in sorted({r["rate_bps"] for r in found}):
        for method in dict.fromkeys(r["method"] for r in found):
            mine = [r for r in found if r["rate_bps"] == rate and r["method"] == method]
            done = [r["seconds"] for r in mine if r["seconds"] is not None]
            steps = [r["steps"] for r in mine if r["steps"] is not None]
            rows.append({"rate_bps": rate, "method": method, "lr": mine[0]["lr"],
                         "runs": len(mine), "reached": len(done),
                         "steps": float(np.median(steps)) if steps else None,
                         "step_s": float(np.median([r["step_s"] for r in mine])),
                         "seconds": float(np.median(done)) if done else None,
                         "seconds_min": min(done, default=None),
                         "seconds_max": max(done, default=None),
                         "seconds_mean": float(np.mean(done)) if done else None,
                         "seconds_ci95": runs.ci95(done),
                         "steps_agree": all(r["steps_agree"] for r in mine)})
    for row in rows:
        base = next(r for r in rows if r["rate_bps"] == row["rate_bps"]
                    and r["method"] == exact)
        row["speedup"] = (base["seconds"] / row["seconds"] if row["seconds"]
                          and base["seconds"] and row["reached"] == row["runs"]
                          and base["reached"] == base["runs"] else None)
    return rows


def _time(r: dict) -> str:
    if r["seconds"] is None:
        return "never"
    return (f"{r['seconds']:.3g} [{r['seconds_min']:.3g}-{r['seconds_max']:.3g}]"
            f" ({r['seconds_mean']:.3g} ± {r['seconds_ci95']:.2g})")


def table(rows: list[dict], target: float) -> str:
    lines = [f"{'rate':<11}{'method':<20}{'lr':>7}{'reached':>9}{'steps':>8}{'ms/step':>9}"
             f"   {'s to ' + format(target, '.4f') + ': median [min-max] (mean ±95%)':<48}"
             f"{'vs exact':>9}"]
    for r in rows:
        lines.append(f"{format_rate(r['rate_bps']):<11}{r['method']:<20}{r['lr']:>7g}"
                     f"{r['reached']:>5}/{r['runs']:<3}"
                     f"{'-' if r['steps'] is None else format(r['steps'], '.0f'):>8}"
                     f"{1e3 * r['step_s']:>9.1f}   {_time(r):<48}"
                     f"{'-' if r['speedup'] is None else format(r['speedup'], '.2f') + 'x':>9}"
                     + ("" if r["steps_agree"] else "  (steps differ from tuning)"))
    return "\n".join(lines)


@renderer("time-to-accuracy")
def render(record: dict) -> str:
    """The tuning's outcome, then per rate and method the time to the target."""
    tuned, base = record["tuning"], record["tuning"]["baseline"]
    how = tuned["provenance"]
    # records before provenance quoted its words printed --base's value bare: quote it
    command = how["command"].replace(f"--base {tuned['base']} ",
                                     f"--base {shlex.quote(tuned['base'])} ", 1)
    seeds = ", ".join(map(str, record["seeds"]))
    if "margin" in base:  # tuned with the exact ring's own variants and a margin
        ending = (f"{base['test_acc']:.4f} ± {base['test_acc_ci95']:.4f} (mean and 95% "
                  f"interval over seeds {seeds}): target {record['target']:.4f} (that minus "
                  f"{base['margin']:.4f}, the larger of --near {tuned['near']:g} and the "
                  f"interval's half-width). Every method's rate, the exact ring's "
                  f"variants' too, was tuned for the fewest steps to it")
        added = tuned.get("refined", {})  # tunings before equal budgets have none
        budget = ("; configurations swept (variants x rates): " + ", ".join(
            f"{k} {v}" + (f" ({len(added[k])} of them rates added to equal the most)"
                          if added.get(k) else "")
            for k, v in tuned["configurations"].items()))
    else:
        ending = (f"{base['test_acc']:.4f} (mean of seeds {seeds}): target "
                  f"{record['target']:.4f} (that minus {tuned['near']:g}). Every method's "
                  f"rate was tuned for the fewest steps to it")
        budget = ""
    out = [f"Tuned by `{command}` (commit {how['commit'][:10]}, {how['date']}). "
           f"{record['hosts']} hosts x {record['ranks_per_host']} rank(s), `{record['base']}`; "
           f"tuned for accuracy, the exact ring (lr {base['lr']:g}) ends at test accuracy "
           f"{ending} on the validation split (sweep seeds "
           f"{', '.join(map(str, tuned['sweep_seeds']))}; tuned steps to the validation "
           f"target {tuned['target_validation']:.4f}{budget}):", "",
           "| method | rate (steps to validation target) per lr swept | lr | goes on |",
           "|---|---|---:|---|"]
    for method, t in tuned["tuned"].items():
        swept = ", ".join(f"{float(lr):g}: {'-' if v is None else format(v, '.0f')}"
                          for lr, v in sorted(t["steps"].items(), key=lambda kv: float(kv[0])))
        out.append(f"| {method} | {swept} | {t['lr']:g} | "
                   f"{'yes' if method in tuned['methods'] else 'no'} |")
    exact = tuned.get("exact", BASELINE)
    out += ["", "Seconds of training to the target, median [min-max] over the seeds that "
            "reached it (mean ± 95% interval); x = speedup of the median over the exact "
            f"ring's ({exact}) at that rate (only where every seed of both reached it):", "",
            "| link | method | reached | steps | ms/step | seconds to target | vs exact |",
            "|---|---|---:|---:|---:|---|---:|"]
    for r in record["rows"]:
        steps = "-" if r["steps"] is None else f"{r['steps']:.0f}"
        speed = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        flag = "" if r["steps_agree"] else " (steps differ from tuning)"
        out.append(f"| {format_rate(r['rate_bps'])} | {r['method']} (lr {r['lr']:g}) | "
                   f"{r['reached']}/{r['runs']} | {steps} | {1e3 * r['step_s']:.1f} | "
                   f"{_time(r)}{flag} | {speed} |")
    return "\n".join(out) + "\n"


def plot(found: list[dict], folder: str, target: float, out: str) -> list[str]:
    """Test accuracy against training seconds, one panel per rate, every seed a line."""
    plt = pyplot()
    rates = sorted({r["rate_bps"] for r in found})
    fig, axes = plt.subplots(1, len(rates), figsize=(7 * len(rates), 5), squeeze=False)
    methods = list(dict.fromkeys(r["method"] for r in found))
    for ax, rate in zip(axes[0], rates, strict=True):
        for i, method in enumerate(methods):
            style = {**method_style(method, i), "markevery": 0.2, "markersize": 4}
            for r in (r for r in found if r["rate_bps"] == rate and r["method"] == method):
                records = runs.load_run(os.path.join(
                    folder, f"{int(rate)}-{method}-seed{r['seed']}.jsonl"))["records"]
                seconds = np.cumsum([0.0 if i < WARMUP_STEPS else rec["wall_s"]
                                     for i, rec in enumerate(records)])
                points = [(s, rec["test_acc"]) for s, rec in zip(seconds, records, strict=True)
                          if rec.get("test_acc") is not None]
                ax.plot(*zip(*points, strict=True), **style,
                        label=method if r["seed"] == found[0]["seed"] else None)
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.set(xscale="log", xlabel="training seconds (evaluations excluded)",
               ylabel="test accuracy", title=f"{format_rate(rate)} links")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())  # they overlap on short spans
        legend_beside(ax, fontsize=8)
    return save_figure(fig, out)
