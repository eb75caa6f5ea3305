"""The time-to-accuracy study's results from its record: per link, repeat and method the
time to the target's sustained crossing, paired with the exact ring's seed by seed (the
verdict), its split into steps and time per step, the verdicts that hold in every repeat;
the table printed and rendered into the docs, and the plot."""

from __future__ import annotations

import os

import numpy as np

from ringcomp import runs
from ringcomp.cli import format_rate
from ringcomp.experiments.crossing import paired_ratio, verdict
from ringcomp.plots import legend_beside, method_style, pyplot, save_figure
from ringcomp.results.blocks import renderer

WARMUP_STEPS = 1  # not timed: one-time start-up costs (the study's step 3)


def _per_seed(found: list[dict], rate: float, repeat: int, method: str, key: str) -> list:
    return [r[key] for r in sorted((r for r in found if r["rate_bps"] == rate
                                    and r["repeat"] == repeat and r["method"] == method),
                                   key=lambda r: r["seed"])]


def summarize(found: list[dict], exact: str) -> list[dict]:
    """Per link x repeat x method: seeds that got there, median steps and ms per step, the
    time to the target (median, min, max over the seeds that got there) and, seed by seed
    against the exact ring's variant ``exact``: the time ratio (the verdict), the steps
    ratio and the time-per-step ratio."""
    rows = []
    for rate in sorted({r["rate_bps"] for r in found}):
        for repeat in sorted({r["repeat"] for r in found}):
            base = {k: _per_seed(found, rate, repeat, exact, k)
                    for k in ("seconds", "steps", "step_s")}
            for method in dict.fromkeys(r["method"] for r in found):
                mine = {k: _per_seed(found, rate, repeat, method, k)
                        for k in ("seconds", "steps", "step_s", "lr", "steps_agree")}
                done = [s for s in mine["seconds"] if s is not None]
                timed = [s for s in mine["step_s"] if s is not None]
                time_ratio = paired_ratio(mine["seconds"], base["seconds"])
                rows.append({
                    "rate_bps": rate, "repeat": repeat, "method": method,
                    "lr": mine["lr"][0], "runs": len(mine["seconds"]),
                    "reached": len(done),
                    "steps": float(np.median([s for s in mine["steps"] if s is not None]))
                    if done else None,
                    "step_s": float(np.median(timed)) if timed else None,
                    "seconds": float(np.median(done)) if done else None,
                    "seconds_min": min(done, default=None),
                    "seconds_max": max(done, default=None),
                    "vs_exact": time_ratio, "verdict": verdict(time_ratio),
                    "steps_ratio": paired_ratio(mine["steps"], base["steps"]),
                    "step_time_ratio": paired_ratio(mine["step_s"], base["step_s"]),
                    "steps_agree": all(mine["steps_agree"])})
    return rows


def findings(rows: list[dict]) -> dict:
    """Per link and method: the verdict every repeat gave, or ``unstable``."""
    out = {}
    for r in rows:
        key = (r["rate_bps"], r["method"])
        out[key] = r["verdict"] if out.get(key, r["verdict"]) == r["verdict"] else "unstable"
    return out


def _ratio(r: dict | None) -> str:
    return "-" if r is None else f"{r['ratio']:.2f} [{r['low']:.2f}-{r['high']:.2f}]"


def _swept_cell(tuned: dict, lr: str, n: int) -> str:
    """``lr: mean steps`` of one swept rate, ``(k/n)`` where only k sweep seeds got there."""
    v, k = tuned["steps"][lr], sum(x is not None for x in tuned["steps_seeds"][lr])
    return f"{float(lr):g}: " + ("-" if v is None else f"{v:.0f}" + (
        "" if k == n else f" ({k}/{n})"))


def _time(r: dict) -> str:
    if r["seconds"] is None:
        return "never"
    return f"{r['seconds']:.3g} [{r['seconds_min']:.3g}-{r['seconds_max']:.3g}]"


def table(rows: list[dict], target: float) -> str:
    lines = [f"{'rate':<11}{'rep':>4} {'method':<22}{'lr':>8}{'reached':>9}{'steps':>7}"
             f"{'ms/step':>9}  {'s to ' + format(target, '.4f') + ' [min-max]':<24}"
             f"{'time vs exact':>20}{'steps vs exact':>20}  verdict"]
    for r in rows:
        lines.append(f"{format_rate(r['rate_bps']):<11}{r['repeat']:>4} {r['method']:<22}"
                     f"{r['lr']:>8g}{r['reached']:>5}/{r['runs']:<3}"
                     f"{'-' if r['steps'] is None else format(r['steps'], '.0f'):>7}"
                     f"{'-' if r['step_s'] is None else format(1e3 * r['step_s'], '.1f'):>9}"
                     f"  {_time(r):<24}{_ratio(r['vs_exact']):>20}"
                     f"{_ratio(r['steps_ratio']):>20}  {r['verdict']}"
                     + ("" if r["steps_agree"] else "  (numbers differ from tuning)"))
    return "\n".join(lines)


@renderer("time-to-accuracy")
def render(record: dict) -> str:
    """The tuning's outcome, then per link, repeat and method the time to the target and
    its ratio to the exact ring's, then the findings that hold in every repeat."""
    tuned, base = record["tuning"], record["tuning"]["baseline"]
    how, n = tuned["provenance"], len(tuned["sweep_seeds"])
    seeds = ", ".join(map(str, record["seeds"]))
    out = [f"Tuned by `{how['command']}` (commit {how['commit'][:10]}, {how['date']}). "
           f"{record['hosts']} hosts x {record['ranks_per_host']} rank(s), `{record['base']}`."
           f" Tuned for accuracy, the exact ring (lr {base['lr']:g}) ends at a test level "
           f"(mean of its last {tuned['window']} evaluations) of {base['test_acc']:.4f} over "
           f"seeds {seeds}, {base['test_acc_min']:.4f} on the lowest: target "
           f"{record['target']:.4f}, {base['margin']:.4f} below the mean (the larger of "
           f"--near {tuned['near']:g} and the 95% interval, and at least half --near below "
           f"every seed). Steps count to the sustained crossing: the first evaluation from "
           f"which the mean of {tuned['window']} evaluations stays at or above the target to "
           f"the run's end. Every method's rate, the exact ring's variants' too, was tuned "
           f"for the fewest steps to the validation target {tuned['target_validation']:.4f} "
           f"on {n} sweep seeds ({', '.join(map(str, tuned['sweep_seeds']))}): a rate scores "
           f"the seeds that got there, then their mean steps; every timed method's grid "
           f"refined until the rates beside its best are at most {tuned['resolution']:g}x "
           "apart. Steps to the validation target per rate (mean; k/n: only k sweep seeds got "
           "there; -: none):", "",
           "| method | steps per lr swept | lr | rates beside it | goes on |",
           "|---|---|---:|---|---|"]
    for method, t in tuned["tuned"].items():
        swept = ", ".join(_swept_cell(t, lr, n) for lr in
                          sorted(t["steps"], key=float))
        gaps = tuned["gaps"].get(method)
        out.append(f"| {method} | {swept} | {t['lr']:g} | "
                   + ("-" if gaps is None else " and ".join(f"{g:.2f}x" for g in gaps))
                   + f" | {'yes' if method in tuned['methods'] else 'no'} |")
    out += ["", f"Seconds of training to the target, median [min-max] over the seeds that "
            f"got there; vs exact: the time over the exact ring's ({tuned['exact']}) on the "
            "same seed, geometric mean [95% interval]; its split into steps (the method's) "
            "and time per step (this implementation's on these cores); the verdict where the "
            "interval leaves out 1:", "",
            "| link | repeat | method | reached | steps | ms/step | seconds to target | "
            "time vs exact | steps vs exact | step time vs exact | verdict |",
            "|---|---:|---|---:|---:|---:|---|---|---|---|---|"]
    for r in record["rows"]:
        steps = "-" if r["steps"] is None else f"{r['steps']:.0f}"
        ms = "-" if r["step_s"] is None else f"{1e3 * r['step_s']:.1f}"
        flag = "" if r["steps_agree"] else " (numbers differ from tuning)"
        out.append(f"| {format_rate(r['rate_bps'])} | {r['repeat'] + 1} | {r['method']} "
                   f"(lr {r['lr']:g}) | {r['reached']}/{r['runs']} | {steps} | {ms} | "
                   f"{_time(r)}{flag} | {_ratio(r['vs_exact'])} | {_ratio(r['steps_ratio'])}"
                   f" | {_ratio(r['step_time_ratio'])} | {r['verdict']} |")
    found = findings(record["rows"])
    out += ["", f"Findings: the verdict against the exact ring where all {record['repeats']} "
            "repeats give it, else unstable:", "",
            "| link | " + " | ".join(m for m in tuned["methods"] if m != tuned["exact"])
            + " |", "|---|" + "---|" * (len(tuned["methods"]) - 1)]
    for rate in sorted({k[0] for k in found}):
        out.append(f"| {format_rate(rate)} | " + " | ".join(
            found[(rate, m)] for m in tuned["methods"] if m != tuned["exact"]) + " |")
    return "\n".join(out) + "\n"


def plot(found: list[dict], folder: str, target: float, out: str) -> list[str]:
    """Test accuracy against training seconds up to the sustained crossing, one panel per
    rate, every seed of the first repeat a line."""
    plt = pyplot()
    rates = sorted({r["rate_bps"] for r in found})
    fig, axes = plt.subplots(1, len(rates), figsize=(7 * len(rates), 5), squeeze=False)
    methods = list(dict.fromkeys(r["method"] for r in found))
    for ax, rate in zip(axes[0], rates, strict=True):
        for i, method in enumerate(methods):
            style = {**method_style(method, i), "markevery": 0.2, "markersize": 4}
            for r in (r for r in found if r["rate_bps"] == rate and r["method"] == method
                      and r["repeat"] == 0 and r["steps"] is not None):
                records = runs.load_run(os.path.join(
                    folder, f"{int(rate)}-{method}-seed{r['seed']}-r0.jsonl"))["records"]
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
