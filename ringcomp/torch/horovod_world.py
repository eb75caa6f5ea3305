"""Horovod's process-level calls over ringcomp: ``init``, ``shutdown``, the world's ranks
and node layout (computed once in ``init``), what is built, ``barrier`` and the timeline
(names of ``import ringcomp.torch as hvd``)."""

from __future__ import annotations

import importlib.util
from concurrent.futures import Future, ThreadPoolExecutor

from ringcomp.torch import horovod_refused, joining, timeline
from ringcomp.transport.cache import get_transport
from ringcomp.transport.comm import Transport

#: the process's world (``init``) and the asynchronous calls' thread and communicator
_WORLD: dict = {"transport": None, "async": None, "pool": None, "nodes": None,
                "homogeneous": True}


def init(comm=None) -> None:
    """Horovod's ``init``: ringcomp's world is MPI's (``comm``: an mpi4py communicator, or
    None for the world). Calling it again is fine; the calls below need it first. The
    node layout (``local_rank``, ``local_size``, ``cross_rank``, ``cross_size``) is
    worked out here, collectively, so that asking it later is local to each rank, as in
    Horovod (a rank asking alone used to wait out the deadline)."""
    if _WORLD["transport"] is None:
        world = get_transport(comm)
        layout = world.allgather_obj((world.node_leader, world.local_size))
        nodes = sorted({leader for leader, _ in layout})
        _WORLD["nodes"] = (len(nodes), nodes.index(world.node_leader))
        _WORLD["homogeneous"] = len({count for _, count in layout}) == 1
        _WORLD["transport"] = world
        joining.open_channel(world)


def is_initialized() -> bool:
    return _WORLD["transport"] is not None


def shutdown() -> None:
    """Finish the asynchronous calls in flight and forget the world (``init`` again to go
    on)."""
    if _WORLD["pool"] is not None:
        _WORLD["pool"].shutdown(wait=True)
        _WORLD["async"].close()
    joining.close_channel()
    _WORLD.update(transport=None, pool=None)
    _WORLD["async"] = None


def _world() -> Transport:
    if _WORLD["transport"] is None:
        raise ValueError("ringcomp.torch: call init() first (Horovod's hvd.init())")
    return _WORLD["transport"]


def rank() -> int:
    return _world().rank


def size() -> int:
    return _world().size


def local_size() -> int:
    """Ranks of this job on this node (worked out in ``init``)."""
    return _world().local_size


def local_rank() -> int:
    """This rank's position among its node's ranks (worked out in ``init``)."""
    return _world().local_rank


def cross_size() -> int:
    """The number of nodes (worked out in ``init``)."""
    _world()
    return _WORLD["nodes"][0]


def cross_rank() -> int:
    """This rank's node's position among the nodes, whatever the ranks' placement
    (worked out in ``init``)."""
    _world()
    return _WORLD["nodes"][1]


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's: record every hop of this module's calls on tensors until
    ``stop_timeline`` (``ringcomp.torch.timeline``; call it on every rank)."""
    timeline.start_timeline(file_path, _world().rank, mark_cycles)


def stop_timeline() -> None:
    """Horovod's: write the timeline - a Chrome/Perfetto trace at the file
    ``start_timeline`` named (collective: every rank calls it)."""
    timeline.stop_timeline(_world())


def _answer(value: bool, why: str):
    """One of Horovod's build questions, answered as ringcomp is (``why``: its docstring)."""
    def answer() -> bool:
        return value

    answer.__doc__ = why
    return answer


mpi_built = _answer(True, "ringcomp runs on MPI: always.")
mpi_enabled = _answer(True, "ringcomp runs on MPI: always.")
mpi_threads_supported = _answer(True, "ringcomp runs MPI at MPI_THREAD_MULTIPLE (it warns "
                                      "below it): True.")
nccl_built = _answer(False, "ringcomp calls no NCCL (its device path is CUDA kernels + "
                            "MPI): never.")
gloo_built = gloo_enabled = _answer(False, "ringcomp runs no Gloo: never.")
rocm_built = ddl_built = ccl_built = _answer(False, "Not a ringcomp back end: never.")


def cuda_built() -> bool:
    """Whether the device path can run here: CuPy is installed (ringcomp's CUDA kernels
    are Numba's, compiled at run time; nothing is built ahead)."""
    return importlib.util.find_spec("cupy") is not None


def is_homogeneous() -> bool:
    """Whether every node runs as many ranks (worked out in ``init``)."""
    _world()
    return _WORLD["homogeneous"]


def barrier(process_set=None) -> None:
    """Horovod's ``barrier``: returns once every rank called it (under the deadline)."""
    horovod_refused.check_process_set(process_set)
    joining.announce(joining.OTHER, "barrier")
    _world().barrier()


def _submit(fn, *args) -> Future:
    """Run ``fn(*args, transport)`` on the asynchronous calls' own thread and communicator,
    one call at a time in the order submitted (every rank must submit in the same order,
    as every rank makes its calls in the same order: checked by each call's agreement)."""
    world = _world()
    if _WORLD["pool"] is None:  # made at the same call on every rank: collective
        _WORLD["async"] = Transport(world.comm)
        _WORLD["pool"] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringcomp-hvd")
    return _WORLD["pool"].submit(fn, *args, _WORLD["async"])
