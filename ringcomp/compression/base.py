"""The compressor contract, the registry, and spec strings such as ``"topk:ratio=0.01"``."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ringcomp.kernels.rng import stream_key

REGISTRY: dict[str, type] = {}

#: How partial aggregates combine at a hop (see ``ringcomp.collectives.compressed_ring``).
AGGREGATIONS = ("exact", "cascade", "linear", "marsit", "lowrank")


@dataclass(frozen=True)
class Key:
    """Where an encode or merge happens: seeds every random choice reproducibly.

    ``offset`` is the global index of the segment's first element, so element i of the
    buffer always draws from the same place of the stream whatever the segmentation.
    """

    seed: int = 0
    step: int = 0
    bucket: int = 0
    hop: int = 0
    offset: int = 0

    def stream(self) -> int:
        return stream_key(self.seed, self.step, self.bucket, self.hop)

    def at(self, hop: int, offset: int) -> Key:
        return Key(self.seed, self.step, self.bucket, hop, offset)


class Compressor(ABC):
    """Encode a float segment into a fixed-size byte payload, decode it, combine payloads.

    Subclasses set ``name``, ``aggregation`` (``cascade``: decode, add, re-encode at each
    hop; ``linear``: payloads add in the compressed domain; ``marsit``: bit-wise merge) and
    implement ``nbytes``, ``encode``, ``decode`` and, when linear, ``add`` (Marsit:
    ``merge``). Payloads are uint8 arrays of exactly ``nbytes(n)`` bytes holding everything
    the receiver needs.
    """

    name = ""
    aggregation = "cascade"
    unbiased = False

    def __init__(self, **params):
        if params:
            raise ValueError(f"compressor {self.name!r} takes no parameters, got {params}")

    def spec(self) -> str:
        """The spec string that recreates this compressor (used to agree across ranks)."""
        params = getattr(self, "params", {})
        return self.name + "".join(f":{k}={v}" for k, v in sorted(params.items()))

    @abstractmethod
    def nbytes(self, n: int) -> int:
        """Exact payload size for ``n`` elements (receivers post receives of this size)."""

    @abstractmethod
    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        """The uint8 payload of ``x`` (``nbytes(x.size)`` bytes)."""

    @abstractmethod
    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        """Write the ``n`` values a payload stands for into ``out``; return ``out``."""

    def add(self, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
        raise TypeError(f"compressor {self.name!r} is not linear")


class SparseCompressor(Compressor):
    """A compressor that keeps ``ceil(ratio * n)`` of a segment's ``n`` coordinates."""

    def __init__(self, ratio: float = 0.01):
        if not 0 < ratio <= 1:
            raise ValueError(f"{self.name}: ratio must be in (0, 1], got {ratio}")
        self.ratio = float(ratio)
        self.params = {"ratio": self.ratio}

    def k(self, n: int) -> int:
        return min(n, math.ceil(self.ratio * n))


class SharedSeedCompressor(Compressor):
    """A linear compressor whose random choices every rank shares (hop-independent).

    The payload starts with a 16-byte header - the shared stream key and the segment's
    offset, from which the receiver re-derives the choices - followed by float32 values
    that add element-wise along a ring or tree (``add``), so nothing cascades.
    """

    aggregation = "linear"
    HEADER = 16

    @staticmethod
    def shared_stream(key: Key) -> int:
        """The stream of ``key`` with hop 0: the same on every rank and every hop."""
        return key.at(0, key.offset).stream()

    def new_payload(self, n: int, key: Key) -> tuple[np.ndarray, int]:
        """An ``nbytes(n)`` payload with its header written; returns (payload, stream)."""
        payload = np.empty(self.nbytes(n), np.uint8)
        stream = self.shared_stream(key)
        payload[:self.HEADER].view(np.uint64)[:] = (stream, key.offset)
        return payload, stream

    def header(self, payload: np.ndarray) -> tuple[int, int]:
        """(stream, offset) of a payload."""
        stream, offset = payload[:self.HEADER].view(np.uint64)
        return int(stream), int(offset)

    @staticmethod
    def body(payload: np.ndarray) -> np.ndarray:
        return payload[SharedSeedCompressor.HEADER:].view(np.float32)

    def add(self, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
        if not np.array_equal(a[:self.HEADER], b[:self.HEADER]):
            raise ValueError(f"{self.name}: payloads of different seeds or segments cannot "
                             f"be added")
        total = a.copy()
        np.add(self.body(a), self.body(b), out=self.body(total))
        return total


def register(cls):
    """Class decorator: make a compressor available by its ``name``."""
    if cls.name in REGISTRY:
        raise ValueError(f"compressor {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def get_compressor(spec) -> Compressor | None:
    """A compressor from an object, a name, or a spec ``"name:key=value:key=value"``.

    ``None`` and ``"none"`` mean no compression (the exact algorithms).
    """
    if spec is None or isinstance(spec, Compressor):
        return None if spec is None or spec.name == "none" else spec
    if not isinstance(spec, str):
        raise TypeError(f"compressor must be a name, a spec string or a Compressor, not "
                        f"{type(spec).__name__}")
    name, *parts = spec.split(":")
    if name not in REGISTRY:
        raise ValueError(f"unknown compressor {name!r}; known: {', '.join(sorted(REGISTRY))}")
    params = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"bad compressor parameter {part!r} in {spec!r}: use key=value")
        if "," in value:
            raise ValueError(f"bad compressor parameter {part!r} in {spec!r}: parameters are "
                             f"separated by ':' (e.g. countsketch:ratio=0.3:keep=0.1)")
        params[key] = _value(value)
    try:
        compressor = REGISTRY[name](**params)
    except TypeError as err:  # an unknown keyword, or text where a number belongs
        raise ValueError(f"bad parameters in compressor spec {spec!r}: {err}") from None
    return None if compressor.name == "none" else compressor
