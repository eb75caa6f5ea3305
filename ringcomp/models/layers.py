"""Layers with explicit forward and backward: dense, convolution (im2col), pooling, ReLU.

Written once for ``xp`` (NumPy or CuPy: each layer computes in its input's array module),
with no scatter-adds or fancy indexing, so both give the same operations in the same order.
"""

from __future__ import annotations

import numpy as np

from ringcomp.kernels.arrays import array_module


class Layer:
    """A layer owns named parameters (views into a ParamStore) and caches what backward
    needs. ``backward(dy)`` writes its parameter gradients into the store's views and
    returns the gradient of its input."""

    params: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def bind(self, store, prefix: str) -> None:
        self.store, self.prefix = store, prefix

    def p(self, name: str) -> np.ndarray:
        return self.store.param(f"{self.prefix}.{name}")

    def g(self, name: str) -> np.ndarray:
        return self.store.grad_of(f"{self.prefix}.{name}")

    def init(self, rng: np.random.Generator) -> None:
        """Initialise the parameters (He for weights, zeros for biases)."""


class Dense(Layer):
    def __init__(self, fan_in: int, fan_out: int):
        self.params = (("weight", (fan_in, fan_out)), ("bias", (fan_out,)))
        self.fan_in = fan_in

    def init(self, rng):
        self.p("weight")[...] = rng.standard_normal(self.p("weight").shape) * np.sqrt(
            2.0 / self.fan_in)

    def forward(self, x):
        self.x = x
        return x @ self.p("weight") + self.p("bias")

    def backward(self, dy):
        array_module(dy).matmul(self.x.T, dy, out=self.g("weight"))
        dy.sum(axis=0, out=self.g("bias"))
        return dy @ self.p("weight").T


class ReLU(Layer):
    def forward(self, x):
        self.mask = x > 0
        return x * self.mask

    def backward(self, dy):
        return dy * self.mask


class Flatten(Layer):
    def forward(self, x):
        self.shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy):
        return dy.reshape(self.shape)


class Conv2d(Layer):
    """'Same' k x k convolution, stride 1, as one matrix product over im2col patches.

    Patch layout: rows p = (c, ki, kj) (c slowest), columns q = (i, j); patch element
    (p, q) is the zero-padded input at (c, i + ki, j + kj). Both directions move whole
    shifted windows, one per (ki, kj): im2col copies them out, col2im adds them back in
    (ki, kj) order, so every padded element sums its contributions in the same order
    on any array module.
    """

    def __init__(self, c_in: int, c_out: int, k: int, height: int, width: int):
        self.params = (("weight", (c_in * k * k, c_out)), ("bias", (c_out,)))
        self.shape = (c_in, height, width)
        self.c_out, self.fan_in, self.k = c_out, c_in * k * k, k

    init = Dense.init

    def forward(self, x):
        xp, k, pad = array_module(x), self.k, self.k // 2
        n, (c, h, w) = x.shape[0], self.shape
        padded = xp.zeros((n, c, h + 2 * pad, w + 2 * pad), x.dtype)
        padded[:, :, pad:pad + h, pad:pad + w] = x
        cols = xp.empty((n, c, k, k, h, w), x.dtype)
        for ki in range(k):
            for kj in range(k):
                cols[:, :, ki, kj] = padded[:, :, ki:ki + h, kj:kj + w]
        self.cols = cols.reshape(n, c * k * k, h * w)
        out = xp.einsum("npq,pc->ncq", self.cols, self.p("weight"), optimize=True)
        out += self.p("bias")[None, :, None]
        return out.reshape(n, self.c_out, h, w)

    def backward(self, dy):
        xp, k, pad = array_module(dy), self.k, self.k // 2
        n, (c, h, w) = dy.shape[0], self.shape
        dy = dy.reshape(n, self.c_out, -1)  # (N, C_out, H*W)
        self.g("weight")[...] = xp.einsum("npq,ncq->pc", self.cols, dy, optimize=True)
        self.g("bias")[...] = dy.sum(axis=(0, 2))
        dcols = xp.einsum("pc,ncq->npq", self.p("weight"), dy, optimize=True)
        dcols = dcols.reshape(n, c, k, k, h, w)
        dpadded = xp.zeros((n, c, h + 2 * pad, w + 2 * pad), dy.dtype)
        for ki in range(k):
            for kj in range(k):
                dpadded[:, :, ki:ki + h, kj:kj + w] += dcols[:, :, ki, kj]
        return dpadded[:, :, pad:pad + h, pad:pad + w]


class MaxPool2(Layer):
    """2 x 2 max pooling, stride 2 (height and width even)."""

    def forward(self, x):
        n, c, h, w = x.shape
        blocks = x.reshape(n, c, h // 2, 2, w // 2, 2)
        out = blocks.max(axis=(3, 5))
        # the first maximum of each block gets the gradient (ties broken deterministically)
        flat = blocks.transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
        self.argmax = flat.argmax(axis=-1)
        self.shape = x.shape
        return out

    def backward(self, dy):
        xp, (n, c, h, w) = array_module(dy), self.shape
        hit = xp.arange(4) == self.argmax[..., None]
        # +0.0 where not hit (a product with a 0/1 mask would give -0.0 for negative dy)
        grad = xp.where(hit, dy[..., None], dy.dtype.type(0))
        grad = grad.reshape(n, c, h // 2, w // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5)
        return grad.reshape(n, c, h, w)


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over the batch and its gradient with respect to the logits
    (``labels`` in the same memory as ``logits``)."""
    xp = array_module(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    probs = exp / exp.sum(axis=1, keepdims=True)
    rows = xp.arange(logits.shape[0])
    loss = float(-xp.log(probs[rows, labels] + 1e-30).mean())
    probs[rows, labels] -= 1.0
    n = logits.shape[0]
    return loss, probs / n
