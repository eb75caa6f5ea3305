"""``torch.distributed`` backend ``"ringcomp"``: ``dist.init_process_group("ringcomp")`` under
``mpiexec`` or ``srun`` - rank and size from MPI, no MASTER_ADDR, no store to set up.

Importing this module registers the backend (CPU tensors) and lets torch's ``env://``
rendezvous take rank and world size from MPI when MASTER_ADDR is not set, with a store all
ranks share (with it set, torch's own rendezvous runs, as for any other backend). Served
here, exactly (torch's collectives promise exact results; compression goes through DDP's
comm hook, ``ringcomp.torch.ringcomp_hook``): ``all_reduce`` and ``reduce`` (SUM, AVG,
PRODUCT, MIN, MAX), ``broadcast``, ``all_gather``, ``all_gather_into_tensor``,
``reduce_scatter``, ``reduce_scatter_tensor``, their coalesced forms, ``all_to_all`` and
``all_to_all_single`` (uneven splits too), ``gather``, ``scatter``, ``send``/``recv``,
``barrier`` and ``new_group``, each group's collectives on a thread of its own in call
order (``async_op=True`` returns at once; ``wait``, ``is_completed``, ``get_future``), the
point-to-point messages posted when called. What it does not serve (CUDA tensors,
bfloat16, a receive from any source) raises ``torch.distributed.DistBackendError`` naming
the call. ``RINGCOMP_ALGORITHM`` picks the all-reduce's algorithm (default ``auto``); the
process group's ``timeout`` is ringcomp's deadline.
"""

from __future__ import annotations

import importlib
import os
from urllib.parse import urlparse

import numpy as np
import torch
import torch.distributed as dist

from ringcomp.api import allgather, broadcast, reduce_scatter
from ringcomp.collectives import REGISTRY
from ringcomp.plans.call import allreduce
from ringcomp.torch import exchange
from ringcomp.torch.backend_tensors import host, refused
from ringcomp.torch.backend_work import GroupThread, Posted, queued
from ringcomp.torch.ddp import rank0_address
from ringcomp.transport.agree import everywhere_shared
from ringcomp.transport.groups import group_transports, world_shape

NAME = "ringcomp"
#: torch's reduce ops and ringcomp's (AVG: a sum, divided by the group's size)
_OPS = ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "sum"), (dist.ReduceOp.MAX, "max"),
        (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.PRODUCT, "prod"))


class ProcessGroupRingcomp(dist.ProcessGroup):
    """A process group over an MPI communicator, every collective ringcomp's."""

    def __init__(self, rank: int, size: int, ranks, timeout_s: float, algorithm: str):
        super().__init__(rank, size)
        # the collectives' transport, and one for send/recv: a user's tags never meet
        # the collectives' messages
        self.transport, self.messages = group_transports(ranks, timeout_s, 2)
        if self.transport.rank != rank:
            raise refused("new_group", f"torch's group rank {rank} is MPI's "
                                        f"{self.transport.rank} (ranks {list(ranks)})")
        self.algorithm = algorithm
        # every collective of the group runs on this thread, in call order: async_op=True
        # and DDP's buckets return at once and overlap the caller's work, as gloo's do
        self.thread = GroupThread(f"ringcomp group of {len(ranks) or size} ranks")

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return NAME

    # torch's base class keeps a group's name in its C++ backends, which a group made in
    # Python has none of ("ProcessGroup name not set" when a new_group was destroyed)
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def _op(self, opts, tensor, call: str) -> tuple[str, bool]:
        """(ringcomp's op, whether to divide by the group's size) for ``opts.reduceOp``."""
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = next((mine for theirs, mine in _OPS if op == theirs), None)
        if name is None:
            raise refused(call, f"reduce op {op} (served: SUM, AVG, PRODUCT, MIN, MAX)")
        average = op == dist.ReduceOp.AVG
        if average and not tensor.is_floating_point():
            raise refused(call, f"AVG of {tensor.dtype} (a floating type)")
        return name, average

    def _prepared(self, prepare):
        """``prepare()`` - a call's local checks and NumPy views - on every rank of the
        group; a refusal on any rank is raised on every rank (``everywhere``), so that no
        rank enters the collective alone (it then met the next call's messages)."""
        return self.prepared_shared(lambda: (prepare(), None))[0]

    def prepared_shared(self, prepare):
        """``_prepared`` for a ``prepare`` returning (its result, a small value every rank
        sees): (the result, every rank's value) - what a call whose ranks' sizes must match
        each other's judges, the same on every rank (``exchange``)."""
        return everywhere_shared(self.transport, prepare, raise_as=dist.DistBackendError)

    def _one_per_rank(self, tensors: list, call: str, what: str) -> list:
        if len(tensors) != self.size():
            raise refused(call, f"{len(tensors)} {what} tensors for a group of "
                                 f"{self.size()}")
        return tensors

    @queued
    def allreduce(self, tensors, opts=None):
        jobs = self._prepared(lambda: [(*self._op(opts, t, "all_reduce"),
                                        host(t, "all_reduce")) for t in tensors])
        for name, average, a in jobs:
            allreduce(a, out=a, op=name, algorithm=self.algorithm, comm=self.transport)
            if average:
                a /= self.size()
        return tensors

    @queued
    def reduce(self, tensors, opts=None):
        """An all-reduce whose result the root keeps (the other ranks' tensors unchanged)."""
        root = opts.rootRank if opts is not None else 0
        jobs = self._prepared(lambda: [(*self._op(opts, t, "reduce"), host(t, "reduce"))
                                       for t in tensors])
        for name, average, a in jobs:
            out = a if self.rank() == root else np.empty_like(a)
            allreduce(a, out=out, op=name, algorithm=self.algorithm, comm=self.transport)
            if average:
                out /= self.size()
        return tensors

    @queued
    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts).get_future().value()

    @queued
    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        arrays = self._prepared(lambda: [host(t, "broadcast") for t in tensors])
        for a in arrays:
            broadcast(a, root=root, comm=self.transport)
        return tensors

    @queued
    def allgather(self, output_lists, inputs, opts=None):
        arrays = self._prepared(lambda: [
            (self._one_per_rank(outputs, "all_gather", "output"), host(t, "all_gather"))
            for outputs, t in zip(output_lists, inputs, strict=True)])
        for outputs, a in arrays:
            for out, row in zip(outputs, allgather(a, comm=self.transport), strict=True):
                out.copy_(torch.from_numpy(row).view_as(out))
        return output_lists

    @queued
    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts).get_future().value()

    @queued
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for output, tensor in zip(outputs, inputs, strict=True):
            self.all_gather_single(output, tensor, opts)
        return outputs

    @queued
    def all_gather_single(self, output, tensor, opts=None):
        call = "all_gather_into_tensor"

        def prepare():
            if output.numel() != tensor.numel() * self.size():
                raise refused(call, f"an output of {output.numel()} elements for "
                                     f"{self.size()} inputs of {tensor.numel()}")
            return host(output, call), host(tensor, call)

        out, a = self._prepared(prepare)
        allgather(a, comm=self.transport, out=out.reshape(self.size(), *tensor.shape))
        return output

    def _reduce_scatter(self, output: torch.Tensor, inputs: list, opts, call: str,
                        listed: bool = False):
        """``inputs`` (their elements in order: p equal blocks, block r for rank r)
        reduced; this rank's block into ``output`` (``ringcomp.reduce_scatter``'s blocks
        are equal when p divides the length). ``listed``: one input per rank."""

        def prepare():
            if listed:
                self._one_per_rank(inputs, call, "input")
            name, average = self._op(opts, output, call)
            out = host(output, call).reshape(-1)
            flat = np.concatenate([host(t, call).reshape(-1) for t in inputs])
            if flat.size != out.size * self.size():
                raise refused(call, f"{flat.size} input elements for an output of "
                                     f"{out.size} in a group of {self.size()}")
            return name, average, out, flat

        name, average, out, flat = self._prepared(prepare)
        reduce_scatter(flat, op=name, out=out, comm=self.transport)
        if average:
            out /= self.size()
        return output

    @queued
    def reduce_scatter(self, outputs, input_lists, opts=None):
        for output, inputs in zip(outputs, input_lists, strict=True):
            self._reduce_scatter(output, inputs, opts, "reduce_scatter", listed=True)
        return outputs

    @queued
    def reduce_scatter_single(self, output, tensor, opts=None):
        return self._reduce_scatter(output, [tensor], opts, "reduce_scatter_tensor")

    @queued
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for output, tensor in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(output, tensor, opts)
        return outputs

    @queued
    def alltoall(self, outputs, inputs, opts=None):
        exchange.all_to_all(self, outputs, inputs)
        return outputs

    @queued
    def all_to_all_single(self, output, tensor, output_splits, input_splits, opts=None):
        exchange.all_to_all_single(self, output, tensor, output_splits, input_splits)
        return output

    @queued
    def gather(self, output_lists, inputs, opts=None):
        root = opts.rootRank if opts is not None else 0
        exchange.gather(self, output_lists[0] if output_lists else [], inputs[0], root)
        return output_lists

    @queued
    def scatter(self, outputs, input_lists, opts=None):
        root = opts.rootRank if opts is not None else 0
        exchange.scatter(self, outputs[0], input_lists[0] if input_lists else [], root)
        return outputs

    def send(self, tensors, dst: int, tag: int = 0):
        return Posted(self.messages, [self.messages.isend(host(t, "send"), dst, tag)
                                      for t in tensors], tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        return Posted(self.messages, [self.messages.irecv(host(t, "recv"), src, tag)
                                      for t in tensors], tensors)

    @queued
    def barrier(self, opts=None):
        self.transport.barrier()
        return None

    def shutdown(self) -> None:
        """Run what was queued, then close both transports (``destroy_process_group``)."""
        self.thread.stop()
        self.transport.close()
        self.messages.close()


def _recv_anysource(self, tensors, tag: int = 0):
    """``recv`` without a source: refused by name (torch's base class would answer 'No
    backend type associated with device type cpu')."""
    raise refused("recv from any source", "not served by this backend (name the source)")


ProcessGroupRingcomp.recv_anysource = _recv_anysource


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
                                options.timeout.total_seconds(), _settings())


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
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    if not getattr(handlers["env"], "ringcomp", False):
        handlers["env"] = _mpi_rendezvous(handlers["env"])


register()
