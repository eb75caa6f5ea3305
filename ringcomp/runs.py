"""Training runs from ``--metrics`` JSONL files: load, summarise over seeds, tabulate, plot."""

from __future__ import annotations

import json

import numpy as np

from ringcomp.plots import (
    legend_beside,
    method_style,
    pyplot,
    save_figure,
    series_style,
    whole_numbers,
)

#: where a step's wall time went (the rest: the step's statistics all-reduce, evaluation)
TIME_PARTS = ("compute_s", "exposed_comm_s", "update_s")


def load_run(path: str) -> dict:
    """``{"records": [per-step records], "summary": the summary record or None}``; a
    resumed run's file holds several summaries: the last one counts, steps are de-duplicated
    (the later record of a step wins)."""
    steps, summary = {}, None
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON record ({err})") from None
            if record.get("summary"):
                summary = record
            elif "step" in record:
                steps[record["step"]] = record
    if not steps and not (summary and summary.get("stopped")):  # a run may stop at step 0
        raise ValueError(f"{path}: no step records (write it with ringcomp.train --metrics)")
    return {"path": path, "records": [steps[k] for k in sorted(steps)], "summary": summary}


def steps_to(records: list[dict], target: float) -> int | None:
    """Steps taken when the test accuracy first reached ``target`` (None: never)."""
    for record in records:
        if record.get("test_acc") is not None and record["test_acc"] >= target:
            return record["step"] + 1
    return None


def _stopped(run: dict) -> bool:
    """Whether the run was stopped by a non-finite loss or gradient."""
    return bool(run["summary"] and run["summary"].get("stopped"))


def _final(records: list[dict], key: str):
    values = [r[key] for r in records if r.get(key) is not None]
    return values[-1] if values else None


def ci95(values: list[float]) -> float | None:
    """Half-width of the 95% Student-t interval of the mean of ``values`` (0 for one)."""
    if not values:
        return None
    if len(values) == 1:
        return 0.0
    from scipy import stats  # here: 1.3 s of CPU at import, and only result tables use it

    return float(stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1)
                 / np.sqrt(len(values)))


def paired_difference(runs: list[dict], reference: list[dict]) -> tuple[float, float] | None:
    """Mean and 95% half-width of the final test accuracy of ``runs`` minus that of
    ``reference``, pair by pair (the same seeds in the same order: the same data order and
    initial weights, so what a seed's luck does to both cancels, and the interval is
    narrower than the two groups' own); None unless every pair has both accuracies."""
    if len(runs) != len(reference) or not runs:
        return None
    pairs = [(None if _stopped(a) else _final(a["records"], "test_acc"),
              None if _stopped(b) else _final(b["records"], "test_acc"))
             for a, b in zip(runs, reference, strict=True)]
    if any(None in pair for pair in pairs):
        return None
    diffs = [a - b for a, b in pairs]
    return float(np.mean(diffs)), ci95(diffs)


def summarize(groups: dict[str, list[dict]], target: float) -> list[dict]:
    """One row per label over its runs (seeds): means (and the spread of test accuracy)."""
    rows = []
    for label, runs in groups.items():
        stopped = [run["summary"]["steps"] for run in runs if _stopped(run)]
        accs = [a for a in (_final(run["records"], "test_acc") for run in runs
                            if not _stopped(run)) if a is not None]
        reached = [steps_to(run["records"], target) for run in runs]
        measured = [run["records"] for run in runs if run["records"]]
        per_step = {key: float(np.mean([np.mean([r[key] for r in records])
                                        for records in measured])) if measured else np.nan
                    for key in ("wall_s", "wire_bytes", *TIME_PARTS)}
        rows.append({
            "label": label, "runs": len(runs), "steps": len(runs[0]["records"]),
            "test_acc": float(np.mean(accs)) if accs else None,
            "test_acc_std": float(np.std(accs)) if accs else None,
            "test_acc_ci95": ci95(accs),
            "loss": float(np.mean([_final(run["records"], "loss") for run in runs
                                   if not _stopped(run)] or [np.nan])),
            "steps_to_target": (float(np.mean(reached)) if None not in reached else None),
            "reached": sum(r is not None for r in reached),
            "diverged": len(stopped), "diverged_at": min(stopped, default=None), **per_step})
    return rows


def format_rows(rows: list[dict], target: float) -> str:
    head = (f"{'run':<24}{'runs':>5}{'steps':>7}{'test acc ±95%':>16}{'loss':>9}"
            f"{'steps to ' + format(target, 'g'):>14}{'wire KB/step':>14}{'ms/step':>9}"
            f"{'compute':>9}{'exp.comm':>9}{'update':>8}")
    lines = [head]
    for r in rows:
        acc = ("-" if r["test_acc"] is None
               else f"{r['test_acc']:.3f} ± {r['test_acc_ci95']:.3f}")
        if r["diverged"]:
            acc = (f"NaN @{r['diverged_at']}" if r["diverged"] == r["runs"]
                   else f"{acc} ({r['diverged']} NaN)")
        reach = ("never" if r["reached"] == 0 else f"{r['steps_to_target']:.0f}"
                 if r["steps_to_target"] is not None else f"{r['reached']}/{r['runs']} runs")
        lines.append(f"{r['label']:<24}{r['runs']:>5}{r['steps']:>7}{acc:>16}"
                     f"{r['loss']:>9.4f}{reach:>14}{r['wire_bytes'] / 1e3:>14.1f}"
                     f"{r['wall_s'] * 1e3:>9.2f}"
                     + "".join(f"{r[k] * 1e3:>{w}.2f}" for k, w in zip(TIME_PARTS, (9, 9, 8),
                                                                       strict=True)))
    return "\n".join(lines)


def _mean_curve(runs: list[dict], key: str) -> tuple[list[int], list[float]]:
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for r in run["records"]:
            if r.get(key) is not None:
                by_step.setdefault(r["step"] + 1, []).append(r[key])
    steps = sorted(by_step)
    return steps, [float(np.mean(by_step[s])) for s in steps]


def plot_runs(groups: dict[str, list[dict]], rows: list[dict], out: str,
              target: float | None = None) -> list[str]:
    """Loss and test accuracy against steps (mean over each label's runs) side by side,
    and where each step's time went. Writes ``out``.png and ``out``.svg."""
    plt = pyplot()
    fig, (loss_ax, acc_ax, time_ax) = plt.subplots(1, 3, figsize=(18, 5))
    for i, (label, runs) in enumerate(groups.items()):
        # a colour per run here (several share a compressor), never one colour and marker
        # for two
        style = {**method_style(label, i), **series_style(i), "markevery": 0.1,
                 "markersize": 4}
        steps, loss = _mean_curve(runs, "loss")
        window = max(1, len(steps) // 40)  # per-step losses are noisy: a running mean
        smooth = np.convolve(loss, np.ones(window) / window, mode="valid")
        loss_ax.plot(steps[window - 1:], smooth, **style, label=label)
        acc_ax.plot(*_mean_curve(runs, "test_acc"), **style, label=label)
    loss_ax.set(xlabel="step", ylabel="training loss (mean over runs, running mean)",
                yscale="log")
    acc_ax.set(xlabel="step", ylabel="test accuracy (mean over runs)")
    if target is not None:
        acc_ax.axhline(target, color="k", lw=0.8, alpha=0.5)
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        whole_numbers(ax.xaxis)
    legend_beside(acc_ax, fontsize=7)
    labels, left = [r["label"] for r in rows], np.zeros(len(rows))
    for key in (*TIME_PARTS, "other"):
        ms = np.array([(r["wall_s"] - sum(r[k] for k in TIME_PARTS) if key == "other"
                        else r[key]) * 1e3 for r in rows]).clip(min=0)
        time_ax.barh(labels, ms, left=left, label=key.removesuffix("_s"))
        left += ms
    time_ax.invert_yaxis()
    time_ax.set(xlabel="ms per step (rank 0, mean)", title="where a step's time went")
    legend_beside(time_ax, fontsize=8)
    time_ax.tick_params(axis="y", labelsize=7)
    return save_figure(fig, out)
