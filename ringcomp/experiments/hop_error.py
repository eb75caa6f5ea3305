"""The hop study: how much error each aggregation scheme adds per hop, and whether it is biased.

Every rank holds a correlated Gaussian vector (a shared component plus its own noise, like
gradients of one model on different data). Each method runs ``steps`` times with fresh
random keys in shadow mode, which yields two pictures:

1. error versus ranks aggregated (mean over steps): cascading compression compounds, linear
   methods stay flat, Marsit's single draw is as far from the mean of signs as a ±1 vector
   must be;
2. error of the average over T steps against what the method estimates (the exact sum; the
   mean of signs for sign-bit aggregation) versus T: unbiased methods fall like 1/sqrt(T),
   biased ones level off at their bias.
"""

from __future__ import annotations

import logging

import numpy as np

from ringcomp.cli import common_parser, out_path, parse_list
from ringcomp.compression import get_compressor
from ringcomp.log import Heartbeat
from ringcomp.plans.call import allreduce
from ringcomp.plots import legend_beside, method_style, plot_hops, pyplot, save_figure
from ringcomp.results.blocks import renderer
from ringcomp.results.record import machine_load, provenance, write
from ringcomp.trace import Tracer, format_shadow, shadow_table
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)

DEFAULT_METHODS = ["ring+sign", "ring+marsit", "ring+qsgd", "ring+topk", "ring+fp16",
                   "ring+countsketch", "tree+sign", "tree+marsit", "dbtree+marsit",
                   "torus+sign", "torus+marsit", "torus+qsgd", "twostage+sign",
                   "allgather+marsit"]


def inputs(rank: int, n: int, seed: int) -> np.ndarray:
    """Shared component + own noise, both standard normal: signs agree on ~2/3 of pairs."""
    common = np.random.default_rng([seed, 1 << 20]).standard_normal(n)
    return (common + np.random.default_rng([seed, rank]).standard_normal(n)).astype(np.float32)


def estimates_signs(method: str) -> bool:
    """Sign-bit aggregation returns ±1 per element: it estimates the mean of the signs."""
    return get_compressor(method.split("+", 1)[1]).signs_only


def run_method(transport, method: str, x: np.ndarray, targets: dict, steps: int,
               seed: int, progress=lambda label: None) -> tuple[list[dict],
                                                                list[tuple[int, float]]]:
    """Shadow records of this rank and the bias curve [(T, error of the T-step mean)];
    ``progress(label)`` after each step."""
    algorithm, compressor = method.split("+", 1)
    target = targets["signs" if estimates_signs(method) else "sum"]
    tracer = Tracer()
    total, curve, shadow = np.zeros(x.size), [], []
    for step in range(steps):
        out = allreduce(x, algorithm=algorithm, compressor=compressor, seed=seed,
                        step=step, tracer=tracer, shadow=True)
        total += out
        shadow += [r for r in tracer.records if r["type"] == "op"
                   or (r["type"] == "hop" and r["kind"] == "shadow")]
        tracer.records.clear()  # the send/recv/encode records are not needed here
        progress(method)
        t = step + 1
        if t & (t - 1) == 0 or t == steps:
            curve.append((t, float(np.linalg.norm(total / t - target)
                                   / np.linalg.norm(target))))
    return shadow, curve




def format_bias(curves: dict) -> str:
    """The error of the T-step average against the target, one row per method."""
    ts = [t for t, _ in next(iter(curves.values()))]
    lines = [f"{'method':<20}" + "".join(f"{'T=' + str(t):>9}" for t in ts)]
    lines += [f"{method:<20}" + "".join(f"{e:>9.3f}" for _, e in curve)
              for method, curve in curves.items()]
    return "\n".join(lines)


def format_by_contributors(rows: list[dict], p: int) -> str:
    """The error of each method's partial aggregate once it covers 2, 4, 8, ... and all p
    ranks (the mean over hops and steps; "-" where no hop covers that many)."""
    counts = sorted({k for k in (2, 4, 8, 16, 32, 64) if k < p} | {p})
    error = {(r["alg"], r["contributors"]): r["error"] for r in rows}
    methods = list(dict.fromkeys(r["alg"] for r in rows))
    lines = [f"{'method':<20}" + "".join(f"{'k=' + str(k):>9}" for k in counts)]
    for method in methods:
        cells = [error.get((method, k)) for k in counts]
        lines.append(f"{method:<20}" + "".join(f"{'-' if e is None else format(e, '.3f'):>9}"
                                                for e in cells))
    return "\n".join(lines)


@renderer("hops")
def render(record: dict) -> str:
    return (f"p = {record['p']}, {record['elements']} float32 per rank, {record['steps']} "
            "steps per method. Error of the partial aggregate once it covers k ranks (mean "
            "over hops and steps; against the exact sum of those ranks, for Marsit and "
            "majority vote against the mean of their signs):\n\n```text\n"
            f"{format_by_contributors(record['hops'], record['p'])}\n```\n\n"
            "Error of the average over T steps against the target (bias):\n\n```text\n"
            f"{format_bias(record['bias'])}\n```\n")


def plot_bias(curves: dict, out: str) -> list[str]:
    """Error of the T-step average against T, log-log, with the 1/sqrt(T) slope."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.8))
    floor = 0.02  # near-exact methods (fp16) would flatten the picture: pinned below
    for i, (method, curve) in enumerate(curves.items()):
        low = max(e for _, e in curve) < floor
        ax.loglog([t for t, _ in curve], [max(e, floor) for _, e in curve],
                  **method_style(method, i),
                  label=f"{method} (< {floor}, at the floor)" if low else method)
    first = max(e for curve in curves.values() for _, e in curve[:1])
    ts = sorted({t for curve in curves.values() for t, _ in curve})
    ax.loglog(ts, [first / np.sqrt(t) for t in ts], "k", lw=0.8, alpha=0.5,
              label="1/sqrt(T)")
    ax.set_xlabel("steps averaged (T)")
    ax.set_ylabel("rel. L2 error of the average vs target")
    ax.set_title("bias: target = exact sum (mean of signs for sign bits)")
    ax.grid(alpha=0.3, which="both")
    legend_beside(ax, fontsize=7)
    return save_figure(fig, out)


def main(args) -> int:
    transport = get_transport()
    p, rank = transport.size, transport.rank
    before = machine_load() if rank == 0 else None
    x = inputs(rank, args.elements, args.seed)
    targets = {"sum": allreduce(x.astype(np.float64), algorithm="mpi"),
               "signs": allreduce(np.where(x >= 0, 1.0, -1.0), algorithm="mpi") / p}
    shadows, curves = [], {}
    progress = Heartbeat(log, "hops: steps", len(args.methods) * args.steps)
    for method in args.methods:
        mine, curves[method] = run_method(transport, method, x, targets, args.steps,
                                          args.seed, progress)
        shadows += [r for part in transport.allgather_obj(mine) for r in part]
    if rank != 0:
        return 0
    rows = shadow_table(shadows)
    for row in rows:  # Marsit's ±1 output is judged against the mean of signs
        row["error"] = row["rel_err_signs"] if estimates_signs(row["alg"]) else row["rel_err"]
    print(f"# ringcomp.experiments hops: p = {p}, {args.elements} float32 per rank, "
          f"{args.steps} steps per method, seed {args.seed}")
    print("# error of the compressed partial aggregate after each hop (mean over steps)")
    print(format_shadow(rows))
    print("# bias: rel. L2 error of the T-step average against the target")
    print(format_bias(curves))
    written = plot_hops({f"p = {p}": rows}, f"{args.out}-per-hop", "error")
    written += plot_bias(curves, f"{args.out}-bias")
    prov = provenance(["mpiexec", "-n", str(p), *args.command_line],
                      mpi_facts()["mpi_library"], before, args.digests, ranks=p,
                      placement="one node")
    write(f"{args.out}.json", "hops", prov, {
        "p": p, "elements": args.elements, "steps": args.steps, "seed": args.seed,
        "hops": rows, "bias": curves})
    for path in written + [f"{args.out}.json"]:
        log.info(f"wrote {path}")
    return 0


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("hops", parents=[common_parser()],
                       help="error per hop and bias over steps of every aggregation scheme")
    p.add_argument("--methods", type=parse_list, default=DEFAULT_METHODS,
                   help="algorithm+compressor pairs (default: %(default)s)")
    p.add_argument("--elements", type=int, default=1 << 15,
                   help="vector length per rank (default: %(default)s)")
    p.add_argument("--steps", type=int, default=64,
                   help="repetitions with fresh random keys, averaged (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=out_path, default="hops",
                   help="output path prefix (default: %(default)s)")
    p.set_defaults(run=main, mpi=True, digest_parts=lambda args: [
        f"hops:{method}" for method in args.methods])
