"""Horovod's collectives as autograd functions: gradients flow back through them by
Horovod's rules (``HorovodAllreduce``, ``HorovodAllgather``, ``HorovodBroadcast``).

Each takes its forward and its backward collective as callables (``ringcomp.torch.horovod``
passes its own calls, so a backward collective is announced to joined ranks and agreed as
any call): a backward runs a collective, so every rank must run its backward pass, as
with Horovod."""

from __future__ import annotations

import torch


class Allreduce(torch.autograd.Function):
    """Forward ``reduce(tensor)``; backward the same reduction of the incoming gradient
    (same op, same scale factors)."""

    @staticmethod
    def forward(ctx, tensor, reduce, reduce_grad):
        ctx.reduce_grad = reduce_grad
        return reduce(tensor)

    @staticmethod
    def backward(ctx, grad):
        return ctx.reduce_grad(grad.contiguous()), None, None


class Allgather(torch.autograd.Function):
    """Forward ``gather(tensor)`` -> (every rank's rows, this rank's first row in them);
    backward the incoming gradient summed over ranks, this rank's rows of it."""

    @staticmethod
    def forward(ctx, tensor, gather, sum_grad):
        result, offset = gather(tensor)
        ctx.rows, ctx.sum_grad = (offset, tensor.shape[0]), sum_grad
        return result

    @staticmethod
    def backward(ctx, grad):
        offset, rows = ctx.rows
        return ctx.sum_grad(grad.contiguous()).narrow(0, offset, rows), None, None


class Broadcast(torch.autograd.Function):
    """Forward ``broadcast(tensor)``; backward the incoming gradient summed over ranks on
    the root, times zero elsewhere (Horovod's rule: NaN stays NaN)."""

    @staticmethod
    def forward(ctx, tensor, broadcast, sum_grad, is_root: bool):
        ctx.sum_grad, ctx.is_root = sum_grad, is_root
        return broadcast(tensor)

    @staticmethod
    def backward(ctx, grad):
        summed = ctx.sum_grad(grad.contiguous())
        return (summed if ctx.is_root else summed * 0), None, None, None
