"""``python -m ringcomp.experiments STUDY``: one study (hops, convergence, validate, network,
time-to-accuracy, tune-for-target, codecs, kernels, torch, resnet50, train-time) or
``digests`` (the value records' digests against the code); the MPI ones under mpiexec,
``network`` and ``time-to-accuracy`` as root on their own (they launch emulated clusters),
``codecs``, ``train-time`` and ``kernels`` on their own (the first two launch their jobs,
the last is one process)."""

from __future__ import annotations

import importlib
import sys

from ringcomp import cli
from ringcomp.cli import apply_common
from ringcomp.experiments import (
    codecs,
    convergence,
    digests,
    hop_error,
    kernels,
    network,
    resnet50,
    target_tuning,
    time_to_accuracy,
    torch_tables,
    train_time,
    validate,
)
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import launched_tasks


def main(argv=None) -> int:
    parser = cli.Parser(
        prog="python -m ringcomp.experiments",
        description="Studies behind the README's figures; run under mpiexec. Rank 0 prints "
                    "the tables and writes the plots and a JSON of the numbers.")
    sub = parser.add_subparsers(dest="study", required=True)
    studies = [hop_error, convergence, validate, network, time_to_accuracy, target_tuning,
               codecs, kernels, torch_tables, resnet50, train_time, digests]
    for study in studies:  # each owns its sub-parser
        study.add_parser(sub)
    args = parser.parse_args(argv)
    tasks = launched_tasks()
    if not args.mpi and tasks > 1:
        # N copies would each launch its own jobs (or time the same kernels) and write the
        # same record; under mpiexec their jobs' MPI_Init fails with a PMI error
        parser.error(f"{args.study} is not an MPI job: run it alone, without mpiexec or srun "
                     f"(it launches any job it needs itself; this process is one of "
                     f"{tasks} tasks)")
    # what a record names as the command that reproduces it
    args.command_line = ["python", "-m", "ringcomp.experiments",
                         *(sys.argv[1:] if argv is None else argv)]
    if getattr(args, "check", None) is not None:
        args.check(args, parser)
    if args.mpi:
        apply_common(args)
    # a study of computed values: the digests of the code its values come from, first
    # (``digests``: its record keeps them; CI computes them again)
    parts = args.digest_parts(args) if getattr(args, "digest_parts", None) else []
    args.digests = digests.stamp(get_transport(), parts) if parts else {}
    # a study may name the module whose ``main`` runs it (imported only now: torch)
    run = importlib.import_module(args.run).main if isinstance(args.run, str) else args.run
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
