"""Tuning for a target: every method's learning rate chosen for the fewest steps to (near)
the exact ring's final accuracy - the first half of the time-to-accuracy study, under mpiexec.

A method tuned for its best final accuracy may not get to a target soonest, so each is
tuned for it here; steps count to its sustained crossing (``crossing``), runs full length:

1. The exact ring (``ring``) is tuned as the convergence study tunes it (best mean final
   level over ``--sweep-seeds``, 80% split) and trained on every ``--seeds`` seed.
   Targets (``crossing.target_below``): the test target from the final runs (what the
   timing runs are timed to), the validation target from the sweep seeds at the tuned rate.
2. Every method, the exact ring's variants (``ring``, ``ring-m<momentum>``) among them,
   at every rate: one run per sweep seed on the 80% split; a rate scores the sweep seeds
   that reached the validation target, then their mean steps (``target_tuning_choice``);
   the rate grid and Marsit's ratio grid grown past an edge where the best sits.
3. The same resolution for every method that goes on (step 4's): rates are added around
   its best (``refine_rate``) until the rates beside it are at most ``RESOLUTION`` apart.
4. What goes on (``going_on``): the exact ring's and Marsit's fastest variants, every other
   method reaching the target on a sweep seed, and ``ring+marsit`` at the trainer's default
   ratio (1/10: ringcomp's, not the paper's) at its own best rate, reached or not.
5. Final: every method that goes on, on every ``--seeds`` seed, whole training set, with
   ``--metrics``: its steps to the test target and the accuracy there, which a timing run
   cut at those steps must reproduce.

Invariant: every rank decides alike (a score is the run's all-reduced summary). Rank 0 writes
``<out>.json`` (kind ``target-tuning``), which ``time-to-accuracy --tuned`` times again.
"""

from __future__ import annotations

import logging
import os
import shlex

from ringcomp.cli import common_parser, out_path, parse_list
from ringcomp.experiments import add_sweep_options, check_sweep, parse_ints, start_runs
from ringcomp.experiments.convergence import (
    EXTEND,
    METHODS,
    best_rate,
    digest_parts,
    grow_past_edges,
    mean_scores,
    method_options,
    next_ratio,
    sweep_length,
)
from ringcomp.experiments.crossing import (
    WINDOW,
    final_level,
    sustained_step,
    target_below,
)
from ringcomp.experiments.target_tuning_choice import (
    BASELINE,
    MAX_REFINED,
    RESOLUTION,
    best_marsit,
    configurations,
    describe,
    gaps_beside,
    going_on,
    is_exact_variant,
    rate_keys,
    refine_rate,
    swept,
    tuned_of,
)
from ringcomp.results.record import machine_load, provenance, write
from ringcomp.runner import run
from ringcomp.training.config import parse
from ringcomp.training.trainer import NonFinite
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)

#: the target's distance below the exact ring's final level, at least
NEAR = 0.01
#: the sweep seeds: five, so that one seed's luck does not pick a rate
SWEEP_SEEDS = [100, 101, 102, 103, 104]
#: options the study sets per run: --base must leave them alone
OWNED = ("--lr", "--seed", "--stop-at", "--metrics", "--eval-on", "--global-lr")


def _summary(transport, options: list[str]) -> dict | None:
    """The run's summary (the same on every rank); None when it diverged."""
    try:
        return run(parse([*options, "--no-progress"]), transport)
    except NonFinite:
        return None


class Runs:
    """One tuning's training runs: a sweep run made once per options (step 1's and step
    2's runs of the exact ring are the same), a final run each time."""
    def __init__(self, transport):
        self.transport, self._swept = transport, {}

    def final(self, options: list[str]) -> dict | None:
        return _summary(self.transport, options)  # made every time

    def sweep(self, options: list[str]) -> dict | None:
        if tuple(options) not in self._swept:
            self._swept[tuple(options)] = self.final(options)
        return self._swept[tuple(options)]


def _level(summary: dict | None) -> float | None:
    return None if summary is None else final_level(summary["evaluations"])


def tune_baseline(runs: Runs, args, base: list[str], swept_: list[str], folder: str) -> dict:
    """Step 1: the exact ring tuned for accuracy, its final runs and the two targets."""
    def accuracy(rates):
        return {lr: [_level(runs.sweep([*swept_, *method_options(BASELINE, lr), "--seed",
                                        str(seed), "--eval-on", "validation"]))
                     for seed in args.sweep_seeds] for lr in rates}

    scores = grow_past_edges(accuracy, args.lrs)
    means = mean_scores(scores)
    lr = best_rate(means)
    if means[lr] is None:
        raise SystemExit(f"the exact ring diverged at every rate of {sorted(scores)}: no "
                         "target to tune for")
    finals = {str(seed): _level(runs.final([
        *base, *method_options(BASELINE, lr), "--seed", str(seed), "--metrics",
        _final(folder, BASELINE, seed)])) for seed in args.seeds}
    if None in finals.values():
        raise SystemExit(f"the exact ring diverged at its tuned rate {lr:g} on a final seed")
    levels = list(finals.values())
    target_test, margin = target_below(levels, args.near)
    target_val, margin_val = target_below(scores[lr], args.near)
    return {"lr": lr, "window": WINDOW, "validation": {str(k): v for k, v in means.items()},
            "validation_seeds": {str(k): v for k, v in scores.items()},
            "seed_test_acc": finals, "test_acc": sum(levels) / len(levels),
            "test_acc_min": min(levels), "margin": margin, "target_test": target_test,
            "margin_validation": margin_val, "target_validation": target_val}


def _final(folder: str, method: str, seed: int, kind: str = "final") -> str:
    """A final run's metrics file (absolute): ``final`` for step 1's, ``target`` step 5's."""
    return os.path.abspath(os.path.join(folder, f"{kind}-{method}-seed{seed}.jsonl"))


def _sweep_steps(runs: Runs, args, swept_: list[str], method: str, target: float, rates):
    """Steps 2 and 3: ``method``'s steps to the sustained crossing of ``target`` on
    validation at each rate, one per sweep seed (None: missed or diverged)."""
    out = {}
    for lr in rates:
        out[lr] = []
        for seed in args.sweep_seeds:
            s = runs.sweep([*swept_, *method_options(method, lr), "--seed", str(seed),
                            "--eval-on", "validation"])
            out[lr].append(None if s is None else sustained_step(s["evaluations"], target))
    return out


def tune_method(runs: Runs, args, swept_: list[str], method: str, target: float) -> dict:
    """Step 2: ``method``'s best rate for the target on validation."""
    return tuned_of(grow_past_edges(
        lambda rates: _sweep_steps(runs, args, swept_, method, target, rates),
        args.lrs, mean=rate_keys))


def refine(runs: Runs, args, swept_: list[str], tuned: dict, target: float) -> dict:
    """Step 3: every method going on refined to ``RESOLUTION`` around its best rate,
    what goes on chosen again after each. Returns the rates added per method."""
    added: dict = {}
    while True:
        pending = [m for m in going_on(tuned) if len(added.get(m, [])) < MAX_REFINED
                   and refine_rate(swept(tuned[m])) is not None]
        if not pending:
            return added
        method = pending[0]
        rate = refine_rate(swept(tuned[method]))
        scores = swept(tuned[method])
        scores.update(_sweep_steps(runs, args, swept_, method, target, [rate]))
        tuned[method] = tuned_of(scores)
        added.setdefault(method, []).append(rate)


def final_runs(runs: Runs, args, base: list[str], folder: str, tuned: dict,
               timed: list[str], target: float) -> tuple[dict, dict, dict]:
    """Step 5: the metrics paths, sustained steps and accuracies there, per method, seed."""
    finals, steps, accuracy = {}, {}, {}
    for method in timed:
        finals[method], steps[method], accuracy[method] = {}, {}, {}
        for seed in args.seeds:
            path = _final(folder, method, seed, "target")
            summary = runs.final([*base, *method_options(method, tuned[method]["lr"]),
                                  "--seed", str(seed), "--metrics", path])
            reached = None if summary is None else sustained_step(summary["evaluations"],
                                                                  target)
            finals[method][str(seed)] = path
            # kept in the record too: the timing study compares against these, and the
            # metrics files stay in this checkout only (docs/records/*-runs/ is ignored)
            steps[method][str(seed)] = reached
            accuracy[method][str(seed)] = None if reached is None else dict(
                summary["evaluations"])[reached]
    return finals, steps, accuracy


def main(args) -> int:
    transport = get_transport()
    before = machine_load() if transport.rank == 0 else None
    folder = start_runs(transport, args, METHODS)
    runs = Runs(transport)
    base = list(args.base_options)
    swept_ = [*base, *sweep_length(base, transport.size)]
    baseline = tune_baseline(runs, args, base, swept_, folder)
    target_val, target_test = baseline["target_validation"], baseline["target_test"]
    tuned = {}
    methods = list(args.methods)  # the exact ring too: tuned for the target as the others
    grown = 0
    for method in methods:  # grows while running: Marsit's ratio grid past its edge
        tuned[method] = tune_method(runs, args, swept_, method, target_val)
        if method == methods[-1] and grown < EXTEND:
            # next_ratio reads (rate, score per rate, ...): higher scores better
            more = next_ratio({m: (t["lr"], rate_keys(swept(t)), {})
                               for m, t in tuned.items()})
            if more is not None and more not in methods:
                methods.append(more)
                grown += 1
    refined = refine(runs, args, swept_, tuned, target_val)
    marsit, timed = best_marsit(tuned), going_on(tuned)
    if not timed or not is_exact_variant(timed[0]):
        raise SystemExit("no variant of the exact ring reached the validation target "
                         f"{target_val:.4f} on every sweep seed at any rate: nothing to "
                         "time against")
    finals, final_steps, final_accuracy = final_runs(runs, args, base, folder, tuned,
                                                     timed, target_test)
    if transport.rank == 0:
        result = {"ranks": transport.size, "base": args.base, "near": args.near,
                  "lrs": args.lrs, "seeds": args.seeds, "sweep_seeds": args.sweep_seeds,
                  "window": WINDOW, "resolution": RESOLUTION,
                  "baseline": baseline, "target_test": target_test,
                  "target_validation": target_val, "tuned": tuned, "marsit": marsit,
                  "exact": timed[0], "configurations": configurations(tuned),
                  "refined": refined,
                  "gaps": {m: gaps_beside(swept(tuned[m])) for m in timed},
                  "methods": timed, "finals": finals, "final_steps": final_steps,
                  "final_accuracy": final_accuracy}
        prov = provenance(["mpiexec", "-n", str(transport.size), *args.command_line],
                          mpi_facts()["mpi_library"], before, args.digests,
                          ranks=transport.size, placement="one node")
        write(f"{args.out}.json", "target-tuning", prov, result)
        print(describe(result))
        log.info(f"wrote {args.out}.json")
    return 0


def add_tuning_options(p, near_default) -> None:
    """``--sweep-seeds`` and ``--near``, shared with ``time-to-accuracy`` (``near_default``
    None: filled in by the caller's check)."""
    p.add_argument("--sweep-seeds", default=None, type=parse_ints,
                   help=f"seeds of the sweeps (default: {','.join(map(str, SWEEP_SEEDS))})")
    p.add_argument("--near", type=float, default=near_default,
                   help="the target is the exact ring's final test level (mean over "
                        "--seeds) minus the larger of this and its 95%% interval's "
                        "half-width, and at least half this below its lowest seed's "
                        f"(default: {NEAR})")


def check_tuning(args, parser, base_words: list[str]) -> None:
    """The checks the tuning's options need, here and in ``time-to-accuracy``
    (parser.error, alike on every rank)."""
    if args.sweep_seeds is None:
        args.sweep_seeds = SWEEP_SEEDS
    if not args.sweep_seeds:
        parser.error("--sweep-seeds needs at least one seed")
    if not 0 <= args.near < 1:
        parser.error(f"--near must be an accuracy in [0, 1), got {args.near:g}")
    if any(word.split("=")[0] in OWNED for word in base_words):
        parser.error(f"--base must leave {', '.join(OWNED)} to the study")
    check_sweep(args, parser)


def check_args(args, parser) -> None:
    """Refuse what would fail mid-study (parser.error, alike on every rank)."""
    args.base_options = shlex.split(args.base)
    args.methods = [BASELINE] + [m for m in args.methods if m != BASELINE]
    check_tuning(args, parser, args.base_options)


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments`` (run by
    ``time-to-accuracy``; under mpiexec)."""
    p = sub.add_parser("tune-for-target", parents=[common_parser()],
                       help="each method's rate for the fewest steps to the exact ring's "
                            "final accuracy (time-to-accuracy's tuning; under mpiexec)")
    p.add_argument("--base", required=True, help="the training options every method shares")
    p.add_argument("--methods", type=parse_list, required=True,
                   help=f"of {', '.join(METHODS)}, ring+marsit-s<any ratio>, or "
                        "ring-m<momentum> (the exact ring at another momentum); the exact "
                        "ring is tuned first in any case")
    add_sweep_options(p, "0.003,0.01,0.03,0.1", "0,1,2,3,4")
    add_tuning_options(p, NEAR)
    p.add_argument("--out", type=out_path, default="tune-for-target",
                   help="output path prefix: <out>.json, <out>-runs/ (default: %(default)s)")
    p.set_defaults(run=main, mpi=True, check=check_args, digest_parts=digest_parts)
