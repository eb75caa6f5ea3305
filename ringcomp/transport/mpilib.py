"""Facts about the MPI library this process loaded, read through ctypes (no mpi4py import)."""

from __future__ import annotations

import os

#: the path once found: a loaded library is never unloaded (every Transport asks, and the
#: maps of a process with PyTorch loaded run to thousands of lines: ~4 ms a read)
_FOUND: list[str] = []


def libmpi_path() -> str | None:
    """Path of the libmpi that this process loaded (through mpi4py), from /proc/self/maps."""
    if _FOUND:
        return _FOUND[0]
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if "/" in line else ""
                if "libmpi" in os.path.basename(path) and ".so" in path:
                    _FOUND.append(path)
                    return path
    except OSError:
        pass
    return None


def detect_cuda_aware() -> bool:
    """Ask the loaded MPI library whether it accepts CUDA device pointers, and check that
    the CUDA driver it would use to move them opens here.

    MPICH family: ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA=0, &flag)``; Open MPI:
    ``MPIX_Query_cuda_support()``. Unknown means no: a device pointer given to a
    non-CUDA-aware MPI is garbage or a crash, so staging is the safe default. The driver
    check because Open MPI 4.1 built with CUDA answers 1 even where libcuda cannot be
    loaded (it only warns that its CUDA support is disabled).
    """
    import ctypes

    path = libmpi_path()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return False
    supported = None
    if hasattr(lib, "MPIX_GPU_query_support"):
        flag = ctypes.c_int(0)
        if lib.MPIX_GPU_query_support(0, ctypes.byref(flag)) == 0:
            supported = bool(flag.value)
    if supported is None and hasattr(lib, "MPIX_Query_cuda_support"):
        supported = bool(lib.MPIX_Query_cuda_support())
    return bool(supported) and _cuda_driver_opens()


def _cuda_driver_opens() -> bool:
    """Whether the CUDA driver library (``libcuda.so.1``) can be loaded by this process."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True
