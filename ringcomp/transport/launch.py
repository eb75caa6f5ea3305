"""How the job was launched and how it ends: singleton detection, abort on an uncaught
exception, facts about the MPI library."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from mpi4py import MPI

from ringcomp.errors import LauncherError
from ringcomp.transport.mpilib import libmpi_path

#: what a launcher sets in every process it starts (MPICH/Hydra, Open MPI, PMIx, MVAPICH,
#: Slurm's srun)
LAUNCHER_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE",
                 "SLURM_STEP_NUM_TASKS")


def launched() -> bool:
    """Whether an MPI launcher started this process (``mpiexec -n 1`` included)."""
    return any(os.environ.get(var) for var in LAUNCHER_VARS)


def launched_tasks() -> int:
    """How many processes the launcher that started this one says it started (1 when none
    did, or one task: a Slurm batch step)."""
    sizes = [int(value) for var in LAUNCHER_VARS
             if (value := os.environ.get(var, "")).isdigit()]
    return max(sizes, default=1)


#: what a launcher outside MPI tells its processes (torchrun, torch.distributed.launch,
#: accelerate): the number of processes it started
FOREIGN_WORLD_VARS = ("WORLD_SIZE",)
#: what torchrun (torch.distributed.run) sets in every process it starts, one included
TORCHRUN_VARS = ("TORCHELASTIC_RUN_ID",)


def check_launcher(comm) -> None:
    """Fail loudly when N processes were started as N singletons (each rank 0 of 1), or by
    a launcher whose world disagrees with MPI's (``check_foreign_world``).

    The classic mistakes: ``srun --mpi=none``, a launcher of one MPI starting a Python linked
    to another MPI, or N shells each running python: the launcher's environment then says
    there are several tasks while MPI says there is one.
    """
    check_foreign_world()
    world = MPI.COMM_WORLD.Get_size()
    if comm.Get_size() != 1 or world != 1:  # COMM_SELF of a real job
        return
    for var in LAUNCHER_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 1:
            raise LauncherError(
                f"MPI reports a world of 1 process but the launcher set {var}={value}: these "
                "processes were started as singletons that each believe they are rank 0 of 1. "
                "Launch with the mpiexec that belongs to the MPI mpi4py was built against "
                f"(MPI here: {' '.join(MPI.Get_library_version().split()[:3])}), or under "
                "Slurm with `srun --mpi=pmi2` (MPICH wheel) / `--mpi=pmix` (Open MPI).")


def check_foreign_world() -> None:
    """Fail when a launcher outside MPI - torchrun, which sets ``WORLD_SIZE`` - says another
    number of processes than MPI's world: its processes are not one MPI job, so each is a
    world of one and the first collective that expects the others waits for ever."""
    world = MPI.COMM_WORLD.Get_size()
    for var in FOREIGN_WORLD_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) != world:
            raise LauncherError(
                f"{var}={value} (set by torchrun or another launcher outside MPI) but MPI "
                f"reports a world of {world} process(es): ringcomp's ranks are MPI's, and "
                f"processes that torchrun starts are not one MPI job. Launch with "
                f"`mpiexec -n {value} python {_command()}` (or srun --mpi=pmi2 under "
                "Slurm), without torchrun")
    if not launched() and any(os.environ.get(var) for var in TORCHRUN_VARS):
        # one process too: its worlds agree, but torch.distributed's default init then
        # waits in the store torchrun's own agent holds (it hung there)
        count = os.environ.get("WORLD_SIZE", "") or "N"
        raise LauncherError(
            f"started by torchrun (TORCHELASTIC_RUN_ID is set): ringcomp's ranks are MPI's, "
            f"and torchrun's processes are not an MPI job. Launch with `mpiexec -n {count} "
            f"python {_command()}` (or srun --mpi=pmi2 under Slurm), without torchrun")


def _command() -> str:
    """This process's command line after the interpreter, for a suggested launch: under
    ``python -m ringcomp.<tool>`` ``sys.argv[0]`` is still "-m" while the package is
    imported (the module name was lost), so the original command line is read."""
    orig = list(getattr(sys, "orig_argv", []))
    if sys.argv[:1] == ["-m"] and "-m" in orig[1:]:
        return " ".join(orig[orig.index("-m", 1):])
    return " ".join(sys.argv) if sys.argv and sys.argv[0] else "train.py"


def check_world() -> None:
    """``check_foreign_world`` as ``import ringcomp`` runs it: a launch by torchrun stops in
    seconds with the command that works, before any collective waits (N singletons are
    refused when a transport is made: the studies that start their own jobs say it their
    way first).
    Under ``python -m`` (a ringcomp tool) as one line and exit status 2, as the tools' own
    refusals; in a program of the user's as the exception."""
    try:
        check_foreign_world()
    except LauncherError as exc:
        # ``python -m ringcomp.<tool>`` imports this package before the tool runs, while
        # sys.argv[0] is still "-m" (a script of the user's has its path there)
        if sys.argv[:1] == ["-m"]:
            sys.stderr.write(f"ringcomp: {exc}\n")
            sys.exit(2)
        raise


def install_abort_on_exception() -> None:
    """Make an uncaught exception on any rank (or thread) abort the whole MPI job.

    Without this, one rank dies with a traceback while the others wait for it forever.
    """
    if getattr(install_abort_on_exception, "_done", False):
        return
    install_abort_on_exception._done = True

    def _abort(exc_type, exc, tb, thread=None):
        try:
            size = MPI.COMM_WORLD.Get_size()
        except ImportError:  # no MPI library (``startup``): nobody to abort either
            size = 1
        if size == 1:  # nobody waits for us: the usual report
            sys.__excepthook__(exc_type, exc, tb)
            return
        where = f" in thread {thread.name}" if thread is not None else ""
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(f"[ringcomp rank {MPI.COMM_WORLD.Get_rank()}] uncaught exception"
                         f"{where}; aborting the job:\n{text}")
        sys.stderr.flush()
        time.sleep(1.0)  # let the launcher forward the traceback before the kill
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = _abort
    threading.excepthook = lambda a: _abort(a.exc_type, a.exc_value, a.exc_traceback, a.thread)


# -- run-time facts --------------------------------------------------------------------
def mpi_facts() -> dict:
    """Facts about the MPI in use, for ``ringcomp.info`` and benchmark headers."""
    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    return {
        "mpi_library": " ".join(MPI.Get_library_version().splitlines()[0].split(",")[0].split()),
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
        "thread_level": levels.get(MPI.Query_thread(), str(MPI.Query_thread())),
        "libmpi": libmpi_path(),
        "host": MPI.Get_processor_name(),
    }
