"""The compressor contract, the registry, and spec strings such as ``"topk:ratio=0.01"``."""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ringcomp.kernels.rng import stream_key

REGISTRY: dict[str, type] = {}

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


#: each compressor class's spec at its defaults (``Compressor.label``)
_DEFAULT_SPECS: dict = {}


class Compressor(ABC):
    """Encode a float segment into a fixed-size byte payload, decode it, aggregate at hops.

    A compressor is a codec (``nbytes``, ``encode``, ``decode``; payloads are uint8 arrays
    of exactly ``nbytes(n)`` bytes holding everything the receiver needs) plus a hop rule:
    how partial aggregates of several ranks meet on the way. The rule is one of three bases
    in ``ringcomp.compression.rules`` (cascade, linear, Marsit's bit merge); a compressor
    subclasses one of them and collectives call its hop operations, never a rule's name:

    - ``join(incoming, x, have, key, scratch)``: one rank's raw values ``x`` join an
      incoming payload aggregating ``have`` ranks (a ring hop); returns the payload.
    - ``start(x, key)`` -> a partial aggregate of one rank; ``combine(agg, payload, n,
      have, joining, key, scratch)`` adds a payload of ``joining`` ranks to an aggregate of
      ``have`` (``agg=None``: of none yet; ``scratch``: ``n`` elements of the output's
      dtype the rule may decode into); ``finish(agg, key, carry)`` makes the payload sent
      (tree nodes, two-stage owners). A partial aggregate is whatever the rule keeps
      between hops: raw sums (cascade, encoded once per send) or a payload.
    - ``settle(total)``: what an all-gather's exact sum of every rank's decoded payload
      becomes (the sum itself; Marsit's signs: a majority vote).

    Capabilities a caller may rely on are class attributes: ``cascades`` (re-encodes at
    every hop, so error grows with the hops), ``linear`` (payloads add), ``unbiased``,
    ``signs_only`` (the result is ±1 per element: it goes with the Marsit optimizer's
    global compensation, not error feedback) and ``wraps_exact`` (aggregated by its own
    scheme over any exact algorithm, PowerSGD). ``aggregation`` names the rule for messages
    and reports only.
    """

    name = ""
    #: the smallest magnitude the payload cannot carry (it arrives as Inf): fp16's 65520;
    #: None where every finite float32 survives (the all-reduce refuses values beyond it
    #: and a sum that passes it, ``ringcomp.api``)
    overflows_at: float | None = None
    aggregation = ""
    cascades = False
    linear = False
    unbiased = False
    signs_only = False
    wraps_exact = False
    #: ``join`` may decode into its ``scratch`` (a rule that merges payloads never does:
    #: the ring hands it none)
    join_uses_scratch = True

    def __init__(self, **params):
        if params:
            raise ValueError(f"compressor {self.name!r} takes no parameters, got {params}")

    def spec(self) -> str:
        """The spec string that recreates this compressor (used to agree across ranks)."""
        params = getattr(self, "params", {})
        return self.name + "".join(f":{k}={v}" for k, v in sorted(params.items()))

    def label(self) -> str:
        """What traces and their tables name this compressor's calls by: its name where
        its options are its defaults (the records' labels), else its full spec - two top-k
        ratios in one run are two rows, not one row averaging both. Worked out once."""
        label = self.__dict__.get("_label")
        if label is None:
            kind = type(self)
            if kind not in _DEFAULT_SPECS:
                try:
                    _DEFAULT_SPECS[kind] = kind().spec()
                except Exception:  # a compressor without defaults for every option
                    _DEFAULT_SPECS[kind] = ""
            spec = self.spec()
            label = self._label = self.name if spec == _DEFAULT_SPECS[kind] else spec
        return label

    @abstractmethod
    def nbytes(self, n: int) -> int:
        """Exact payload size for ``n`` elements (receivers post receives of this size)."""

    @abstractmethod
    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        """The uint8 payload of ``x`` (``nbytes(x.size)`` bytes)."""

    @abstractmethod
    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        """Write the ``n`` values a payload stands for into ``out``; return ``out``."""

    def state_dict(self) -> dict:
        """What the compressor carries between calls (most carry nothing): a copy."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``'s output; ``{}`` forgets everything."""
        if state:
            raise ValueError(f"compressor {self.name!r} keeps no state, got {sorted(state)}")

    def _no_hop_rule(self):
        return TypeError(f"compressor {self.name!r} has no hop rule ({self.aggregation} "
                         f"aggregation)")

    def join(self, incoming, x, have: int, key: Key, scratch=None) -> np.ndarray:
        raise self._no_hop_rule()

    def start(self, x, key: Key):
        raise self._no_hop_rule()

    def combine(self, agg, payload, n: int, have: int, joining: int, key: Key, scratch):
        raise self._no_hop_rule()

    def finish(self, agg, key: Key, carry=None) -> np.ndarray:
        raise self._no_hop_rule()

    def settle(self, total) -> None:  # noqa: B027 - a hook most rules leave as it is
        """Nothing to do: an all-gather's result is the sum of the decoded payloads."""

    def warm_up(self, xp=np, dtype=np.float32, elements: int = 0) -> None:
        """Run the codec and its hop rule once on an array of ``xp`` (NumPy, CuPy) of
        ``elements`` (default ``WARM_UP_ELEMENTS``), so their kernels are compiled, or
        loaded from Numba's cache, now rather than inside the first collective, where the
        time would be charged to communication. PowerSGD's factors are plain array work:
        nothing to load."""
        if self.wraps_exact:
            return
        x = xp.linspace(-1.0, 1.0, elements or WARM_UP_ELEMENTS, dtype=dtype)
        key = Key()
        payload = self.encode(x, key)
        self.decode(payload, x.size, xp.empty_like(x))
        if self.aggregation:  # a hop rule: the ring's join, the tree's start/combine/finish
            self.join(payload, x, 1, key.at(1, 0), xp.empty_like(x))
            agg = self.combine(self.start(x, key), payload, x.size, 1, 1, key.at(1, 0),
                               xp.empty_like(x))
            self.finish(agg, key.at(2, 0))


#: ``Compressor.warm_up``'s array: past the kernels' special cases for a few elements
WARM_UP_ELEMENTS = 1024


class SparseCompressor(Compressor):
    """A compressor that keeps ``ceil(ratio * n)`` of a segment's ``n`` coordinates."""

    def __init__(self, ratio: float = 0.01):
        if not 0 < ratio <= 1:
            raise ValueError(f"{self.name}: ratio must be in (0, 1], got {ratio}")
        self.ratio = float(ratio)
        self.params = {"ratio": self.ratio}

    def k(self, n: int) -> int:
        return min(n, math.ceil(self.ratio * n))


def register(cls):
    """Class decorator: make a compressor available by its ``name``."""
    if cls.name in REGISTRY:
        raise ValueError(f"compressor {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


#: the entry-point group in which an installed package names its compressors, e.g. in its
#: setup.cfg: ``[options.entry_points] ringcomp.compressors = mine = mypkg.codec:Mine``
ENTRY_POINTS = "ringcomp.compressors"
_INSTALLED_LOADED = [False]


def load_installed() -> None:
    """Register the compressors that installed packages name under ``ENTRY_POINTS``, once
    per process: so the command-line tools, which run no code of the user's, know them as
    the API does. An entry point names a ``Compressor`` class (registered unless its
    import registered it) or a module that registers its own when imported; one that
    fails to load is skipped with a warning, naming it."""
    if _INSTALLED_LOADED[0]:
        return
    _INSTALLED_LOADED[0] = True
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINTS):
        try:
            found = point.load()
            if isinstance(found, type) and issubclass(found, Compressor) \
                    and REGISTRY.get(found.name) is not found:
                register(found)
        except Exception as exc:  # a broken plugin must not stop ringcomp
            warnings.warn(f"compressor entry point {point.name!r} ({point.value}) of "
                          f"{ENTRY_POINTS!r} did not load: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)


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
        load_installed()
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
