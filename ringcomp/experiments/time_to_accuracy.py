"""Time to accuracy on the emulated links: wall-clock training time until a target test
accuracy, the exact ring against compressed methods, each at its own tuned rate (root).

1. Tune on this machine's shared memory, where a run is quick (the links change the time a
   step takes, never the numbers it computes): ``experiments convergence --tasks custom``
   with ``--base``, ``--methods``, ``--lrs`` and ``--seeds`` picks every method's best rate
   on the validation split and trains every seed at it, recording the steps each needs to
   reach ``--target`` on the test set.
2. For every ``--rates`` value, one testbed of ``--hosts`` x ``--ranks-per-host`` (the same
   rank count) trains every method x seed at its rate with ``--stop-at`` the target: the
   run ends after the first evaluation at or above it.
3. Time to accuracy = the sum of the steps' wall times up to that evaluation, the first step
   left out (it loads Numba's compiled kernels and touches every buffer first: up to 1.7 s
   measured, a one-time cost a real run amortizes) and evaluations excluded (the same work
   for every method). Invariant checked: a testbed run
   takes exactly the steps its tuning run took to the target (same seed, same numbers);
   a mismatch is printed as a warning and kept in the JSON.

The table gives, per rate and method, the steps to the target, the time per step, the time
to accuracy (mean ± 95% t-interval over the seeds that reached it) and its speedup over
the exact ring. Not run under mpiexec: it launches the tuning job and the testbeds itself.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import numpy as np

from ringcomp import runs
from ringcomp.cli import format_rate, out_path, parse_list
from ringcomp.cluster import job_path, run
from ringcomp.experiments import (
    add_sweep_options,
    add_testbed_options,
    check_sweep,
    check_testbed_hosts,
)
from ringcomp.experiments.convergence import METHODS, marsit_ratio, method_options
from ringcomp.netns import Testbed, TestbedError, check_available
from ringcomp.plots import method_style, pyplot, save_figure

BASELINE = "ring"
WARMUP_STEPS = 1  # not timed: one-time start-up costs, see step 3
#: a teacher task whose gradients (1.2 MB, float32) make the link matter at 100 Mbit/s and
#: 1 Gbit/s, while a step's compute stays a few ms on these cores
BASE = ("--model mlp:512x512 --dataset synthetic --samples 8192 --features 64 --epochs 3 "
        "--batch-size 8 --eval-every 16")
DEFAULT_METHODS = ["ring", "ring+marsit", "ring+sign", "ring+topk+ef", "twostage+sign+ef"]


def tune(args) -> dict:
    """Step 1: the convergence study on shared memory; its JSON (rank 0's)."""
    command = ["mpiexec", "-n", str(args.hosts * args.ranks_per_host), "python", "-m",
               "ringcomp.experiments", "convergence", "--tasks", "custom", "--base",
               args.base, "--methods", ",".join(args.methods), "--lrs",
               ",".join(map(str, args.lrs)), "--seeds", ",".join(map(str, args.seeds)),
               "--target", str(args.target), "--out", f"{args.out}-tune"]
    print(f"# tuning: {shlex.join(command)}", flush=True)
    status = subprocess.run(command, env={**os.environ, "PATH": job_path()}).returncode
    if status != 0:
        raise SystemExit(f"ringcomp.experiments time-to-accuracy: tuning failed (exit "
                         f"{status})")
    with open(f"{args.out}-tune.json") as f:
        return json.load(f)["tasks"]["custom"]


def tuned_steps(args, method: str, seed: int) -> int | None:
    """Steps the tuning run of ``method`` on ``seed`` took to the target (None: never)."""
    path = os.path.join(f"{args.out}-tune-runs", f"custom-{method}-seed{seed}.jsonl")
    return runs.steps_to(runs.load_run(path)["records"], args.target)


def time_to(records: list[dict], target: float) -> tuple[int, float] | None:
    """(steps, seconds of training after the warm-up) when the test accuracy first
    reached ``target``."""
    steps = runs.steps_to(records, target)
    if steps is None:
        return None
    return steps, float(sum(r["wall_s"] for r in records[WARMUP_STEPS:steps]))


def measure(testbed, rate: float, args, rates: dict, folder: str) -> list[dict]:
    """Step 2: every method x seed on the testbed; one record per run."""
    found = []
    for method in args.methods:
        for seed in args.seeds:
            path = os.path.join(folder, f"{int(rate)}-{method}-seed{seed}.jsonl")
            command = ["python", "-m", "ringcomp.train", *shlex.split(args.base),
                       *method_options(method, rates[method]), "--seed", str(seed),
                       "--stop-at", str(args.target), "--metrics", path, "--no-progress"]
            status, _ = run(testbed, args.ranks_per_host, command, args.timeout)
            if status != 0:
                raise SystemExit(f"{method} seed {seed} failed on the {format_rate(rate)} "
                                 f"testbed (exit {status})")
            records = runs.load_run(path)["records"]
            reached, expected = time_to(records, args.target), tuned_steps(args, method, seed)
            row = {"rate_bps": rate, "method": method, "seed": seed, "lr": rates[method],
                   "steps": reached[0] if reached else None,
                   "seconds": reached[1] if reached else None,
                   "step_s": float(np.mean([r["wall_s"] for r in records[WARMUP_STEPS:]
                                            or records])),
                   "ran_steps": len(records), "tuned_steps": expected,
                   "steps_agree": (reached[0] if reached else None) == expected}
            if not row["steps_agree"]:
                print(f"# warning: {method} seed {seed} reached {args.target:g} at step "
                      f"{row['steps']} on the testbed, {expected} when tuned: the numbers "
                      f"differ between runs", flush=True)
            print(f"# {format_rate(rate)} {method} seed {seed}: " + (
                f"{reached[1]:.1f} s, {reached[0]} steps" if reached
                else f"not reached in {len(records)} steps"), flush=True)
            found.append(row)
    return found


def summarize(found: list[dict]) -> list[dict]:
    """Per rate x method: means over the seeds that reached the target, and the speedup
    of the mean time over the exact ring's at the same rate."""
    rows = []
    for rate in sorted({r["rate_bps"] for r in found}):
        for method in dict.fromkeys(r["method"] for r in found):
            mine = [r for r in found if r["rate_bps"] == rate and r["method"] == method]
            done = [r["seconds"] for r in mine if r["seconds"] is not None]
            rows.append({"rate_bps": rate, "method": method, "lr": mine[0]["lr"],
                         "runs": len(mine), "reached": len(done),
                         "steps": (float(np.mean([r["steps"] for r in mine if r["steps"]]))
                                   if done else None),
                         "step_s": float(np.mean([r["step_s"] for r in mine])),
                         "seconds": float(np.mean(done)) if done else None,
                         "seconds_ci95": runs.ci95(done),
                         "steps_agree": all(r["steps_agree"] for r in mine)})
    for row in rows:
        base = next(r for r in rows if r["rate_bps"] == row["rate_bps"]
                    and r["method"] == BASELINE)
        row["speedup"] = (base["seconds"] / row["seconds"] if row["seconds"]
                          and base["seconds"] and row["reached"] == row["runs"]
                          and base["reached"] == base["runs"] else None)
    return rows


def table(rows: list[dict], target: float) -> str:
    lines = [f"{'rate':<11}{'method':<20}{'lr':>7}{'reached':>9}{'steps':>8}{'ms/step':>9}"
             f"{'seconds to ' + format(target, 'g') + ' ±95%':>24}{'vs ring':>9}"]
    for r in rows:
        time = ("never" if r["seconds"] is None
                else f"{r['seconds']:.1f} ± {r['seconds_ci95']:.1f}")
        lines.append(f"{format_rate(r['rate_bps']):<11}{r['method']:<20}{r['lr']:>7g}"
                     f"{r['reached']:>5}/{r['runs']:<3}"
                     f"{'-' if r['steps'] is None else format(r['steps'], '.0f'):>8}"
                     f"{1e3 * r['step_s']:>9.1f}{time:>24}"
                     f"{'-' if r['speedup'] is None else format(r['speedup'], '.2f') + 'x':>9}"
                     + ("" if r["steps_agree"] else "  (steps differ from tuning)"))
    return "\n".join(lines)


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
        ax.legend(fontsize=8)
    return save_figure(fig, out)


def main(args) -> int:
    try:  # before minutes of tuning: a testbed can be built here
        check_available()
    except TestbedError as err:
        raise SystemExit(f"ringcomp.experiments time-to-accuracy: {err}") from None
    tuned = tune(args)
    rates = {row["label"]: row["lr"] for row in tuned["rows"]}
    folder = f"{args.out}-runs"
    os.makedirs(folder, exist_ok=True)
    found = []
    for rate in args.rates:
        print(f"# {format_rate(rate)}: {args.hosts} hosts x {args.ranks_per_host} ranks",
              flush=True)
        try:
            with Testbed(args.hosts, rate) as testbed:
                found += measure(testbed, rate, args, rates, folder)
        except TestbedError as err:  # not root, no namespaces: say so, no traceback
            raise SystemExit(f"ringcomp.experiments time-to-accuracy: {err}") from None
    rows = summarize(found)
    print(f"# time to test accuracy {args.target:g}: {args.hosts} hosts x "
          f"{args.ranks_per_host} ranks, base: {args.base}")
    print(table(rows, args.target))
    written = plot(found, folder, args.target, args.out)
    with open(f"{args.out}.json", "w") as f:
        json.dump({"hosts": args.hosts, "ranks_per_host": args.ranks_per_host,
                   "base": args.base, "target": args.target, "seeds": args.seeds,
                   "lrs": args.lrs, "tuning": tuned["rows"], "runs": found, "rows": rows},
                  f, indent=1)
    for path in [*written, f"{args.out}.json"]:
        print(f"# wrote {path}")
    return 0


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("time-to-accuracy", help="wall-clock time to a test accuracy on "
                                                "emulated links (root; not under mpiexec)")
    add_testbed_options(p, "100mbit,1gbit")
    p.add_argument("--ranks-per-host", type=int, default=1, help="default: 1")
    p.add_argument("--base", default=BASE, help="training options every method shares "
                                                "(default: %(default)s)")
    p.add_argument("--methods", type=parse_list, default=DEFAULT_METHODS,
                   help=f"of {', '.join(METHODS)}; the exact ring, every row's baseline, is "
                        f"always added (default: %(default)s)")
    add_sweep_options(p, "0.003,0.01,0.03,0.1", "0,1,2")
    p.add_argument("--target", type=float, default=0.6,
                   help="test accuracy to reach (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=900,
                   help="seconds before one training run is killed (default: %(default)s)")
    p.add_argument("--out", type=out_path, default="time-to-accuracy", help="output path prefix")
    p.set_defaults(run=main, mpi=False, check=check_args)


def check_args(args, parser) -> None:
    """What the options cannot say alone (parser.error on a bad combination)."""
    check_testbed_hosts(args, parser)
    if args.ranks_per_host < 1:
        parser.error("--ranks-per-host must be >= 1")
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown --methods {unknown}; known: {', '.join(METHODS)}")
    args.methods = [BASELINE] + [m for m in args.methods if m != BASELINE]
    if not 0 < args.target <= 1:
        parser.error(f"--target must be an accuracy in (0, 1], got {args.target:g}")
    check_sweep(args, parser)
    owned = ("--lr", "--seed", "--stop-at", "--metrics")  # set per run by the study
    if any(marsit_ratio(m) is not None for m in args.methods):
        owned += ("--global-lr",)
    if any(word.split("=")[0] in owned for word in shlex.split(args.base)):
        parser.error(f"--base must leave {', '.join(owned)} to the study")
