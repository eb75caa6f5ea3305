"""Studies that produce the README's figures (``python -m ringcomp.experiments NAME``)."""

from __future__ import annotations

import os


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
