"""Marsit (SEEDS.md, seed 1) as a PyTorch optimizer, stepping in a DistributedOptimizer."""

from __future__ import annotations

import math

import torch


class Marsit(torch.optim.Optimizer):
    """Marsit's update with global compensation, stepping inside a DistributedOptimizer.

    The rule is ``ringcomp.training.optim.MarsitRule`` (the NumPy trainer's): each rank sends
    ``p_m = lr·m_m + c_m`` (its local step plus its compensation; ``m_m`` its own momentum
    ``mu·m_m + g_m + wd·x``, or the gradient itself without momentum), the marsit all-reduce
    aggregates the signs into one ±1 vector ``v``, every rank applies ``x -= global_lr·v``
    and keeps ``c_m = p_m - global_lr·v``. Every ``k``-th step (Marsit-K; 0 = never), and
    for tensors below ``small_tensor`` elements, ``p_m`` travels in full precision instead:
    ``x -= mean(p_m)`` and ``c_m = 0``.

    Args:
        params: the parameters (one group: the rule works on one flat vector).
        lr: the local step eta_l.
        global_lr: the global step eta_s (default lr / 10, as ``ringcomp.train``).
        k: a full-precision round every k steps (0 = never).
        momentum: each rank's local momentum mu, applied before the signs are taken
            (default 0, as ``torch.optim.SGD``'s).
        weight_decay: L2 weight decay added to the local gradient (default 0).

    ``step`` is the DistributedOptimizer's; called outside one it refuses (a sign
    aggregate needs the other ranks). The learning rates are read from the parameter
    group at every step, so LR schedulers act on them.
    """

    def __init__(self, params, lr: float, global_lr: float | None = None, k: int = 0,
                 momentum: float = 0.0, weight_decay: float = 0.0):
        global_lr = lr / 10 if global_lr is None else global_lr
        for name, value in (("lr", lr), ("global_lr", global_lr)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"Marsit: {name} must be a finite number > 0, got {value}")
        if int(k) != k or k < 0:
            raise ValueError(f"Marsit: k must be a whole number >= 0 (0 = never), got {k}")
        if not (math.isfinite(momentum) and 0 <= momentum < 1):
            raise ValueError(f"Marsit: momentum must be in [0, 1), got {momentum}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"Marsit: weight_decay must be a finite number >= 0, got "
                             f"{weight_decay}")
        super().__init__(params, {"lr": lr, "global_lr": global_lr, "k": int(k),
                                  "momentum": momentum, "weight_decay": weight_decay})
        if len(self.param_groups) != 1:
            raise ValueError("Marsit takes one parameter group (its rule updates one flat "
                             "vector)")

    def step(self, closure=None):
        raise RuntimeError("Marsit steps inside ringcomp.torch.DistributedOptimizer(..., "
                           "compressor='marsit'): its update needs every rank's signs")
