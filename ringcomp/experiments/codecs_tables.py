"""The codecs study's tables, rendered into the docs from its record (and printed by the
study): the rings at each size against the raw ring and the memory-copy bound, the
split of a call, the testbed's rows."""

from __future__ import annotations

import numpy as np

from ringcomp.cli import human_bytes
from ringcomp.results.blocks import renderer


def _raw(row: dict) -> str:
    """'0.030 | 4.3 (3.1-6.0)', or '- | -' for records measured before the raw column."""
    if "raw_s" not in row:
        return "- | -"
    return (f"{row['raw_s'] * 1e3:.3f} | {row['raw_median']:.2f} ({row['raw_min']:.2f}-"
            f"{row['raw_max']:.2f})")


def _ratio(row: dict) -> str:
    return f"{row['median']:.2f} ({row['min']:.2f}-{row['max']:.2f})"


@renderer("codecs")
def render(record: dict) -> str:
    """The record's three tables as markdown."""
    p = record["ranks"]
    lines = ["Kernels on one host thread (GB/s of the float32 input) against single-core "
             "memcpy; Numba's also on every thread:", "",
             "| kernel | backend | threads | GB/s | per core / memcpy |", "|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['backend']} | {r['threads']} | {r['GBps']:.2f} | "
              f"{r['vs_copy']:.2f} |" for r in record["kernels"]]
    lines += ["", f"Compressed rings against the exact ring, {p} ranks on one node (shared "
              "memory): time over the exact ring's, repetition by repetition, median (min-max); "
              "the bound is every rank reading its input and writing its output once at "
              "memcpy speed, its ranks sharing the node's cores:", "",
              "| size | compressor | time ms | exact ring ms | ratio to exact ring | "
              "bound ms | of bound | reps |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {human_bytes(r['size_bytes'])} | {r['compressor']} | {r['time_s'] * 1e3:.2f} "
              f"| {r['base_s'] * 1e3:.2f} | {_ratio(r)} | {r['bound_s'] * 1e3:.2f} | "
              f"{r['of_bound']:.2f} | {r['reps']} |" for r in record["rings"]]
    lines += ["", f"The exact `auto` against MPI's own Allreduce, {p} ranks, paired the same "
              "way: through ringcomp (`algorithm=\"mpi\"`: the same argument agreement and "
              "checks) and called straight through mpi4py (`comm.Allreduce`: what ringcomp's "
              "per-call path adds); `auto` ran what it had settled on for that size:", "",
              "| size | auto ran | auto ms | MPI via ringcomp ms | ratio | raw MPI ms | "
              "ratio to raw | reps |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {human_bytes(r['size_bytes'])} | {r.get('chosen') or '-'} | "
              f"{r['time_s'] * 1e3:.3f} | {r['base_s'] * 1e3:.3f} | {_ratio(r)} | "
              f"{_raw(r)} | {r['reps']} |" for r in record["auto"]]
    if "split" in record:  # records before the time split, start-up and testbed lack them
        lines += _later_lines(record)
    return "\n".join(lines)


def _later_lines(record: dict) -> list[str]:
    """The time split, the start-up and the testbed table."""
    lines = []
    lines += ["", "Where a call's time goes (trace of every call on every rank, mean per call; "
              "codec: encode, merge and decode; waits: blocked in MPI; rest: the Python path "
              "around them and MPI progress outside waits; tracing itself adds to the rest):",
              "", "| ranks | method | size | call ms | codec ms | waits ms | rest ms | calls |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['p']} | {r['method']} | {human_bytes(r['size_bytes'])} | "
              f"{r['op_s'] * 1e3:.2f} | {r['codec_s'] * 1e3:.2f} | {r['wait_s'] * 1e3:.2f} | "
              f"{r['rest_s'] * 1e3:.2f} | {r['calls']} |" for r in record["split"]]
    start = record["startup_s"]
    lines += ["", f"Start-up: `mpiexec -n {record['startup_ranks']} python -m ringcomp.train "
              f"--steps 1`, launch to exit, {np.median(start):.2f} s (min {min(start):.2f}, "
              f"max {max(start):.2f}, {len(start)} runs)."]
    lines += _testbed_lines(record["testbed"])
    return lines


def _testbed_lines(bed: dict) -> list[str]:
    if "skipped" in bed:
        return ["", f"Emulated cluster: not measured ({bed['skipped']})."]
    rate = bed["rate_bps"]
    lines = ["", f"On the emulated cluster, {bed['hosts']} hosts x 1 rank at "
             f"{rate / 1e9:g} Gbit/s each (`ringcomp.testbed`, TCP between namespaces, all on "
             "this machine's cores): the wire bound is this rank's bytes sent at the line "
             "rate; the exact ring's share of it is its share of the line rate:", "",
             "| size | compressor | time ms | speed-up over exact ring | wire bound ms | "
             "of wire bound |", "|---|---|---|---|---|---|"]
    speed = {r["compressor"]: r for r in bed["paired"]}
    for r in bed["rows"]:
        ratio = speed.get(r["compressor"])
        text = "1" if ratio is None else (f"{1 / ratio['median']:.1f} ({1 / ratio['max']:.1f}-"
                                          f"{1 / ratio['min']:.1f})")
        lines.append(f"| {human_bytes(r['size_bytes'])} | {r['compressor']} | "
                     f"{r['time_s'] * 1e3:.1f} | {text} | {r['wire_bound_s'] * 1e3:.1f} | "
                     f"{r['of_wire_bound']:.2f} |")
    return lines
