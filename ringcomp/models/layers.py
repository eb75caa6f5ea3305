"""Layers with explicit forward and backward: dense, convolution (im2col), pooling, ReLU."""

from __future__ import annotations

import numpy as np


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
        np.matmul(self.x.T, dy, out=self.g("weight"))
        np.sum(dy, axis=0, out=self.g("bias"))
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


def _im2col_index(channels: int, height: int, width: int, k: int):
    """Gather indices: patch rows (c, ki, kj) x output positions of a 'same' k x k conv."""
    pad = k // 2
    ci, ki, kj = np.meshgrid(np.arange(channels), np.arange(k), np.arange(k), indexing="ij")
    oi, oj = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    rows = (ki.reshape(-1, 1) + oi.reshape(1, -1))
    cols = (kj.reshape(-1, 1) + oj.reshape(1, -1))
    return ci.reshape(-1, 1), rows, cols, pad


class Conv2d(Layer):
    """'Same' k x k convolution, stride 1, as one matrix product over im2col patches."""

    def __init__(self, c_in: int, c_out: int, k: int, height: int, width: int):
        self.params = (("weight", (c_in * k * k, c_out)), ("bias", (c_out,)))
        self.shape = (c_in, height, width)
        self.c_out, self.fan_in = c_out, c_in * k * k
        self.index = _im2col_index(c_in, height, width, k)

    init = Dense.init

    def forward(self, x):
        ci, rows, cols, pad = self.index
        padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        self.padded_shape = padded.shape
        self.cols = padded[:, ci, rows, cols]  # (N, C*k*k, H*W)
        out = np.einsum("npq,pc->ncq", self.cols, self.p("weight"), optimize=True)
        out += self.p("bias")[None, :, None]
        n, (_, h, w) = x.shape[0], self.shape
        return out.reshape(n, self.c_out, h, w)

    def backward(self, dy):
        n = dy.shape[0]
        dy = dy.reshape(n, self.c_out, -1)  # (N, C_out, H*W)
        self.g("weight")[...] = np.einsum("npq,ncq->pc", self.cols, dy, optimize=True)
        self.g("bias")[...] = dy.sum(axis=(0, 2))
        dcols = np.einsum("pc,ncq->npq", self.p("weight"), dy, optimize=True)
        ci, rows, cols, pad = self.index
        dpadded = np.zeros(self.padded_shape, dy.dtype)
        np.add.at(dpadded, (slice(None), ci, rows, cols), dcols)
        _, h, w = self.shape
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
        n, c, h, w = self.shape
        grad = np.zeros((n, c, h // 2, w // 2, 4), dy.dtype)
        np.put_along_axis(grad, self.argmax[..., None], dy[..., None], axis=-1)
        grad = grad.reshape(n, c, h // 2, w // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5)
        return grad.reshape(n, c, h, w)


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over the batch and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probs = exp / exp.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    loss = float(-np.log(probs[np.arange(n), labels] + 1e-30).mean())
    probs[np.arange(n), labels] -= 1.0
    return loss, probs / n
