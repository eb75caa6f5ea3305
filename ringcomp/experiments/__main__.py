"""``python -m ringcomp.experiments STUDY``: one study (hops, convergence, validate, network,
time-to-accuracy, tune-for-target, codecs, torch); the MPI ones under mpiexec, ``network`` and
``time-to-accuracy`` as root on their own (they launch emulated clusters), ``codecs`` on its
own (it launches its jobs)."""

from __future__ import annotations

import importlib
import importlib.util
import sys


def _load_on_first_use(name: str) -> None:
    """Put module ``name`` in ``sys.modules`` unexecuted; it runs on first attribute access
    (importlib's documented lazy-import recipe). For scipy.stats, which the studies' result
    tables need on rank 0 only and which costs ~1.3 s of CPU per process to import: every
    rank of every study, and every ``--help``, paid it."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    # ``from scipy import stats`` then finds it as an attribute: asking the import system
    # again would load it at once (Python 3.11 reads the module's ``__spec__``)
    setattr(sys.modules[parent], child, module)


_load_on_first_use("scipy.stats")

from ringcomp import cli  # noqa: E402 - after the lazy modules are in place
from ringcomp.cli import apply_common  # noqa: E402
from ringcomp.experiments import (  # noqa: E402
    codecs,
    convergence,
    hop_error,
    network,
    target_tuning,
    time_to_accuracy,
    torch_tables,
    validate,
)


def main(argv=None) -> int:
    parser = cli.Parser(
        prog="python -m ringcomp.experiments",
        description="Studies behind the README's figures; run under mpiexec. Rank 0 prints "
                    "the tables and writes the plots and a JSON of the numbers.")
    sub = parser.add_subparsers(dest="study", required=True)
    studies = [hop_error, convergence, validate, network, time_to_accuracy, target_tuning,
               codecs, torch_tables]
    for study in studies:  # each owns its sub-parser
        study.add_parser(sub)
    args = parser.parse_args(argv)
    # what a record names as the command that reproduces it
    args.command_line = ["python", "-m", "ringcomp.experiments",
                         *(sys.argv[1:] if argv is None else argv)]
    if getattr(args, "check", None) is not None:
        args.check(args, parser)
    if args.mpi:
        apply_common(args)
    # a study may name the module whose ``main`` runs it (imported only now: torch)
    run = importlib.import_module(args.run).main if isinstance(args.run, str) else args.run
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
