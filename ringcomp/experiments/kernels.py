"""``python -m ringcomp.experiments kernels``: the compression kernels' throughput as a record.

With ``--device gpu`` the CUDA kernels on CuPy arrays against a device-to-device copy timed
alike (CUDA events, best of 20), each row beside the target issue 31 sets for it, and each
on a ring hop's 1 MiB segment in microseconds per call, launches included; on the host
every backend against single-core memcpy (``bench --kernels``' table). One process,
no mpiexec. The GPU rows are what docs/gpu.md renders (``jobs/gpu-records.sh`` runs this).
"""

from __future__ import annotations

import logging

from ringcomp.cli import out_path, parse_size
from ringcomp.devices.placement import gpu_unavailable
from ringcomp.kernelbench import HOP_CALLS, HOP_ELEMENTS, format_rows, hop_rows, kernel_rows
from ringcomp.log import Heartbeat
from ringcomp.results.blocks import renderer
from ringcomp.results.record import machine_load, provenance, write

log = logging.getLogger(__name__)

#: the targets on the device, in GB/s of input over a device copy's (issue 31's, with
#: issue 55's sign join): the 1-bit path's kernels near a copy, every other kernel a quarter
TARGETS = {"sign pack": 0.70, "sign unpack": 0.70, "marsit merge 1/3": 0.70,
           "sign scale": 0.70, "sign join": 0.70}
OTHER_TARGET = 0.25


#: issue 31's target for a ring hop's codec on a 1 MiB segment, microseconds per call
HOP_TARGETS = {"marsit merge 1/3": 100.0, "marsit join 1/3": 100.0}


def main(args) -> int:
    before = machine_load() if args.out else None
    rows = kernel_rows(args.elements, device=args.device,
                       progress=Heartbeat(log, "kernels: rows measured"))
    print(format_rows(rows))
    data = {"device": args.device, "elements": args.elements, "rows": rows}
    if args.device == "gpu":  # where launching, not bytes, can set a hop's cost
        data.update(hop_elements=HOP_ELEMENTS, hop_calls=HOP_CALLS, hop_rows=hop_rows())
        print(f"\nper call at {HOP_ELEMENTS} elements, host time included (us):")
        print("\n".join(f"{r['kernel']:<18}{r['backend']:<9}{r['us']:>10.1f}"
                        + (f"{r['us_dispatcher']:>10.1f} through the dispatcher"
                           if "us_dispatcher" in r else "") for r in data["hop_rows"]))
    if args.out:
        prov = provenance(args.command_line, "", before, device=args.device)
        write(f"{args.out}.json", "kernels", prov, data)
        log.info(f"wrote {args.out}.json")
    return 0


@renderer("kernels")
def render(record: dict) -> str:
    """One row per kernel: GB/s of float32 input and its ratio to the copy; on the device
    with the target and whether it is met."""
    gpu = record["device"] == "gpu"
    head = (f"{record['elements']:,} float32 elements; GB/s of input, "
            + ("vs a device-to-device copy timed alike (CUDA events, best of 20)" if gpu
               else "per core over single-core memcpy (best of 5)") + ":\n\n")
    lines = ["| kernel | backend | threads | GB/s | vs copy |" + (" target | met |" if gpu
                                                                 else ""),
             "|---|---|---:|---:|---:|" + ("---:|---|" if gpu else "")]
    for r in record["rows"]:
        line = (f"| {r['kernel']} | {r['backend']} | {r['threads'] or '-'} | "
                f"{_gbps(r['GBps'])} | {r['vs_copy']:.2f} |")
        if gpu:
            target = (None if r["kernel"] == "device copy"
                      else TARGETS.get(r["kernel"], OTHER_TARGET))
            line += (" - | - |" if target is None else
                     f" {target:.2f} | {'yes' if r['vs_copy'] >= target else '**no**'} |")
        lines.append(line)
    return head + "\n".join(lines) + "\n" + _render_hops(record)


def _render_hops(record: dict) -> str:
    """The GPU record's second table: each kernel on a ring hop's segment, microseconds per
    call with the host's launching included, beside issue 31's hop target."""
    if not record.get("hop_rows"):
        return ""
    n = record["hop_elements"]
    both = any("us_dispatcher" in r for r in record["hop_rows"])
    lines = [f"\nThe same on a ring hop's segment, {n:,} float32 elements ({4 * n / 2**20:g} "
             f"MiB): microseconds per call, {record['hop_calls']} calls back to back, the "
             f"host's launching and allocations included" + (
                 "; as ringcomp launches, and with every launch through Numba's dispatcher "
                 "(`RINGCOMP_DIRECT_LAUNCH=0`) in the same run" if both else "") + ":\n",
             "| kernel | backend | us per call |" + (" through the dispatcher |" if both
                                                    else "") + " target | met |",
             "|---|---|---:|" + ("---:|" if both else "") + "---:|---|"]
    for r in record["hop_rows"]:
        target = HOP_TARGETS.get(r["kernel"])
        dispatcher = r.get("us_dispatcher")
        lines.append(f"| {r['kernel']} | {r['backend']} | {r['us']:.1f} | " + (
            ("-" if dispatcher is None else f"{dispatcher:.1f}") + " | " if both else "") + (
            "- | - |" if target is None else
            f"{target:.0f} | {'yes' if r['us'] <= target else '**no**'} |"))
    return "\n".join(lines) + "\n"


def _gbps(value: float) -> str:
    """Three significant digits, never in exponent form (1380, 28.9, 0.0412)."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("kernels", help="the compression kernels' throughput as a record "
                                       "(--device gpu: against a device copy; one process)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="host backends against memcpy, or the CUDA kernels against a "
                        "device copy (default: cpu)")
    p.add_argument("--elements", type=parse_size, default=1 << 24,
                   help="float32 elements per kernel call (default: 16M; the GPU figures: "
                        "64M)")
    p.add_argument("--out", type=out_path, default=None,
                   help="write OUT.json, a record (default: print only)")
    p.set_defaults(run=main, mpi=False, check=check_args)


def check_args(args, parser) -> None:
    if args.elements < 1:
        parser.error(f"--elements must be at least 1, got {args.elements}")
    if args.device == "gpu" and (why := gpu_unavailable()):
        parser.error(f"--device gpu: {why}")
