"""The fused SGD update in NumPy: the specification ``optim_numba`` matches bit for bit."""

from __future__ import annotations

import numpy as np


def sgd(x: np.ndarray, v: np.ndarray, g: np.ndarray, scale, lr, momentum, weight_decay):
    """In place, in float32: ``d = scale·g + wd·x; v = momentum·v + d; x -= lr·v``
    (PyTorch's SGD; ``scale`` turns the all-reduced sum into the mean). ``v`` is unused
    when ``momentum`` is 0."""
    scale, lr, momentum, weight_decay = (np.float32(a) for a in (scale, lr, momentum,
                                                                  weight_decay))
    d = g * scale
    if weight_decay:
        d += weight_decay * x
    if momentum:
        v *= momentum
        v += d
        d = v
    x -= lr * d
