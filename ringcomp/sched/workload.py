"""What one training iteration computes: tensor sizes and compute times, from a network's
published shape (the replay models) or from a measured profile."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ringcomp.sched.networks import NETWORKS, backward_tensors
from ringcomp.sched.profile_record import Profile


@dataclass(frozen=True)
class Workload:
    """Per gradient tensor in backward order: bytes, and the backward seconds that end with
    it (its layer's time on the layer's first tensor); plus the forward seconds."""

    name: str
    sizes: tuple[int, ...]
    backward_s: tuple[float, ...]
    forward_s: float

    @property
    def ready(self) -> list[float]:
        return np.cumsum(self.backward_s).tolist()

    @property
    def compute_s(self) -> float:
        """One iteration on one worker: forward + backward, nothing communicated."""
        return self.forward_s + float(np.sum(self.backward_s))


def from_network(net: str, batch: int, tflops: float) -> Workload:
    """A replay network: forward FLOPs x batch / tflops per layer, backward twice that."""
    if net not in NETWORKS:
        raise ValueError(f"unknown network {net!r}; known: {', '.join(NETWORKS)} (or a "
                         f"profile JSON from train --plan --profile)")
    layers, rate = NETWORKS[net](), tflops * 1e12 / batch
    sizes, backward, previous = [], [], None
    for i, _, shape in backward_tensors(layers):  # a layer's time on its first tensor
        sizes.append(4 * int(np.prod(shape)))
        backward.append(2 * layers[i].flops / rate if i != previous else 0.0)
        previous = i
    return Workload(net, tuple(sizes), tuple(backward),
                    sum(layer.flops for layer in layers) / rate)


def from_profile(path: str) -> Workload:
    """A measured profile; its forward time is taken as half its backward time."""
    profile = Profile.load(path)
    return Workload(os.path.basename(path), tuple(profile.sizes), tuple(profile.backward_s),
                    float(np.sum(profile.backward_s)) / 2)


def load(spec: str, batch: int = 32, tflops: float = 10.0) -> Workload:
    return from_profile(spec) if spec.endswith(".json") else from_network(spec, batch, tflops)
