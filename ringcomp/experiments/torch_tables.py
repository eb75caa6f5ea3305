"""The PyTorch study's options, tables and record renderer, without importing torch (the
study itself, ``torch_ddp``, is imported only when it runs: ``--help`` stays fast)."""

from __future__ import annotations

import importlib.util

from ringcomp.cli import common_parser, out_path, parse_list
from ringcomp.results.blocks import renderer

#: name -> how it trains: ``opt`` (DistributedOptimizer options) or ``ddp`` (a hook; None:
#: DDP's own all-reduce; ``ringcomp:<compressor>``: ringcomp's hook with error feedback), on
#: the ``backend`` process group (default: gloo; ``ringcomp``: the torch.distributed backend)
METHODS = {
    "ringcomp": {"opt": {}},
    "ringcomp-mpi": {"opt": {"algorithm": "mpi"}},
    "ddp-gloo": {"ddp": None},
    "ddp-ringcomp": {"ddp": None, "backend": "ringcomp"},
    "ddp-ringcomp+sign": {"ddp": "ringcomp:sign", "backend": "ringcomp"},
    "ddp+ringcomp": {"ddp": "ringcomp"},
    "ddp+fp16": {"ddp": "fp16"},
    "ddp+powersgd": {"ddp": "powersgd"},
    "ringcomp-fp16": {"opt": {"compressor": "fp16"}},
    "ringcomp-powersgd": {"opt": {"compressor": "powersgd", "error_feedback": True}},
    "ringcomp-topk+ef": {"opt": {"compressor": "topk:ratio=0.01", "error_feedback": True}},
    "ringcomp-sign+ef": {"opt": {"compressor": "sign", "error_feedback": True}},
    "ringcomp-qsgd": {"opt": {"compressor": "qsgd"}},
    "ringcomp-marsit": {"opt": {"compressor": "marsit"}, "marsit": True},
}


def format_tables(result: dict) -> str:
    """Step time of every speed method against DDP's gloo all-reduce, then the accuracy
    table, as the study prints them."""
    speed = result["speed"]
    base = next((r["step_ms"] for r in speed if r["method"] == "ddp-gloo"), None)
    lines = [f"# step time, {result['speed_model']} ({result['parameters'] / 1e6:.2f}M "
             f"parameters), {result['ranks']} ranks, batch {result['batch_size']}/rank, "
             f"{result['threads']} threads/rank",
             f"{'method':<20}{'ms/step':>9}{'[min-max]':>17}{'vs ddp-gloo':>13}{'MB/step':>9}"]
    for r in speed:
        ratio = f"{r['step_ms'] / base:.2f}x" if base else "-"
        spread = (f"[{r['step_min_ms']:.2f}-{r['step_max_ms']:.2f}]" if "step_min_ms" in r
                  else "-")
        lines.append(f"{r['method']:<20}{r['step_ms']:>9.2f}{spread:>17}{ratio:>13}"
                     f"{r['wire_bytes'] / 1e6:>9.3f}")
    timed = {r.get("timed_steps") for r in speed}
    if len(timed) == 1 and None not in timed:
        lines.append(f"# ms/step: median over {timed.pop()} timed steps (the slowest rank's)")
    lines += [f"# {result['model']} on digits, {result['steps']} steps, lr {result['lr']}, "
              f"seed {result['seed']}",
              f"{'method':<20}{'test acc':>9}{'KB/step':>9}{'ms/step':>9}"]
    for r in result["table"]:
        lines.append(f"{r['method']:<20}{r['test_acc']:>9.3f}{r['wire_bytes'] / 1e3:>9.1f}"
                     f"{r['step_ms']:>9.2f}")
    return "\n".join(lines)


@renderer("torch-ddp")
def render(record: dict) -> str:
    return f"```text\n{format_tables(record)}\n```\n"


def check_args(args, parser) -> None:
    """Refuse what would fail mid-study (parser.error, alike on every rank)."""
    for flag, methods in (("--methods", args.methods), ("--speed-methods", args.speed_methods)):
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            parser.error(f"unknown {flag} {unknown}; known: {', '.join(METHODS)}")
    if args.warmup < 0 or min(args.steps, args.speed_steps) <= args.warmup:
        parser.error(f"--steps and --speed-steps must exceed --warmup ({args.warmup} >= 0): "
                     f"the median is over the steps after it")
    if args.batch_size < 1 or not args.lr > 0 or not args.bucket_mb > 0:
        parser.error("--batch-size must be >= 1, --lr and --bucket-mb > 0")


def add_parser(sub) -> None:
    """This study's sub-parser of ``python -m ringcomp.experiments``; none without torch
    (the [torch] extra): the study is not offered."""
    if importlib.util.find_spec("torch") is None:
        return
    p = sub.add_parser("torch", parents=[common_parser()],
                       help="ringcomp vs DDP (gloo, fp16 and PowerSGD hooks) on a torch model")
    p.add_argument("--speed-model", default="torch:mlp:1024x1024",
                   help="model for the step-time table (default: %(default)s, 1.2M)")
    p.add_argument("--speed-methods", type=parse_list,
                   default=["ringcomp", "ddp-gloo", "ddp+ringcomp"],
                   help="default: %(default)s")
    p.add_argument("--speed-steps", type=int, default=60, help="default: %(default)s")
    p.add_argument("--model", default="torch:cnn", help="model for the accuracy table")
    p.add_argument("--methods", type=parse_list, default=list(METHODS),
                   help=f"of {', '.join(METHODS)} (default: all)")
    p.add_argument("--steps", type=int, default=300, help="default: %(default)s")
    p.add_argument("--warmup", type=int, default=5, help="untimed first steps")
    p.add_argument("--batch-size", type=int, default=8, help="per rank (default: 8)")
    p.add_argument("--lr", type=float, default=0.02, help="default: %(default)s")
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="fusion buckets of every method (DDP's default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=out_path, default="torch-ddp", help="output path prefix")
    # the study's own module imports torch: named here, imported only when it runs
    p.set_defaults(run="ringcomp.experiments.torch_ddp", mpi=True, check=check_args)
