"""Optimizers that update flat slices of the parameters: SGD, Adam and Marsit's update."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import numpy as np

from ringcomp.kernels.backends import for_size


class Optimizer(ABC):
    """Elementwise update rules applied bucket by bucket (a bucket = a slice of the flat
    parameter vector), so a bucket is updated as soon as its all-reduce is done.

    ``prepare`` returns what this rank all-reduces for a bucket (the gradient itself, or
    Marsit's scaled-and-compensated vector); ``apply`` receives the all-reduced sum (or
    Marsit's aggregated signs) and updates ``params`` in place. ``state`` holds every buffer
    a checkpoint must keep, as flat arrays keyed by name, allocated with ``xp`` (NumPy, or
    CuPy when the parameters are on a GPU).
    """

    def __init__(self, size: int, lr: float, xp=np):
        self.size, self.lr, self.state, self.xp = size, lr, {}, xp

    def buffer(self, name: str) -> np.ndarray:
        if name not in self.state:
            self.state[name] = self.xp.zeros(self.size, np.float32)
        return self.state[name]

    def prepare(self, grad: np.ndarray, params: np.ndarray, lo: int, hi: int,
                compressed: bool) -> np.ndarray:
        """What this rank all-reduces for the bucket [lo, hi) with gradient ``grad`` and
        parameters ``params`` (that slice): the gradient itself, unless the rule says."""
        return grad

    def scratch(self, size: int) -> Optimizer:
        """A twin with the same settings and fresh, empty state for ``size`` elements: for
        timing the update without touching (or copying) the run's state."""
        twin = copy.copy(self)
        twin.size, twin.state = size, {}
        return twin

    @abstractmethod
    def apply(self, params, reduced, lo: int, hi: int, ranks: int, step: int,
              compressed: bool) -> None:
        """Update ``params`` (the slice [lo, hi)) from the all-reduced ``reduced``."""

    def skip(self, lo: int) -> None:  # noqa: B027 - stateless optimizers have nothing to undo
        """The bucket at ``lo`` was prepared but its step is skipped (non-finite values)."""


class SGD(Optimizer):
    """SGD with momentum and weight decay (PyTorch's form: v = mu v + g + wd x; x -= lr v)."""

    def __init__(self, size, lr, momentum=0.9, weight_decay=0.0, xp=np):
        super().__init__(size, lr, xp)
        self.momentum, self.weight_decay = momentum, weight_decay
        tiny = xp.zeros(1, np.float32)
        # resolved once for the run's arrays; a small model's update stays in NumPy
        # (``backends.for_size``: no Numba start-up on every rank for microseconds a step)
        self.kernels = for_size("optim", size, like=tiny)
        # compile (or load) the kernel now, not in step 0
        self.kernels.sgd(tiny, tiny.copy(), tiny.copy(), 1.0, lr, momentum, weight_decay)

    def apply(self, params, reduced, lo, hi, ranks, step, compressed):
        # without momentum there is no velocity buffer; the kernel then never touches v,
        # so any array not aliasing params will do (the CUDA simulator copies each
        # argument back after a launch: an alias of params would undo the update)
        v = self.buffer("momentum")[lo:hi] if self.momentum else reduced
        self.kernels.sgd(params, v, reduced, 1.0 / ranks, self.lr, self.momentum,
                         self.weight_decay)


class Adam(Optimizer):
    """Adam with bias correction; weight decay is L2 added to the gradient (not AdamW's)."""

    def __init__(self, size, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, xp=np):
        super().__init__(size, lr, xp)
        self.beta1, self.beta2, self.eps, self.weight_decay = beta1, beta2, eps, weight_decay

    def apply(self, params, reduced, lo, hi, ranks, step, compressed):
        g = reduced / ranks
        if self.weight_decay:
            g += self.weight_decay * params
        m, v = self.buffer("m")[lo:hi], self.buffer("v")[lo:hi]
        m *= self.beta1
        m += (1 - self.beta1) * g
        v *= self.beta2
        v += (1 - self.beta2) * g * g
        t = step + 1
        m_hat = m / (1 - self.beta1 ** t)
        v_hat = v / (1 - self.beta2 ** t)
        params -= (self.lr * m_hat / (self.xp.sqrt(v_hat) + self.eps)).astype(params.dtype)


class MarsitRule(Optimizer):
    """Marsit's update with global compensation (SEEDS.md, seed 1), with local momentum
    and L2 weight decay.

    1. ``prepare``: d_m = g_m + wd · x (weight decay as SGD's, on the local gradient);
       m_m' = mu · m_m + d_m (each rank's own momentum, before compression, as in signum:
       the sign of a smoothed gradient is less noisy than the sign of one minibatch's);
       p_m = eta_l · m_m' + c_m (the local step and the compensation). p_m is what the
       marsit all-reduce aggregates into the ±1 vector v. Without momentum m_m' = d_m.
    2. ``apply`` on a compressed bucket: x -= eta_s · v and c_m = p_m - eta_s · v (the residual
       is measured against the *global* update every rank applied); m_m = m_m'.
    3. ``apply`` on a full-precision bucket (every K-th step, warm-up steps, small tensors):
       x -= mean over ranks of p_m, c_m = 0 and m_m = m_m' (the momentum is local state
       and survives the reset, as SGD's survives any step).
    4. ``skip``: the step is given up; m_m and c_m stay as they were.

    Invariant: mu = wd = 0 is the paper's rule, bit for bit.
    """

    def __init__(self, size, lr, global_lr=None, momentum=0.0, weight_decay=0.0, xp=np):
        super().__init__(size, lr, xp)
        self.global_lr = lr if global_lr is None else global_lr
        self.momentum, self.weight_decay = momentum, weight_decay
        self.sent = {}  # lo -> (p_m, m_m') of a bucket prepared and not yet applied

    def prepare(self, grad, params, lo, hi, compressed):
        d = grad + self.weight_decay * params if self.weight_decay else grad  # 1.
        m = None
        if self.momentum:
            m = self.momentum * self.buffer("momentum")[lo:hi] + d
            d = m
        p = self.lr * d + self.buffer("compensation")[lo:hi]
        self.sent[lo] = (p, m)
        return p

    def skip(self, lo):
        self.sent.pop(lo, None)

    def scratch(self, size):
        twin = super().scratch(size)
        twin.sent = {}
        return twin

    def apply(self, params, reduced, lo, hi, ranks, step, compressed):
        (p, m), c = self.sent.pop(lo), self.buffer("compensation")[lo:hi]
        if compressed:  # 2.
            update = self.global_lr * reduced
            params -= update
            self.xp.subtract(p, update, out=c)
        else:  # 3.
            params -= reduced / ranks
            c[...] = 0
        if m is not None:
            self.buffer("momentum")[lo:hi] = m


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "marsit": MarsitRule}
