"""ringcomp: hop-by-hop ring and tree all-reduce over MPI, built to measure compression."""

from ringcomp.api import algorithms, allgather, allreduce, broadcast, reduce_scatter
from ringcomp.comm import Transport
from ringcomp.compression import Compressor, compressors, get_compressor
from ringcomp.errors import ArgumentMismatchError, LauncherError, RingcompError
from ringcomp.launch import install_abort_on_exception
from ringcomp.trace import Tracer
from ringcomp.transports import get_transport

__version__ = "0.1.0"

__all__ = [
    "ArgumentMismatchError", "Compressor", "LauncherError", "RingcompError", "Tracer",
    "Transport", "algorithms", "allgather", "allreduce", "broadcast", "compressors",
    "get_compressor", "get_transport",
    "install_abort_on_exception", "reduce_scatter",
]
