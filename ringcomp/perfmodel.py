"""``python -m ringcomp.perfmodel``: what-if predictions - iteration time, its parts, and whether
(and below which bandwidth) each compressor pays off against the overlapped exact ring."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys

from ringcomp import cli
from ringcomp.cli import out_path, parse_list, parse_rate
from ringcomp.results import record
from ringcomp.results.perftable import format_table
from ringcomp.sched import workload as workloads
from ringcomp.sched.costs import Network
from ringcomp.sched.planners import check_spec
from ringcomp.sched.predict import break_even, predict
from ringcomp.training.whatif import add_workload_options, codec_of, codecs_for

log = logging.getLogger("ringcomp.perfmodel")  # not __name__: "__main__" under python -m

DEFAULT_METHODS = "none,fp16,marsit,ring+sign,sign,topk,ring+topk,countsketch"


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="python -m ringcomp.perfmodel",
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
    p.add_argument("--record", metavar="PATH", type=out_path, default=None,
                   help="write the table as a record with its provenance (what docs/ renders "
                        "from: python -m ringcomp.report docs)")
    return p


def main(argv=None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    before = record.machine_load() if args.record else None  # codecs are timed here
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
    result = {"model": work.name, "tensors": len(work.sizes), "mb": sum(work.sizes) / 1e6,
              "compute_ms": work.compute_s * 1e3, "workers": args.workers,
              "bandwidth_bps": args.bandwidth, "latency_s": args.latency, "plan": args.plan,
              "codec_speedup": args.codec_speedup, "rows": rows}
    print("# ringcomp.perfmodel: " + format_table(result)[2:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=lambda v: None if v is math.inf else v)
        log.info(f"wrote {args.json}")
    if args.record:
        prov = record.provenance(["python", "-m", "ringcomp.perfmodel",
                                  *(sys.argv[1:] if argv is None else argv)], "", before)
        record.write(args.record, "perfmodel", prov, result)
        log.info(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
