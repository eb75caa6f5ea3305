"""Facts about the MPI library this process loaded, read through ctypes (no mpi4py import)."""

from __future__ import annotations

import os


def libmpi_path() -> str | None:
    """Path of the libmpi that this process loaded (through mpi4py), from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if "/" in line else ""
                if "libmpi" in os.path.basename(path) and ".so" in path:
                    return path
    except OSError:
        pass
    return None


def detect_cuda_aware() -> bool:
    """Ask the loaded MPI library whether it accepts CUDA device pointers.

    MPICH family: ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA=0, &flag)``; Open MPI:
    ``MPIX_Query_cuda_support()``. Unknown means no: a device pointer given to a
    non-CUDA-aware MPI is garbage or a crash, so staging is the safe default.
    """
    import ctypes

    path = libmpi_path()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return False
    if hasattr(lib, "MPIX_GPU_query_support"):
        flag = ctypes.c_int(0)
        if lib.MPIX_GPU_query_support(0, ctypes.byref(flag)) == 0:
            return bool(flag.value)
    if hasattr(lib, "MPIX_Query_cuda_support"):
        return bool(lib.MPIX_Query_cuda_support())
    return False
