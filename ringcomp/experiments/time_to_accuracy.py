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
from ringcomp.experiments.time_to_accuracy_tables import (
    BASELINE,
    WARMUP_STEPS,
    plot,
    summarize,
    table,
)
from ringcomp.netns import Testbed, TestbedError, check_available
from ringcomp.results.record import load, machine_load, provenance, write
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)

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
