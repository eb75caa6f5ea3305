"""Horovod's ``start_timeline`` / ``stop_timeline`` onto ringcomp's tracer: every hop of
every Horovod call on tensors and every DistributedOptimizer bucket between them, as a
Chrome/Perfetto trace."""

from __future__ import annotations

import os
import shutil
import weakref

from ringcomp.checks import probe_directory, probe_writable
from ringcomp.trace import Tracer

_STATE: dict = {"tracer": None, "path": None}
#: the DistributedOptimizers without a tracer of their own: a timeline records their buckets
_FOLLOWING: weakref.WeakSet = weakref.WeakSet()


def tracer() -> Tracer | None:
    """The tracer of the timeline being recorded, or None (then tracing costs nothing)."""
    return _STATE["tracer"]


def follow(optimizer):
    """Let timelines record ``optimizer``'s buckets (a DistributedOptimizer made without
    ``tracer=``); returns the tracer of the timeline being recorded now, or None."""
    _FOLLOWING.add(optimizer)
    return _STATE["tracer"]


def _retrace(tracer) -> list:
    """Switch every followed optimizer's engine to ``tracer``; their Futures. An engine
    closed without its optimizer (``ringcomp.train`` closes a torch job's reducer when the
    run ends) has nothing more to record: skipped, as a closed optimizer's."""
    return [opt.reducer.engine.set_tracer(tracer) for opt in list(_FOLLOWING)
            if not opt.closed and not opt.reducer.engine.closed]


def start_timeline(file_path: str, rank: int, mark_cycles: bool = False) -> None:
    """Horovod's ``start_timeline``: record every hop of every ``ringcomp.torch`` call on
    tensors from now on (all-reduces, gathers, broadcasts, their asynchronous forms), to
    be written by ``stop_timeline`` (the files ``rank`` writes are probed now), and the
    buckets every DistributedOptimizer without a ``tracer=`` of its own submits from now
    on. Call it on every rank at the same point of the loop (the optimizers' bucket plans
    are made anew under the timeline: collective). ``mark_cycles`` (Horovod's
    tensor-fusion cycles) is refused: ringcomp's calls have none to mark."""
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
    _retrace(recorder)


def stop_timeline(transport) -> str | None:
    """Horovod's ``stop_timeline`` (collective: every rank calls it): write the records
    (``<file>.ranks/rank-<r>.jsonl`` on every rank, merged by rank 0) and put the merged
    Chrome trace at the file ``start_timeline`` named; returns its path on rank 0."""
    recorder, path = _STATE["tracer"], _STATE["path"]
    if recorder is None:
        raise RuntimeError("ringcomp.torch.stop_timeline: no timeline is being recorded "
                           "(start_timeline(file) first)")
    _STATE.update(tracer=None, path=None)
    for switched in _retrace(None):  # the buckets already submitted are recorded first
        switched.result()
    merged = recorder.write(transport)
    if merged is None:
        return None
    shutil.copyfile(merged, path)
    return path
