"""Horovod's ``start_timeline`` / ``stop_timeline`` onto ringcomp's tracer: every hop of
every Horovod call on tensors between them, as a Chrome/Perfetto trace."""

from __future__ import annotations

import os
import shutil

from ringcomp.checks import probe_directory, probe_writable
from ringcomp.trace import Tracer

_STATE: dict = {"tracer": None, "path": None}


def tracer() -> Tracer | None:
    """The tracer of the timeline being recorded, or None (then tracing costs nothing)."""
    return _STATE["tracer"]


def start_timeline(file_path: str, rank: int, mark_cycles: bool = False) -> None:
    """Horovod's ``start_timeline``: record every hop of every ``ringcomp.torch`` call on
    tensors from now on (all-reduces, gathers, broadcasts, their asynchronous forms), to
    be written by ``stop_timeline`` (the files ``rank`` writes are probed now). Call it on
    every rank. ``mark_cycles`` (Horovod's tensor-fusion cycles) is refused: ringcomp's
    calls have none to mark (a DistributedOptimizer traces its buckets through its own
    ``tracer=``)."""
    if mark_cycles:
        raise ValueError("ringcomp.torch.start_timeline: mark_cycles marks Horovod's "
                         "tensor-fusion cycles; ringcomp's calls have none")
    if _STATE["tracer"] is not None:
        raise RuntimeError("ringcomp.torch.start_timeline: a timeline is being recorded "
                           f"already (into {_STATE['path']!r}): stop_timeline() first")
    path = os.fspath(file_path)
    recorder = Tracer(path + ".ranks")
    # what stop_timeline writes is checked now, not after the calls it records
    probe_directory(recorder.directory, recorder.outputs(rank))
    if rank == 0:  # which alone copies the merged trace there
        probe_writable(path)
    _STATE.update(tracer=recorder, path=path)


def stop_timeline(transport) -> str | None:
    """Horovod's ``stop_timeline`` (collective: every rank calls it): write the records
    (``<file>.ranks/rank-<r>.jsonl`` on every rank, merged by rank 0) and put the merged
    Chrome trace at the file ``start_timeline`` named; returns its path on rank 0."""
    recorder, path = _STATE["tracer"], _STATE["path"]
    if recorder is None:
        raise RuntimeError("ringcomp.torch.stop_timeline: no timeline is being recorded "
                           "(start_timeline(file) first)")
    _STATE.update(tracer=None, path=None)
    merged = recorder.write(transport)
    if merged is None:
        return None
    shutil.copyfile(merged, path)
    return path
