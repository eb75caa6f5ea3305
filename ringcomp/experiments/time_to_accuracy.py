"""Time to accuracy on the emulated links: wall-clock training time until (near) the exact
ring's final test accuracy, for good, as the Marsit paper states its claim, every method
tuned for that target (root).

1. Tune on this machine's shared memory, where a run is quick (the links change the time a
   step takes, never the numbers it computes): ``experiments tune-for-target`` sets the
   target clear below the exact ring's final level on every seed, picks every method's
   rate for the fewest steps to its sustained crossing (``crossing``) on the validation
   split, refined to the same resolution around every timed method's best, and trains every
   seed at full length: the steps to the sustained crossing on the test set.
2. ``--repeats`` times over, for every ``--rates`` value, one testbed of ``--hosts`` x
   ``--ranks-per-host`` (the same rank count) trains every method x seed at its rate for
   exactly those steps (``--steps``); a seed that never got there is counted, not run. The
   repeats are whole passes over the links, one after the other, so that the machine's
   state in between shows as a difference between them.
3. Time to accuracy = the sum of the steps' wall times, the first step left out (it loads
   Numba's compiled kernels and touches every buffer first: up to 1.7 s measured, a
   one-time cost a real run amortizes) and evaluations excluded (the same work for every
   method). Invariant checked: the testbed run's last evaluation equals the tuning run's
   accuracy at that step (same seed, same numbers); a mismatch is printed as a warning and
   kept in the record.
4. Verdicts (``time_to_accuracy_tables``): every method's time over the exact ring's on
   the same seed, the geometric mean ratio with its 95% interval, per link and repeat; a
   finding only where every repeat gives the same verdict, else "unstable". The ratio
   splits into steps (the method's) and time per step (this implementation's).

Not run under mpiexec: it launches the tuning job and the testbeds itself; writes a record.
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
from ringcomp.experiments.target_tuning import (
    BASELINE,
    NEAR,
    add_tuning_options,
    check_tuning,
)
from ringcomp.experiments.time_to_accuracy_tables import (
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
DEFAULT_METHODS = ["ring", "ring-m0.5", "ring-m0.95", "ring+marsit", "ring+marsit-s0.01",
                   "ring+marsit-s0.03", "ring+sign"]


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


def tuned_at(tuned: dict, method: str, seed: int) -> tuple[int | None, float | None]:
    """Steps the tuning's final run of ``method`` on ``seed`` took to the sustained
    crossing (None: never) and its accuracy there."""
    return (tuned["final_steps"][method][str(seed)],
            tuned["final_accuracy"][method][str(seed)])


def measure(testbed, rate: float, repeat: int, args, tuned: dict,
            folder: str) -> list[dict]:
    """Step 2: every method x seed on the testbed, cut at its tuned steps; one row per
    run."""
    found = []
    lrs = {m: t["lr"] for m, t in tuned["tuned"].items()}
    for method in tuned["methods"]:
        for seed in args.seeds:
            steps, accuracy = tuned_at(tuned, method, seed)
            row = {"rate_bps": rate, "repeat": repeat, "method": method, "seed": seed,
                   "lr": lrs[method], "steps": steps, "seconds": None, "step_s": None,
                   "steps_agree": True}
            if steps is not None:
                path = os.path.join(folder, f"{int(rate)}-{method}-seed{seed}-r{repeat}.jsonl")
                command = ["python", "-m", "ringcomp.train", *shlex.split(args.base),
                           *method_options(method, lrs[method]), "--seed", str(seed),
                           "--steps", str(steps), "--metrics", path, "--no-progress"]
                status, _ = run(testbed, args.ranks_per_host, command, args.timeout)
                if status != 0:
                    raise SystemExit(f"{method} seed {seed} failed on the "
                                     f"{format_rate(rate)} testbed (exit {status})")
                records = runs.load_run(path)["records"]
                walls = [r["wall_s"] for r in records[WARMUP_STEPS:]]
                last = [r["test_acc"] for r in records if r.get("test_acc") is not None]
                row.update(seconds=float(sum(walls)), step_s=float(np.median(walls)),
                           steps_agree=len(records) == steps and last[-1:] == [accuracy])
                if not row["steps_agree"]:
                    log.warning(f"{method} seed {seed}: the testbed run's accuracy at step "
                                f"{steps} is {last[-1:]}, the tuning's {accuracy}: the "
                                "numbers differ between runs")
            log.info(f"{format_rate(rate)} repeat {repeat} {method} seed {seed}: " + (
                f"{row['seconds']:.2f} s, {steps} steps" if steps is not None
                else "never reached when tuned: not run"))
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
    for repeat in range(args.repeats):
        for rate in args.rates:
            log.info(f"repeat {repeat}, {format_rate(rate)}: {args.hosts} hosts x "
                     f"{args.ranks_per_host} ranks")
            try:
                with Testbed(args.hosts, rate) as testbed:
                    found += measure(testbed, rate, repeat, args, tuned, folder)
            except TestbedError as err:  # not root, no namespaces: say so, no traceback
                raise SystemExit(f"ringcomp.experiments time-to-accuracy: {err}") from None
    rows = summarize(found, tuned["exact"])
    target = tuned["target_test"]
    print(f"# time to a sustained test accuracy {target:.4f} (the exact ring's final level "
          f"{tuned['baseline']['test_acc']:.4f} minus {tuned['baseline']['margin']:.4f}): "
          f"{args.hosts} hosts x {args.ranks_per_host} ranks, base: {args.base}")
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
        "target": target, "seeds": args.seeds, "lrs": args.lrs, "repeats": args.repeats,
        "tuning": tuned,
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
    p.add_argument("--repeats", type=int, default=2,
                   help="whole passes over the links, one after the other; a verdict is a "
                        "finding only where every pass gives it (default: %(default)s)")
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
    if "final_accuracy" not in tuned:  # before sustained crossings: first crossings
        parser.error(f"--tuned {args.tuned} counts steps to a first crossing of the "
                     "target, not a sustained one: tune again with this version")
    args.tuned_record = tuned
    args.base, args.methods, args.lrs = tuned["base"], tuned["methods"], tuned["lrs"]
    args.seeds, args.sweep_seeds, args.near = (tuned["seeds"], tuned["sweep_seeds"],
                                               tuned["near"])


def check_args(args, parser) -> None:
    """What the options cannot say alone (parser.error on a bad combination)."""
    check_testbed_hosts(args, parser)
    if args.ranks_per_host < 1:
        parser.error("--ranks-per-host must be >= 1")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
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
