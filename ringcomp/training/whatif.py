"""The workload, link and codec inputs the what-if tools share (``ringcomp.perfmodel`` and
``ringcomp.simulate``): their options, and each compressor's measured or given codec cost."""

from __future__ import annotations

import argparse
import math

from ringcomp.cli import parse_duration
from ringcomp.sched.costs import Codec, parse_method
from ringcomp.training.measure import measure_codec


def codecs_for(methods, speedup: float, fixed: Codec | None = None) -> dict:
    """Encode+decode cost of every compressor named: ``fixed`` for all, or measured here
    (once each)."""
    out = {}
    for method in methods:
        _, compressor = parse_method(method)
        if compressor is not None and compressor.spec() not in out:
            out[compressor.spec()] = (fixed.scaled(1 / speedup) if fixed
                                      else measure_codec(compressor, speedup=speedup))
    return out


def parse_codec(text: str) -> Codec | None:
    """``measured`` -> None; ``A,B`` -> an encode + decode costs A seconds per call + B
    seconds per element (a decode alone counted as much); ``A,B,C,D``: the same, and a
    decode alone costs C seconds per call + D per element."""
    if text == "measured":
        return None
    try:
        values = [float(v) for v in text.split(",")]
        if len(values) not in (2, 4) or not all(v >= 0 and math.isfinite(v) for v in values):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad codec {text!r}: 'measured', A,B (an encode + decode: seconds per call, "
            f"seconds per element; finite, >= 0) or A,B,C,D (C,D: the decode alone)") from None
    return Codec(values[0], values[1], tuple(values[2:]) if len(values) == 4 else None)


def codec_of(method: str, codecs: dict):
    compressor = parse_method(method)[1]
    return None if compressor is None else codecs[compressor.spec()]


def add_workload_options(p: argparse.ArgumentParser, codec_speedup: float) -> None:
    """The options ``model`` and ``simulate`` share: the workload, the link's start-up and
    local addition cost, and the codec."""
    p.add_argument("--model", default="resnet50",
                   help="resnet50, vgg16, bert-base, or a profile JSON from train --plan "
                        "--profile (default: %(default)s)")
    p.add_argument("--latency", type=parse_duration, default=parse_duration("10us"),
                   help="per-message start-up alpha, e.g. 10us (default: 10us)")
    p.add_argument("--gamma", type=float, default=1e-10,
                   help="seconds per byte of local addition (default: 1e-10, ~10 GB/s)")
    p.add_argument("--batch", type=int, default=32, help="samples per worker (networks only)")
    p.add_argument("--tflops", type=float, default=10.0,
                   help="compute speed of a worker (networks only; default: 10)")
    p.add_argument("--codec", type=parse_codec, default=None,
                   help="encode+decode cost: 'measured' on this machine per compressor "
                        "(default), or A,B = A s per call + B s per element for all "
                        "(A,B,C,D: the decode alone costs C + D per element)")
    p.add_argument("--codec-speedup", type=float, default=codec_speedup,
                   help="divide the encode/decode cost (e.g. 20 for a GPU; default: "
                        "%(default)s)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
