"""The convergence study: every aggregation scheme on the same training task, each at its
own best learning rate, over seeds.

For every task (a set of ``ringcomp.train`` options: the MLP or CNN on digits, IID or with
label skew, or the synthetic teacher) and every method (training options on top):

1. Sweep: one run per learning rate of ``--lrs`` (the same grid for every method; for
   Marsit the local rate, its global step lr/10 moving with it, or another fixed fraction of
   it for the ``ring+marsit-s<ratio>`` methods) on each sweep seed, trained
   on 80% of the training set and scored on the other 20% (``--eval-on validation``: the
   test set is not looked at), for as many steps as the final runs (more epochs of the
   smaller set: a rate is judged on the run it will be used for, and what happens late,
   such as Marsit-K's first full-precision round at step K, happens in the sweep too). The
   best validation accuracy, averaged over ``--sweep-seeds`` (default three: one seed's
   score is noisy, rates within a few tenths of a point of each other swap places from seed
   to seed), picks the method's rate; a rate that diverges on any sweep seed scores
   nothing. Where the best rate is the grid's smallest or largest, the grid grows one
   geometric step past it and that rate is swept too, up to ``EXTEND`` times (the rates
   each method actually saw are in its row).
2. Final: ``--seeds`` runs at that rate on the whole training set, scored on the test set
   (one split for every seed, sweeps included: ``--data-seed``), each writing
   ``<out>-runs/<task>-<method>-seed<s>.jsonl``; every seed's test accuracy is kept, so the
   paired differences can be derived again from the record.

Momentum 0.9 wherever it applies (SGD and Marsit's local momentum alike). Rank 0 prints,
per task, the table (best rate, validation accuracy per rate, final test accuracy mean ±
95% t-interval over seeds, its difference to the first method's paired seed by seed with
its own interval, steps to ``--target``, wire bytes and time per step), draws the runs and
writes everything as a record (``ringcomp.results``: with its provenance and the digests of
its methods, ``experiments.digests``) after every task.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex

from ringcomp import runs
from ringcomp.cli import common_parser, out_path, parse_list, positive_int
from ringcomp.experiments import add_sweep_options, check_sweep, parse_ints, start_runs
from ringcomp.experiments.miniatures import train_part
from ringcomp.results.record import machine_load, provenance, write
from ringcomp.runner import run
from ringcomp.training import data
from ringcomp.training.config import parse
from ringcomp.training.trainer import NonFinite
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)

#: name: training options. Names read algorithm+compressor[+ef] so plots colour them alike.
METHODS = {
    "ring": [],
    "ring+sign": ["--compressor", "sign"],  # cascading: decode, add, re-encode every hop
    "torus+sign": ["--algorithm", "torus", "--compressor", "sign"],
    "allgather+sign+ef": ["--algorithm", "allgather", "--compressor", "sign",
                          "--error-feedback"],  # EF-signSGD: scaled signs, summed
    "allgather+marsit": ["--algorithm", "allgather", "--compressor", "marsit"],  # majority
    "ring+marsit": ["--compressor", "marsit"],  # Marsit, K = infinity
    "tree+marsit": ["--algorithm", "tree", "--compressor", "marsit"],
    "torus+marsit": ["--algorithm", "torus", "--compressor", "marsit"],
    "ring+marsit-k100": ["--compressor", "marsit", "--marsit-k", "100"],
    "ring+topk+ef": ["--compressor", "topk", "--error-feedback"],
    "ring+qsgd": ["--compressor", "qsgd"],  # cascading, unbiased
    "ring+countsketch": ["--compressor", "countsketch"],
    "ring+countsketch+ef": ["--compressor", "countsketch", "--error-feedback"],
    "twostage+sign+ef": ["--algorithm", "twostage", "--compressor", "sign",
                         "--error-feedback"],  # DeepSpeed's 1-bit all-reduce
}
#: Marsit with its global step eta_s at another fraction of eta_l than the default 1/10
#: (``ring+marsit-s<ratio>``, any ratio > 0; these are the named ones): swept over the same
#: --lrs, they show what tuning Marsit's second rate buys (it gets that many more tries than
#: the other methods: compare against ring+marsit, not against exact). Where the best ratio
#: is the smallest or largest swept, the study adds one past it (``next_ratio``).
MARSIT_RATIOS = {"ring+marsit-s0.01": 0.01, "ring+marsit-s0.03": 0.03, "ring+marsit-s0.3": 0.3}
#: the ratio ring+marsit itself runs at (the trainer's default eta_s = eta_l / 10)
MARSIT_DEFAULT_RATIO = 0.1
_RATIO_NAME = re.compile(r"ring\+marsit-s(\d+(?:\.\d*)?(?:e-?\d+)?)")


#: the exact ring at another momentum than the trainer's default 0.9 (``ring-m<momentum>``,
#: 0 <= momentum < 1): the exact ring's own second knob, so that a study tuning Marsit's
#: second rate can give the exact ring as many configurations
_MOMENTUM_NAME = re.compile(r"ring-m(\d+(?:\.\d*)?(?:e-?\d+)?)")


def marsit_ratio(method: str) -> float | None:
    """eta_s / eta_l of a ``ring+marsit-s<ratio>`` method (None: not one)."""
    match = _RATIO_NAME.fullmatch(method)
    ratio = float(match.group(1)) if match else 0.0
    return ratio if ratio > 0 and math.isfinite(ratio) else None


def ring_momentum(method: str) -> float | None:
    """The momentum of a ``ring-m<momentum>`` method (None: not one)."""
    match = _MOMENTUM_NAME.fullmatch(method)
    momentum = float(match.group(1)) if match else -1.0
    return momentum if 0 <= momentum < 1 else None


class _Methods(dict):
    """The named methods, and every ``ring+marsit-s<ratio>`` and ``ring-m<momentum>``
    besides the named ones."""

    def __contains__(self, method) -> bool:
        return (dict.__contains__(self, method) or marsit_ratio(str(method)) is not None
                or ring_momentum(str(method)) is not None)

    def __missing__(self, method: str) -> list[str]:
        if marsit_ratio(method) is not None:
            return ["--compressor", "marsit"]
        if ring_momentum(method) is not None:
            return ["--momentum", str(ring_momentum(method))]
        raise KeyError(method)


METHODS = _Methods(METHODS)
METHODS.update({name: ["--compressor", "marsit"] for name in MARSIT_RATIOS})
DEFAULT_METHODS = ["ring", "ring+sign", "torus+sign", "ring+marsit", "tree+marsit",
                   "torus+marsit", "ring+marsit-k100", "allgather+sign+ef",
                   "allgather+marsit", "ring+topk+ef", "ring+qsgd", "twostage+sign+ef"]
#: name: the options every method shares on that task
TASKS = {
    "mlp": "--model mlp --dataset digits --epochs 20 --batch-size 8 --eval-every 20",
    "mlp-skew": "--model mlp --dataset digits --epochs 20 --batch-size 8 --eval-every 20 "
                "--partition label-skew:0.1",
    "cnn": "--model cnn --dataset digits --epochs 10 --batch-size 8 --eval-every 20",
    "cnn-skew": "--model cnn --dataset digits --epochs 10 --batch-size 8 --eval-every 20 "
                "--partition label-skew:0.1",
    "teacher": "--model mlp --dataset synthetic --samples 8192 --features 64 --epochs 4 "
               "--batch-size 8 --eval-every 40",
}
QUICK = {"lrs": [0.03, 0.1], "seeds": [0, 1], "sweep_seeds": [100], "extra": ["--epochs", "1"]}
SWEEP_SEEDS = [100, 101, 102]
#: how many times the grid may grow past an edge where the best rate sits
EXTEND = 2


def _train(transport, options: list[str]) -> float | None:
    """The run's final (test or validation) accuracy; None when it diverged (NaN/Inf:
    every rank stops at the same step)."""
    try:
        return run(parse(options), transport)["test_acc"]
    except NonFinite:
        return None


def method_options(method: str, lr: float) -> list[str]:
    """The training options of ``method`` at learning rate ``lr``."""
    options = [*METHODS[method], "--lr", str(lr)]
    if marsit_ratio(method) is not None:
        options += ["--global-lr", str(lr * marsit_ratio(method))]
    return options


def next_ratio(chosen: dict) -> str | None:
    """Another ``ring+marsit-s<ratio>`` one geometric step past the edge where the best
    second rate sits (ring+marsit counts as ``MARSIT_DEFAULT_RATIO``), or None.

    ``chosen``: method -> (rate, mean validation per rate, scores), as ``run_task`` keeps
    them. Only when at least one ratio method was asked for and two ratios were swept: each
    ratio scores its best mean validation accuracy over its rates (a ratio whose every rate
    diverged scores nothing)."""
    ratios = {}
    for method, (_, means, _) in chosen.items():
        ratio = MARSIT_DEFAULT_RATIO if method == "ring+marsit" else marsit_ratio(method)
        if ratio is not None:
            finite = [acc for acc in means.values() if acc is not None]
            ratios[ratio] = max(finite) if finite else None
    if len(ratios) < 2 or not any(marsit_ratio(m) for m in chosen):
        return None
    swept = sorted(ratios)
    best = best_rate(ratios)
    if ratios[best] is None or best not in (swept[0], swept[-1]):
        return None
    low = best == swept[0]
    step = swept[1] / swept[0] if low else swept[-1] / swept[-2]
    return f"ring+marsit-s{float(f'{best / step if low else best * step:.3g}'):g}"


def sweep_length(base: list[str], ranks: int) -> list[str]:
    """Options that make a sweep run (on the 80% split) as many steps as a final run of
    ``base`` on the whole training set: ``--steps`` and enough ``--epochs``."""
    a = parse(base)
    sets = [data.load(a.dataset, a.data_seed, a.samples, a.features, evaluate)
            for evaluate in ("test", "validation")]
    full, held = (len(s.x_train) // (a.batch_size * ranks) for s in sets)
    steps = a.steps or a.epochs * full
    if held == 0:  # fewer samples than one global batch: the trainer says so
        return []
    return ["--steps", str(steps), "--epochs", str(-(-steps // held))]


def sweep_until_inside(transport, base: list[str], method: str, lrs, seeds) -> dict:
    """``sweep`` over ``lrs``, grown past an edge where the best rate sits
    (``grow_past_edges``)."""
    return grow_past_edges(lambda rates: sweep(transport, base, method, rates, seeds), lrs)


def grow_past_edges(sweep_rates, lrs, mean=None) -> dict:
    """``sweep_rates(rates) -> {rate: [score per seed]}`` (higher is better; None: that
    seed failed) over ``lrs``, then one geometric step past the edge while the best mean
    sits at the smallest or largest rate swept (at most ``EXTEND`` steps): a best rate at
    the grid's edge says only that the optimum may lie beyond it. Every score, in rate
    order. ``mean``: scores per seed -> one comparable value per rate (None: none), by
    default ``mean_scores``."""
    scores = sweep_rates(lrs)
    for _ in range(EXTEND):
        swept = sorted(scores)
        best = best_rate((mean or mean_scores)(scores))
        if len(swept) < 2 or best not in (swept[0], swept[-1]):
            break
        low = best == swept[0]
        step = swept[1] / swept[0] if low else swept[-1] / swept[-2]
        beyond = float(f"{best / step if low else best * step:.3g}")
        scores.update(sweep_rates([beyond]))
    return dict(sorted(scores.items()))


def sweep(transport, base: list[str], method: str, lrs, seeds) -> dict:
    """Validation accuracy of ``method`` at every rate of ``lrs``, one per seed of ``seeds``
    (None: diverged); ``base`` already holds the sweep's length (``sweep_length``)."""
    return {lr: [_train(transport, [*base, *method_options(method, lr), "--seed", str(seed),
                                    "--eval-on", "validation", "--no-progress"])
                 for seed in seeds] for lr in lrs}


def mean_scores(scores: dict) -> dict:
    """Each rate's mean validation accuracy over the sweep seeds; None when any diverged."""
    return {lr: None if None in accs else sum(accs) / len(accs) for lr, accs in scores.items()}


def best_rate(scores: dict) -> float:
    """The rate with the best validation accuracy (the smaller on a tie); the smallest
    rate if every run diverged."""
    finite = {lr: acc for lr, acc in scores.items() if acc is not None}
    return max(sorted(finite), key=lambda lr: finite[lr]) if finite else min(scores)


def run_task(transport, args, task: str, base: list[str], folder: str) -> list[dict]:
    """Sweep and final runs of every method on one task; rank 0 gets the rows."""
    groups, chosen, finals = {}, {}, {}
    swept = [*base, *sweep_length(base, transport.size)]  # the same for every method
    methods, grown = list(args.methods), 0
    for method in methods:  # grows while running: a second-rate study past its edge
        scores = sweep_until_inside(transport, swept, method, args.lrs, args.sweep_seeds)
        means = mean_scores(scores)
        chosen[method] = (best_rate(means), means, scores)
        finals[method] = {}
        for seed in args.seeds:
            path = os.path.join(folder, f"{task}-{method}-seed{seed}.jsonl")
            acc = _train(transport, [*base, *method_options(method, chosen[method][0]),
                                     "--seed", str(seed), "--metrics", path, "--no-progress"])
            log.info(f"{task} {method} lr {chosen[method][0]:g} seed {seed}: "
                     + ("diverged" if acc is None else f"test accuracy {acc:.4f}"))
            if transport.rank == 0:
                groups.setdefault(method, []).append(runs.load_run(path))
            finals[method][str(seed)] = acc
        if method == methods[-1] and grown < EXTEND:
            more = next_ratio(chosen)
            if more is not None and more not in methods:
                methods.append(more)
                grown += 1
    if transport.rank != 0:
        return []
    rows = runs.summarize(groups, args.target)
    reference = args.methods[0]
    for row in rows:
        row["lr"], means, scores = chosen[row["label"]]
        row["validation"] = {str(lr): acc for lr, acc in means.items()}
        row["validation_seeds"] = {str(lr): accs for lr, accs in scores.items()}
        row["seed_test_acc"] = finals[row["label"]]  # None: diverged
        # against the first method, seed by seed: differences a group interval would hide
        diff = runs.paired_difference(groups[row["label"]], groups[reference])
        row["versus"] = reference
        row["diff"], row["diff_ci95"] = diff if diff else (None, None)
    return rows


def format_task(rows: list[dict], lrs) -> str:
    """The method table of one task: rate chosen, validation per rate, then the runs'."""
    def cell(row, lr) -> str:  # "-": not swept for this method; NaN: diverged
        if str(lr) not in row["validation"]:
            return f"{'-':>10}"
        acc = row["validation"][str(lr)]
        return f"{'NaN' if acc is None else format(acc, '.3f'):>10}"

    def diff(row) -> str:
        return "-" if row["diff"] is None else f"{row['diff']:+.3f} ± {row['diff_ci95']:.3f}"

    lrs = sorted({float(lr) for row in rows for lr in row["validation"]} | set(lrs))
    grid = "".join(f"{'val@' + format(lr, 'g'):>10}" for lr in lrs)
    versus = f"test - {rows[0]['versus']} (paired)" if rows else ""
    lines = [f"{'method':<20}{'lr':>7}{grid}  {versus}"]
    lines += [f"{r['label']:<20}{r['lr']:>7g}"
              + "".join(cell(r, lr) for lr in lrs) + f"  {diff(r):>17}"
              for r in rows]
    return "\n".join(lines)


def main(args) -> int:
    transport = get_transport()
    before = machine_load() if transport.rank == 0 else None
    if args.global_batch and args.global_batch % transport.size:
        raise SystemExit(f"--global-batch {args.global_batch} does not split over "
                         f"{transport.size} ranks: give a multiple of the rank count")
    folder = start_runs(transport, args, METHODS)
    results = {}
    for task in args.tasks:
        base = shlex.split(args.base if task == "custom" else TASKS[task])
        base += QUICK["extra"] if args.quick else []
        if args.global_batch:  # each rank's share (the last --batch-size given wins)
            base += ["--batch-size", str(args.global_batch // transport.size)]
        rows = run_task(transport, args, task, base, folder)
        if transport.rank != 0:
            continue
        results[task] = {"base": shlex.join(base), "rows": rows}
        print(f"# ringcomp.experiments convergence, task {task}: {transport.size} ranks, "
              f"lr grid {','.join(map(str, args.lrs))} (best mean on validation, seeds "
              f"{','.join(map(str, args.sweep_seeds))}), test seeds "
              f"{','.join(map(str, args.seeds))}, base: "
              f"{shlex.join(base)}")
        print(format_task(rows, args.lrs))
        print(runs.format_rows(rows, args.target))
        groups = {r["label"]: [runs.load_run(os.path.join(folder, f"{task}-{r['label']}-seed"
                                                          f"{s}.jsonl")) for s in args.seeds]
                  for r in rows}
        for path in runs.plot_runs(groups, rows, f"{args.out}-{task}", args.target):
            log.info(f"wrote {path}")
        # after every task: a long study stopped later keeps the tasks it finished
        prov = provenance(["mpiexec", "-n", str(transport.size), *args.command_line],
                          mpi_facts()["mpi_library"], before, args.digests,
                          ranks=transport.size, placement="one node")
        write(f"{args.out}.json", "convergence", prov, {
            "ranks": transport.size, "seeds": args.seeds, "lrs": args.lrs,
            "sweep_seeds": args.sweep_seeds, "target": args.target, "tasks": results})
        log.info(f"wrote {args.out}.json")
    return 0


def check_args(args, parser) -> None:
    """Refuse what would fail mid-study (parser.error, alike on every rank)."""
    unknown = [t for t in args.tasks if t not in (*TASKS, "custom")]
    if unknown:
        parser.error(f"unknown --tasks {unknown}; known: {', '.join(TASKS)}, custom")
    if "custom" in args.tasks and not args.base:
        parser.error("--tasks custom needs --base (the options every method shares)")
    if args.base and "custom" not in args.tasks:
        parser.error("--base acts only with --tasks custom")
    if args.quick:  # the smoke form's rates and seeds, where the user named none
        for name in ("lrs", "seeds", "sweep_seeds"):
            if getattr(args, name) is None:
                setattr(args, name, QUICK[name])
    if args.sweep_seeds is None:
        args.sweep_seeds = SWEEP_SEEDS
    if not args.sweep_seeds:
        parser.error("--sweep-seeds needs at least one seed")
    ratios = [m for m in args.methods if marsit_ratio(m) is not None]
    if ratios and args.base and any(w.split("=")[0] == "--global-lr"
                                    for w in shlex.split(args.base)):
        parser.error(f"--base sets --global-lr, which {', '.join(ratios)} set at every rate")
    check_sweep(args, parser)


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("convergence", parents=[common_parser()],
                       help="every aggregation scheme at its best learning rate, over seeds")
    p.add_argument("--methods", type=parse_list, default=DEFAULT_METHODS,
                   help=f"of {', '.join(METHODS)}, or ring+marsit-s<any ratio> "
                        "(default: %(default)s)")
    p.add_argument("--tasks", type=parse_list, default=["mlp"],
                   help=f"of {', '.join(TASKS)}, custom (with --base); default: mlp")
    p.add_argument("--base", default=None,
                   help="with --tasks custom: the training options every method shares")
    add_sweep_options(p, "0.01,0.03,0.1", "0,1,2,3,4")
    p.add_argument("--sweep-seeds", "--sweep-seed", default=None, type=parse_ints,
                   help="seeds of the learning-rate sweep, whose mean validation accuracy "
                        f"picks the rate (default: {','.join(map(str, SWEEP_SEEDS))}, "
                        "apart from --seeds)")
    p.add_argument("--global-batch", type=positive_int, default=None, metavar="N",
                   help="hold the global batch at N samples a step: each rank's batch is "
                        "N / ranks (N a multiple of the rank count), so runs at several "
                        "rank counts take the same steps on the same data (default: each "
                        "task's batch of 8 a rank)")
    p.add_argument("--target", type=float, default=0.9,
                   help="test accuracy for the steps-to-target column (default: 0.9)")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke test: 1 epoch, rates {QUICK['lrs']}, seeds {QUICK['seeds']}, "
                        f"sweep seeds {QUICK['sweep_seeds']} (any of them given still acts)")
    p.add_argument("--out", type=out_path, default="convergence",
                   help="output path prefix (default: %(default)s)")
    p.set_defaults(run=main, mpi=True, check=check_args, digest_parts=digest_parts)


def digest_parts(args) -> list[str]:
    """The miniatures that decide this study's values: its methods' training options (a
    ``ring+marsit-s<ratio>`` method's are Marsit's). None for ``--quick``: a smoke run,
    whose record is not for the docs (``digests --check`` would refuse it there)."""
    if getattr(args, "quick", False):  # tune-for-target, which shares it, has no --quick
        return []
    return [train_part(METHODS[method]) for method in args.methods]
