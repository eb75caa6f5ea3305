"""``replay:<net>``: the parameter tensors of ResNet-50, VGG-16 and BERT-base with synthetic
gradients and emulated per-layer compute, for communication studies at realistic scale."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ringcomp.models.params import ParamStore


@dataclass(frozen=True)
class ReplayLayer:
    """One module of the network: its parameter tensors and its forward FLOPs per sample."""

    name: str
    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    flops: float


def _conv(name, c_in, c_out, k, out_side, bias=False) -> ReplayLayer:
    tensors = (("weight", (c_out, c_in, k, k)),) + ((("bias", (c_out,)),) if bias else ())
    return ReplayLayer(name, tensors, 2.0 * out_side ** 2 * k * k * c_in * c_out)


def _norm(name, channels, elements) -> ReplayLayer:
    """BatchNorm / LayerNorm: a scale and a shift, a few FLOPs per activation."""
    return ReplayLayer(name, (("weight", (channels,)), ("bias", (channels,))), 4.0 * elements)


def _linear(name, fan_in, fan_out, rows=1) -> ReplayLayer:
    return ReplayLayer(name, (("weight", (fan_out, fan_in)), ("bias", (fan_out,))),
                       2.0 * rows * fan_in * fan_out)


def resnet50() -> list[ReplayLayer]:
    """torchvision's ResNet-50 (v1.5, stride on the 3x3 conv) at 224x224: 25,557,032
    parameters in 161 tensors."""
    layers = [_conv("conv1", 3, 64, 7, 112), _norm("bn1", 64, 64 * 112 ** 2)]
    c_in, side = 64, 56
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512),
                                                strict=True), start=1):
        out_side = side if stage == 1 else side // 2
        for block in range(blocks):
            first_side = side if block == 0 else out_side
            prefix = f"layer{stage}.{block}"
            layers += [_conv(f"{prefix}.conv1", c_in, width, 1, first_side),
                       _norm(f"{prefix}.bn1", width, width * first_side ** 2),
                       _conv(f"{prefix}.conv2", width, width, 3, out_side),
                       _norm(f"{prefix}.bn2", width, width * out_side ** 2),
                       _conv(f"{prefix}.conv3", width, 4 * width, 1, out_side),
                       _norm(f"{prefix}.bn3", 4 * width, 4 * width * out_side ** 2)]
            if block == 0:
                layers += [_conv(f"{prefix}.downsample.0", c_in, 4 * width, 1, out_side),
                           _norm(f"{prefix}.downsample.1", 4 * width,
                                 4 * width * out_side ** 2)]
            c_in = 4 * width
        side = out_side
    return layers + [_linear("fc", 2048, 1000)]


def vgg16() -> list[ReplayLayer]:
    """torchvision's VGG-16 (no batch norm) at 224x224: 138,357,544 parameters in 32
    tensors."""
    layers, c_in, side = [], 3, 224
    for block, (convs, width) in enumerate(zip((2, 2, 3, 3, 3), (64, 128, 256, 512, 512),
                                               strict=True)):
        for i in range(convs):
            layers.append(_conv(f"features.{block}.{i}", c_in, width, 3, side, bias=True))
            c_in = width
        side //= 2
    return layers + [_linear("classifier.0", 512 * 7 * 7, 4096),
                     _linear("classifier.3", 4096, 4096), _linear("classifier.6", 4096, 1000)]


def bert_base(seq: int = 128) -> list[ReplayLayer]:
    """BERT-base (uncased; 12 layers, hidden 768, 12 heads, vocabulary 30522) with its
    pooler, at sequence length ``seq``: 109,482,240 parameters in 199 tensors. The
    attention score and context products (no parameters) are counted with the attention
    output projection."""
    hidden, inner = 768, 3072
    layers = [ReplayLayer("embeddings", (("word", (30522, hidden)), ("position", (512, hidden)),
                                         ("token_type", (2, hidden))), 3.0 * seq * hidden),
              _norm("embeddings.LayerNorm", hidden, seq * hidden)]
    for i in range(12):
        prefix = f"encoder.layer.{i}"
        attention = _linear(f"{prefix}.attention.output.dense", hidden, hidden, seq)
        layers += [_linear(f"{prefix}.attention.self.{name}", hidden, hidden, seq)
                   for name in ("query", "key", "value")]
        layers += [ReplayLayer(attention.name, attention.tensors,
                               attention.flops + 4.0 * seq * seq * hidden),
                   _norm(f"{prefix}.attention.output.LayerNorm", hidden, seq * hidden),
                   _linear(f"{prefix}.intermediate.dense", hidden, inner, seq),
                   _linear(f"{prefix}.output.dense", inner, hidden, seq),
                   _norm(f"{prefix}.output.LayerNorm", hidden, seq * hidden)]
    return layers + [_linear("pooler.dense", hidden, hidden)]


NETWORKS = {"resnet50": resnet50, "vgg16": vgg16, "bert-base": bert_base}


def backward_tensors(layers: list[ReplayLayer]) -> list[tuple[int, str, tuple[int, ...]]]:
    """(layer index, tensor name, shape) of every parameter tensor, in backward order (the
    order gradients become final, and the layout of the flat parameter store)."""
    return [(i, name, shape) for i in reversed(range(len(layers)))
            for name, shape in layers[i].tensors]
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
        """``placement`` (a ``ringcomp.placement.Placement``; default the host): where the
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
