"""The ResNet-50 study's options, table and record renderer, without importing torch (the
study itself, ``resnet50_run``, is imported only when it runs: ``--help`` stays fast).

``python -m ringcomp.experiments resnet50`` (under mpiexec; ``--device gpu`` on a GPU
machine): ResNet-50 (25.6M parameters, ``torch:resnet50``) on synthetic ImageNet-shaped
images (``--dataset images``), trained by ``ringcomp.train``'s own job for a few steps with
each method, and by PyTorch's DDP beside them. Per method, the slowest rank's median step
split into compute (forward and backward), exposed communication (waiting for the last
buckets after backward) and update; then, from a shorter traced run of the same method,
what the communication thread spent in the codec (encode, merge, decode) and in staging
copies through host memory, per step.
"""

from __future__ import annotations

import importlib.util
import math

from ringcomp.api import algorithm_options
from ringcomp.cli import common_parser, out_path, parse_list
from ringcomp.results.blocks import renderer

#: ringcomp's methods: name -> ``ringcomp.train`` options
METHODS = {
    "exact": [],
    "marsit": ["--compressor", "marsit"],
    "sign+ef": ["--compressor", "sign", "--error-feedback"],
    "topk+ef": ["--compressor", "topk:ratio=0.01", "--error-feedback"],
    "powersgd": ["--compressor", "powersgd", "--error-feedback"],
}
#: PyTorch's DDP, beside them: NCCL where every rank has a GPU of its own, else gloo
DDP = "ddp"
#: PyTorch DDP's default bucket_cap_mb; the study gives ringcomp the same buckets
DDP_BUCKET_MB = 25.0
#: the buckets of records made before the study had --bucket-mb: the trainer's default
#: for ringcomp, PyTorch's for DDP
OLD_BUCKETS = "ringcomp 1 MB, DDP 25 MB"


def _algorithm(argv: list) -> str:
    """The algorithm a method's training options name (the trainer's default: ring)."""
    return argv[argv.index("--algorithm") + 1] if "--algorithm" in argv else "ring"


def _buckets(result: dict) -> str:
    """The fusion buckets (and segments, where set) the runs used, as the table names them."""
    mb, segment = result.get("bucket_mb"), result.get("segment_bytes")
    return ((OLD_BUCKETS if mb is None else f"{mb:g} MB")
            + (f", segments {segment / 2**20:g} MiB" if segment else ""))


def format_table(result: dict) -> str:
    """One row per method: ms per step (median, the slowest rank's) and its parts."""
    side = result["side"]
    lines = [f"# ResNet-50 ({result['parameters'] / 1e6:.1f}M parameters) on 3x{side}x{side} "
             f"synthetic images, {result['ranks']} ranks on the {result['device'].upper()}, batch "
             f"{result['batch_size']}/rank; ms per step, the slowest rank's median over "
             f"{result['steps']} steps after {result['warmup']}; buckets "
             f"{_buckets(result)}",
             f"{'method':<10}{'step':>8}{'[min-max]':>17}{'compute':>9}{'exposed':>9}"
             f"{'update':>8}{'comm':>8}{'codec':>8}{'staging':>9}{'MB sent':>9}"
             f"{'calls':>7}{'x ddp':>7}"]
    ddp = next((r for r in result["rows"] if r["method"] == DDP), None)
    for r in result["rows"]:
        spread = f"[{r['step_min_ms']:.0f}-{r['step_max_ms']:.0f}]"
        parts = [f"{r[k]:>9.1f}" if r.get(k) is not None else f"{'-':>9}"
                 for k in ("compute_ms", "exposed_ms")]
        parts += [f"{r[k]:>8.1f}" if r.get(k) is not None else f"{'-':>8}"
                  for k in ("update_ms", "comm_ms", "codec_ms")]
        staging = f"{r['staging_ms']:>9.1f}" if r.get("staging_ms") is not None else f"{'-':>9}"
        # all-reduces a step (the traced timeline's), and the step over DDP's (medians)
        calls = len(r["timeline"]["ops"]) if r.get("timeline") else None
        vs_ddp = r["step_ms"] / ddp["step_ms"] if ddp is not None else None
        lines.append(f"{r['method']:<10}{r['step_ms']:>8.1f}{spread:>17}{''.join(parts)}"
                     f"{staging}{r['wire_bytes'] / 1e6:>9.2f}"
                     f"{calls if calls is not None else '-':>7}"
                     f"{f'{vs_ddp:.2f}' if vs_ddp is not None else '-':>7}")
    lines.append("# compute: forward + backward; exposed: waiting for the all-reduces after "
                 "backward; comm: the communication thread's busy time (overlaps compute); "
                 f"codec, staging: its encode/merge/decode and host copies, from "
                 f"{result['trace_steps']} traced steps; calls: all-reduces a step; x ddp: "
                 "the step over DDP's")
    timed = [r for r in result["rows"] if r.get("timeline")]
    if timed:
        lines.append("# when the all-reduces ran (rank 0's last traced step, ms from its "
                     "start): forward + backward, then each all-reduce as MB start-end")
    for r in timed:
        line = r["timeline"]
        ops = [f"{b / 1e6:.1f} {t0:.0f}-{t1:.0f}" for b, t0, t1 in line["ops"]]
        rows = [" | ".join(ops[i:i + 6]) for i in range(0, len(ops), 6)] or ["none"]
        lines.append(f"#   {r['method']:<9} 0-{line['compute_ms']:.0f}; {rows[0]}")
        lines += [f"#   {'':<9} {row}" for row in rows[1:]]
    if ddp is not None:
        lines.append(f"# {DDP}: torch DDP, {ddp['backend']} backend ({ddp['why']}); its "
                     f"all-reduce runs inside backward, so its step is not split")
    return "\n".join(lines)


@renderer("resnet50")
def render(record: dict) -> str:
    return f"```text\n{format_table(record)}\n```\n"


def check_args(args, parser) -> None:
    """Refuse what would fail mid-study (parser.error, alike on every rank)."""
    unknown = [m for m in args.methods if m not in (*METHODS, DDP)]
    if unknown:
        parser.error(f"unknown --methods {unknown}; known: {', '.join((*METHODS, DDP))}")
    if args.trace:
        parser.error("--trace: the study traces its own runs (the codec and staging columns)")
    if args.side < 32:
        parser.error(f"--side must be >= 32 (ResNet-50 halves it five times), got {args.side}")
    if args.warmup < 0 or args.steps < 1 or args.trace_steps < 1:
        parser.error("--warmup must be >= 0, --steps and --trace-steps >= 1")
    if not (math.isfinite(args.bucket_mb) and args.bucket_mb > 0):
        parser.error(f"--bucket-mb must be > 0, got {args.bucket_mb:g}")
    if args.segment_bytes < 0 or 0 < args.segment_bytes < 4:
        parser.error(f"--segment-bytes must be 0 (the algorithm's own) or >= 4, got "
                     f"{args.segment_bytes}")
    unsegmented = [m for m in args.methods if m in METHODS and "segment_bytes" not in
                   algorithm_options(_algorithm(METHODS[m]))]
    if args.segment_bytes and unsegmented:
        parser.error(f"--segment-bytes: the algorithms of {unsegmented} have no segments")
    if args.batch_size < 1 or args.samples < 1:
        parser.error("--batch-size and --samples must be >= 1")


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``; none without torch
    (the [torch] extra): the study is not offered."""
    if importlib.util.find_spec("torch") is None:
        return
    p = sub.add_parser("resnet50", parents=[common_parser()],
                       help="ResNet-50 on ImageNet-shaped data: step time split per method")
    p.add_argument("--device", choices=("cpu", "gpu"), default="gpu",
                   help="where each rank trains (default: gpu)")
    p.add_argument("--side", type=int, default=224, help="image side (default: 224)")
    p.add_argument("--samples", type=int, default=320,
                   help="images drawn, a fifth of them held out (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank (default: 32)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default: 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed first steps (default: 2)")
    p.add_argument("--trace-steps", type=int, default=3,
                   help="steps of the traced run after one untimed (default: 3)")
    p.add_argument("--bucket-mb", type=float, default=DDP_BUCKET_MB,
                   help="fusion bucket size in MB for ringcomp's methods (a bucket closes "
                        "once it holds this much) and DDP's bucket_cap_mb (each bucket under "
                        "it) alike (default: %(default)g, DDP's own)")
    p.add_argument("--segment-bytes", type=int, default=0,
                   help="the ring's pipelining segment for ringcomp's methods (DDP has "
                        "none; default 0: the algorithm's own, 1 MiB)")
    p.add_argument("--methods", type=parse_list, default=[*METHODS, DDP],
                   help=f"of {', '.join((*METHODS, DDP))} (default: all)")
    p.add_argument("--out", type=out_path, default="resnet50", help="output path prefix")
    p.set_defaults(run="ringcomp.experiments.resnet50_run", mpi=True, check=check_args)
