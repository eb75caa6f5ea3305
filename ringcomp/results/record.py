"""A record: one study's data plus its provenance (command, commit, host, versions, load)."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time

from threadpoolctl import threadpool_info

from ringcomp.cluster import testbed_context
from ringcomp.version import ROOT, git

#: the packages whose versions a record names
PACKAGES = ("numpy", "numba", "mpi4py", "mpich", "openmpi", "scipy", "torch", "cupy")
#: a process counts as busy when it used more than this share of one core while sampled
BUSY_SHARE = 0.1
#: how long the other processes' CPU use is sampled (seconds)
BUSY_WINDOW = 0.25


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _simd() -> str | None:
    """The widest vector extension the CPU reports (what Numba's kernels compile for: a
    codec's speed differs by it, e.g. 64-bit multiplies are one AVX-512 instruction and
    emulated under AVX2); None where /proc/cpuinfo does not say."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith(("flags", "Features"))), None)
    except OSError:
        return None
    if flags is None:
        return None
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"),
                       ("sse4_2", "SSE4.2"), ("asimd", "NEON")):
        if flag in flags:
            return name
    return None


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (OSError, ValueError):
        return None


def _gpus() -> list[dict]:
    """The GPUs ``nvidia-smi`` lists (model, driver, memory); none without it. With the
    CUDA runtime version where the study loaded CuPy (what its kernels ran on), and
    ``mps`` where an MPS server's control pipe is there (the ranks' kernels then share the
    GPU through it instead of taking turns)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listed = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = [dict(zip(("model", "driver", "memory"), (field.strip() for field in
                                                      line.rsplit(",", 2)), strict=True))
             for line in listed.splitlines() if line.count(",") >= 2]
    if found and os.path.exists(os.path.join(
            os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"), "control")):
        for gpu in found:  # CUDA clients find an MPS server by this pipe: ranks share it
            gpu["mps"] = True
    cupy = sys.modules.get("cupy")
    if cupy is not None and found:
        with contextlib.suppress(Exception):  # a CuPy without a usable runtime says nothing
            version = cupy.cuda.runtime.runtimeGetVersion()
            for gpu in found:
                gpu["cuda_runtime"] = f"{version // 1000}.{version % 1000 // 10}"
    return found


def _versions() -> dict:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def blas_kernels() -> str | None:
    """The kernels OpenBLAS runs here ('Haswell', 'SkylakeX', ...; None without OpenBLAS
    loaded): a matrix product's bits depend on them, so a digest of training steps does."""
    return next((lib.get("architecture") for lib in threadpool_info()
                 if lib.get("internal_api") == "openblas"), None)


def _cpu_times() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, user + system CPU seconds) of every process /proc shows."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)": state first
            found[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return found


def busy_processes(window: float = BUSY_WINDOW) -> int | None:
    """How many other processes used more than ``BUSY_SHARE`` of a core over ``window``
    seconds (``busy_pids``); None where /proc cannot be read."""
    return len(busy_pids(window)) if os.path.isdir("/proc/self") else None


def _command_line(pid: int) -> bytes | None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()
    return None


def busy_pids(window: float = BUSY_WINDOW) -> set[int]:
    """The other processes that used more than ``BUSY_SHARE`` of a core over ``window``
    seconds: this process, its ancestors, its siblings (the job's other ranks under one
    launcher) and the processes running this very command line (its other ranks under
    other launchers: the testbed's, one per emulated host) do not count."""
    first = _cpu_times()
    time.sleep(window)
    second = _cpu_times()
    mine, parent = os.getpid(), os.getppid()
    ours, pid = {mine}, mine
    while pid in second and pid not in (0, 1):  # the ancestors: the launcher, a shell
        pid = second[pid][0]
        ours.add(pid)
    busy = {pid for pid, (ppid, used) in second.items()
            if pid not in ours and ppid != parent and pid in first
            and used - first[pid][1] > BUSY_SHARE * window}
    command = _command_line(mine)
    return {pid for pid in busy if command is None or _command_line(pid) != command}


def machine_load() -> dict:
    """The machine's load now: the 1-minute load average and the count of other busy
    processes (``busy_processes``). Taken when a study starts and again when it writes its
    record: timing figures move with it."""
    return {"load1": round(os.getloadavg()[0], 2), "busy_processes": busy_processes()}


#: the environment variables that change how fast the same code runs: MPI's and its
#: transports' settings, thread counts, kernel choices (MPICH's heavy yield, for one, made
#: back-to-back small all-reduces 3-4x slower here)
TIMING_VARIABLES = ("MPIR_CVAR_", "MPICH_", "OMPI_MCA_", "PRTE_MCA_", "UCX_", "FI_", "NUMBA_",
                    "OMP_NUM_THREADS", "OPENBLAS_", "MKL_NUM_THREADS", "RINGCOMP_")


def timing_environment() -> dict:
    """The variables of ``TIMING_VARIABLES`` set in this process's environment, sorted,
    but for the one the Makefile sets for every run (MPICH's shared-memory collectives'
    threshold, against their busy-spin below MPI_THREAD_MULTIPLE: no change at the
    thread level ringcomp runs at)."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(TIMING_VARIABLES) and k != "MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD"}


def provenance(command: list[str], mpi: str, before: dict | None,
               digests: dict | None = None, **extra) -> dict:
    """Where, when and on what a record was measured.

    Args:
        command: the command line that reproduces it.
        mpi: the MPI library (``launch.mpi_facts``), '' for none.
        before: ``machine_load()`` taken when the study started (None: not taken, for a
            record of computed values only); the load after is taken here.
        digests: for a record of computed values, ``{part@ranks: digest}`` of the
            miniature runs that decide them (``experiments.digests``), computed in this
            process, whose BLAS kernels (``blas_kernels``) the record names beside them;
            CI re-runs them.
        extra: anything else the study knows (rank count, placement, device).
    """
    testbed = testbed_context()
    if testbed is not None and command[:2] == ["mpiexec", "-n"]:
        # a job ``python -m ringcomp.testbed`` started: the command that reproduces it is
        # the testbed's, and its ranks sit on emulated hosts, not on one node
        command = [*testbed["command"], "--", *command[3:]]
        extra["placement"] = testbed["placement"]
    # the docs (README.md too) and the records themselves do not count: a study writing
    # several records in a row would otherwise call every record after the first "dirty"
    status = [line for line in git("status", "--porcelain", "--untracked-files=no")
              .splitlines() if not line.split(maxsplit=1)[-1].startswith(("docs/",
                                                                          "README.md"))]
    # a copy without its .git (a device machine's) takes the commit it was copied at from
    # RINGCOMP_COMMIT, and says so
    commit = git("rev-parse", "HEAD")
    if not commit and os.environ.get("RINGCOMP_COMMIT"):
        commit = os.environ["RINGCOMP_COMMIT"]
        extra.setdefault("commit_from", "RINGCOMP_COMMIT (no git checkout)")
    found = {"command": shlex.join(command), "commit": commit,
             "dirty": bool(status), "date": datetime.datetime.now(datetime.UTC)
             .strftime("%Y-%m-%d %H:%M UTC"),
             "host": {"name": platform.node(), "cores": os.cpu_count(), "cpu": _cpu_model(),
                      "simd": _simd(), "memory_gib": _memory_gib(), "os": platform.platform(),
                      "gpus": _gpus()},
             "mpi": mpi, "versions": _versions(), **extra}
    environment = timing_environment()
    if environment:
        found["environment"] = environment
    if before is not None:
        found["load"] = {"before": before, "after": machine_load()}
    if digests:
        found["digests"] = dict(sorted(digests.items()))
        found["digests_blas"] = blas_kernels()
    return found


def write(path: str, kind: str, prov: dict, data: dict) -> None:
    """Write a record atomically (a crash leaves the old one)."""
    record = {"kind": kind, "provenance": prov, **data}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def load(path: str) -> dict:
    """The record at ``path`` (relative paths from the project root); a record that is not
    whole JSON (truncated, say) raises ValueError naming its file."""
    with open(path if os.path.isabs(path) else os.path.join(ROOT, path)) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"record {path} is not whole JSON (truncated?): {exc}") from None
