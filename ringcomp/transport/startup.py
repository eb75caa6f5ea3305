"""MPI's start-up under a deadline: a rank stuck in MPI_Init is told why and stopped."""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import types

#: what says a launcher started this process (a plain ``python`` starts as a singleton,
#: which cannot hang in MPI_Init)
LAUNCHER_VARIABLES = ("PMI_FD", "PMI_PORT", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
#: the least time MPI_Init is given unless RINGCOMP_INIT_TIMEOUT says otherwise: it waits for
#: the slowest rank to start Python, which a short deadline for waits must not cut off
MIN_DEADLINE_S = 300.0


def check_timeout(value, what: str = "timeout") -> float:
    """A deadline in seconds: a finite number >= 0 (0 disables the deadline). Defined here,
    in the module ``import ringcomp`` runs first, so the variables read before MPI starts
    and the deadlines the transport takes are parsed by one rule (``checks`` re-exports it)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}") from None
    if not (seconds >= 0 and seconds != float("inf")):
        raise ValueError(f"{what} must be a finite number of seconds >= 0 (0 = no deadline), "
                         f"got {value!r}")
    return seconds


def _seconds(name: str) -> float | None:
    """The variable as seconds; None when unset. A value ``check_timeout`` refuses raises
    its ValueError here, at import, on every rank (it used to switch the watch off)."""
    raw = os.environ.get(name, "")
    return check_timeout(raw, name) if raw else None


def deadline() -> float:
    """Seconds MPI_Init may take (0: no deadline): RINGCOMP_INIT_TIMEOUT; else
    RINGCOMP_TIMEOUT, the waits' deadline, but at least 300 s (0 disables it here too)."""
    init, waits = _seconds("RINGCOMP_INIT_TIMEOUT"), _seconds("RINGCOMP_TIMEOUT")
    if init is not None:
        return init
    if waits == 0:
        return 0.0
    return max(waits or 0.0, MIN_DEADLINE_S)


def stuck_message(seconds: float) -> str:
    rank = os.environ.get("PMI_RANK") or os.environ.get("PMIX_RANK") or os.environ.get(
        "OMPI_COMM_WORLD_RANK", "?")
    return (
        f"[ringcomp] MPI_Init did not return in {seconds:g} s (RINGCOMP_INIT_TIMEOUT) on "
        f"{socket.gethostname()}, pid {os.getpid()}, launcher rank {rank}: this process is "
        "stuck starting MPI and is stopped. Usual causes: under `srun --mpi=pmi2` with the "
        "MPICH wheel, Slurm's PMI-1 parser lost a request (slurmstepd printed 'mpi/pmi2: "
        "value not properly terminated in client request'): submit again, or launch with "
        "mpirun inside the allocation; a launcher of another MPI than the one mpi4py uses; "
        "another rank that died while starting.\n")


#: why MPI could not be loaded ("" while it could, or was not tried)
MPI_MISSING = [""]


def no_mpi_message(reason: str) -> str:
    return ("ringcomp: no MPI library could be loaded (" + reason.strip().replace("\n", "; ")
            + "). The tools that need none (perfmodel, simulate, report) work without one; "
            "for the collectives install MPI with ringcomp: pip install 'ringcomp[mpich]' "
            "(the MPICH wheel), or use a site MPI: load its module "
            "and build mpi4py against it (pip install --no-binary mpi4py mpi4py), or point "
            "mpi4py at its library (MPI4PY_LIBMPI=/path/to/libmpi.so)")


class _MissingMPI(types.ModuleType):
    """Stands in for ``mpi4py.MPI`` when no MPI library loads: importing it works (so
    ``import ringcomp`` and the tools that need no MPI do), using it raises the message."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise ImportError(MPI_MISSING[0])


def _import_mpi() -> None:
    """``import mpi4py.MPI``; when its MPI library cannot be loaded, put ``_MissingMPI`` in
    its place and remember why."""
    try:
        import mpi4py.MPI  # noqa: F401
    except RuntimeError as err:  # mpi4py's "cannot load MPI library"
        if "cannot load MPI library" not in str(err):
            raise
        MPI_MISSING[0] = no_mpi_message(str(err))
        import mpi4py

        sys.modules["mpi4py.MPI"] = mpi4py.MPI = _MissingMPI("mpi4py.MPI")


def mpi_loaded() -> bool:
    return not MPI_MISSING[0]


def import_mpi_with_deadline() -> None:
    """Import ``mpi4py.MPI`` (which runs MPI_Init) and stop this process if that hangs.

    MPI_Init holds the GIL, so no Python thread can watch it; a forked child does.

    1. Nothing to watch when MPI is already imported, when no launcher started this
       process, when the deadline is 0, or when other threads run (fork would copy a
       process in the middle of their work): import as usual.
    2. Fork a child that holds the read end of a pipe; this process keeps the write end
       and imports ``mpi4py.MPI``.
    3. The child waits on the pipe up to ``deadline()``. End of file - this process closed
       its end after MPI_Init returned, or died - and it exits quietly. Deadline first: it
       writes why to stderr and sends SIGTERM (its default action ends a process blocked
       in C, which a Python handler could not run in).
    4. This process closes its end and reaps the child: nothing is left behind.

    Invariant: the child only calls select, write, kill and _exit (it copies a process
    whose other state it must not touch).
    """
    seconds = deadline()
    if ("mpi4py.MPI" in sys.modules or seconds == 0 or threading.active_count() > 1
            or not any(os.environ.get(v) for v in LAUNCHER_VARIABLES)):
        _import_mpi()
        return
    message = stuck_message(seconds).encode()  # 1.
    read_end, write_end = os.pipe()
    parent = os.getpid()
    child = os.fork()  # 2.
    if child == 0:
        try:  # 3.
            os.close(write_end)
            ready, _, _ = select.select([read_end], [], [], seconds)
            if not ready:
                os.write(2, message)
                os.kill(parent, signal.SIGTERM)
        finally:
            os._exit(0)
    os.close(read_end)
    try:
        _import_mpi()
    finally:
        os.close(write_end)  # 4.
        os.waitpid(child, 0)
