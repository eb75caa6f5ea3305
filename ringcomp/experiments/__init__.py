"""Studies that produce the README's figures (``python -m ringcomp.experiments NAME``)."""

from __future__ import annotations

import os

from ringcomp.cli import parse_list, parse_rate


def start_runs(transport, args, known) -> str:
    """Check ``args.methods`` against ``known`` (on every rank: the same verdict) and make
    the folder ``<out>-runs`` for the runs' metrics files; returns it."""
    unknown = [m for m in args.methods if m not in known]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {', '.join(known)}")
    folder = f"{args.out}-runs"
    if transport.rank == 0:
        os.makedirs(folder, exist_ok=True)
    transport.barrier()
    return folder


def add_testbed_options(p, rates: str) -> None:
    """``--hosts`` and ``--rates`` of a study on the emulated links (default ``rates``)."""
    p.add_argument("--hosts", type=int, default=4, help="emulated hosts (default: 4)")
    p.add_argument("--rates", type=lambda s: [parse_rate(x) for x in parse_list(s)],
                   default=[parse_rate(r) for r in parse_list(rates)],
                   help=f"link rates (default: {rates})")


def check_testbed_hosts(args, parser) -> None:
    if not 2 <= args.hosts <= 8:
        parser.error(f"--hosts must be 2..8 (2 cores cannot drive more), got {args.hosts}")


def parse_ints(text: str) -> list[int]:
    """A comma-separated list of integers (seeds)."""
    return [int(x) for x in parse_list(text)]


def add_sweep_options(p, lrs: str, seeds: str) -> None:
    """``--lrs`` (the learning-rate grid) and ``--seeds`` of a study that tunes each
    method's rate. Their defaults are filled in by ``check_sweep``, so a study's smoke form
    (``--quick``) can tell a value the user gave, which it keeps, from a default."""
    p.add_argument("--lrs", type=lambda s: [float(x) for x in parse_list(s)], default=None,
                   help=f"learning-rate grid (default {lrs})")
    p.add_argument("--seeds", type=parse_ints, default=None,
                   help=f"seeds of the final runs (default: {seeds})")
    p.set_defaults(sweep_defaults=([float(x) for x in parse_list(lrs)], parse_ints(seeds)))


def check_sweep(args, parser) -> None:
    """Fill in the defaults of ``--lrs`` and ``--seeds`` not given, then check them."""
    default_lrs, default_seeds = args.sweep_defaults
    args.lrs = default_lrs if args.lrs is None else args.lrs
    args.seeds = default_seeds if args.seeds is None else args.seeds
    if not args.lrs or not all(lr > 0 for lr in args.lrs) or not args.seeds:
        parser.error("--lrs needs rates > 0 and --seeds at least one seed")
