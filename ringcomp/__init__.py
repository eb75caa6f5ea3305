"""ringcomp: hop-by-hop ring and tree all-reduce over MPI, built to measure compression."""

from ringcomp.startup import import_mpi_with_deadline
from ringcomp.version import __version__ as __version__  # setup.cfg, --version: one source

# first of all: every import below initialises MPI, and a launcher that never lets MPI_Init
# return would hang this process forever (ringcomp/startup.py)
import_mpi_with_deadline()

from ringcomp.api import algorithms, allgather, allreduce, broadcast, reduce_scatter  # noqa: E402
from ringcomp.comm import Transport  # noqa: E402
from ringcomp.compression import Compressor, compressors, get_compressor  # noqa: E402
from ringcomp.errors import ArgumentMismatchError, LauncherError, RingcompError  # noqa: E402
from ringcomp.launch import check_world, install_abort_on_exception  # noqa: E402
from ringcomp.persistent import AllreducePlan, allreduce_init  # noqa: E402
from ringcomp.trace import Tracer  # noqa: E402
from ringcomp.transports import get_transport  # noqa: E402

# a launch MPI does not know (torchrun; N singletons) stops here, on every process
check_world()

__all__ = [
    "AllreducePlan", "ArgumentMismatchError", "Compressor", "LauncherError", "RingcompError",
    "Tracer", "Transport", "algorithms", "allgather", "allreduce", "allreduce_init",
    "broadcast", "compressors", "get_compressor", "get_transport",
    "install_abort_on_exception", "reduce_scatter",
]
