"""The training job's options: command line, TOML file, validation and cross-rank agreement."""

from __future__ import annotations

import argparse
import hashlib
import json

import tomllib

from ringcomp.cli import common_parser

# name: (default, type, help). A TOML file given with --config sets defaults by these names
# (dashes or underscores); the command line overrides it.
OPTIONS = {
    "model": ("mlp", str, "mlp, mlp:256x128 (hidden widths), logreg, cnn, cnn:8x16, "
                          "replay:resnet50, replay:vgg16, replay:bert-base"),
    "dataset": ("digits", str, "digits (scikit-learn's 8x8 images) or synthetic"),
    "samples": (8192, int, "synthetic: number of samples"),
    "features": (64, int, "synthetic: features per sample"),
    "replay_tflops": (10.0, float, "replay models: emulated compute speed; a layer's "
                                   "backward sleeps 2 x its forward FLOPs x batch / this "
                                   "(0 = no compute)"),
    "replay_scale": (1.0, float, "replay models: keep this fraction of every tensor "
                                 "(and of the compute) to fit many ranks in memory"),
    "algorithm": ("ring", str, "all-reduce algorithm (ringcomp.algorithms())"),
    "compressor": ("none", str, "compressor name or spec, e.g. marsit, topk:ratio=0.01"),
    "error_feedback": (False, bool, "keep each rank's compression residual per bucket"),
    "optimizer": ("auto", str, "sgd, adam, marsit; auto = marsit with the marsit "
                               "compressor, else sgd"),
    "lr": (0.1, float, "learning rate (Marsit: the local step eta_l)"),
    "global_lr": (None, float, "Marsit's global step eta_s (default: lr / 10)"),
    "marsit_k": (0, int, "Marsit-K: a full-precision round every K steps (0 = never)"),
    "momentum": (0.9, float, "SGD momentum"),
    "weight_decay": (0.0, float, "L2 weight decay"),
    "epochs": (10, int, "epochs over the training set"),
    "steps": (0, int, "stop after this many steps (0 = run all epochs)"),
    "batch_size": (8, int, "samples per rank per step (global batch = ranks x this)"),
    "seed": (0, int, "seed of data order, initialisation and compression"),
    "bucket_mb": ("1", str, "fusion bucket size in MB; 0 = one bucket per tensor, "
                            "all = one bucket for the whole model"),
    "plan": (None, str, "fusion plan from a profile (overrides --bucket-mb): layerwise, "
                        "modelwise, fixed:<MB>, mgwfbp, layerfusion, optimal"),
    "profile": (None, str, "with --plan: profile JSON to read, or to write when it does not "
                           "exist yet (default: measure, keep in memory)"),
    "profile_steps": (5, int, "with --plan: forward/backward passes timed for the profile"),
    "mergecomp_steps": (5, int, "--plan mergecomp: timed steps per probe of the online "
                                "search"),
    "small_tensor": (1024, int, "tensors with fewer elements travel uncompressed"),
    "warmup_steps": (0, int, "first steps without compression"),
    "segment_bytes": (0, int, "pipelining segment of the collective (0 = its default)"),
    "eval_every": (0, int, "evaluate on the test set every N steps (0 = every epoch)"),
    "metrics": (None, str, "write JSONL records (one per step and a summary) to this path"),
    "shadow": (False, bool, "with --trace: record every hop's error against exact sums"),
    "checkpoint_dir": (None, str, "directory for checkpoints"),
    "checkpoint_every": (0, int, "checkpoint every N steps (0 = only at the end)"),
    "keep": (3, int, "complete checkpoints to keep"),
    "resume": (False, bool, "continue from the newest complete checkpoint"),
    "skip_nonfinite": (False, bool, "skip a step whose loss or gradient is NaN/Inf "
                                    "instead of stopping"),
    "progress": (True, bool, "progress bar on rank 0 (--no-progress to hide)"),
}
# options that may differ between ranks or between a run and its resumption
LOCAL = {"metrics", "progress", "resume", "trace", "timeout", "cuda_aware", "config"}
# options that change the trajectory: a checkpoint must have been written with the same ones
TRAJECTORY = {"model", "dataset", "samples", "features", "replay_scale", "algorithm", "compressor",
              "error_feedback", "optimizer", "lr", "global_lr", "marsit_k", "momentum",
              "weight_decay", "batch_size", "seed", "bucket_mb", "plan", "small_tensor",
              "warmup_steps", "segment_bytes"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ringcomp.train", parents=[common_parser()],
        description="Data-parallel training over ringcomp's all-reduce (run under mpiexec): "
                    "buckets of gradients are all-reduced on a background thread while "
                    "backward continues, with any algorithm x compressor.")
    p.add_argument("--config", metavar="TOML", help="read option defaults from a TOML file")
    for name, (default, kind, text) in OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                           help=text)
        else:
            p.add_argument(flag, type=kind, default=default, help=f"{text} "
                           f"(default: {default})")
    return p


def parse(argv=None) -> argparse.Namespace:
    """Command line over TOML over defaults; unknown TOML keys are an error."""
    p = parser()
    first, _ = p.parse_known_args(argv)
    if first.config:
        with open(first.config, "rb") as f:
            table = {k.replace("-", "_"): v for k, v in tomllib.load(f).items()}
        unknown = sorted(set(table) - set(OPTIONS))
        if unknown:
            p.error(f"{first.config}: unknown options {unknown}")
        p.set_defaults(**table)
    args = p.parse_args(argv)
    if args.global_lr is None:
        args.global_lr = args.lr / 10
    if args.optimizer == "auto":
        args.optimizer = "marsit" if args.compressor.split(":")[0] == "marsit" else "sgd"
    return args


def shared(args) -> dict:
    """The options every rank must agree on."""
    return {k: v for k, v in sorted(vars(args).items()) if k not in LOCAL}


def digest(options: dict) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:16]


def agree(transport, args) -> None:
    """Fail on every rank, naming the options, when ranks got different configurations."""
    mine = shared(args)
    everyone = transport.allgather_obj(mine)
    if all(digest(other) == digest(mine) for other in everyone):
        return
    differing = sorted({k for other in everyone for k in set(other) | set(mine)
                        if other.get(k) != everyone[0].get(k)})
    detail = "; ".join(f"{k}: " + ", ".join(f"rank {r}={other.get(k)!r}"
                                            for r, other in enumerate(everyone))
                       for k in differing[:4])
    raise ValueError(f"ranks got different training options ({', '.join(differing)}): "
                     f"{detail}")
