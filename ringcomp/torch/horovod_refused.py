"""What Horovod has and ringcomp does not: each name there, refused with what to do
instead (an AttributeError said nothing), never imitated."""

from __future__ import annotations

_PROCESS_SETS = ("ringcomp.torch: process sets are Horovod's; ringcomp runs on a "
                 "communicator: pass comm= (an mpi4py communicator of the ranks) to init() "
                 "instead")


class _GlobalProcessSet:
    """Horovod's ``global_process_set``: every rank - what ringcomp's calls run on, so a
    call may pass it (``process_set=hvd.global_process_set``); no other set exists."""

    def __repr__(self) -> str:
        return "ringcomp.torch.global_process_set"


global_process_set = _GlobalProcessSet()


class ProcessSet:
    """Horovod's ``ProcessSet``: refused (``_PROCESS_SETS``)."""

    def __init__(self, *args, **kwargs):
        raise ValueError(_PROCESS_SETS)


def add_process_set(*args, **kwargs):
    raise ValueError(_PROCESS_SETS)


def remove_process_set(*args, **kwargs):
    raise ValueError(_PROCESS_SETS)


def check_process_set(process_set) -> None:
    """Every call's ``process_set=``: None or the global set, else refused."""
    if process_set is not None and process_set is not global_process_set:
        raise ValueError(_PROCESS_SETS)


def alltoall_async(*args, **kwargs):
    """Horovod's ``alltoall_async`` is not a ringcomp collective: refused."""
    raise NotImplementedError(
        "ringcomp.torch.alltoall_async: ringcomp has no all-to-all (it is an all-reduce "
        "library); use mpi4py's comm.Alltoallv on the tensors' NumPy views")


def sparse_allreduce_async(*args, **kwargs):
    """Horovod's sparse all-reduce: refused (ringcomp's collectives are dense)."""
    raise NotImplementedError(
        "ringcomp.torch.sparse_allreduce_async: ringcomp's all-reduces are dense; pass "
        "tensor.to_dense(), or a compressor (topk keeps the largest values sparse on the "
        "wire)")


class _Elastic:
    """Horovod's ``hvd.elastic`` (rank changes while training): refused on any use."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(
            f"ringcomp.torch.elastic.{name}: elastic training is Horovod's; a ringcomp job "
            f"is one MPI world for its lifetime (resume from a checkpoint with another "
            f"rank count instead)")


elastic = _Elastic()
