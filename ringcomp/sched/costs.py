"""Cost of one all-reduce of a message on a network, exact or compressed, at any world size.

The utility paper's model (SEEDS.md, seed 2) extended hop by hop: alpha = seconds per message,
beta = seconds per byte on the wire (8 / bandwidth), gamma = seconds per byte of local
addition, and a compressor's codec cost ``c(k) = a + b·k`` seconds for k elements (one
encode + decode), of which ``d(k)`` is the decode alone (c(k) where it is not known).
n elements, m = 4n bytes, m_c = the compressor's bytes for n elements, L = ceil(log2 p):

- exact ring: 2(p-1)(alpha + m/p·beta) + (p-1)·m/p·gamma
- exact tree: 2L(alpha + m·beta) + L·m·gamma
- compressed ring (cascade: decode+add+encode per hop; marsit: bit merge per hop; linear:
  add in the compressed domain; two-stage alike): c(n) + 2(p-1)(alpha + m_c/p·beta)
  + (p-1)·c(n/p)
- compressed tree: c(n) + 2L(alpha + m_c·beta) + L·c(n)
- all-gather of payloads (GRACE; non-summable compressors): c(n) + (p-1)(alpha + m_c·beta)
  + (p-1)·(d(n) + m·gamma): every rank encodes its own vector once and decodes and adds
  each payload it receives (``collectives/gather.py``); none is encoded again

The per-hop merge is charged a full codec call c(n/p) whatever the rule (an upper bound for
Marsit's merge and for linear adds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ringcomp import alphabeta
from ringcomp.compression import get_compressor


@dataclass(frozen=True)
class Network:
    """alpha (s per message), beta (s per byte), gamma (s per byte added locally)."""

    alpha: float
    beta: float
    gamma: float = 0.0

    @classmethod
    def of(cls, bandwidth_bps: float, latency_s: float, gamma: float = 0.0) -> Network:
        return cls(latency_s, 8.0 / bandwidth_bps, gamma)


@dataclass(frozen=True)
class Codec:
    """One encode + decode of k elements costs a + b·k seconds; one decode alone
    ``decode`` = (a, b) of its own (None: not known, then counted as the whole)."""

    a: float
    b: float
    decode: tuple[float, float] | None = None

    def __call__(self, k: float) -> float:
        return self.a + self.b * k

    def decoding(self, k: float) -> float:
        """Seconds of one decode of k elements."""
        return self(k) if self.decode is None else self.decode[0] + self.decode[1] * k

    def scaled(self, factor: float) -> Codec:
        """Every cost times ``factor`` (a faster device: below 1; shared cores: above)."""
        decode = None if self.decode is None else (self.decode[0] * factor,
                                                    self.decode[1] * factor)
        return Codec(self.a * factor, self.b * factor, decode)


def exact_cost(algorithm: str, p: int, nbytes: float, net: Network) -> float:
    """Seconds of an exact all-reduce of ``nbytes``: the algorithm's alpha-beta
    coefficients (``alphabeta.COSTS``, the one table of them) on this network."""
    if p == 1:
        return 0.0
    return _priced_exact(alphabeta.coefficients(algorithm, p, nbytes), net)


def _priced_exact(terms: tuple[float, float, float], net: Network) -> float:
    a, b, g = terms
    return a * net.alpha + b * net.beta + g * net.gamma


#: a compressed form's work past moving its payloads, per (p, elements, codec): (codec
#: seconds, elements added exactly). The ring (and two-stage) join a chunk of n/p at each
#: of p - 1 hops, the tree the whole vector at each of its rounds; the all-gather decodes
#: every other rank's payload and adds it
_CODEC_WORK = {
    "ring": lambda p, n, codec: ((p - 1) * codec(n / p), 0),
    "twostage": lambda p, n, codec: ((p - 1) * codec(n / p), 0),
    "tree": lambda p, n, codec: (math.ceil(math.log2(p)) * codec(n), 0),
    "allgather": lambda p, n, codec: ((p - 1) * codec.decoding(n), (p - 1) * n),
}


def compressed_terms(algorithm: str, p: int, nbytes: float, compressor, codec: Codec
                     ) -> tuple[float, float, float, float, float]:
    """What a compressed all-reduce of ``nbytes`` costs apart from the network: (one
    encode's seconds, the alpha and beta coefficients of its payloads, the codec's seconds
    at the hops, bytes added exactly); ``compressed_cost`` prices them on a network."""
    n = nbytes / 4
    if p == 1:
        return codec(n), 0.0, 0.0, 0.0, 0.0
    if algorithm not in _CODEC_WORK:
        raise ValueError(f"no cost formula for compressed algorithm {algorithm!r}; known: "
                         f"{', '.join(sorted(_CODEC_WORK))}")
    wire = compressor.nbytes(max(1, int(n)))
    a, b, _ = alphabeta.coefficients(algorithm, p, wire)
    work, added = _CODEC_WORK[algorithm](p, n, codec)
    return codec(n), a, b, work, 4 * added


def compressed_cost(algorithm: str, p: int, nbytes: float, net: Network, compressor,
                    codec: Codec) -> float:
    """Seconds of a compressed all-reduce of ``nbytes`` (float32) under the table above:
    one encode, the payloads moved as the exact algorithm moves its bytes (its
    coefficients at the payload's size; the all-gather's adds at the full size), and the
    codec's work at the hops (``_CODEC_WORK``)."""
    return _priced(compressed_terms(algorithm, p, nbytes, compressor, codec), net)


def _priced(terms: tuple[float, float, float, float, float], net: Network) -> float:
    """``compressed_terms`` on ``net`` (one expression, one rounding order, however
    they were come by)."""
    encode, a, b, work, added = terms
    return encode + a * net.alpha + b * net.beta + work + added * net.gamma


def natural_algorithm(compressor) -> str:
    """Where a compressor is used when no algorithm is named: summable (linear, marsit,
    low-rank) ones on the ring, the others (top-k, sign, QSGD) over an all-gather, as GRACE
    and the utility paper run them (``ring+topk`` asks for cascading instead)."""
    return "ring" if compressor is None or not compressor.cascades else "allgather"


def parse_method(method: str) -> tuple[str, object]:
    """``topk``, ``ring+topk`` or ``none`` -> (algorithm, compressor or None)."""
    algorithm, _, spec = method.rpartition("+")
    compressor = get_compressor(spec)
    return algorithm or natural_algorithm(compressor), compressor


def message_costs(method: str, p: int, net: Network, codec: Codec | None,
                  memo: dict | None = None
                  ) -> tuple[Callable[[float], float], Callable[[float], float] | None]:
    """(exact cost, compressed cost or None) of one message of m bytes, for a planner.
    ``memo``: a dict kept across calls with the same method, ``p`` and codec (any
    network) - what a message costs apart from the network is then worked out once per
    size (``predict.break_even`` prices each size on ~60 networks; the same numbers)."""
    algorithm, compressor = parse_method(method)
    exact_algorithm = "ring" if algorithm in ("allgather", "twostage") else algorithm
    exact_terms = {} if memo is None else memo.setdefault("exact", {})

    def exact(m: float) -> float:
        if p == 1:
            return 0.0
        terms = exact_terms.get(m)
        if terms is None:
            terms = exact_terms[m] = alphabeta.coefficients(exact_algorithm, p, m)
        return _priced_exact(terms, net)

    if compressor is None:
        return exact, None
    if codec is None:
        raise ValueError(f"{method}: a compressor needs its codec cost")
    compressed_memo = {} if memo is None else memo.setdefault("compressed", {})

    def compressed(m: float) -> float:
        terms = compressed_memo.get(m)
        if terms is None:
            terms = compressed_memo[m] = compressed_terms(algorithm, p, m, compressor, codec)
        return _priced(terms, net)

    return exact, compressed
