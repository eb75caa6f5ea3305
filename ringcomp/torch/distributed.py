"""``torch.distributed`` backend ``"ringcomp"``: ``dist.init_process_group("ringcomp")`` under
``mpiexec`` or ``srun`` - rank and size from MPI, no MASTER_ADDR, no store to set up.

Importing this module registers the backend (CPU and CUDA tensors) and lets torch's ``env://``
rendezvous take rank and world size from MPI when MASTER_ADDR is not set, with a store all
ranks share (with it set, torch's own rendezvous runs, as for any other backend). Served
here, exactly (torch's collectives promise exact results; compression goes through DDP's
comm hook, ``ringcomp.torch.ringcomp_hook``): ``all_reduce`` and ``reduce`` (SUM, AVG,
PRODUCT, MIN, MAX; BAND, BOR, BXOR on integers), ``broadcast``, ``all_gather``,
``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``, their
coalesced forms, ``all_to_all`` and
``all_to_all_single`` (uneven splits too), ``gather``, ``scatter``, ``send``/``recv``,
``barrier`` and ``new_group``, each group's collectives on a thread of its own in call
order (``async_op=True`` returns at once; ``wait``, ``is_completed``, ``get_future``), the
point-to-point messages posted when called. What it does not serve (bfloat16, a
receive from any source, CUDA tensors without CuPy) raises
``torch.distributed.DistBackendError`` naming the call. ``RINGCOMP_ALGORITHM`` picks the
all-reduce's algorithm (default ``auto``); the process group's ``timeout`` is ringcomp's
deadline.
"""

from __future__ import annotations

import importlib
import os
from urllib.parse import urlparse

import torch.distributed as dist

from ringcomp.collectives import REGISTRY
from ringcomp.torch.backend_tensors import refused
from ringcomp.torch.ddp import rank0_address
from ringcomp.torch.process_group import NAME, ProcessGroupRingcomp
from ringcomp.transport.groups import world_shape


def _settings() -> str:
    """The all-reduce's algorithm from the environment; compression is refused here."""
    if os.environ.get("RINGCOMP_COMPRESSOR", "none") not in ("", "none"):
        raise refused("init_process_group", "RINGCOMP_COMPRESSOR is set, but torch's "
                       "collectives promise exact results; compress gradients through "
                       "DDP's comm hook (ringcomp.torch.ringcomp_hook)")
    algorithm = os.environ.get("RINGCOMP_ALGORITHM", "auto")
    if algorithm not in REGISTRY:
        raise refused("init_process_group", f"RINGCOMP_ALGORITHM={algorithm!r}: unknown; "
                       f"known: {', '.join(sorted(REGISTRY))}")
    return algorithm


def _create(options, _backend_options):
    """torch's extended creator: the group over the global ranks it names (all of
    MPI_COMM_WORLD for the default group)."""
    return ProcessGroupRingcomp(options.group_rank, options.group_size,
                                options.global_ranks_in_group,
                                options.timeout.total_seconds(), _settings)


def _mpi_rendezvous(torch_env):
    """torch's ``env://`` handler, unless MASTER_ADDR is unset: then rank and size are
    MPI's and the store a TCPStore at a free port of rank 0, its address broadcast over
    MPI - shared by every rank, so any backend can start on it (gloo too), not only this
    one, whose groups never use it."""

    def handler(url, **kwargs):
        if os.environ.get("MASTER_ADDR"):
            yield from torch_env(url, **kwargs)
            return
        rank, size = world_shape()
        where = urlparse(rank0_address())
        timeout = kwargs.get("timeout", dist.constants.default_pg_timeout)
        yield (dist.TCPStore(where.hostname, where.port, size, rank == 0, timeout),
               rank, size)

    handler.ringcomp = True
    return handler


def register() -> None:
    """Register the backend and the MPI rendezvous (idempotent: importing does it)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True,
                                     devices=["cpu", "cuda"])
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    if not getattr(handlers["env"], "ringcomp", False):
        handlers["env"] = _mpi_rendezvous(handlers["env"])


register()
