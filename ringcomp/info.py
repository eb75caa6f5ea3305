"""``python -m ringcomp.info``: what every rank runs on, and a launcher sanity check."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys

import numpy as np

from ringcomp import cli
from ringcomp.errors import LauncherError
from ringcomp.plans.call import allreduce
from ringcomp.trace import Tracer
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import mpi_facts


def _module_version(name: str) -> str:
    if importlib.util.find_spec(name) is None:
        return "-"
    try:
        module = __import__(name)
        return getattr(module, "__version__", "?")
    except Exception as exc:  # a broken optional install must not stop the report
        return f"broken ({type(exc).__name__})"


def _gpu() -> str:
    if importlib.util.find_spec("cupy") is None:
        return "-"
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        return f"{count} device(s)"
    except Exception as exc:
        return f"none ({type(exc).__name__})"


def rank_facts(transport) -> dict:
    """One rank's facts (host, MPI, thread level, CUDA-awareness, optional packages)."""
    facts = mpi_facts()
    return {
        "rank": transport.rank, "host": facts["host"], "pid": os.getpid(),
        "mpi": facts["mpi_library"], "thread": facts["thread_level"],
        "cuda_aware": transport.cuda_aware, "numpy": np.__version__,
        "numba": _module_version("numba"), "cupy": _module_version("cupy"), "gpu": _gpu(),
        "python": sys.version.split()[0],
    }


def format_table(rows: list[dict]) -> str:
    cols = ["rank", "host", "pid", "mpi", "thread", "cuda_aware", "numba", "cupy", "gpu"]
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(width[c]) for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(width[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = cli.Parser(
        prog="python -m ringcomp.info", parents=[cli.common_parser()],
        description="Print a per-rank table (host, MPI library, thread level, CUDA-awareness, "
                    "numba/cupy) on rank 0 and check the launch: fails when N processes were "
                    "started as N singletons that each believe they are rank 0 of 1.")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    cli.apply_common(args)
    try:
        transport = get_transport()
    except LauncherError as exc:
        print(f"ringcomp.info: launch error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # no MPI library: what to install, in one line
        print(f"ringcomp.info: {exc}", file=sys.stderr)
        return 2
    rows = transport.allgather_obj(rank_facts(transport))
    # prove the ranks really talk: a checked all-reduce of each rank's id
    tracer = Tracer(args.trace) if args.trace else None
    total = allreduce(np.array([transport.rank + 1], np.int64), tracer=tracer,
                      comm=transport)
    expected = transport.size * (transport.size + 1) // 2
    if tracer is not None:
        tracer.write(transport)
    if transport.rank == 0:
        if args.json:
            print(json.dumps({"size": transport.size, "ranks": rows}, indent=1))
        else:
            version = importlib.metadata.version("ringcomp")
            print(f"ringcomp {version}: {transport.size} rank(s); ring all-reduce check "
                  f"{'ok' if total[0] == expected else 'FAILED'}")
            print(format_table(rows))
    return 0 if total[0] == expected else 1


if __name__ == "__main__":
    sys.exit(main())
