"""Tuning for a target: every method's learning rate chosen for the fewest steps to (near)
the exact ring's final accuracy - the first half of the time-to-accuracy study, under mpiexec.

The Marsit paper claims less *time to the accuracy of uncompressed training*; a method tuned
for its best final accuracy may not be the one that gets there soonest, so each method is
tuned for that target here:

1. The exact ring (``ring``) is tuned as the convergence study tunes it (best mean
   validation accuracy over ``--sweep-seeds``, on the 80% split, the grid grown past an
   edge) and trained on every ``--seeds`` seed on the whole training set, scored on the test
   set. The margin is the larger of ``--near`` and the half-width of the 95% interval of
   those final accuracies, so that the target sits below the exact ring's plateau and its
   seed-to-seed noise. Targets: its mean final test accuracy minus the margin (the test
   target, what the testbed runs stop at) and its best mean validation accuracy minus the
   margin (the validation target, what the sweeps below aim at).
2. Every method, the exact ring's variants (``ring``, ``ring-m<momentum>``) among them,
   at every rate: one run per sweep seed on the 80% split with ``--stop-at`` the
   validation target; the rate with the fewest steps to it (mean over the sweep seeds; a
   rate that misses it, or diverges, on any seed scores nothing) wins, the grid grown past
   an edge where it sits (``convergence.grow_past_edges``).
3. The same budget for every family: the configurations each family (the exact ring's
   variants, Marsit's, and every other method on its own) was swept over, variants x
   rates, are counted, and every family with fewer than the most gets rates added until
   it has as many (``refine_rate``: the geometric midpoint nearest its fastest variant's
   best rate, gaps narrower than ``MIN_GAP`` left alone, the fastest chosen again after
   each). So the exact ring is tuned as hard as Marsit, whose ratio grid grew; each
   family's count and its added rates are recorded (a family left with no gap to split
   keeps fewer, and the count shows it).
4. One of each family goes on: the exact ring's variant and Marsit's (``ring+marsit`` and
   the ``ring+marsit-s<r>`` asked for; its ratio grid grows past an edge as the
   convergence study's does) with the fewest steps; ``ring+marsit`` at the paper's default
   ratio goes on too when asked for, reached or not (its time is part of the claim).
5. Final: every method that goes on, on every ``--seeds`` seed, on the whole training set
   with ``--stop-at`` the test target and ``--metrics`` written: the steps the testbed runs
   must reproduce, recorded (``final_steps``) so that a clone can time them again.

Invariant: every rank takes the same decisions (each score is the run's summary, the same on
every rank: an all-reduced evaluation). Rank 0 writes ``<out>.json``, a record (kind
``target-tuning``) that ``time-to-accuracy --tuned`` can time again on other links.
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
    SWEEP_SEEDS,
    best_rate,
    digest_parts,
    grow_past_edges,
    mean_scores,
    method_options,
    next_ratio,
    sweep_length,
)
from ringcomp.experiments.target_tuning_choice import (
    BASELINE,
    best_marsit,
    configurations,
    family_of,
    fastest,
    going_on,
    is_exact_variant,
    negated,
    refine_rate,
    tuned_of,
)
from ringcomp.results.record import machine_load, provenance, write
from ringcomp.runner import run
from ringcomp.runs import ci95
from ringcomp.training.config import parse
from ringcomp.training.trainer import NonFinite
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)

#: the target: the exact ring's final test accuracy minus this
NEAR = 0.01
#: options the study sets per run: --base must leave them alone
OWNED = ("--lr", "--seed", "--stop-at", "--metrics", "--eval-on", "--global-lr")


def _summary(transport, options: list[str]) -> dict | None:
    """The run's summary (the same on every rank); None when it diverged."""
    try:
        return run(parse([*options, "--no-progress"]), transport)
    except NonFinite:
        return None


def tune_baseline(transport, args, base: list[str], swept: list[str], folder: str) -> dict:
    """Step 1: the exact ring tuned for accuracy, its final runs and the two targets."""
    def accuracy(rates):
        return {lr: [None if s is None else s["test_acc"] for s in (
            _summary(transport, [*swept, *method_options(BASELINE, lr), "--seed", str(seed),
                                 "--eval-on", "validation"]) for seed in args.sweep_seeds)]
                for lr in rates}

    scores = grow_past_edges(accuracy, args.lrs)
    means = mean_scores(scores)
    lr = best_rate(means)
    if means[lr] is None:
        raise SystemExit(f"the exact ring diverged at every rate of {sorted(scores)}: no "
                         "target to tune for")
    finals = {}
    for seed in args.seeds:
        summary = _summary(transport, [*base, *method_options(BASELINE, lr), "--seed",
                                       str(seed), "--metrics", _final(folder, BASELINE, seed)])
        finals[str(seed)] = None if summary is None else summary["test_acc"]
    if None in finals.values():
        raise SystemExit(f"the exact ring diverged at its tuned rate {lr:g} on a final seed")
    final = sum(finals.values()) / len(finals)
    spread = ci95(list(finals.values()))
    margin = max(args.near, spread)  # below the plateau and its seed-to-seed noise
    return {"lr": lr, "validation": {str(k): v for k, v in means.items()},
            "validation_seeds": {str(k): v for k, v in scores.items()},
            "seed_test_acc": finals, "test_acc": final, "test_acc_ci95": spread,
            "margin": margin, "target_test": final - margin,
            "target_validation": means[lr] - margin}


def _final(folder: str, method: str, seed: int, kind: str = "final") -> str:
    """A final run's metrics file (absolute: the timing study reads it from elsewhere):
    ``final`` for the exact ring's full-length runs of step 1, ``target`` for the runs
    that stop at the target (step 4)."""
    return os.path.abspath(os.path.join(folder, f"{kind}-{method}-seed{seed}.jsonl"))


def _sweep_steps(transport, args, swept: list[str], method: str, target: float,
                 rates) -> dict:
    """Steps 2 and 3: ``method``'s steps to ``target`` on validation at each rate, one per
    sweep seed, negated (``grow_past_edges`` and ``best_rate`` take higher as better;
    None: missed or diverged)."""
    out = {}
    for lr in rates:
        out[lr] = []
        for seed in args.sweep_seeds:
            s = _summary(transport, [*swept, *method_options(method, lr), "--seed",
                                     str(seed), "--eval-on", "validation",
                                     "--stop-at", str(target)])
            reached = None if s is None else s.get("reached_step")
            out[lr].append(None if reached is None else -reached)
    return out


def tune_method(transport, args, swept: list[str], method: str, target: float) -> dict:
    """Step 2: ``method``'s rate with the fewest mean steps to ``target`` on validation."""
    return tuned_of(grow_past_edges(
        lambda rates: _sweep_steps(transport, args, swept, method, target, rates), args.lrs))


def equal_budgets(transport, args, swept: list[str], tuned: dict, target: float) -> dict:
    """Step 3: every family swept at as many configurations as the most-swept one, rates
    added (``refine_rate``) to its fastest variant (its first where none reached),
    chosen again after each. Returns the rates added per family (``tuned`` is updated)."""
    counts = configurations(tuned)
    budget = max(counts.values())
    added = {family: [] for family in counts}
    for family, count in counts.items():
        members = [m for m in tuned if family_of(m) == family]
        for _ in range(budget - count):
            variant = fastest(tuned, members.__contains__) or members[0]
            rate = refine_rate(tuned[variant]["steps"])
            if rate is None:  # no gap of MIN_GAP or more left: it keeps fewer (counted)
                break
            scores = negated(tuned[variant])
            scores.update(_sweep_steps(transport, args, swept, variant, target, [rate]))
            tuned[variant] = tuned_of(scores)
            added[family].append([variant, rate])
    return added


def main(args) -> int:
    transport = get_transport()
    before = machine_load() if transport.rank == 0 else None
    folder = start_runs(transport, args, METHODS)
    base = list(args.base_options)
    swept = [*base, *sweep_length(base, transport.size)]
    baseline = tune_baseline(transport, args, base, swept, folder)
    target_val, target_test = baseline["target_validation"], baseline["target_test"]
    tuned = {}
    methods = list(args.methods)  # the exact ring too: tuned for the target as the others
    grown = 0
    for method in methods:  # grows while running: Marsit's ratio grid past its edge
        tuned[method] = tune_method(transport, args, swept, method, target_val)
        if method == methods[-1] and grown < EXTEND:
            # next_ratio reads (rate, mean score per rate, ...): fewer steps score higher
            more = next_ratio({m: (t["lr"], {lr: None if v is None else -v
                                              for lr, v in t["steps"].items()}, {})
                               for m, t in tuned.items()})
            if more is not None and more not in methods:
                methods.append(more)
                grown += 1
    refined = equal_budgets(transport, args, swept, tuned, target_val)
    marsit, timed = best_marsit(tuned), going_on(tuned)
    if not timed or not is_exact_variant(timed[0]):
        raise SystemExit("no variant of the exact ring reached the validation target "
                         f"{target_val:.4f} at any rate: nothing to time against")
    finals, final_steps = {}, {}
    for method in timed:
        finals[method], final_steps[method] = {}, {}
        for seed in args.seeds:
            path = _final(folder, method, seed, "target")
            summary = _summary(transport, [*base, *method_options(method,
                                                                  tuned[method]["lr"]),
                                           "--seed", str(seed), "--stop-at",
                                           str(target_test), "--metrics", path])
            finals[method][str(seed)] = path
            # kept in the record too: the timing study compares against these, and the
            # metrics files stay in this checkout only (docs/records/*-runs/ is ignored)
            final_steps[method][str(seed)] = None if summary is None else summary.get(
                "reached_step")
    if transport.rank == 0:
        result = {"ranks": transport.size, "base": args.base, "near": args.near,
                  "lrs": args.lrs, "seeds": args.seeds, "sweep_seeds": args.sweep_seeds,
                  "baseline": baseline, "target_test": target_test,
                  "target_validation": target_val, "tuned": tuned, "marsit": marsit,
                  "exact": timed[0], "configurations": configurations(tuned),
                  "refined": refined,
                  "methods": timed, "finals": finals, "final_steps": final_steps}
        prov = provenance(["mpiexec", "-n", str(transport.size), *args.command_line],
                          mpi_facts()["mpi_library"], before, args.digests,
                          ranks=transport.size, placement="one node")
        write(f"{args.out}.json", "target-tuning", prov, result)
        print(f"# exact ring tuned for accuracy: lr {baseline['lr']:g}, final test "
              f"accuracy {baseline['test_acc']:.4f} ± {baseline['test_acc_ci95']:.4f}; "
              f"margin {baseline['margin']:.4f}: test target {target_test:.4f}, validation "
              f"target {target_val:.4f}")
        print("# configurations swept (variants x rates): " + ", ".join(
            f"{family} {count}" + (f" ({len(refined[family])} rates added)"
                                   if refined.get(family) else "")
            for family, count in result["configurations"].items()))
        for method, t in tuned.items():
            steps = t["steps"][str(t["lr"])]
            print(f"# {method}: lr {t['lr']:g}, "
                  + (f"{steps:.0f} steps to the validation target" if t["reached"]
                     else "never reached the validation target")
                  + ("" if method in timed else " (not run on)"))
        log.info(f"wrote {args.out}.json")
    return 0


def add_tuning_options(p, near_default) -> None:
    """``--sweep-seeds`` and ``--near``, shared with ``time-to-accuracy`` (``near_default``
    None: filled in by the caller's check)."""
    p.add_argument("--sweep-seeds", default=None, type=parse_ints,
                   help=f"seeds of the sweeps (default: {','.join(map(str, SWEEP_SEEDS))})")
    p.add_argument("--near", type=float, default=near_default,
                   help="the target is the exact ring's final test accuracy (mean over "
                        "--seeds) minus the larger of this and its 95%% interval's "
                        f"half-width (default: {NEAR})")


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
