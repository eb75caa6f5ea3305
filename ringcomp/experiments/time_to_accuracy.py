"""Time to accuracy on the emulated links: wall-clock training time until (near) the exact
ring's final test accuracy, as the Marsit paper states its claim, every method tuned for
that target (root).

1. Tune on this machine's shared memory, where a run is quick (the links change the time a
   step takes, never the numbers it computes): ``experiments tune-for-target`` trains the
   exact ring at its best rate to its final accuracy, sets the target below that (by the
   larger of ``--near`` and the 95% interval of its seeds), picks every method's rate for
   the fewest steps to it on the validation split, the exact ring's too (its fastest
   variant of ``ring`` and the ``ring-m<momentum>`` asked for goes on, as Marsit's fastest
   of ``ring+marsit`` and the ``ring+marsit-s<r>``; ``ring+marsit`` at the paper's default
   ratio goes on as well), and trains every seed at it.
2. For every ``--rates`` value, one testbed of ``--hosts`` x ``--ranks-per-host`` (the same
   rank count) trains every method x seed at its rate with ``--stop-at`` the target: the
   run ends after the first evaluation at or above it.
3. Time to accuracy = the sum of the steps' wall times up to that evaluation, the first step
   left out (it loads Numba's compiled kernels and touches every buffer first: up to 1.7 s
   measured, a one-time cost a real run amortizes) and evaluations excluded (the same work
   for every method). Invariant checked: a testbed run takes exactly the steps its tuning
   run took to the target (same seed, same numbers); a mismatch is printed as a warning and
   kept in the record.

The table gives, per rate and method, the steps to the target, the time per step, the time
to accuracy over the seeds (median [min-max], mean ± 95% t-interval; seeds that never reach
it are counted, not timed) and the speedup of its median over the timed exact ring's. Not run
under mpiexec: it launches the tuning job and the testbeds itself; writes a record.
"""

from __future__ import annotations

import json
import logging
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
    check_testbed_hosts,
)
from ringcomp.experiments.convergence import METHODS, method_options
from ringcomp.experiments.target_tuning import NEAR, add_tuning_options, check_tuning
from ringcomp.netns import Testbed, TestbedError, check_available
from ringcomp.plots import legend_beside, method_style, pyplot, save_figure
from ringcomp.results.blocks import renderer
from ringcomp.results.record import load, machine_load, provenance, write
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)

BASELINE = "ring"
WARMUP_STEPS = 1  # not timed: one-time start-up costs, see step 3
#: a teacher task whose gradients (1.2 MB, float32) make the link matter at 100 Mbit/s and
#: 1 Gbit/s, while a step's compute stays a few ms on these cores
BASE = ("--model mlp:512x512 --dataset synthetic --samples 8192 --features 64 --epochs 3 "
        "--batch-size 8 --eval-every 16")
#: the exact ring gets as many variants (its momentum) as Marsit (its second rate) before
#: Marsit's ratio grid grows; the cascading sign beside them
DEFAULT_METHODS = ["ring", "ring-m0", "ring-m0.5", "ring-m0.95", "ring+marsit",
                   "ring+marsit-s0.01", "ring+marsit-s0.03", "ring+sign"]


def tune(args) -> dict:
    """Step 1: ``tune-for-target`` on shared memory; its JSON."""
    command = ["mpiexec", "-n", str(args.hosts * args.ranks_per_host), "python", "-m",
               "ringcomp.experiments", "tune-for-target", "--base", args.base, "--methods",
               ",".join(args.methods), "--lrs", ",".join(map(str, args.lrs)), "--seeds",
               ",".join(map(str, args.seeds)), "--sweep-seeds",
               ",".join(map(str, args.sweep_seeds)), "--near", str(args.near),
               "--out", f"{args.out}-tune"]
    log.info(f"tuning: {shlex.join(command)}")
    status = subprocess.run(command, env={**os.environ, "PATH": job_path()}).returncode
    if status != 0:
        raise SystemExit(f"ringcomp.experiments time-to-accuracy: tuning failed (exit "
                         f"{status})")
    with open(f"{args.out}-tune.json") as f:
        return json.load(f)


def tuned_steps(tuned: dict, method: str, seed: int) -> int | None:
    """Steps the tuning run of ``method`` on ``seed`` took to the target (None: never):
    as the tuning recorded them, or (a tuning before it did) from its metrics file."""
    if "final_steps" in tuned:
        return tuned["final_steps"][method][str(seed)]
    path = tuned["finals"][method][str(seed)]
    return runs.steps_to(runs.load_run(path)["records"], tuned["target_test"])


def time_to(records: list[dict], target: float) -> tuple[int, float] | None:
    """(steps, seconds of training after the warm-up) when the test accuracy first
    reached ``target``."""
    steps = runs.steps_to(records, target)
    if steps is None:
        return None
    return steps, float(sum(r["wall_s"] for r in records[WARMUP_STEPS:steps]))


def measure(testbed, rate: float, args, tuned: dict, folder: str) -> list[dict]:
    """Step 2: every method x seed on the testbed; one record per run."""
    found = []
    target = tuned["target_test"]
    lrs = {BASELINE: tuned["baseline"]["lr"],
           **{m: t["lr"] for m, t in tuned["tuned"].items()}}
    for method in tuned["methods"]:
        for seed in args.seeds:
            path = os.path.join(folder, f"{int(rate)}-{method}-seed{seed}.jsonl")
            command = ["python", "-m", "ringcomp.train", *shlex.split(args.base),
                       *method_options(method, lrs[method]), "--seed", str(seed),
                       "--stop-at", str(target), "--metrics", path, "--no-progress"]
            status, _ = run(testbed, args.ranks_per_host, command, args.timeout)
            if status != 0:
                raise SystemExit(f"{method} seed {seed} failed on the {format_rate(rate)} "
                                 f"testbed (exit {status})")
            records = runs.load_run(path)["records"]
            reached, expected = time_to(records, target), tuned_steps(tuned, method, seed)
            row = {"rate_bps": rate, "method": method, "seed": seed, "lr": lrs[method],
                   "steps": reached[0] if reached else None,
                   "seconds": reached[1] if reached else None,
                   "step_s": float(np.median([r["wall_s"] for r in records[WARMUP_STEPS:]
                                              or records])),
                   "ran_steps": len(records), "tuned_steps": expected,
                   "steps_agree": (reached[0] if reached else None) == expected}
            if not row["steps_agree"]:
                log.warning(f"{method} seed {seed} reached {target:.4f} at step "
                            f"{row['steps']} on the testbed, {expected} when tuned: the "
                            "numbers differ between runs")
            log.info(f"{format_rate(rate)} {method} seed {seed}: " + (
                f"{reached[1]:.2f} s, {reached[0]} steps" if reached
                else f"not reached in {len(records)} steps"))
            found.append(row)
    return found


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


def main(args) -> int:
    before = machine_load()
    try:  # before minutes of tuning: a testbed can be built here
        check_available()
    except TestbedError as err:
        raise SystemExit(f"ringcomp.experiments time-to-accuracy: {err}") from None
    tuned = args.tuned_record or tune(args)
    folder = f"{args.out}-runs"
    os.makedirs(folder, exist_ok=True)
    found = []
    for rate in args.rates:
        log.info(f"{format_rate(rate)}: {args.hosts} hosts x {args.ranks_per_host} ranks")
        try:
            with Testbed(args.hosts, rate) as testbed:
                found += measure(testbed, rate, args, tuned, folder)
        except TestbedError as err:  # not root, no namespaces: say so, no traceback
            raise SystemExit(f"ringcomp.experiments time-to-accuracy: {err}") from None
    rows = summarize(found, tuned.get("exact", BASELINE))
    target = tuned["target_test"]
    margin = tuned["baseline"].get("margin", args.near)
    print(f"# time to test accuracy {target:.4f} (the exact ring's final "
          f"{tuned['baseline']['test_acc']:.4f} minus {margin:.4f}): {args.hosts} hosts x "
          f"{args.ranks_per_host} ranks, base: {args.base}")
    print(table(rows, target))
    written = plot(found, folder, target, args.out)
    prov = provenance(["sudo", ".venv/bin/python", *args.command_line[1:]],
                      mpi_facts()["mpi_library"], before,
                      ranks=args.hosts * args.ranks_per_host,
                      placement=f"{args.hosts} emulated hosts x {args.ranks_per_host} "
                                "rank(s) (network namespaces on one machine, "
                                "rate-limited veth links)")
    write(f"{args.out}.json", "time-to-accuracy", prov, {
        "hosts": args.hosts, "ranks_per_host": args.ranks_per_host, "base": args.base,
        "target": target, "seeds": args.seeds, "lrs": args.lrs, "tuning": tuned,
        "runs": found, "rows": rows})
    for path in [*written, f"{args.out}.json"]:
        log.info(f"wrote {path}")
    return 0


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("time-to-accuracy", help="wall-clock time to (near) the exact ring's "
                                                "final accuracy on emulated links (root; "
                                                "not under mpiexec)")
    add_testbed_options(p, "100mbit,1gbit,10gbit")
    p.add_argument("--ranks-per-host", type=int, default=1, help="default: 1")
    p.add_argument("--base", default=None, help="training options every method shares "
                                                f"(default: {BASE})")
    p.add_argument("--methods", type=parse_list, default=None,
                   help=f"of {', '.join(METHODS)}, ring+marsit-s<any ratio> or "
                        "ring-m<momentum>; the exact ring, the target's source, is always "
                        f"added (default: {','.join(DEFAULT_METHODS)})")
    add_sweep_options(p, "0.003,0.01,0.03,0.1", "0,1,2,3,4")
    add_tuning_options(p, None)  # None: --tuned can tell a --near given from the default
    p.add_argument("--tuned", metavar="PATH", default=None,
                   help="time the methods of an earlier tuning (tune-for-target's record, "
                        "e.g. PREFIX-tune.json) instead of tuning again: its task, methods, "
                        "rates, seeds and target")
    p.add_argument("--timeout", type=float, default=900,
                   help="seconds before one training run is killed (default: %(default)s)")
    p.add_argument("--out", type=out_path, default="time-to-accuracy", help="output path prefix")
    p.set_defaults(run=main, mpi=False, check=check_args)


def use_tuned(args, parser) -> None:
    """``--tuned``: the tuning record fixes the task, methods, rates, seeds and target;
    refuse any of them given too, and a rank count other than the tuning's."""
    given = [f"--{name.replace('_', '-')}" for name in ("base", "methods", "lrs", "seeds",
                                                        "sweep_seeds", "near")
             if getattr(args, name) is not None]
    if given:
        parser.error(f"--tuned fixes {', '.join(given)} (the tuning's own): leave them out")
    try:
        tuned = load(os.path.abspath(args.tuned))
    except (OSError, ValueError) as err:
        parser.error(f"--tuned {args.tuned}: {err}")
    if tuned.get("kind") != "target-tuning":
        parser.error(f"--tuned {args.tuned} is not a tune-for-target record (kind "
                     f"{tuned.get('kind')!r})")
    if tuned["ranks"] != args.hosts * args.ranks_per_host:
        parser.error(f"--tuned {args.tuned} was tuned at {tuned['ranks']} ranks; the "
                     f"testbeds have {args.hosts * args.ranks_per_host}")
    missing = [] if "final_steps" in tuned else [
        p for runs_ in tuned["finals"].values() for p in runs_.values()
        if not os.path.exists(p)]
    if missing:  # a tuning that kept its steps only in its metrics files
        parser.error(f"--tuned {args.tuned}: its final runs' metrics are gone "
                     f"({missing[0]}, ...); run its tuning again first: "
                     f"{tuned['provenance']['command']}")
    args.tuned_record = tuned
    args.base, args.methods, args.lrs = tuned["base"], tuned["methods"], tuned["lrs"]
    args.seeds, args.sweep_seeds, args.near = (tuned["seeds"], tuned["sweep_seeds"],
                                               tuned["near"])


def check_args(args, parser) -> None:
    """What the options cannot say alone (parser.error on a bad combination)."""
    check_testbed_hosts(args, parser)
    if args.ranks_per_host < 1:
        parser.error("--ranks-per-host must be >= 1")
    args.tuned_record = None
    if args.tuned:
        use_tuned(args, parser)
        return
    args.base = BASE if args.base is None else args.base
    args.methods = DEFAULT_METHODS if args.methods is None else args.methods
    args.near = NEAR if args.near is None else args.near
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown --methods {unknown}; known: {', '.join(METHODS)}, "
                     "ring+marsit-s<ratio>, ring-m<momentum>")
    args.methods = [BASELINE] + [m for m in args.methods if m != BASELINE]
    check_tuning(args, parser, shlex.split(args.base))
