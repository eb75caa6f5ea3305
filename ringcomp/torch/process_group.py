"""The ``"ringcomp"`` backend's ``ProcessGroup``: torch's collectives as ringcomp's, over an
MPI communicator (``ringcomp.torch.distributed`` registers it)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringcomp.api import allgather, broadcast, reduce_scatter
from ringcomp.kernels.arrays import array_module
from ringcomp.plans.call import allreduce
from ringcomp.torch import exchange
from ringcomp.torch.backend_tensors import refused, view
from ringcomp.torch.backend_work import GroupThread, Posted, coalesced, queued
from ringcomp.transport.agree import everywhere_shared
from ringcomp.transport.groups import group_transports

#: the backend's name, as torch's init_process_group and new_group take it
NAME = "ringcomp"

#: torch's reduce ops and ringcomp's (AVG: a sum, divided by the group's size; the bitwise
#: ones, on integers, MPI's own Allreduce: ``BITWISE``)
_OPS = ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "sum"), (dist.ReduceOp.MAX, "max"),
        (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.PRODUCT, "prod"),
        (dist.ReduceOp.BAND, "band"), (dist.ReduceOp.BOR, "bor"), (dist.ReduceOp.BXOR, "bxor"))
BITWISE = ("band", "bor", "bxor")


class ProcessGroupRingcomp(dist.ProcessGroup):
    """A process group over an MPI communicator, every collective ringcomp's."""

    def __init__(self, rank: int, size: int, ranks, timeout_s: float, settings):
        """``settings()``: the all-reduce's algorithm, or a refusal; run on every rank and
        agreed, so that a refusal on one rank (its environment set otherwise) is raised on
        every rank rather than leaving the others waiting in the group's first call."""
        super().__init__(rank, size)
        # the collectives' transport, and one for send/recv: a user's tags never meet
        # the collectives' messages
        self.transport, self.messages = group_transports(ranks, timeout_s, 2)
        try:
            if self.transport.rank != rank:
                raise refused("new_group", f"torch's group rank {rank} is MPI's "
                                            f"{self.transport.rank} (ranks {list(ranks)})")
            self.algorithm = self._prepared(settings)
        except dist.DistBackendError:
            self.transport.close()
            self.messages.close()
            raise
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
            raise refused(call, f"reduce op {op} (served: SUM, AVG, PRODUCT, MIN, MAX, "
                                f"BAND, BOR, BXOR)")
        average = op == dist.ReduceOp.AVG
        if average and not tensor.is_floating_point():
            raise refused(call, f"AVG of {tensor.dtype} (a floating type)")
        if name in BITWISE and (tensor.is_floating_point() or tensor.is_complex()):
            raise refused(call, f"{name.upper()} of {tensor.dtype} (an integer type)")
        return name, average

    def _reduce(self, a, out, name: str) -> None:
        """ringcomp's all-reduce of ``a`` into ``out``; a bitwise op: MPI's own."""
        if name not in BITWISE:
            allreduce(a, out=out, op=name, algorithm=self.algorithm, comm=self.transport)
            return
        # MPI's call agrees on nothing: the ranks' lengths and dtypes were compared when the
        # call was prepared (``_reductions``)
        with self.transport.exclusive("allreduce"):
            self.transport.native_allreduce(out, name, None if out is a else a)

    def _prepared(self, prepare):
        """``prepare()`` - a call's local checks and NumPy views - on every rank of the
        group; a refusal on any rank is raised on every rank (``everywhere``), so that no
        rank enters the collective alone (it then met the next call's messages)."""
        return self.prepared_shared(lambda: (prepare(), None))[0]

    def _reductions(self, prepare, call: str) -> list:
        """``_prepared`` for a reduction's jobs (tuples whose first item is the op and
        last the array reduced), sharing in the same exchange each array a bitwise op hands
        MPI's own Allreduce - which agrees on nothing - and refusing on every rank where
        the ranks' lengths or dtypes differ."""

        def shared():
            jobs = prepare()
            return jobs, [(a.size, str(a.dtype)) for name, *_, a in jobs if name in BITWISE]

        jobs, seen = self.prepared_shared(shared)
        if len(set(map(tuple, seen))) > 1:
            raise refused(call, f"ranks passed different tensors for a bitwise op (elements, "
                                f"dtype): {seen}")
        return jobs

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

    def _reduced(self, tensors, opts, kind: str, keep: bool):
        """Every tensor reduced across the group (averaged for AVG); written back where
        ``keep`` (on this rank), else into scratch."""
        jobs = self._reductions(lambda: [(*self._op(opts, t, kind), view(t, kind))
                                         for t in tensors], kind)
        for name, average, a in jobs:
            out = a if keep else array_module(a).empty_like(a)
            self._reduce(a, out, name)
            if average:
                out /= self.size()
        return tensors

    @queued
    def allreduce(self, tensors, opts=None):
        return self._reduced(tensors, opts, "all_reduce", keep=True)

    @queued
    def reduce(self, tensors, opts=None):
        """An all-reduce whose result the root keeps (the other ranks' tensors unchanged)."""
        root = opts.rootRank if opts is not None else 0
        return self._reduced(tensors, opts, "reduce", keep=self.rank() == root)

    @queued
    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts).get_future().value()

    @queued
    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        arrays = self._prepared(lambda: [view(t, "broadcast") for t in tensors])
        for a in arrays:
            broadcast(a, root=root, comm=self.transport)
        return tensors

    @queued
    def allgather(self, output_lists, inputs, opts=None):
        arrays = self._prepared(lambda: [
            (self._one_per_rank(outputs, "all_gather", "output"), view(t, "all_gather"))
            for outputs, t in zip(output_lists, inputs, strict=True)])
        for outputs, a in arrays:
            # torch copies each row in (a NumPy view of an output kept FSDP1 from freeing
            # its storage); torch.as_tensor shares a CuPy row's memory as it does NumPy's
            for out, row in zip(outputs, allgather(a, comm=self.transport), strict=True):
                out.copy_(torch.as_tensor(row, device=out.device).view_as(out))
        return output_lists

    @queued
    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts).get_future().value()


    @queued
    def all_gather_single(self, output, tensor, opts=None):
        call = "all_gather_into_tensor"

        def prepare():
            if output.numel() != tensor.numel() * self.size():
                raise refused(call, f"an output of {output.numel()} elements for "
                                     f"{self.size()} inputs of {tensor.numel()}")
            return view(output, call), view(tensor, call)

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
            out = view(output, call).reshape(-1)
            parts = [view(t, call).reshape(-1) for t in inputs]
            flat = array_module(out).concatenate(parts)
            if flat.size != out.size * self.size():
                raise refused(call, f"{flat.size} input elements for an output of "
                                     f"{out.size} in a group of {self.size()}")
            return [(name, average, out, flat)]

        [(name, average, out, flat)] = self._reductions(prepare, call)
        if name in BITWISE:  # the whole reduced (MPI's own), this rank's block kept
            self._reduce(flat, flat, name)
            out[...] = flat[self.rank() * out.size:(self.rank() + 1) * out.size]
        else:
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

    # the coalescing manager's fast path: one call per (output, input) pair, in order
    all_gather_single_coalesced = coalesced("all_gather_single")
    reduce_scatter_single_coalesced = coalesced("reduce_scatter_single")

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
        return Posted(self.messages, [self.messages.isend(view(t, "send"), dst, tag)
                                      for t in tensors], tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        return Posted(self.messages, [self.messages.irecv(view(t, "recv"), src, tag)
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
