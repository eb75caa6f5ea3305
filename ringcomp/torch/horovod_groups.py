"""Horovod's grouped calls and its reduce-scatter, built from ``horovod``'s single calls
(so each keeps their checks, agreement, join announcement and autograd rules)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import torch

from ringcomp.torch import horovod, horovod_async, horovod_world


def grouped_allreduce_(tensors: list[torch.Tensor], average=None, name=None, op=None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set=None) -> list[torch.Tensor]:
    """Horovod's ``grouped_allreduce_``: ``allreduce_`` of each tensor, in order."""
    return [horovod.allreduce_(t, average, _named(name, i), op, prescale_factor,
                               postscale_factor, process_set)
            for i, t in enumerate(tensors)]


def grouped_allreduce_async(tensors: list[torch.Tensor], average=None, name=None, op=None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set=None) -> Future:
    """Horovod's ``grouped_allreduce_async``: one handle whose ``synchronize`` returns the
    list of new tensors."""
    handles = [horovod_async.allreduce_async(t, average, _named(name, i), op, prescale_factor,
                                       postscale_factor, process_set)
               for i, t in enumerate(tensors)]
    return _gathered(handles)


def grouped_allreduce_async_(tensors: list[torch.Tensor], average=None, name=None, op=None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set=None) -> Future:
    """In place: one handle whose ``synchronize`` returns the tensors, reduced."""
    handles = [horovod_async.allreduce_async_(t, average, _named(name, i), op, prescale_factor,
                                        postscale_factor, process_set)
               for i, t in enumerate(tensors)]
    return _gathered(handles)


def grouped_allgather(tensors: list[torch.Tensor], name=None,
                      process_set=None) -> list[torch.Tensor]:
    """Horovod's ``grouped_allgather``: ``allgather`` of each tensor, in order."""
    return [horovod.allgather(t, _named(name, i), process_set) for i, t in enumerate(tensors)]


def reducescatter(tensor: torch.Tensor, name=None, compression=None, op=None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set=None) -> torch.Tensor:
    """Horovod's ``reducescatter``: the reduction (default Average) of ``tensor`` over all
    ranks, split along dimension 0 as evenly as possible (the first ``rows % size`` ranks
    get a row more); this rank's part. Run as the all-reduce, then this rank's rows -
    p times the bytes of a true reduce-scatter's second phase, the same values - so its
    gradient is the all-reduce's, narrowed: Horovod's rule (an all-gather of the
    incoming gradients, divided by the size for Average)."""
    if tensor.dim() == 0:
        raise ValueError("ringcomp.torch.reducescatter: needs a tensor of at least one "
                         "dimension (it splits dimension 0)")
    reduced = horovod.allreduce(tensor, name=name, compression=compression,
                                op=op if op is not None else horovod.Average,
                                prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set)
    return reduced.narrow(0, *_rows(tensor.shape[0]))


def reducescatter_async(tensor: torch.Tensor, name=None, op=None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set=None) -> Future:
    """``reducescatter`` in the background: a handle whose ``synchronize`` returns this
    rank's rows."""
    if tensor.dim() == 0:
        raise ValueError("ringcomp.torch.reducescatter_async: needs a tensor of at least "
                         "one dimension (it splits dimension 0)")
    handle = horovod_async.allreduce_async(tensor, name=name,
                                     op=op if op is not None else horovod.Average,
                                     prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor,
                                     process_set=process_set)
    start, rows = _rows(tensor.shape[0])
    done: Future = Future()

    def finish(reduced: Future) -> None:
        try:
            done.set_result(reduced.result().narrow(0, start, rows))
        except Exception as exc:  # the all-reduce's error, at synchronize
            done.set_exception(exc)

    handle.add_done_callback(finish)
    return done


def _rows(count: int) -> tuple[int, int]:
    """(first row, rows) of this rank's part of ``count`` rows, as Horovod splits them."""
    size, rank = horovod_world.size(), horovod_world.rank()
    rows, extra = divmod(count, size)
    return rank * rows + min(rank, extra), rows + (rank < extra)


def grouped_reducescatter(tensors: list[torch.Tensor], name=None, compression=None,
                          op=None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0,
                          process_set=None) -> list[torch.Tensor]:
    """``reducescatter`` of each tensor, in order."""
    return [reducescatter(t, _named(name, i), compression, op, prescale_factor,
                          postscale_factor, process_set) for i, t in enumerate(tensors)]


def _named(name, index: int):
    """The name of a group's ``index``-th call (Horovod names them alike)."""
    return None if name is None else f"{name}.{index}"


def _gathered(handles: list[Future]) -> Future:
    """One handle for several: its result is the list of theirs, in order."""
    done: Future = Future()
    lock = threading.Lock()  # the worker's callbacks and the caller's (a done handle's)

    def finish(_handle) -> None:
        with lock:
            if done.done() or not all(h.done() for h in handles):
                return
            try:
                done.set_result([h.result() for h in handles])
            except Exception as exc:  # the first failed call's error, at synchronize
                done.set_exception(exc)

    for handle in handles:
        handle.add_done_callback(finish)
    if not handles:
        done.set_result([])
    return done
