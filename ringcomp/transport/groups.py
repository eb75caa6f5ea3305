"""The world's shape and Transports over some of its ranks, for callers outside this package
that make process groups (the ``torch.distributed`` backend)."""

from __future__ import annotations

from mpi4py import MPI

from ringcomp.transport.comm import Transport


def world_shape() -> tuple[int, int]:
    """(this process's rank, the number of ranks) in ``MPI_COMM_WORLD``."""
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def group_transports(ranks, timeout: float, count: int) -> list[Transport]:
    """``count`` Transports over the world ranks ``ranks`` in that order (empty: the whole
    world), each on a private communicator of its own, so that the messages of one never
    match another's. Collective over those ranks only (``MPI_Comm_create_group``); the
    caller closes them."""
    world = MPI.COMM_WORLD
    ranks = list(ranks) or list(range(world.Get_size()))
    if ranks == list(range(world.Get_size())):
        return [Transport(world, timeout=timeout) for _ in range(count)]
    group = world.Get_group().Incl(ranks)
    base = world.Create_group(group)
    group.Free()
    try:
        return [Transport(base, timeout=timeout) for _ in range(count)]
    finally:
        base.Free()  # each Transport keeps its own duplicate
