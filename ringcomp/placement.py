"""Where a rank's arrays live: host memory (NumPy) or this rank's GPU (CuPy), by local rank."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

DEVICES = ("cpu", "gpu")


def local_rank() -> int:
    """This process's rank among those on its node, from the launcher (MPICH's Hydra,
    Open MPI, Slurm); 0 when none says."""
    for var in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def gpu_unavailable() -> str:
    """Why this process cannot use a GPU through CuPy, or '' if it can."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return ""
        return "CuPy sees no CUDA device"
    except Exception as err:  # no CuPy, no driver
        return (f"no usable GPU ({type(err).__name__}: {err}); install the gpu extra on a "
                "GPU machine")


@dataclass(frozen=True)
class Placement:
    """An array namespace (``xp``) and, for a GPU, which one (``index``).

    CuPy's current device is per host thread: every thread that touches this placement's
    arrays (the training loop, the communication engine) calls ``bind_thread`` first.
    """

    device: str
    xp: object
    index: int | None = None

    def bind_thread(self) -> None:
        """Make this placement's GPU the calling thread's current device (no-op on the
        host, or for a namespace that is not CuPy)."""
        if self.index is not None:
            import cupy

            cupy.cuda.Device(self.index).use()

    def synchronize(self) -> None:
        """Wait for the work queued on this thread's current stream (before reading a
        clock: GPU kernels run asynchronously); a no-op on the host."""
        if self.index is not None:
            import cupy

            cupy.cuda.get_current_stream().synchronize()

    def put(self, host: np.ndarray):
        """A copy of ``host`` in this placement's memory (``host`` itself on the CPU)."""
        return host if self.xp is np else self.xp.array(host)


def gpu_placement() -> Placement:
    """This rank's GPU: local rank modulo the GPUs CuPy sees (several ranks may share
    one), made current for the calling thread."""
    import cupy

    placement = Placement("gpu", cupy, local_rank() % cupy.cuda.runtime.getDeviceCount())
    placement.bind_thread()
    return placement


def place(device: str) -> Placement:
    """The placement for ``--device cpu|gpu``; ValueError for another name or a GPU that
    cannot be used (no silent fall-back to the host)."""
    if device == "cpu":
        return Placement("cpu", np)
    if device != "gpu":
        raise ValueError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
    why = gpu_unavailable()
    if why:
        raise ValueError(f"--device gpu: {why}")
    return gpu_placement()
