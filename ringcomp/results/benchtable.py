"""The all-reduce benchmark's table as `ringcomp.bench` prints it; its record and renderer."""

from __future__ import annotations

import numpy as np

from ringcomp.cli import human_bytes
from ringcomp.results.blocks import renderer
from ringcomp.trace import format_split

#: the columns after size, count, type, redop, algorithm and compressor, as nccl-tests
#: groups them: out of place, then in place (time = median of the repetitions, each the
#: slowest rank's), then OSU's min / avg / max of the out-of-place times
_GROUPS = (("out-of-place", 38), ("in-place", 38), ("out-of-place spread", 30))


def header(gpu: bool = False, spread: bool = False) -> str:
    """The two heading lines: the column groups, then the columns."""
    lead = 68 * " "
    groups = lead + "".join(f"{name:^{width}}" for name, width in _GROUPS)
    names = (f"{'size(B)':>9} {'count':>10} {'type':>8} {'redop':>5} {'algorithm':<20} "
             f"{'compressor':<10}"
             + 2 * (f" {'time_us':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7} ")
             + f"{'min_us':>10} {'avg_us':>10} {'max_us':>10} "
             f"{'wire_B/rank':>12} {'vs_mpi':>7} {'rel_err':>8}"
             + (f" {'=cpu':>5}" if gpu else "")
             + (f" {'vs_mpi min-max':>15}" if spread else ""))
    return groups.rstrip() + "\n" + names


def paired_ratios(row: dict, mpi_row: dict) -> np.ndarray:
    """This row's time over MPI's, repetition by repetition (they ran back to back)."""
    return np.asarray(row["times_s"]) / np.asarray(mpi_row["times_s"])


def _count(value) -> str:
    return "-" if value is None else str(value)


def _form(row: dict, prefix: str) -> str:
    """One form's time (us), algbw and busbw (GB/s) and #wrong; ``-`` where a record
    measured before the in-place form has none."""
    t = row.get(prefix + "time_s")
    if t is None:
        return f" {'-':>10} {'-':>8} {'-':>8} {'-':>7} "
    return (f" {t * 1e6:>10.1f} {row[prefix + 'algbw_GBps']:>8.3f} "
            f"{row[prefix + 'busbw_GBps']:>8.3f} {_count(row[prefix + 'wrong']):>7} ")


def format_row(row: dict, spread: tuple[float, float] | None = None) -> str:
    name = row["algorithm"]
    if name == "auto":
        name = f"auto({row['chosen']})"
    wire = "-" if row["wire_bytes"] is None else f"{row['wire_bytes']:.0f}"
    vs = "-" if row["vs_mpi"] is None else f"{row['vs_mpi']:.2f}"
    # the record keeps the repetitions rounded: the spread as measured where it has it
    times = row.get("times_s") or [row["time_s"]]
    spread_us = [row.get(key, default) * 1e6 for key, default in (
        ("time_min_s", min(times)), ("time_avg_s", float(np.mean(times))),
        ("time_max_s", max(times)))]
    # rel_err only where a compressor makes it an error: exact rows differ from MPI's
    # result by summation order alone (#wrong says whether beyond it)
    rel = "-" if row["compressor"] == "none" or row["rel_err"] is None else \
        f"{row['rel_err']:.2g}"
    return (f"{human_bytes(row['size_bytes']):>9} {row['count']:>10} {row['dtype']:>8} "
            f"{row.get('op', 'sum'):>5} {name:<20} {row['compressor']:<10}"
            + _form(row, "") + _form(row, "inplace_")
            + "".join(f"{us:>10.1f} " for us in spread_us)
            + f"{wire:>12} {vs:>7} {rel:>8}"
            + ("" if row.get("cpu_equal") is None else
               f" {'yes' if row['cpu_equal'] else 'no':>5}")
            + ("" if spread is None else f" {f'{spread[0]:.2f}-{spread[1]:.2f}':>15}"))


def average_busbw(rows: list[dict]) -> str:
    """nccl-tests' closing line, per algorithm (one table holds several): the mean
    out-of-place bus bandwidth over the sizes, exact rows."""
    by: dict[str, list[float]] = {}
    for row in rows:
        if row["compressor"] == "none":
            by.setdefault(row["algorithm"], []).append(row["busbw_GBps"])
    return "# Avg bus bandwidth (GB/s, out of place, exact rows): " + ", ".join(
        f"{name} {np.mean(values):.3f}" for name, values in by.items())


def record_data(rows: list[dict], ranks: int, summary: str | None,
                split: list[dict] | None = None,
                slowdown: list[float] | None = None) -> dict:
    """What a bench record keeps: every row with its repetitions' times (for the paired
    ratios), the hop summary when the run was traced, ``--split``'s table, and how much
    the ranks slowed each other's host work (``hostshare.rank_slowdown``)."""
    def rounded(times):
        return [float(f"{t:.4g}") for t in times]

    kept = [{**row, "times_s": rounded(row["times_s"]),
             "inplace_times_s": rounded(row["inplace_times_s"])} for row in rows]
    data = {"ranks": ranks, "rows": kept, "hop_summary": summary}
    if split is not None:
        data["split"] = split
    if slowdown is not None:
        data["rank_slowdown"] = slowdown
    return data


def slowdown_note(ranks: int, slowdown: list[float]) -> str:
    """The table's line on ``hostshare.rank_slowdown``'s ratios: median [min-max]."""
    return (f"# host work (a Python loop) took {float(np.median(slowdown)):.2g}x "
            f"[{min(slowdown):g}-{max(slowdown):g}] as long with all {ranks} ranks running "
            "it at once as on one alone: per-call host costs stretch about as much")


@renderer("bench")
def render(record: dict) -> str:
    """The table as the bench prints it, plus the range of the paired ratios to MPI's own
    ``Allreduce`` (every repetition's time over MPI's in the same repetition)."""
    rows = record["rows"]
    gpu = any(r.get("cpu_equal") is not None for r in rows)
    mpi = {(r["size_bytes"], r["dtype"]): r for r in rows if r["algorithm"] == "mpi"}
    reps = min(len(r["times_s"]) for r in rows)
    lines = [f"# {record['ranks']} ranks, at least {reps} repetitions per row (time: the "
             "median; vs_mpi min-max: the extremes of the paired ratios)",
             header(gpu, spread=True)]
    if record.get("rank_slowdown") is not None:
        lines.insert(1, slowdown_note(record["ranks"], record["rank_slowdown"]))
    for row in rows:
        ref = mpi.get((row["size_bytes"], row["dtype"]))
        spread = None
        if ref is not None and row is not ref:
            ratios = paired_ratios(row, ref)
            spread = (float(ratios.min()), float(ratios.max()))
        lines.append(format_row(row, spread) if spread else
                     format_row(row) + f" {'-':>15}")
    lines.append(average_busbw(rows))
    text = "```text\n" + "\n".join(lines) + "\n```\n"
    if record.get("hop_summary"):
        text += ("\nRank 0's hops (`time`: post to completion, summed over hops; `wait`: the "
                 "part blocked in `Wait`):\n\n```text\n" + record["hop_summary"] + "\n```\n")
    if record.get("split"):
        text += ("\nWhere a call's time goes (`--split`: the median of each part per call, "
                 "over every rank's calls, from a trace of as many calls again; `checks`: "
                 "argument checks and the agreement; `codec`: encode, merge, decode; `wait`: "
                 "blocked on messages; `rest`: the rest of the collective, MPI's own call "
                 "included; the medians of the parts need not add up to the median "
                 "total):\n\n```text\n"
                 + format_split(record["split"]) + "\n```\n")
    return text
