"""``python -m ringcomp.model``: what-if predictions - iteration time, its parts, and whether
(and below which bandwidth) each compressor pays off against the overlapped exact ring."""

from __future__ import annotations

import argparse
import json
import math
import sys

from ringcomp import cli
from ringcomp.cli import parse_duration, parse_list, parse_rate
from ringcomp.sched import workload as workloads
from ringcomp.sched.costs import Codec, Network, parse_method
from ringcomp.sched.planners import check_spec
from ringcomp.sched.predict import break_even, predict
from ringcomp.training.measure import measure_codec

DEFAULT_METHODS = "none,fp16,marsit,ring+sign,sign,topk,ring+topk,countsketch"


def codecs_for(methods, speedup: float, fixed: Codec | None = None) -> dict:
    """Encode+decode cost of every compressor named: ``fixed`` for all, or measured here
    (once each)."""
    out = {}
    for method in methods:
        _, compressor = parse_method(method)
        if compressor is not None and compressor.spec() not in out:
            out[compressor.spec()] = (Codec(fixed.a / speedup, fixed.b / speedup) if fixed
                                      else measure_codec(compressor, speedup=speedup))
    return out


def parse_codec(text: str) -> Codec | None:
    """``measured`` -> None; ``A,B`` -> A seconds per call + B seconds per element."""
    if text == "measured":
        return None
    try:
        a, b = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad codec {text!r}: 'measured' or A,B (seconds "
                                         f"per call, seconds per element)") from None
    return Codec(a, b)


def codec_of(method: str, codecs: dict):
    compressor = parse_method(method)[1]
    return None if compressor is None else codecs[compressor.spec()]


def format_rate(bps: float | None) -> str:
    if bps is None:
        return "never"
    if math.isinf(bps):
        return "always"
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"


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
                        "(default), or A,B = A s per call + B s per element for all")
    p.add_argument("--codec-speedup", type=float, default=codec_speedup,
                   help="divide the encode/decode cost (e.g. 20 for a GPU; default: "
                        "%(default)s)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="python -m ringcomp.model",
        description="Predict one training iteration (forward, backward with bucketed "
                    "all-reduces overlapped, FIFO) for each method at a world size, bandwidth "
                    "and latency; say whether compression pays off and the break-even "
                    "bandwidth. Codec costs are measured on this machine.")
    add_workload_options(p, codec_speedup=1.0)
    p.add_argument("--workers", type=int, default=16, help="world size (default: 16)")
    p.add_argument("--bandwidth", type=parse_rate, default=parse_rate("10Gbps"),
                   help="per-link rate, e.g. 100Mbps, 10Gbps (default: 10Gbps)")
    p.add_argument("--methods", type=parse_list, default=parse_list(DEFAULT_METHODS),
                   help="compressors, or algorithm+compressor (ring+sign = cascading); "
                        "none = the exact ring (default: %(default)s)")
    p.add_argument("--plan", default="optimal",
                   help="fusion plan of every method (layerwise, modelwise, fixed:<MB>, "
                        "mgwfbp, layerfusion, mergecomp, optimal; default: optimal)")
    return p


def main(argv=None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    methods = list(dict.fromkeys(["none", *args.methods]))
    try:  # unknown networks, compressors, plans: one line, not a traceback
        work = workloads.load(args.model, args.batch, args.tflops)
        codecs = codecs_for(methods, args.codec_speedup, args.codec)
        check_spec(args.plan)
    except (ValueError, OSError) as err:
        cli.error(str(err))
    net = Network.of(args.bandwidth, args.latency, args.gamma)
    rows = [predict(work, m, args.workers, net, codec_of(m, codecs), args.plan)
            for m in methods]
    base = rows[0]["iter_s"]
    for row in rows:
        row["speedup"] = base / row["iter_s"]
        row["break_even_bps"] = (None if row["method"] == "none" else break_even(
            work, row["method"], args.workers, args.latency, args.gamma,
            codec_of(row["method"], codecs), args.plan))
    print(f"# ringcomp.model: {work.name}, {len(work.sizes)} tensors, "
          f"{sum(work.sizes) / 1e6:.1f} MB, compute {work.compute_s * 1e3:.1f} ms/iter; "
          f"{args.workers} workers, {format_rate(args.bandwidth)}, latency "
          f"{args.latency * 1e6:.3g} us, plan {args.plan}, codec speedup {args.codec_speedup}")
    print(f"{'method':<16}{'alg':<10}{'buckets':>8}{'iter ms':>10}{'no-ovl ms':>11}"
          f"{'exposed ms':>11}{'wire MB':>9}{'speedup':>9}  {'pays off':<9}"
          f"{'below (break-even)':<20}")
    for r in rows:
        pays = "-" if r["method"] == "none" else ("yes" if r["speedup"] > 1 else "no")
        below = "-" if r["method"] == "none" else format_rate(r["break_even_bps"])
        print(f"{r['method']:<16}{r['algorithm']:<10}{r['buckets']:>8}"
              f"{r['iter_s'] * 1e3:>10.2f}{r['no_overlap_s'] * 1e3:>11.2f}"
              f"{r['exposed_comm_s'] * 1e3:>11.2f}{r['wire_MB']:>9.2f}{r['speedup']:>8.2f}x"
              f"  {pays:<9}{below:<20}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": work.name, "workers": args.workers,
                       "bandwidth_bps": args.bandwidth, "latency_s": args.latency,
                       "plan": args.plan, "rows": rows},
                      f, indent=1, default=lambda v: None if v is math.inf else v)
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
