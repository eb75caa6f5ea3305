"""``python -m ringcomp.simulate``: the timeline model swept over world sizes, plans,
compressors and bandwidths - scaling efficiency to thousands of workers."""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys

from ringcomp import cli
from ringcomp.cli import format_rate, out_path, parse_list, parse_rate
from ringcomp.plots import legend_beside, pyplot, save_figure
from ringcomp.results import record
from ringcomp.results.simtable import format_table
from ringcomp.sched import workload as workloads
from ringcomp.sched.costs import Network
from ringcomp.sched.planners import check_spec
from ringcomp.sched.predict import predict
from ringcomp.training.whatif import add_workload_options, codec_of, codecs_for

log = logging.getLogger("ringcomp.simulate")  # not __name__: "__main__" under python -m

#: the seeds' names for plans: WFBP = one message per tensor, SyncEASGD = one after backward
ALIASES = {"wfbp": "layerwise", "syncea": "modelwise"}


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="python -m ringcomp.simulate",
        description="Trace-driven timeline simulation (compute per layer, per-bucket "
                    "encode/decode, collectives on one FIFO link with ring/tree/all-gather "
                    "costs) of one iteration for every workers x plan x compressor x "
                    "bandwidth. Scaling efficiency = one worker's compute time / iteration "
                    "time (weak scaling: the batch per worker is fixed).")
    add_workload_options(p, codec_speedup=20.0)
    p.add_argument("--workers", default="4,16,64,256,1024,2048",
                   type=lambda s: [int(x) for x in parse_list(s)],
                   help="world sizes (default: 4,16,64,256,1024,2048)")
    p.add_argument("--bandwidth", default=[parse_rate("10Gbps")],
                   type=lambda s: [parse_rate(x) for x in parse_list(s)],
                   help="link rates, e.g. 1Gbps,10Gbps,100Gbps (default: 10Gbps)")
    p.add_argument("--plans", type=parse_list,
                   default=parse_list("wfbp,mgwfbp,mergecomp,optimal,syncea"),
                   help="wfbp (= layerwise), mgwfbp, mergecomp, layerfusion, optimal, "
                        "syncea (= modelwise), fixed:<MB> (default: %(default)s)")
    p.add_argument("--compressors", type=parse_list, default=parse_list("none,marsit,topk"),
                   help="as for ringcomp.perfmodel --methods (default: %(default)s)")
    p.add_argument("--out", type=out_path, default="simulate",
                   help="plot path without extension (default: %(default)s)")
    p.add_argument("--record", metavar="PATH", type=out_path, default=None,
                   help="write the table as a record with its provenance (what docs/ renders "
                        "from: python -m ringcomp.report docs)")
    return p


def simulate(args) -> dict:
    """The table's data: the workload, the codec costs used and one row per link x world
    size x plan x compressor."""
    work = workloads.load(args.model, args.batch, args.tflops)
    codecs = codecs_for(args.compressors, args.codec_speedup, args.codec)
    rows = []
    for rate in args.bandwidth:
        net = Network.of(rate, args.latency, args.gamma)
        for p in args.workers:
            for plan in args.plans:
                for method in args.compressors:
                    row = predict(work, method, p, net, codec_of(method, codecs),
                                  ALIASES.get(plan, plan))
                    rows.append({**row, "plan": plan, "compressor": method,
                                 "bandwidth_bps": rate,
                                 "scaling_efficiency": work.compute_s / row["iter_s"]})
    return {"model": work.name, "batch": args.batch, "tflops": args.tflops,
            "latency_s": args.latency, "gamma": args.gamma,
            "codec_speedup": args.codec_speedup,
            # the per-call and per-element costs (already divided by the speed-up) of an
            # encode + decode, then of the decode alone where known
            "codecs": {spec: [codec.a, codec.b, *(codec.decode or ())]
                       for spec, codec in codecs.items()},
            "workers": args.workers, "bandwidths_bps": args.bandwidth, "plans": args.plans,
            "compressors": args.compressors, "rows": rows}


def plot(records: list[dict], out: str) -> list[str]:
    plt = pyplot()
    rates = sorted({r["bandwidth_bps"] for r in records})
    plans = list(dict.fromkeys(r["plan"] for r in records))
    compressors = list(dict.fromkeys(r["compressor"] for r in records))
    colours = plt.get_cmap("tab10").colors  # colour = compressor, line and marker = plan
    lines, markers = ("-", "--", "-.", ":", (0, (1, 4)), (0, (5, 1))), "osD^vP*X"
    fig, axes = plt.subplots(1, len(rates), figsize=(6.5 * len(rates), 4.8), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        for (i, plan), (j, compressor) in itertools.product(enumerate(plans),
                                                             enumerate(compressors)):
            pts = [(r["workers"], r["scaling_efficiency"]) for r in records
                   if (r["plan"], r["compressor"], r["bandwidth_bps"]) == (plan, compressor,
                                                                             rate)]
            ax.semilogx([w for w, _ in pts], [100 * e for _, e in pts], base=2,
                        color=colours[j % len(colours)], linestyle=lines[i % len(lines)],
                        marker=markers[i % len(markers)], markersize=4,
                        label=f"{plan} + {compressor}")
        ax.set(xlabel="workers", ylabel="scaling efficiency (%)", ylim=(0, 105),
               title=format_rate(rate))
        ax.grid(alpha=0.3)
        legend_beside(ax, fontsize=6)
    return save_figure(fig, out)


def main(argv=None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    before = record.machine_load() if args.record else None  # codecs are timed here
    try:  # unknown networks, compressors, plans: one line, not a traceback
        for plan in args.plans:
            check_spec(ALIASES.get(plan, plan))
        result = simulate(args)
    except (ValueError, OSError) as err:
        cli.error(str(err))
    print(f"# ringcomp.simulate: {format_table(result)[2:]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result["rows"], f, indent=1)
        log.info(f"wrote {args.json}")
    if args.record:
        prov = record.provenance(["python", "-m", "ringcomp.simulate",
                                  *(sys.argv[1:] if argv is None else argv)], "", before)
        record.write(args.record, "simulate", prov, result)
        log.info(f"wrote {args.record}")
    for path in plot(result["rows"], args.out):
        log.info(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
