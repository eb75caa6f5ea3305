"""The compiled walk's hop codecs give the compressors' own bytes: encode, a ring hop's
join and decode, for every rule it compiles, both dtypes, edge sizes and edge values."""

from __future__ import annotations

import numpy as np
import pytest

from ringcomp.collectives import native_codecs as codecs
from ringcomp.compression import Key, get_compressor
from ringcomp.kernels.rng import call_key, threshold
from ringcomp.kernels.rng_numba import hop_stream

SPECS = ["marsit", "sign", "qsgd", "qsgd:levels=3:bucket=0", "terngrad", "terngrad:bucket=7",
         "topk", "topk:ratio=1.0", "topk:ratio=0.3"]
#: one element, a word and one past, the quantizer's block and one past, two blocks
SIZES = [1, 31, 33, 2048, 2049, 5000]


def _values(kind: str, n: int, dtype, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(n).astype(dtype)
    if kind == "ties":  # many equal magnitudes of both signs: top-k's tie rule decides
        x = np.where(np.arange(n) % 3 == 0, dtype(1.5), x).astype(dtype)
        x[::7] = -1.5
    elif kind == "zeros":  # +0 and -0: every scale zero, every sign a rule's choice
        x = np.zeros(n, dtype)
        x[::2] = -0.0
    return x


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["normal", "ties", "zeros"])
def test_native_codecs_give_the_compressors_bytes(spec, dtype, kind):
    comp = get_compressor(spec)
    rule, constants = codecs.rule_of(comp)
    key, hop, offset = Key(3, 4, 5), 2, 17
    call = np.uint64(call_key(3, 4, 5))
    for n in SIZES:
        x, y = _values(kind, n, dtype, n), _values(kind, n, dtype, n + 1)
        want = comp.encode(x, key.at(0, offset))
        got = np.zeros(comp.nbytes(n), np.uint8)
        codecs.encode(rule, constants, x, got, np.uint64(hop_stream(call, 0)), offset)
        assert got.tobytes() == want.tobytes(), ("encode", n)
        joined = comp.join(want, y, hop, key.at(hop, offset), np.empty(n, dtype))
        codecs.join(rule, constants, want, y, got, np.empty(n, dtype),
                    np.uint64(threshold(1, hop + 1)), np.uint64(hop_stream(call, hop)), offset)
        assert got.tobytes() == joined.tobytes(), ("join", n)
        decoded = np.empty(n, dtype)
        codecs.decode(rule, constants, joined, decoded)
        assert decoded.tobytes() == comp.decode(joined, n, np.empty(n, dtype)).tobytes(), n


def test_only_the_compressors_whose_codec_it_has():
    """A subclass may change its codec: only the exact classes are compiled."""
    assert codecs.rule_of(get_compressor("countsketch")) is None
    assert codecs.rule_of(get_compressor("fp16")) is None
    sign = type(get_compressor("sign"))
    assert codecs.rule_of(type("Mine", (sign,), {"name": "mine"})()) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_top_k_decode_refuses_indices_past_the_chunk(dtype):
    """Compiled code checks no bounds: a top-k payload from a peer whose chunk was longer
    (no agreement, equal k) named indices past this chunk's end and was written past the
    output (heap corruption). Decode and the cascade's join now return 1 for it, with
    nothing written past the output; a payload that fits returns 0."""
    comp = get_compressor("topk:ratio=0.1")
    rule, constants = codecs.rule_of(comp)
    long = np.arange(510, dtype=dtype)  # k = 51 of 510, as of 505: equal payload bytes
    payload = comp.encode(long, Key(0, 0, 0).at(0, 0))
    assert comp.nbytes(510) == comp.nbytes(505)
    guard = np.full(600, 7.0, dtype)
    out = guard[:505]
    assert codecs.decode(rule, constants, payload, out) == 1
    assert np.all(guard[505:] == 7.0)
    assert codecs.join(rule, constants, payload, np.zeros(505, dtype), np.zeros_like(payload),
                       np.empty(505, dtype), np.uint64(0), np.uint64(1), 0) == 1
    fits = comp.encode(long[:505], Key(0, 0, 0).at(0, 0))
    assert codecs.decode(rule, constants, fits, np.empty(505, dtype)) == 0
