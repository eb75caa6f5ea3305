"""The fused SGD update as one CUDA kernel, bit for bit equal to ``optim_ref``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ringcomp.kernels.cuda_launch import launch, mul_f32, usable  # noqa: F401 - usable


@cuda.jit
def _sgd(x, v, g, scale, lr, momentum, weight_decay):
    i = cuda.grid(1)
    if i >= x.size:
        return
    # every product rounded before its add, as the five NumPy passes of the reference do
    d = mul_f32(g[i], scale)
    if weight_decay:
        d = d + mul_f32(weight_decay, x[i])
    if momentum:
        d = mul_f32(v[i], momentum) + d
        v[i] = d
    x[i] = x[i] - mul_f32(lr, d)


def sgd(x, v, g, scale, lr, momentum, weight_decay):
    """See ``optim_ref.sgd``: one pass over device memory, one thread per element."""
    launch(_sgd, x.size, x, v, g, *(np.float32(a) for a in (scale, lr, momentum,
                                                             weight_decay)))
