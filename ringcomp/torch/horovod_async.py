"""Horovod's asynchronous calls on tensors: ``allreduce_async`` and its kin return a handle
(a Future) for ``poll`` and ``synchronize``; each runs on the world's second communicator,
in one background thread, in the order made (names of ``import ringcomp.torch as hvd``)."""

from __future__ import annotations

from concurrent.futures import Future

import torch

from ringcomp.torch import joining
from ringcomp.torch.horovod import (
    Call,
    _announce_reduce,
    _broadcast_into,
    _copy,
    _gather,
    _no_process_set,
    _op,
    _reduce,
    name_key,
)
from ringcomp.torch.horovod_world import _submit


def allreduce_async(tensor: torch.Tensor, average=None, name=None, op=None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set=None) -> Future:
    """``allreduce`` in the background: a handle for ``poll`` and ``synchronize`` (which
    returns the new tensor)."""
    _no_process_set(process_set)
    call = _announce_reduce(joining.ALLREDUCE_ASYNC, "allreduce_async", tensor, Call(
        _op(op, average), None, prescale_factor, postscale_factor, name_key(name)))
    return _submit(_reduce, _copy(tensor), call)


def allreduce_async_(tensor: torch.Tensor, average=None, name=None, op=None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set=None) -> Future:
    """``allreduce_`` in the background (a contiguous ``tensor``, not written before
    ``synchronize``)."""
    _no_process_set(process_set)
    if not tensor.is_contiguous():
        raise ValueError("ringcomp.torch: allreduce_async_ needs a contiguous tensor")
    call = _announce_reduce(joining.ALLREDUCE_ASYNC, "allreduce_async_", tensor, Call(
        _op(op, average), None, prescale_factor, postscale_factor, name_key(name)))
    return _submit(_reduce, tensor.detach(), call)


def allgather_async(tensor: torch.Tensor, name=None, process_set=None) -> Future:
    _no_process_set(process_set)
    joining.announce(joining.OTHER, "allgather_async")
    return _submit(_gather, _copy(tensor))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name=None,
                    process_set=None) -> Future:
    _no_process_set(process_set)
    joining.announce(joining.OTHER, "broadcast_async")
    return _submit(_broadcast_into, _copy(tensor), root_rank)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name=None,
                     process_set=None) -> Future:
    _no_process_set(process_set)
    if not tensor.is_contiguous():
        raise ValueError("ringcomp.torch: broadcast_async_ needs a contiguous tensor")
    joining.announce(joining.OTHER, "broadcast_async_")
    return _submit(_broadcast_into, tensor.detach(), root_rank)


def poll(handle: Future) -> bool:
    """Whether the asynchronous call of ``handle`` has finished."""
    return handle.done()


def synchronize(handle: Future):
    """Wait for ``handle``'s call; its result (the output tensor). A call that failed
    raises its error here."""
    return handle.result()
