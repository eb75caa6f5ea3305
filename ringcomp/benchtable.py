"""The all-reduce benchmark's table as `ringcomp.bench` prints it; its record and renderer."""

from __future__ import annotations

import numpy as np

from ringcomp import measured, records
from ringcomp.cli import human_bytes

#: the files a bench record's times depend on (the collectives and the path around them)
CODE = records.code_files("ringcomp/bench.py", "ringcomp/api.py", "ringcomp/agree.py",
                          "ringcomp/checks.py", "ringcomp/comm.py", "ringcomp/alphabeta.py",
                          *measured.CODEC_CODE)


def header(gpu: bool = False, spread: bool = False) -> str:
    return (f"{'size':>9} {'count':>10} {'dtype':>8} {'algorithm':<20} {'compressor':<10} "
            f"{'time_us':>10} {'algbw_GB/s':>10} {'busbw_GB/s':>10} {'wire_B/rank':>12} "
            f"{'vs_mpi':>7} {'#wrong':>7} {'rel_err':>8}"
            + (f" {'=cpu':>5}" if gpu else "")
            + (f" {'vs_mpi min-max':>15}" if spread else ""))


def paired_ratios(row: dict, mpi_row: dict) -> np.ndarray:
    """This row's time over MPI's, repetition by repetition (they ran back to back)."""
    return np.asarray(row["times_s"]) / np.asarray(mpi_row["times_s"])


def format_row(row: dict, spread: tuple[float, float] | None = None) -> str:
    name = row["algorithm"]
    if name == "auto":
        name = f"auto({row['chosen']})"
    wire = "-" if row["wire_bytes"] is None else f"{row['wire_bytes']:.0f}"
    vs = "-" if row["vs_mpi"] is None else f"{row['vs_mpi']:.2f}"
    wrong = "-" if row["wrong"] is None else str(row["wrong"])
    return (f"{human_bytes(row['size_bytes']):>9} {row['count']:>10} {row['dtype']:>8} "
            f"{name:<20} {row['compressor']:<10} {row['time_s'] * 1e6:>10.1f} "
            f"{row['algbw_GBps']:>10.3f} {row['busbw_GBps']:>10.3f} {wire:>12} {vs:>7} "
            f"{wrong:>7} {row['rel_err']:>8.2g}"
            + ("" if row.get("cpu_equal") is None else
               f" {'yes' if row['cpu_equal'] else 'no':>5}")
            + ("" if spread is None else f" {f'{spread[0]:.2f}-{spread[1]:.2f}':>15}"))


def record_data(rows: list[dict], ranks: int, summary: str | None) -> dict:
    """What a bench record keeps: every row with its repetitions' times (for the paired
    ratios), and the hop summary when the run was traced."""
    kept = [{**row, "times_s": [float(f"{t:.4g}") for t in row["times_s"]]} for row in rows]
    return {"ranks": ranks, "rows": kept, "hop_summary": summary}


@records.renderer("bench", code=lambda record: measured.only(
    CODE, [row["compressor"] for row in record["rows"]]))
def render(record: dict) -> str:
    """The table as the bench prints it, plus the range of the paired ratios to MPI's own
    ``Allreduce`` (every repetition's time over MPI's in the same repetition)."""
    rows = record["rows"]
    gpu = any(r.get("cpu_equal") is not None for r in rows)
    mpi = {(r["size_bytes"], r["dtype"]): r for r in rows if r["algorithm"] == "mpi"}
    reps = min(len(r["times_s"]) for r in rows)
    lines = [f"# {record['ranks']} ranks, at least {reps} repetitions per row (the median "
             "shown; vs_mpi min-max: the extremes of the paired ratios)",
             header(gpu, spread=True)]
    for row in rows:
        ref = mpi.get((row["size_bytes"], row["dtype"]))
        spread = None
        if ref is not None and row is not ref:
            ratios = paired_ratios(row, ref)
            spread = (float(ratios.min()), float(ratios.max()))
        lines.append(format_row(row, spread) if spread else
                     format_row(row) + f" {'-':>15}")
    text = "```text\n" + "\n".join(lines) + "\n```\n"
    if record.get("hop_summary"):
        text += ("\nRank 0's hops (`time`: post to completion, summed over hops; `wait`: the "
                 "part blocked in `Wait`):\n\n```text\n" + record["hop_summary"] + "\n```\n")
    return text
