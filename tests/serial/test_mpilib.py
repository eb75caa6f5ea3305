"""``mpilib.detect_cuda_aware``: the MPI's own answer, and the CUDA driver it would need."""

from __future__ import annotations

import ctypes

import pytest

from ringcomp.transport import mpilib


class FakeLib:
    """A libmpi that answers Open MPI's query (``cuda``) or MPICH's (``gpu``)."""

    def __init__(self, cuda=None, gpu=None, gpu_rc=0):
        if cuda is not None:
            self.MPIX_Query_cuda_support = lambda: int(cuda)
        if gpu is not None:
            def query(kind, flag):
                flag._obj.value = int(gpu)
                return gpu_rc
            self.MPIX_GPU_query_support = query


@pytest.fixture
def loads(monkeypatch):
    """Set what ``ctypes.CDLL`` opens: the fake libmpi, and libcuda or not."""
    state = {"lib": FakeLib(), "driver": True}

    def cdll(path):
        if path == "libcuda.so.1":
            if not state["driver"]:
                raise OSError("libcuda.so.1: cannot open shared object file")
            return object()
        assert path == "/fake/libmpi.so.40"
        return state["lib"]

    monkeypatch.setattr(mpilib, "libmpi_path", lambda: "/fake/libmpi.so.40")
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    return state


@pytest.mark.parametrize("lib,says", [
    (FakeLib(cuda=1), True), (FakeLib(cuda=0), False),
    (FakeLib(gpu=1), True), (FakeLib(gpu=0), False),
    (FakeLib(gpu=1, gpu_rc=1, cuda=0), False),  # MPICH's query failed: Open MPI's answers
    (FakeLib(gpu=0, gpu_rc=1, cuda=1), True),
    (FakeLib(), False)])  # neither query: unknown means staged
def test_the_mpis_answer_decides_where_the_driver_opens(loads, lib, says):
    loads["lib"] = lib
    assert mpilib.detect_cuda_aware() is says


def test_no_cuda_driver_means_staged_whatever_the_mpi_says(loads):
    """Open MPI 4.1 built with CUDA answers 1 where libcuda cannot be loaded (seen with such
    a build on this machine, which has no GPU): staged, not handed over."""
    loads["lib"], loads["driver"] = FakeLib(cuda=1), False
    assert mpilib.detect_cuda_aware() is False


def test_no_mpi_loaded_means_staged(monkeypatch):
    monkeypatch.setattr(mpilib, "libmpi_path", lambda: None)
    assert mpilib.detect_cuda_aware() is False
