"""One flat float32 vector holds every parameter (and one every gradient), in backward order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ParamInfo:
    """Where parameter ``name`` (of ``layer``, forward index) lives in the flat vectors."""

    name: str
    layer: int
    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class ParamStore:
    """Flat parameter and gradient vectors, each parameter a view into them.

    Parameters are laid out in the order backward produces their gradients (output layer
    first), so a bucket of consecutive gradients is one contiguous slice that can be
    all-reduced in place, and the optimizer updates the matching slice of ``flat``.
    """

    def __init__(self, shapes: list[tuple[str, int, tuple[int, ...]]], dtype=np.float32):
        """``shapes``: (name, layer, shape) in backward order; both vectors start as host
        zeros (``place`` moves them)."""
        self.infos: list[ParamInfo] = []
        offset = 0
        for name, layer, shape in shapes:
            self.infos.append(ParamInfo(name, layer, tuple(shape), offset))
            offset += self.infos[-1].size
        self.flat = np.zeros(offset, dtype)
        self.grad = np.zeros(offset, dtype)
        self.index = {info.name: i for i, info in enumerate(self.infos)}

    def place(self, placement) -> None:
        """Move both vectors into ``placement``'s memory (a
        ``ringcomp.devices.placement.Placement``); views taken afterwards (``param``,
        ``grad_of``) are views of the moved vectors."""
        self.flat, self.grad = placement.put(self.flat), placement.put(self.grad)

    @property
    def size(self) -> int:
        return self.flat.size

    def param(self, name: str) -> np.ndarray:
        info = self.infos[self.index[name]]
        return self.flat[info.offset:info.offset + info.size].reshape(info.shape)

    def grad_of(self, name: str) -> np.ndarray:
        info = self.infos[self.index[name]]
        return self.grad[info.offset:info.offset + info.size].reshape(info.shape)
