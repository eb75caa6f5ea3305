"""ringcomp: hop-by-hop ring and tree all-reduce over MPI, built to measure compression.

The public names load on first use (``ringcomp.allreduce`` imports the collectives then),
so the tools that need no MPI (perfmodel, simulate, report) run where no MPI library is
installed; the first use of MPI there says how to install one."""

import importlib

from ringcomp.transport.startup import import_mpi_with_deadline, mpi_loaded
from ringcomp.version import __version__ as __version__  # setup.cfg, --version: one source

# first of all: a launcher that never lets MPI_Init return would hang this process forever
# (ringcomp/transport/startup.py); no MPI library at all is remembered, not raised, here
import_mpi_with_deadline()

if mpi_loaded():
    from ringcomp.transport.launch import check_world

    # a launch MPI does not know (torchrun; N singletons) stops here, on every process
    check_world()

#: public name -> the module that defines it
_HOMES = {
    "AllreducePlan": "plans.plan", "ArgumentMismatchError": "errors",
    "Compressor": "compression", "LauncherError": "errors", "RingcompError": "errors",
    "Tracer": "trace", "Transport": "transport.comm", "algorithms": "api", "allgather": "api",
    "allreduce": "plans.call", "allreduce_init": "plans.plan", "broadcast": "api",
    "compressors": "compression", "get_compressor": "compression",
    "get_transport": "transport.cache", "install_abort_on_exception": "transport.launch",
    "reduce_scatter": "api",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(f"ringcomp.{_HOMES[name]}"), name)
        globals()[name] = value  # the next use is a plain attribute
        return value
    try:  # a submodule, as after an import of the package that imported it
        return importlib.import_module(f"ringcomp.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"ringcomp.{name}":
            raise
    raise AttributeError(f"module 'ringcomp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_HOMES))
