"""The simulator's scaling-efficiency table as ``ringcomp.simulate`` prints it; its record
and renderer."""

from __future__ import annotations

from ringcomp.cli import format_rate
from ringcomp.results.blocks import renderer


def rows_of(result: dict, rate: float, plan: str, compressor: str) -> list[float]:
    """Scaling efficiency per world size of one (link, plan, compressor), in the order of
    ``result['workers']``."""
    return [r["scaling_efficiency"] for r in result["rows"]
            if (r["bandwidth_bps"], r["plan"], r["compressor"]) == (rate, plan, compressor)]


def _cost(per_call_and_element) -> str:
    """'0.809 us + 0.0104 ns/element' from (seconds per call, seconds per element)."""
    a, b = per_call_and_element
    return f"{1e6 * a:.3g} us + {1e9 * b:.3g} ns/element"


def header(result: dict) -> str:
    """The workload, the link model and the codec costs every row assumes."""
    codecs = "; ".join(f"{spec}: {_cost(costs[:2])}" + (f", decode alone {_cost(costs[2:])}"
                                                        if costs[2:] else "")
                       for spec, costs in result["codecs"].items())
    return (f"{result['model']}, batch {result['batch']} per worker at {result['tflops']:g} "
            f"TFLOP/s, latency {result['latency_s'] * 1e6:.3g} us; codecs measured here "
            f"/ {result['codec_speedup']:g}" + (f" ({codecs})" if codecs else ""))


def format_table(result: dict) -> str:
    """The table as the command prints it: per link, one line per plan x compressor."""
    lines = [f"# {header(result)}; scaling efficiency (%)"]
    for rate in result["bandwidths_bps"]:
        lines.append(f"# {format_rate(rate)}")
        lines.append(f"{'plan':<12}{'compressor':<14}"
                     + "".join(f"{w:>8}" for w in result["workers"]))
        for plan in result["plans"]:
            for method in result["compressors"]:
                lines.append(f"{plan:<12}{method:<14}" + "".join(
                    f"{100 * e:>8.1f}" for e in rows_of(result, rate, plan, method)))
    return "\n".join(lines)


@renderer("simulate")
def render(record: dict) -> str:
    """One markdown row per link x plan x compressor, efficiency (%) per world size."""
    out = [f"{header(record)}; scaling efficiency (%) by world size:", "",
           "| link | plan | method | " + " | ".join(map(str, record["workers"])) + " |",
           "|---|---|---|" + "---:|" * len(record["workers"])]
    for rate in record["bandwidths_bps"]:
        for plan in record["plans"]:
            for method in record["compressors"]:
                cells = " | ".join(f"{100 * e:.1f}"
                                   for e in rows_of(record, rate, plan, method))
                out.append(f"| {format_rate(rate)} | {plan} | {method} | {cells} |")
    return "\n".join(out) + "\n"
