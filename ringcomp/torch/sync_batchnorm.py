"""Horovod's ``SyncBatchNorm``: batch normalisation over every rank's batch together."""

from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm


class SyncBatchNorm(_BatchNorm):
    """``torch.nn.BatchNorm*d`` whose training statistics are those of the global batch
    (every rank's rows together), as Horovod's ``hvd.SyncBatchNorm`` and
    ``torch.nn.SyncBatchNorm``: the same outputs, running statistics and gradients as one
    process normalising the concatenated batch. In evaluation (or on one rank) it is the
    plain layer.

    Steps (per channel c, in training, on ``ringcomp.torch``'s world):
      1. all-reduce (sum) this rank's element count and sum of x over the batch and
         spatial dims: the global mean;
      2. all-reduce (sum) the sum of (x - mean)^2: the global (biased) variance - two
         passes, for the accuracy of a centred sum;
      3. normalise with them, update the running mean and the running variance (the
         unbiased one, N / (N - 1)) with ``momentum``, as ``BatchNorm`` does.
    Both all-reduces are ``ringcomp.torch.allreduce`` (autograd functions with Horovod's
    rule: the gradient is the all-reduced gradient), so backward is exact and, as
    forward, collective: every rank must run it.
    """

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected at least 2D input, got {x.dim()}D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ringcomp.torch import horovod, horovod_world

        self._check_input_dim(x)
        if not (self.training and horovod_world.is_initialized() and horovod_world.size() > 1):
            return super().forward(x)
        dims = [0, *range(2, x.dim())]
        shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
        count = torch.full((1,), x.numel() / x.shape[1], dtype=x.dtype, device=x.device)
        totals = horovod.allreduce(torch.cat([count, x.sum(dims)]), op=horovod.Sum)  # 1.
        n = totals[0]
        mean = totals[1:] / n
        centred = x - mean.reshape(shape)
        var = horovod.allreduce(centred.square().sum(dims), op=horovod.Sum) / n  # 2.
        if self.track_running_stats:  # 3.
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                            else self.momentum)
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                unbiased = var.detach() * (n / (n - 1)) if n > 1 else var.detach()
                self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
        y = centred / torch.sqrt(var.reshape(shape) + self.eps)
        if self.affine:
            y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
        return y
