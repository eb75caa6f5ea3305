"""Where a rank's arrays live: host memory (NumPy) or this rank's GPU (CuPy), by local rank."""

from __future__ import annotations

import os
import sys
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


#: environment variables by which a user sizes the host's thread pools; any of them set
#: and ringcomp leaves the pools alone
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def share_host_cores(ranks_on_node: int) -> int | None:
    """Give this rank's BLAS and OpenMP thread pools (NumPy's matrix products, PyTorch's
    CPU kernels) its share of the node's cores; returns that share, or None when the
    user sized the pools (``OMP_NUM_THREADS`` and the like) and they are left alone.

    Every rank otherwise starts one BLAS thread per core, and ranks x cores spinning
    threads fight over the cores: measured here, 4 ranks of an MLP 512x512 on 2 cores took
    17 s of compute for 60 steps instead of 0.1 s (what torchrun and Horovod avoid by
    setting OMP_NUM_THREADS=1 per process).
    """
    if any(var in os.environ for var in THREAD_VARS):
        return None
    from threadpoolctl import threadpool_limits

    share = max(1, (os.cpu_count() or 1) // max(1, ranks_on_node))
    threadpool_limits(limits=share)  # process-wide, kept after the call
    torch = sys.modules.get("torch")  # its own pool; imported only if the model uses it
    if torch is not None:
        torch.set_num_threads(share)
    return share
