"""The training job's options: command line, TOML file, validation and cross-rank agreement."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import math
import re
import sys
import tomllib
import types
from typing import NamedTuple

from ringcomp import cli
from ringcomp.api import algorithm_options, algorithms
from ringcomp.cli import common_parser
from ringcomp.compression import get_compressor
from ringcomp.devices import placement
from ringcomp.models import parse_model_spec
from ringcomp.sched.networks import NETWORKS
from ringcomp.training import data
from ringcomp.training.skew import parse_partition

# name: (default, type, help). A TOML file given with --config sets defaults by these names
# (dashes or underscores); the command line overrides it.
OPTIONS = {
    "model": ("mlp", str, "mlp, mlp:256x128 (hidden widths), logreg, cnn, cnn:8x16, "
                          "replay:resnet50, replay:vgg16, replay:bert-base; PyTorch models "
                          "torch:mlp, torch:cnn, torch:resnet (torch:resnet:16x32: widths "
                          "per stage), torch:resnet50 (3-channel images: --dataset images)"),
    "dataset": ("digits", str, "digits (scikit-learn's 8x8 images), synthetic, or images "
                               "(synthetic ImageNet-shaped: 3 x side x side, 1000 classes)"),
    "samples": (8192, int, "synthetic, images: number of samples"),
    "features": (64, int, "synthetic: features per sample; images: 3·side² (150528 for "
                          "3x224x224)"),
    "data_seed": (0, int, "seed of the data set itself: the train / validation / test split "
                          "(for synthetic also the teacher and its samples, for images the "
                          "images); fixed, so runs of any --seed, sweeps included, share one "
                          "test set none trains on"),
    "replay_tflops": (10.0, float, "replay models: emulated compute speed; a layer's "
                                   "backward sleeps 2 x its forward FLOPs x batch / this "
                                   "(0 = no compute)"),
    "replay_scale": (1.0, float, "replay models: keep this fraction of every tensor "
                                 "(and of the compute) to fit many ranks in memory"),
    "device": ("cpu", str, "cpu, or gpu: parameters, data, gradients, buckets and optimizer "
                          "state on this rank's GPU (local rank modulo the GPUs seen)"),
    "algorithm": ("ring", str, "all-reduce algorithm (ringcomp.algorithms())"),
    "compressor": ("none", str, "compressor name or spec, e.g. marsit, topk:ratio=0.01"),
    "error_feedback": (False, bool, "keep each rank's compression residual per bucket"),
    "optimizer": ("auto", str, "sgd, adam, marsit; auto = marsit with the marsit "
                               "compressor, else sgd"),
    "lr": (0.1, float, "learning rate (Marsit: the local step eta_l)"),
    "global_lr": (None, float, "Marsit's global step eta_s (default: lr / 10)"),
    "marsit_k": (0, int, "Marsit-K: a full-precision round every K steps (0 = never)"),
    "momentum": (None, float, "momentum of sgd and marsit (Marsit's: each rank's own, "
                              "before the signs; default 0.9)"),
    "weight_decay": (0.0, float, "L2 weight decay (added to the gradient)"),
    "epochs": (10, int, "epochs over the training set"),
    "steps": (0, int, "stop after this many steps (0 = run all epochs)"),
    "batch_size": (8, int, "samples per rank per step (global batch = ranks x this)"),
    "seed": (0, int, "seed of data order, initialisation and compression"),
    "bucket_mb": ("1", str, "fusion bucket size in MB (a bucket closes once it holds "
                            "this much); 0 = one bucket per tensor, all = one bucket for "
                            "the whole model"),
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
    "partition": ("iid", str, "which samples each rank reads: iid, label-skew:<alpha> "
                              "(Dirichlet class shares per rank) or shard:<k> (k label-"
                              "sorted shards per rank)"),
    "eval_on": ("test", str, "test, or validation: train on 80%% of the training set and "
                             "evaluate on the rest, the test set left out (for tuning)"),
    "torus": (None, str, "RxC: the torus algorithm's rows x columns (default: one row per "
                         "node, or the squarest shape on one node)"),
    "eval_every": (0, int, "evaluate on the test set every N steps (0 = every epoch)"),
    "stop_at": (0.0, float, "stop after the first evaluation whose accuracy reaches this "
                            "(time to accuracy; 0 = run every step)"),
    "metrics": (None, str, "write JSONL records (one per step and a summary) to this path"),
    "shadow": (False, bool, "with --trace: record every hop's error against exact sums"),
    "checkpoint_dir": (None, str, "directory for checkpoints"),
    "checkpoint_every": (None, int, "checkpoint every N steps (default: only at the end)"),
    "keep": (3, int, "complete checkpoints to keep"),
    "resume": (False, bool, "continue from the newest intact checkpoint"),
    "overwrite": (False, bool, "start afresh in a --checkpoint-dir that holds another run's "
                               "checkpoints, deleting them (without it such a run is "
                               "refused)"),
    "skip_nonfinite": (False, bool, "skip a step whose loss or gradient is NaN/Inf "
                                    "instead of stopping"),
    "progress": ("auto", str, "progress on rank 0: auto (a bar on a terminal, else a line "
                              "every tenth of the run; off with --quiet), bar (a bar even "
                              "where stderr is not a terminal, as under mpiexec), lines, "
                              "none (= --no-progress)"),
}
#: the values an option takes, shown in --help (``RULES`` refuses others, with its message)
CHOICES = {"dataset": data.DATASETS, "eval_on": ("test", "validation"),
           "device": placement.DEVICES, "optimizer": ("auto", "sgd", "adam", "marsit"),
           "algorithm": tuple(algorithms()),
           "progress": ("auto", "bar", "lines", "none")}
#: the --help sections, in order, and the options each shows (every option in exactly one)
GROUPS = {
    "model and data": ("model", "dataset", "samples", "features", "data_seed", "replay_tflops",
                       "replay_scale", "partition", "eval_on", "device"),
    "optimization": ("optimizer", "lr", "global_lr", "marsit_k", "momentum", "weight_decay"),
    "the run": ("epochs", "steps", "batch_size", "seed", "eval_every", "stop_at",
                "skip_nonfinite"),
    "communication": ("algorithm", "torus", "segment_bytes", "bucket_mb", "plan", "profile",
                      "profile_steps", "mergecomp_steps"),
    "compression": ("compressor", "error_feedback", "small_tensor", "warmup_steps", "shadow"),
    "checkpoints": ("checkpoint_dir", "checkpoint_every", "keep", "resume", "overwrite"),
    "output": ("metrics", "progress"),
}
# options that may differ between ranks or between a run and its resumption
LOCAL = {"metrics", "progress", "trace", "timeout", "cuda_aware", "config"}
# options that change the trajectory: a checkpoint must have been written with the same ones
# (--device is not among them: a run may resume on the other device; ranks must agree on it)
TRAJECTORY = {"model", "dataset", "samples", "features", "data_seed", "replay_scale",
              "algorithm", "compressor", "error_feedback", "optimizer", "lr", "global_lr",
              "marsit_k", "momentum", "weight_decay", "batch_size", "seed", "bucket_mb",
              "plan", "small_tensor", "warmup_steps", "segment_bytes", "torus", "partition",
              "eval_on"}


#: what ``python -m ringcomp.train --help`` says first
TRAIN_DESCRIPTION = ("Data-parallel training over ringcomp's all-reduce (run under mpiexec): "
                     "buckets of gradients are all-reduced on a background thread while "
                     "backward continues, with any algorithm x compressor.")


def parser(prog: str = "python -m ringcomp.train",
           description: str = TRAIN_DESCRIPTION) -> argparse.ArgumentParser:
    """The training options' parser, named for the tool that takes them (``train``, or
    ``profile``, which takes the same options: its --help and --version say its name)."""
    p = cli.Parser(prog=prog, parents=[common_parser()], description=description)
    p.add_argument("--config", metavar="TOML", help="read option defaults from a TOML file")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved options as TOML (what ran first: version, "
                        "commit, command) for --config, and exit")
    for title, names in GROUPS.items():
        group = p.add_argument_group(title)
        for name in names:
            default, kind, text = OPTIONS[name]
            flag = "--" + name.replace("_", "-")
            # the default once: not where the text says it, nor where there is none
            shown = "" if default is None or "default" in text else f" (default: {default})"
            if kind is bool:
                group.add_argument(flag, action=argparse.BooleanOptionalAction,
                                   default=default, help=text + shown)
                continue
            metavar = "{" + ",".join(CHOICES[name]) + "}" if name in CHOICES else None
            if name == "progress":  # --progress alone: auto; --no-progress: none
                group.add_argument(flag, nargs="?", const="auto", default=default,
                                   metavar=metavar, help=text + shown)
                group.add_argument("--no-progress", dest="progress", action="store_const",
                                   const="none", help="no progress display")
                continue
            group.add_argument(flag, type=kind, default=default, metavar=metavar,
                               help=text + shown)
    return p


#: the options every tool shares (``cli.common_parser``) and --config: not the job's own,
#: but carried in its configuration
COMMON = {"trace": None, "timeout": None, "cuda_aware": None, "config": None}

#: One training job's options, resolved and checked once, then frozen: made by ``parse``
#: (command line over TOML over defaults) or ``job`` (Python keywords), which refuse alike.
JobConfig = dataclasses.make_dataclass(
    "JobConfig", [(name, object, dataclasses.field(default=default))
                  for name, default in {**{k: v[0] for k, v in OPTIONS.items()},
                                        **COMMON}.items()],
    frozen=True, namespace={"__doc__": "A training job's options, checked and frozen "
                                       "(``ringcomp.training.config``)."})


class Spelling(NamedTuple):
    """How the caller's users write an option: on the command line or as a keyword."""

    option: object  # name -> "--bucket-mb" / "bucket_mb"
    setting: object  # (name, value) -> "--bucket-mb -1" / "bucket_mb=-1"
    text: object  # a sentence naming options by their flags -> the same, respelled


FLAGS = Spelling(lambda name: "--" + name.replace("_", "-"),
                 lambda name, value: f"--{name.replace('_', '-')} {value}",
                 lambda text: text)
#: ringcomp.torch's keywords; the tracer is an argument there, not an option
KEYWORDS = Spelling(lambda name: name, lambda name, value: f"{name}={value!r}",
                    lambda text: re.sub(r"--([a-z][a-z-]*)", lambda m: {"trace": "tracer"}.get(
                        m.group(1), m.group(1).replace("-", "_")), text))


def parse(argv=None, acting_alone=(), prog: str = "python -m ringcomp.train",
          description: str = TRAIN_DESCRIPTION) -> JobConfig:
    """Command line over TOML over defaults; unknown TOML keys and nonsense values are an
    error (one line naming the option, at parse time, on every rank alike).

    ``acting_alone``: options that act by themselves for the calling tool (``ringcomp.profile``
    writes ``--profile`` without ``--plan``); ``prog``, ``description``: the tool's."""
    p = parser(prog, description)
    first, _ = p.parse_known_args(argv)
    if first.config:
        p.set_defaults(**read_config(p, first.config))
    try:
        values = vars(p.parse_args(argv))
        for name in cli.LOGGING_OPTIONS:  # the tool's, acted on by the parser already
            values.pop(name, None)
        show = values.pop("print_config")
        given = dict(values)
        resolved = _resolved(values, acting_alone, FLAGS)
    except ValueError as exc:
        p.error(str(exc))
    if show:  # before any MPI: it needs no launcher
        print(as_toml(given, resolved, prog, argv))
        raise SystemExit(0)
    return resolved


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # TOML's basic strings escape as JSON does


def as_toml(given: dict, config: JobConfig, prog: str, argv=None) -> str:
    """The job's options as TOML that ``--config`` reads back to the same job, after
    comment lines saying what made it (ringcomp version, commit, command): each option as
    given (command line, file or default), what it resolved to beside it where that
    differs (``auto``, an unset option the job fills in), and an unset one as a comment."""
    from ringcomp.version import __version__, source_commit

    command = " ".join([prog, *(sys.argv[1:] if argv is None else argv)])
    lines = [f"# ringcomp {__version__}, commit {source_commit() or 'unknown'}",
             f"# {command}"]
    for name in OPTIONS:
        value, acting = given[name], getattr(config, name)
        if value is None:
            lines.append(f"# {name} = " + ("(not set)" if acting is None else
                                           f"{_toml_value(acting)} (resolved)"))
        elif str(acting) != str(value):
            lines.append(f"{name} = {_toml_value(value)}  # resolved: {_toml_value(acting)}")
        else:
            lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines)


def job(acting_alone=(), **keywords) -> JobConfig:
    """The job configuration of Python keywords (the options of ``parse``, underscores),
    refused as the command line refuses them: TypeError for an unknown keyword or a value
    of the wrong type, ValueError naming the option otherwise."""
    unknown = sorted(set(keywords) - set(OPTIONS) - set(COMMON))
    if unknown:
        raise TypeError(f"unknown training options {unknown}; known: {sorted(OPTIONS)}")
    values = {**{k: v[0] for k, v in OPTIONS.items()}, **COMMON}
    for name, value in keywords.items():
        kind = OPTIONS[name][1] if name in OPTIONS else object
        if value is not None and kind is not object and (
                not isinstance(value, _TOML_TYPES[kind])
                or (isinstance(value, bool) and kind is not bool)):
            raise TypeError(f"{name}={value!r}: need a {kind.__name__}")
        values[name] = value
    return _resolved(values, acting_alone, KEYWORDS)


def _resolved(values: dict, acting_alone, spelling: Spelling) -> JobConfig:
    """``values`` checked (ValueError, spelled as the caller's users write options),
    what "auto" and None stand for filled in, frozen."""
    if values["optimizer"] == "auto":  # first: which options act depends on it
        values["optimizer"] = "marsit" if returns_signs(values["compressor"]) else "sgd"
    problem = check_values(types.SimpleNamespace(**values), acting_alone, spelling)
    if problem:
        raise ValueError(problem)
    for name, (_, kind, _) in OPTIONS.items():  # a number given for a text option: as
        if kind is str and values[name] is not None:  # the command line would have it
            values[name] = str(values[name])
    if values["global_lr"] is None:
        values["global_lr"] = values["lr"] / 10
    if values["momentum"] is None:  # resolved, so a checkpoint records what acted
        values["momentum"] = 0.9 if values["optimizer"] in ("sgd", "marsit") else 0.0
    return JobConfig(**values)


def returns_signs(spec: str) -> bool:
    """Whether the compressor returns signs only (Marsit), which wants the Marsit optimizer;
    a bad spec is left for the trainer to refuse with its own message."""
    try:
        comp = get_compressor(spec)
    except (ValueError, TypeError):
        return False
    return comp is not None and comp.signs_only


#: the TOML value types each option type accepts (a string option takes a number too)
_TOML_TYPES = {bool: bool, int: int, float: (int, float), str: (str, int, float)}


def read_config(p: argparse.ArgumentParser, path: str) -> dict:
    """The TOML file's options (dashes or underscores), type-checked; p.error names the file."""
    try:
        with open(path, "rb") as f:
            table = {k.replace("-", "_"): v for k, v in tomllib.load(f).items()}
    except OSError as exc:
        p.error(f"--config {path}: {exc.strerror or exc}")
    except tomllib.TOMLDecodeError as exc:
        p.error(f"--config {path}: not valid TOML: {exc}")
    unknown = sorted(set(table) - set(OPTIONS))
    if unknown:
        p.error(f"--config {path}: unknown options {unknown}")
    for name, value in table.items():
        kind = OPTIONS[name][1]
        # TOML's bools are ints to isinstance: only a bool option takes one
        if not isinstance(value, _TOML_TYPES[kind]) or (isinstance(value, bool) and
                                                        kind is not bool):
            p.error(f"--config {path}: {name} = {value!r} is not a {kind.__name__}")
        if kind is str:
            table[name] = str(value)
    return table


#: option -> (rule, what it must be); checked on every value, default or not
RULES = {
    "device": (lambda v: v in placement.DEVICES, " or ".join(placement.DEVICES)),
    "samples": (lambda v: v >= 1, ">= 1"),
    "features": (lambda v: v >= 1, ">= 1"),
    "replay_tflops": (lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"),
    "replay_scale": (lambda v: math.isfinite(v) and 0 < v <= 1, "in (0, 1]"),
    "lr": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
    "global_lr": (lambda v: v is None or (math.isfinite(v) and v > 0), "a finite number > 0"),
    "marsit_k": (lambda v: v >= 0, ">= 0 (0 = never)"),
    "momentum": (lambda v: v is None or (math.isfinite(v) and 0 <= v < 1), "in [0, 1)"),
    "weight_decay": (lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"),
    "epochs": (lambda v: v >= 1, ">= 1"),
    "steps": (lambda v: v >= 0, ">= 0 (0 = all epochs)"),
    "batch_size": (lambda v: v >= 1, ">= 1"),
    "seed": (lambda v: 0 <= v < 2**63, "a whole number >= 0"),
    "data_seed": (lambda v: 0 <= v < 2**63, "a whole number >= 0"),
    "bucket_mb": (lambda v: v == "all" or _bucket_mb(v) is not None,
                  "a finite number of MB >= 0, or all"),
    "profile_steps": (lambda v: v >= 1, ">= 1"),
    "mergecomp_steps": (lambda v: v >= 1, ">= 1"),
    "small_tensor": (lambda v: v >= 0, ">= 0"),
    "warmup_steps": (lambda v: v >= 0, ">= 0"),
    "segment_bytes": (lambda v: v == 0 or v >= 4, "0 (the algorithm's default) or >= 4"),
    "eval_every": (lambda v: v >= 0, ">= 0 (0 = every epoch)"),
    "stop_at": (lambda v: math.isfinite(v) and 0 <= v <= 1, "an accuracy in [0, 1] (0 = "
                                                             "never stop early)"),
    "checkpoint_every": (lambda v: v is None or v >= 1, ">= 1 (leave it out to checkpoint "
                                                        "only at the end)"),
    "keep": (lambda v: v >= 1, ">= 1"),
    "eval_on": (lambda v: v in CHOICES["eval_on"], "test or validation"),
    "progress": (lambda v: v in CHOICES["progress"], "auto, bar, lines or none"),
    "partition": (lambda v: _partition_ok(v), "iid, label-skew:<alpha> (alpha > 0) or "
                                              "shard:<k> (k >= 1)"),
}


def _partition_ok(spec: str) -> bool:
    try:
        parse_partition(spec)
    except ValueError:
        return False
    return True

#: option -> (does it act with these args?, when it acts); a value other than the default
#: that would not act is refused rather than silently ignored
NEEDS = {
    "samples": (lambda a: a.dataset in ("synthetic", "images"), "--dataset synthetic or images"),
    "features": (lambda a: a.dataset in ("synthetic", "images"),
                 "--dataset synthetic or images"),
    "data_seed": (lambda a: not a.model.startswith("replay:"),
                  "a model trained on data (replay models have none)"),
    "replay_tflops": (lambda a: a.model.startswith("replay:"), "a replay:<net> model"),
    "replay_scale": (lambda a: a.model.startswith("replay:"), "a replay:<net> model"),
    "profile": (lambda a: a.plan, "--plan"),
    "profile_steps": (lambda a: a.plan, "--plan"),
    "mergecomp_steps": (lambda a: (a.plan or "").startswith("mergecomp"), "--plan mergecomp"),
    "momentum": (lambda a: a.optimizer in ("sgd", "marsit"),
                 "--optimizer sgd or marsit (Adam's first moment is its momentum)"),
    "global_lr": (lambda a: a.optimizer == "marsit", "--optimizer marsit"),
    "marsit_k": (lambda a: a.optimizer == "marsit", "--optimizer marsit"),
    "warmup_steps": (lambda a: a.compressor != "none", "a --compressor"),
    "torus": (lambda a: "torus" in algorithm_options(a.algorithm), "--algorithm torus"),
    "segment_bytes": (lambda a: "segment_bytes" in algorithm_options(a.algorithm),
                      "an --algorithm that pipelines segments (ring, dbtree, torus, "
                      "allgather, rabenseifner, twostage)"),
    "eval_on": (lambda a: not a.model.startswith("replay:"), "a model with data (not "
                                                             "replay:<net>)"),
    "partition": (lambda a: not a.model.startswith("replay:"), "a model with data (not "
                                                               "replay:<net>)"),
    "stop_at": (lambda a: not a.model.startswith("replay:"), "a model with data (not "
                                                             "replay:<net>)"),
    "shadow": (lambda a: a.trace and a.compressor != "none",
               "--trace and a --compressor (it records compressed hops' error)"),
    "checkpoint_every": (lambda a: a.checkpoint_dir, "--checkpoint-dir"),
    "keep": (lambda a: a.checkpoint_dir, "--checkpoint-dir"),
    "resume": (lambda a: a.checkpoint_dir, "--checkpoint-dir"),
    "overwrite": (lambda a: a.checkpoint_dir and not a.resume,
                  "--checkpoint-dir, without --resume"),
}


def _bucket_mb(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def check_values(args, acting_alone=(), spelling: Spelling = FLAGS) -> str:
    """The first nonsense value or option that would not act, as one line ('' if none),
    naming options as ``spelling`` writes them."""
    for name, (rule, text) in RULES.items():
        value = getattr(args, name)
        if not rule(value):
            return f"{spelling.setting(name, value)}: must be {text}"
    if args.model.startswith("replay:"):
        if args.model.partition(":")[2] not in NETWORKS:
            return spelling.text(f"--model {args.model}: unknown replay network; known: "
                                 f"{', '.join(NETWORKS)}")
    else:
        try:
            parse_model_spec(args.model)
        except ValueError as exc:
            return spelling.text(f"--model: {exc}")
        if args.model.startswith("torch:") and importlib.util.find_spec("torch") is None:
            return spelling.text(f"--model {args.model}: PyTorch is not installed (pip "
                                 f"install -e '.[torch]', or any torch build for your machine)")
    if args.device == "gpu" and (why := placement.gpu_unavailable()):
        return spelling.text(f"--device gpu: {why}")
    if args.dataset not in data.DATASETS:
        return spelling.text(f"--dataset {args.dataset}: unknown; known: "
                             f"{', '.join(data.DATASETS)}")
    if args.dataset == "images":
        try:
            data.image_side(args.features)
        except ValueError as exc:
            return spelling.text(f"--dataset images: {exc}")
    for name, (acts, when) in NEEDS.items():
        if getattr(args, name) != OPTIONS[name][0] and name not in acting_alone \
                and not acts(args):
            return spelling.text(f"--{name.replace('_', '-')} acts only with {when}")
    return ""


def collective_options(options) -> dict:
    """The collective's options the user set (``segment_bytes``, ``torus`` attributes of
    ``options``: the trainer's arguments or ringcomp.torch's options)."""
    given = {"segment_bytes": options.segment_bytes, "torus": options.torus}
    return {k: v for k, v in given.items() if v}


def shared(args) -> dict:
    """The options every rank must agree on."""
    items = (dataclasses.asdict(args) if dataclasses.is_dataclass(args) else vars(args))
    return {k: v for k, v in sorted(items.items()) if k not in LOCAL}


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
