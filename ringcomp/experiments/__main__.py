"""``python -m ringcomp.experiments {hops,convergence,validate}``: a study under mpiexec."""

from __future__ import annotations

import argparse
import sys

from ringcomp.cli import apply_common, common_parser, parse_list, parse_rate
from ringcomp.experiments import convergence, hops, network, network_steps, validate
from ringcomp.sched.planners import check_spec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ringcomp.experiments",
        description="Studies behind the README's figures; run under mpiexec. Rank 0 prints "
                    "the tables and writes the plots and a JSON of the numbers.")
    sub = parser.add_subparsers(dest="study", required=True)
    h = sub.add_parser("hops", parents=[common_parser()],
                       help="error per hop and bias over steps of every aggregation scheme")
    h.add_argument("--methods", type=parse_list, default=hops.DEFAULT_METHODS,
                   help="algorithm+compressor pairs (default: %(default)s)")
    h.add_argument("--elements", type=int, default=1 << 15,
                   help="vector length per rank (default: %(default)s)")
    h.add_argument("--steps", type=int, default=64,
                   help="repetitions with fresh random keys, averaged (default: %(default)s)")
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--out", default="hops", help="output path prefix (default: %(default)s)")
    c = sub.add_parser("convergence", parents=[common_parser()],
                       help="train the same model under every aggregation scheme, over seeds")
    c.add_argument("--methods", type=parse_list, default=list(convergence.METHODS),
                   help="method names (default: all: %(default)s)")
    c.add_argument("--seeds", type=lambda s: [int(x) for x in parse_list(s)],
                   default=[0, 1, 2], help="seeds per method (default: 0,1,2)")
    c.add_argument("--base", default=convergence.DEFAULT_BASE,
                   help="training options every method shares (default: %(default)r)")
    c.add_argument("--target", type=float, default=0.9,
                   help="test accuracy for the steps-to-target column (default: 0.9)")
    c.add_argument("--out", default="convergence",
                   help="output path prefix (default: %(default)s)")
    v = sub.add_parser("validate", parents=[common_parser()],
                       help="predicted (profile + plan) versus measured train step time")
    v.add_argument("--methods", type=parse_list, default=["none", "marsit", "topk+ef"],
                   help=f"of {', '.join(validate.METHODS)} (default: %(default)s)")
    v.add_argument("--plans", type=parse_list, default=["layerwise", "mgwfbp", "optimal"],
                   help="default: %(default)s")
    v.add_argument("--base", default=validate.DEFAULT_BASE,
                   help="training options every run shares (default: %(default)r)")
    v.add_argument("--out", default="validate", help="output path prefix")
    n = sub.add_parser("network", help="every algorithm and compressor on emulated "
                                       "rate-limited links (root; not under mpiexec)")
    n.add_argument("--hosts", type=int, default=4, help="emulated hosts (default: 4)")
    n.add_argument("--rates", type=lambda s: [parse_rate(x) for x in parse_list(s)],
                   default=[parse_rate(r) for r in ("100mbit", "1gbit", "10gbit")],
                   help="link rates (default: 100mbit,1gbit,10gbit)")
    n.add_argument("--sizes", default="4K,256K,4M,64M", help="default: %(default)s")
    n.add_argument("--algorithms", default="ring,tree,auto,mpi,allgather",
                   help="the exact ring, every row's baseline, is always added (default: "
                        "%(default)s)")
    n.add_argument("--compressors", default="marsit,fp16,topk,sign",
                   help="default: %(default)s")
    n.add_argument("--iters", type=int, default=3, help="timed repetitions (default: 3)")
    n.add_argument("--models", type=parse_list, default=list(network_steps.MODELS),
                   help="replay models whose training steps are timed on every rate ('' "
                        "for none; default: %(default)s)")
    n.add_argument("--train-methods", type=parse_list, default=list(network_steps.METHODS),
                   help="validate's methods for the training steps; 'none' (the "
                        "uncompressed overlapped baseline) is always added (default: "
                        "%(default)s)")
    n.add_argument("--plan", default="mgwfbp",
                   help="fusion plan of every training run (default: %(default)s)")
    n.add_argument("--replay-scale", type=float, default=0.1,
                   help="fraction of every replay tensor and its compute (default: "
                        "%(default)s; 1 = the published sizes)")
    n.add_argument("--batch-size", type=int, default=32, help="default: %(default)s")
    n.add_argument("--replay-tflops", type=float, default=10.0,
                   help="emulated compute speed per rank (default: %(default)s)")
    n.add_argument("--steps", type=int, default=8,
                   help="training steps per run; the first 3 are warm-up (default: 8)")
    n.add_argument("--timeout", type=float, default=1800,
                   help="seconds before a command on a testbed (one bench, one model's "
                        "training jobs) is killed (default: 1800)")
    n.add_argument("--out", default="network", help="output path prefix")
    args = parser.parse_args(argv)
    if args.study == "network":  # launches its own testbeds: no MPI in this process
        if not 2 <= args.hosts <= 8:
            parser.error(f"--hosts must be 2..8 (2 cores cannot drive more), got {args.hosts}")
        algorithms = parse_list(args.algorithms)  # the exact ring is every row's baseline
        args.algorithms = ",".join(["ring"] + [a for a in algorithms if a != "ring"])
        if args.models:
            args.train_methods = ["none"] + [m for m in args.train_methods if m != "none"]
            unknown = sorted(set(args.train_methods) - set(validate.METHODS))
            if unknown:
                parser.error(f"unknown --train-methods {unknown}; known: "
                             f"{', '.join(validate.METHODS)}")
            unknown = sorted(set(args.models) - set(network_steps.MODELS))
            if unknown:
                parser.error(f"unknown --models {unknown}; known: "
                             f"{', '.join(network_steps.MODELS)}")
            if args.steps < 4:
                parser.error("--steps must be >= 4 (3 warm-up steps + at least one timed)")
            try:
                check_spec(args.plan)
            except ValueError as err:
                parser.error(f"--plan: {err}")
        return network.main(args)
    apply_common(args)
    return {"hops": hops.main, "convergence": convergence.main,
            "validate": validate.main}[args.study](args)


if __name__ == "__main__":
    sys.exit(main())
