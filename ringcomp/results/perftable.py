"""The performance model's table as ``ringcomp.perfmodel`` prints it; its record and renderer."""

from __future__ import annotations

from ringcomp.cli import format_rate
from ringcomp.results.blocks import renderer


def format_table(result: dict) -> str:
    """The header line and one row per method (iteration time, its parts, the speed-up
    over the exact ring and the bandwidth below which the method pays off)."""
    lines = [f"# {result['model']}, {result['tensors']} tensors, {result['mb']:.1f} MB, "
             f"compute {result['compute_ms']:.1f} ms/iter; {result['workers']} workers, "
             f"{format_rate(result['bandwidth_bps'])}, latency "
             f"{result['latency_s'] * 1e6:.3g} us, plan {result['plan']}, codec speedup "
             f"{result['codec_speedup']}",
             f"{'method':<16}{'alg':<10}{'buckets':>8}{'iter ms':>10}{'no-ovl ms':>11}"
             f"{'exposed ms':>11}{'wire MB':>9}{'speedup':>9}  {'pays off':<9}"
             f"{'below (break-even)':<20}"]
    for r in result["rows"]:
        pays = "-" if r["method"] == "none" else ("yes" if r["speedup"] > 1 else "no")
        below = "-" if r["method"] == "none" else format_rate(r["break_even_bps"])
        lines.append(f"{r['method']:<16}{r['algorithm']:<10}{r['buckets']:>8}"
                     f"{r['iter_s'] * 1e3:>10.2f}{r['no_overlap_s'] * 1e3:>11.2f}"
                     f"{r['exposed_comm_s'] * 1e3:>11.2f}{r['wire_MB']:>9.2f}"
                     f"{r['speedup']:>8.2f}x  {pays:<9}{below:<20}")
    return "\n".join(lines)


@renderer("perfmodel")
def render(record: dict) -> str:
    return f"```text\n{format_table(record)}\n```\n"
