"""Horovod's collective calls on tensors, with Horovod's names and semantics, over ringcomp.

``import ringcomp.torch as hvd`` then ``hvd.init()``, ``hvd.rank()``, ``hvd.allreduce(t)``,
``hvd.allreduce_async(t)`` + ``hvd.synchronize(handle)``, ``hvd.broadcast_object(obj)``...
``hvd.join()`` lets ranks that ran out of data give zeros to the others' all-reduces
(``ringcomp.torch.joining``). What Horovod has and ringcomp does not (Adasum, process sets)
is refused with a message, never imitated.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from ringcomp.api import allgather as _allgather
from ringcomp.api import broadcast as _broadcast
from ringcomp.errors import ArgumentMismatchError
from ringcomp.plans.call import allreduce as _allreduce
from ringcomp.torch import horovod_grads, horovod_refused, joining, timeline
from ringcomp.torch.flat import tensor_as_array
from ringcomp.torch.horovod_world import _submit, _world, rank
from ringcomp.transport.agree import options_hash


class Compression:
    """Horovod's ``hvd.Compression``: the compressor each name stands for (``compression=``
    of ``allreduce`` and ``DistributedOptimizer``)."""

    none = None
    fp16 = "fp16"


#: Horovod's reduction ops, as ringcomp names them (Average: a sum divided by the size)
Average, Sum, Min, Max, Product = "average", "sum", "min", "max", "prod"
#: Horovod's ops that ringcomp does not have: refused by name
Adasum = "adasum"

def _op(op, average) -> str:
    if average is not None and op is not None:
        raise ValueError("ringcomp.torch: give op= or the deprecated average=, not both")
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise ValueError("ringcomp.torch: Adasum is Horovod's own reduction; ringcomp does not "
                         "have it (use Average or Sum, with a compressor if you like)")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"ringcomp.torch: unknown op {op!r}; known: Average, Sum, Min, Max, "
                         "Product")
    return op


@dataclass(frozen=True)
class Call:
    """One Horovod all-reduce's arguments beyond its tensor: its op, compression, scale
    factors and the key of its ``name`` (0: none) - all agreed across ranks with the
    call (``_reduce``), and announced to joined ranks, which mirror it (``join``)."""

    op: str
    compression: object = None
    prescale: float = 1.0
    postscale: float = 1.0
    name_key: int = 0


def name_key(name) -> int:
    """A call's ``name`` as the integer every rank agrees on (0: no name): Horovod
    pairs calls by name; ringcomp pairs them in call order and refuses, on every rank, a
    pair whose names differ (two same-shaped calls made in another order on each rank
    were silently swapped)."""
    return 0 if name is None else options_hash({"name": str(name)}) + 1


def _reduce(result: torch.Tensor, call: Call, transport) -> torch.Tensor:
    """All-reduce the contiguous ``result`` in place over ``transport``, scaled as Horovod
    scales: ``prescale`` before, ``postscale`` (and 1/size for Average) after."""
    if result.dtype == torch.bfloat16:  # NumPy has no bfloat16: summed in float32
        with torch.no_grad():
            return result.copy_(_reduce(result.float(), call, transport))
    op = call.op
    with torch.no_grad():
        if call.prescale != 1.0:
            result.mul_(call.prescale)
        array = tensor_as_array(result).reshape(-1)
        # Average is a sum divided here: the op, the scale factors and the name are
        # agreed beside the call's own arguments, so Average on one rank and Sum on
        # another is refused on every rank (it used to return different results)
        _allreduce(array, out=array, op="sum" if op == Average else op, comm=transport,
                   compressor=call.compression, tracer=timeline.tracer(),
                   _agreed={"horovod op": op, "prescale_factor": float(call.prescale),
                            "postscale_factor": float(call.postscale),
                            "name (hashed)": call.name_key})
        scale = call.postscale / (transport.size if op == Average else 1)
        if scale != 1.0:
            result.mul_(scale)
    return result


def _announce_reduce(kind: int, what: str, tensor: torch.Tensor, call: Call) -> Call:
    """Refuse what cannot be reduced (before any rank communicates), then announce the
    all-reduce to ranks in ``join()`` (``joining``, with its scale factors and name, so
    that a joined rank's zeros are agreed as the live ranks' call); returns ``call``."""
    op, scaled = call.op, call.prescale != 1.0 or call.postscale != 1.0
    if op in (Min, Max, Product) and (call.compression is not None or scaled):
        raise ValueError(f"ringcomp.torch: op {op!r} takes no compression and no scaling")
    if not tensor.is_floating_point() and (op == Average or scaled):
        raise TypeError(f"ringcomp.torch: a {tensor.dtype} tensor cannot be averaged or "
                        f"scaled in place: pass op=Sum (and divide as you need)")
    joining.announce(kind, f"{what}(op={op})",
                     *joining.allreduce_mode(op, call.compression, tensor),
                     extra=(call.prescale, call.postscale, call.name_key))
    return call


def _gather(tensor: torch.Tensor, transport, offset: bool = False):
    """Every rank's ``tensor`` along dimension 0 (see ``allgather``); ``offset``: also
    where this rank's rows start in it."""
    shapes = transport.allgather_obj((tuple(tensor.shape), str(tensor.dtype)))
    if len({(s[1:], d) for s, d in shapes}) > 1 or any(len(s) == 0 for s, _ in shapes):
        raise ValueError(f"ringcomp.torch: allgather needs tensors of at least one dimension "
                         f"that differ at most in the first; got {shapes}")
    longest = max(s[0] for s, _ in shapes)
    padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype,
                         device=tensor.device)
    padded[:tensor.shape[0]] = tensor.detach()
    rows = _allgather(tensor_as_array(_bits(padded)), comm=transport,
                      tracer=timeline.tracer())
    gathered = (torch.from_numpy(rows) if isinstance(rows, np.ndarray)
                else torch.from_dlpack(rows))
    result = torch.cat([gathered[r, :s[0]] for r, (s, _) in enumerate(shapes)]).view(
        tensor.dtype)
    if not offset:
        return result
    return result, sum(s[0] for s, _ in shapes[:transport.rank])


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """A bfloat16 tensor as its int16 bits (NumPy has no bfloat16; gathering and
    broadcasting move bits), any other as it is."""
    return tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor


def _broadcast_into(tensor: torch.Tensor, root_rank: int, transport) -> torch.Tensor:
    with torch.no_grad():
        target = tensor if tensor.is_contiguous() else tensor.contiguous()
        _broadcast(tensor_as_array(_bits(target)).reshape(-1), root=root_rank,
                   comm=transport, tracer=timeline.tracer())
        if target is not tensor:
            tensor.copy_(target)
    return tensor


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def allreduce(tensor: torch.Tensor, average=None, name=None, compression=Compression.none,
              op=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set=None) -> torch.Tensor:
    """Horovod's ``allreduce``: a new tensor, the reduction of ``tensor`` over all ranks
    (default op Average); ``compression=Compression.fp16`` sends fp16. Calls pair up
    across ranks in the order they are made, ``name`` or not (Horovod pairs them by
    name): a pair whose names, ops or scale factors differ raises on every rank.
    Gradients flow back through it as Horovod's: the same reduction of the incoming
    gradient (``ringcomp.torch.horovod_grads``)."""
    _no_process_set(process_set)
    call = _announce_reduce(joining.ALLREDUCE, "allreduce", tensor, Call(
        _op(op, average), compression, prescale_factor, postscale_factor, name_key(name)))
    return horovod_grads.Allreduce.apply(
        tensor, lambda t: _reduce(_copy(t), call, _world()),
        lambda grad: allreduce(grad, op=call.op, prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor))


def allreduce_(tensor: torch.Tensor, average=None, name=None, op=None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set=None) -> torch.Tensor:
    """In place: ``tensor`` holds the reduction afterwards; returns it."""
    _no_process_set(process_set)
    call = _announce_reduce(joining.ALLREDUCE, "allreduce_", tensor, Call(
        _op(op, average), None, prescale_factor, postscale_factor, name_key(name)))
    if tensor.is_contiguous():
        _reduce(tensor.detach(), call, _world())
        return tensor
    result = _reduce(_copy(tensor), call, _world())
    with torch.no_grad():
        tensor.copy_(result)
    return tensor


def grouped_allreduce(tensors: list[torch.Tensor], average=None, name=None,
                      compression=Compression.none, op=None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set=None) -> list[torch.Tensor]:
    """Horovod's ``grouped_allreduce``: ``allreduce`` of each tensor, in order (a list of
    new tensors)."""
    return [allreduce(t, average, name, compression, op, prescale_factor, postscale_factor,
                      process_set) for t in tensors]


def alltoall(tensor: torch.Tensor, splits=None, name=None, process_set=None):
    """Horovod's ``alltoall`` is not a ringcomp collective: refused, not imitated."""
    raise NotImplementedError(
        "ringcomp.torch.alltoall: ringcomp has no all-to-all (it is an all-reduce library); "
        "use mpi4py's comm.Alltoallv on the tensors' NumPy views, or torch.distributed")


def allgather(tensor: torch.Tensor, name=None, process_set=None) -> torch.Tensor:
    """Horovod's ``allgather``: every rank's ``tensor`` concatenated along dimension 0, in
    rank order; the first dimension may differ between ranks, the others may not."""
    _no_process_set(process_set)
    joining.announce(joining.OTHER, "allgather")
    return horovod_grads.Allgather.apply(tensor, lambda t: _gather(t, _world(), offset=True),
                                    lambda grad: allreduce(grad, op=Sum))


def broadcast_(tensor: torch.Tensor, root_rank: int, name=None,
               process_set=None) -> torch.Tensor:
    """In place: every rank's ``tensor`` becomes ``root_rank``'s; returns it."""
    _no_process_set(process_set)
    joining.announce(joining.OTHER, "broadcast_")
    return _broadcast_into(tensor, root_rank, _world())


def broadcast(tensor: torch.Tensor, root_rank: int, name=None,
              process_set=None) -> torch.Tensor:
    """A new tensor holding ``root_rank``'s ``tensor`` on every rank."""
    _no_process_set(process_set)
    joining.announce(joining.OTHER, "broadcast")
    return horovod_grads.Broadcast.apply(
        tensor, lambda t: _broadcast_into(_copy(t), root_rank, _world()),
        lambda grad: allreduce(grad, op=Sum), rank() == root_rank)


def broadcast_object(obj, root_rank: int = 0, name=None, process_set=None):
    """``root_rank``'s picklable ``obj`` on every rank."""
    _no_process_set(process_set)
    joining.announce(joining.OTHER, "broadcast_object")
    world = _world()
    _agree_root("broadcast_object", root_rank, world)
    return world.bcast_obj(obj, root=root_rank)


def _agree_root(name: str, root_rank, world) -> None:
    """Raise the same error on every rank unless every rank passed the same valid root
    (one tiny agreement): with roots that differ, each rank used to get its own object."""
    valid = (isinstance(root_rank, (int, np.integer)) and not isinstance(root_rank, bool)
             and 0 <= root_rank < world.size)
    lo, hi = world.agree([int(root_rank) if valid else -1])
    if lo[0] < 0:
        raise ValueError(f"ringcomp.torch.{name}: root_rank must be a rank in 0..{world.size - 1}"
                         f" on every rank (this rank passed {root_rank!r})")
    if lo[0] != hi[0]:
        raise ArgumentMismatchError(f"ringcomp.torch.{name}: ranks passed different "
                                    f"root_rank values (min {lo[0]}, max {hi[0]})")


def allgather_object(obj, name=None, process_set=None) -> list:
    """Every rank's picklable ``obj``, in rank order."""
    _no_process_set(process_set)
    joining.announce(joining.OTHER, "allgather_object")
    return _world().allgather_obj(obj)


def join(device: int = -1) -> int:
    """Horovod's ``join``: this rank has run out of data. Until every rank has called
    ``join``, it adds zeros to the other ranks' all-reduces (Sum or Average - the average
    still divides by ``size()``, as Horovod's - without a compressor or with fp16, through
    ``allreduce`` and its forms and the steps of DistributedOptimizers made after
    ``init()``); their other calls (allgather, broadcast, ...) raise on the live ranks.
    Returns the rank that joined last: its parameters and optimizer state are the ones
    to broadcast to every rank before training on (a joined rank does not step).
    ``device``: the GPU its zeros of device all-reduces live on (-1: the current one)."""
    pending: list[Future] = []

    def mirror(kind: int, count: int, dtype: int, mode: int, extra: tuple) -> None:
        tensor, op, compression = joining.zeros(count, dtype, mode, device)
        call = Call(op, compression, *extra)  # the live ranks' factors and name: agreed
        if kind == joining.ALLREDUCE:
            _reduce(tensor, call, _world())
        else:  # in the order the live ranks submitted theirs, on the same thread
            pending.append(_submit(_reduce, tensor, call))

    def finish() -> None:
        for handle in pending:
            handle.result()

    _world()
    return joining.join(mirror, finish)


def _no_process_set(process_set) -> None:
    horovod_refused.check_process_set(process_set)
