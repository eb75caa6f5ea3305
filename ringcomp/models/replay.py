"""``replay:<net>``: the parameter tensors of ResNet-50, VGG-16 and BERT-base with synthetic
gradients and emulated per-layer compute, for communication studies at realistic scale."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from ringcomp.models.params import ParamStore
from ringcomp.sched.networks import NETWORKS, backward_tensors

NOISE_POOL = 4_194_301  # a prime: the noise pattern never lines up with tensor shapes


class ReplayModel:
    """A network's parameter tensors trained on a noisy quadratic, with emulated compute.

    Each step, for every tensor in backward order: gradient = x + noise (the gradient of
    ``0.5·||x||²`` plus unit Gaussian noise drawn per (seed, step, rank)), then the thread
    sleeps until the layer's share of the step's compute time has passed. Sleeping leaves
    the CPU to the communication thread, as a GPU computing would. Compute time per layer
    = its forward FLOPs x batch / (``tflops``·10¹²): x1 in ``loss`` (forward), x2 in
    ``backward``. ``scale`` < 1 shrinks every tensor (and the compute) to that fraction so
    the big networks fit many ranks on one machine; the tensor count stays.
    """

    replay = True

    def __init__(self, net: str, seed: int, rank: int, batch: int, tflops: float = 10.0,
                 scale: float = 1.0, placement=None):
        """``placement`` (a ``ringcomp.devices.placement.Placement``; default the host): where the
        parameters, gradients and the noise pool live."""
        if net not in NETWORKS:
            raise ValueError(f"unknown replay network {net!r}; known: {', '.join(NETWORKS)}")
        if not 0 < scale <= 1:
            raise ValueError(f"replay scale must be in (0, 1], got {scale}")
        self.net, self.seed, self.rank = net, seed, rank
        self.layers = NETWORKS[net]()
        self.store = ParamStore([
            (f"{i}.{name}", i, shape if scale == 1 else
             (max(1, round(int(np.prod(shape)) * scale)),))
            for i, name, shape in backward_tensors(self.layers)])
        rate = tflops * 1e12 / (batch * scale) if tflops > 0 else float("inf")
        self.seconds = [layer.flops / rate for layer in self.layers]  # forward, per layer
        self.noise = np.random.default_rng([seed, 0x9E71, rank]).standard_normal(
            NOISE_POOL, np.float32)
        start = np.random.default_rng([seed, 0x9E72]).standard_normal(NOISE_POOL, np.float32)
        _add_cyclic(np.zeros_like(self.store.flat), start, 0, self.store.flat)  # same on all
        if placement is not None:
            self.store.place(placement)
            self.noise = placement.put(self.noise)
        self.step = 0

    def begin(self, step: int) -> float:
        """Start ``step``: emulate the forward pass; returns the loss 0.5·mean(x²)."""
        self.step = step
        start = time.perf_counter()
        x = self.store.flat
        loss = 0.5 * float(np.dot(x, x)) / x.size  # cupy.dot on a GPU (NEP 18)
        _sleep_until(start + sum(self.seconds))
        return loss

    def backward(self) -> Iterator[list[int]]:
        """Per layer in backward order: write its gradients, sleep out its compute time,
        yield the indices of its parameters."""
        start, spent = time.perf_counter(), 0.0
        offset = int(np.random.default_rng([self.seed, 0x9E73, self.step, self.rank])
                     .integers(NOISE_POOL))
        by_layer: dict[int, list[int]] = {}
        for index, info in enumerate(self.store.infos):
            by_layer.setdefault(info.layer, []).append(index)
        for layer in reversed(range(len(self.layers))):
            for index in by_layer[layer]:
                info = self.store.infos[index]
                lo, hi = info.offset, info.offset + info.size
                _add_cyclic(self.store.flat[lo:hi], self.noise, offset + lo,
                            self.store.grad[lo:hi])
            spent += 2 * self.seconds[layer]
            _sleep_until(start + spent)
            yield by_layer[layer]

    def compute_seconds(self) -> float:
        """Emulated compute per step (forward + backward)."""
        return 3 * sum(self.seconds)


def _add_cyclic(x: np.ndarray, pool: np.ndarray, start: int, out: np.ndarray) -> None:
    """``out = x + pool[start:]`` with ``pool`` read cyclically: one pass over memory."""
    n, start, done = len(out), start % len(pool), 0
    while done < n:
        take = min(n - done, len(pool) - start)
        np.add(x[done:done + take], pool[start:start + take], out=out[done:done + take])
        done, start = done + take, 0


def _sleep_until(deadline: float) -> None:
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


def describe(net: str) -> dict:
    """Tensor count, parameter count and forward GFLOPs per sample of a network."""
    layers = NETWORKS[net]()
    sizes = [int(np.prod(shape)) for _, _, shape in backward_tensors(layers)]
    return {"tensors": len(sizes), "parameters": sum(sizes),
            "gflops": sum(layer.flops for layer in layers) / 1e9}
