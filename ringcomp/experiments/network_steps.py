"""Training steps on the emulated links: the replay models under every method, measured and
predicted (the training half of ``python -m ringcomp.experiments network``).

On each rate's testbed, one ``experiments validate`` job per replay model trains every
method with the same fusion plan (default ``mgwfbp``: overlapped, merged buckets), so the
uncompressed overlapped baseline (``none``) is always a row. Each run profiles itself on
those links first, so its prediction (profiled forward + the plan's modelled backward and
communication) is the performance model's answer for exactly that network.
"""

from __future__ import annotations

import json
import os

from ringcomp.cli import format_rate
from ringcomp.cluster import run
from ringcomp.plots import legend_beside, method_style, pyplot, save_figure, series_style

MODELS = ("resnet50", "vgg16", "bert-base")
METHODS = ("none", "fp16", "marsit", "sign", "topk+ef")
BASELINE = "none"


def base_options(model: str, args) -> str:
    return (f"--model replay:{model} --replay-scale {args.replay_scale} --batch-size "
            f"{args.batch_size} --replay-tflops {args.replay_tflops} --steps {args.steps}")


def step_rows(testbed, rate: float, args, folder: str) -> list[dict]:
    """Every model x method trained on ``testbed``: ``validate``'s rows plus model, rate."""
    rows = []
    for model in args.models:
        out = os.path.join(folder, f"steps-{model}-{int(rate)}")
        command = ["python", "-m", "ringcomp.experiments", "validate", "--methods",
                   ",".join(args.train_methods), "--plans", args.plan, "--base",
                   base_options(model, args), "--out", out]
        status, _ = run(testbed, 1, command, args.timeout)
        if status != 0:
            raise SystemExit(f"training replay:{model} failed on the {format_rate(rate)} "
                             f"testbed (exit {status})")
        with open(f"{out}.json") as f:
            rows += [{**r, "model": model, "rate_bps": rate} for r in json.load(f)["rows"]]
    return rows


def annotate(rows: list[dict]) -> None:
    """Speedup over the uncompressed overlapped step, measured and as the model says."""
    base = {(r["model"], r["rate_bps"]): r for r in rows if r["method"] == BASELINE}
    for r in rows:
        b = base[(r["model"], r["rate_bps"])]
        r["vs_none"] = b["wall_s"] / r["wall_s"]
        r["model_vs_none"] = b["predicted_s"] / r["predicted_s"]


def table(rows: list[dict]) -> str:
    lines = [f"{'rate':<12}{'model':<10}{'method':<10}{'step ms':>9}{'vs none':>9}"
             f"{'compute':>9}{'exp.comm':>10}{'update':>8}{'model ms':>10}{'error':>8}"]
    for r in rows:
        lines.append(f"{format_rate(r['rate_bps']):<12}{r['model']:<10}{r['method']:<10}"
                     f"{1e3 * r['wall_s']:>9.1f}{r['vs_none']:>8.2f}x"
                     f"{1e3 * r['compute_s']:>9.1f}{1e3 * r['exposed_comm_s']:>10.1f}"
                     f"{1e3 * r['update_s']:>8.1f}{1e3 * r['predicted_s']:>10.1f}"
                     f"{100 * r['error']:>+7.0f}%")
    return "\n".join(lines)


def curves(rows: list[dict], model: str, key: str) -> dict[str, list[tuple]]:
    """method -> sorted (rate, seconds) of ``key`` (wall_s measured, predicted_s model)."""
    out: dict[str, list[tuple]] = {}
    for r in rows:
        if r["model"] == model:
            out.setdefault(r["method"], []).append((r["rate_bps"], r[key]))
    return {m: sorted(pts) for m, pts in out.items()}


def break_evens(rows: list[dict], crossing) -> list[dict]:
    """Per model and compressed method: where its step time crosses the baseline's,
    measured and modelled (``crossing(points, baseline)`` says it in words and rates)."""
    found = []
    for model in dict.fromkeys(r["model"] for r in rows):
        measured, modelled = curves(rows, model, "wall_s"), curves(rows, model, "predicted_s")
        for method in measured:
            if method != BASELINE:
                found.append({"model": model, "method": method,
                              "measured": crossing(measured[method], measured[BASELINE]),
                              "model_says": crossing(modelled[method], modelled[BASELINE])})
    return found


def plot(rows: list[dict], out: str, break_even) -> list[str]:
    """One panel per model: step time against link rate per method, measured (markers)
    and modelled (thin dashed); break-evens with the baseline dotted (measured) and
    dash-dotted (model)."""
    plt = pyplot()
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        measured, modelled = curves(rows, model, "wall_s"), curves(rows, model, "predicted_s")
        for i, method in enumerate(measured):  # a colour per method (names may collide)
            style = {**method_style(f"ring+{method}", i), **series_style(i)}
            pts, model_pts = measured[method], modelled[method]
            ax.loglog([b / 1e9 for b, _ in pts], [1e3 * t for _, t in pts], **style,
                      label=method)
            ax.loglog([b / 1e9 for b, _ in model_pts], [1e3 * t for _, t in model_pts],
                      color=style["color"], lw=0.8, ls="--")
            if method == BASELINE:
                continue
            for points, base, ls in ((pts, measured[BASELINE], ":"),
                                     (model_pts, modelled[BASELINE], "-.")):
                for rate in break_even(points, base):
                    ax.axvline(rate / 1e9, color=style["color"], lw=0.9, ls=ls)
        ax.set(xlabel="link rate (Gbit/s)", ylabel="ms per training step",
               title=f"replay {model}")
        ax.grid(alpha=0.3, which="both")
        legend_beside(ax, fontsize=7)
    fig.suptitle("training step versus bandwidth (thin dashed: model); break-even with "
                 "'none': dotted measured, dash-dot model", fontsize=9)
    return save_figure(fig, out)
