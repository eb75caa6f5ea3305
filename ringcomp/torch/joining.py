"""Horovod's ``join`` over ringcomp: ranks that ran out of data give zeros to the others'
all-reduces until every rank has joined.

The protocol, on a control channel of its own (a duplicate of ``hvd.init()``'s world):

1. Once ``hvd.init()`` ran, every Horovod call on tensors or objects and every step of a
   DistributedOptimizer on that world first *announces* itself: one small agreement
   (``Transport.agree``: the min and max of an int64 vector over ranks) on the control
   channel, made on the caller's thread in program order (an asynchronous call at its
   submission).
2. A rank inside ``join()`` answers each announcement with a "joined" vector and learns
   from the agreed maximum what the live ranks do; it mirrors it: an all-reduce of zeros of
   the announced size, dtype, device, op and compression (on the same thread as theirs:
   the main one or the asynchronous calls'), or a step of zero gradients of the
   DistributedOptimizer of the announced number.
3. A call that a joined rank cannot take part in with zeros (allgather, broadcast, the
   object calls, Min/Max/Product) raises on every live rank, as Horovod's does; the joined
   ranks go on waiting. An optimizer step whose zeros would not arrive as zeros (a
   compressor other than fp16, error feedback, Marsit) runs to its end on every rank - its
   buckets are already on their way - and the live ranks drop it and raise.
4. ``join()`` returns once every rank is inside it: the rank that joined last (of several
   in the same round, the highest), whose parameters ``broadcast_parameters`` can give to
   the others.

Invariant: the live ranks announce the same call (a joined rank mirrors their maximum; a
call that differs between live ranks fails on every rank in that call's own agreement,
the mirroring rank included). Without ``hvd.init()`` nothing is announced and nothing
costs: ``join`` needs it.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from ringcomp.transport.comm import Transport

#: the announced vector's fields: an all-reduce's scale factors (float64 bits) and name
#: key ride in PRESCALE, POSTSCALE, NAME, so that a joined rank's call is agreed as theirs
LIVE, JOINER, KIND, COUNT, DTYPE, MODE, FAILED, PRESCALE, POSTSCALE, NAME = range(10)
#: what a joined rank puts in the extra fields: below any value, so the maximum is a live
#: rank's
_NOTHING = -(1 << 63)
#: what a live rank announces: a call a joined rank cannot mirror, an all-reduce on the
#: main thread, one on the asynchronous calls' thread, a DistributedOptimizer's step
#: (synchronize) or discarded step
OTHER, ALLREDUCE, ALLREDUCE_ASYNC, OPTIMIZER_STEP, OPTIMIZER_DISCARD = range(5)
#: the tensor dtypes an announced all-reduce can carry (their positions are the codes)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64)
#: the ops and compressions a joined rank can mirror with zeros (sum and average: the
#: joined ranks' zeros count in the average's divisor, as Horovod's do)
OPS = ("sum", "average")
COMPRESSIONS = (None, "fp16")

_STATE: dict = {"channel": None, "optimizers": []}


def open_channel(world: Transport) -> None:
    """The control channel for ``world`` (collective: ``hvd.init()`` on every rank)."""
    _STATE["channel"] = Transport(world.comm, timeout=world.timeout)
    _STATE["optimizers"] = []


def close_channel() -> None:
    if _STATE["channel"] is not None:
        _STATE["channel"].close("hvd.shutdown() closed join's control channel")
    _STATE.update(channel=None, optimizers=[])


def register(optimizer) -> int | None:
    """The number a DistributedOptimizer announces its steps by, or None when it runs on
    another group of ranks than ``hvd.init()``'s world or init was not called (creating
    an optimizer is collective: every rank numbers it alike)."""
    channel = _STATE["channel"]
    if channel is None or not channel.same_ranks(optimizer.transport):
        return None
    _STATE["optimizers"].append(weakref.ref(optimizer))
    return len(_STATE["optimizers"]) - 1


def allreduce_mode(op: str, compression, tensor: torch.Tensor) -> tuple[int, int, int]:
    """(kind's count, dtype, mode) of an all-reduce, or mode -1 when a joined rank cannot
    mirror it."""
    mirrorable = (op in OPS and compression in COMPRESSIONS and tensor.dtype in DTYPES
                  and tensor.device.type in ("cpu", "cuda"))
    if not mirrorable:
        return tensor.numel(), -1, -1
    mode = (OPS.index(op) * len(COMPRESSIONS) + COMPRESSIONS.index(compression)) * 2 + (
        tensor.device.type == "cuda")
    return tensor.numel(), DTYPES.index(tensor.dtype), mode


def decode_mode(dtype: int, mode: int) -> tuple[torch.dtype, str, object, str]:
    """(dtype, op, compression, device type) of an announced all-reduce."""
    mode, cuda = divmod(mode, 2)
    op, compression = divmod(mode, len(COMPRESSIONS))
    return DTYPES[dtype], OPS[op], COMPRESSIONS[compression], "cuda" if cuda else "cpu"


def announce(kind: int, what: str, count: int = -1, dtype: int = -1, mode: int = -1,
             extra: tuple = (1.0, 1.0, 0)) -> bool:
    """Step 1 on a live rank: say what this rank is about to do; whether a rank is in
    ``join()``. A call no joined rank can take part in (``OTHER``) raises then, on every
    live rank (``what`` names the call). ``extra``: an all-reduce's prescale and
    postscale factors and name key, which a joined rank's call passes too."""
    channel = _STATE["channel"]
    if channel is None or channel.size == 1:
        return False
    if kind in (ALLREDUCE, ALLREDUCE_ASYNC):
        kind = kind if mode >= 0 else OTHER
    factors = np.array(extra[:2], np.float64).view(np.int64)
    low, high = channel.agree([1, -1, kind, count, dtype, mode, 0, *factors.tolist(),
                               extra[2]])
    if high[FAILED]:
        raise RuntimeError(f"ringcomp.torch: {what}: a rank in join() could not take part "
                           f"(it raised the reason there)")
    if low[LIVE] == 0 and kind == OTHER:
        raise RuntimeError(
            f"ringcomp.torch: {what} while a rank is in join(): a joined rank can only add "
            f"zeros to an all-reduce of op Sum or Average without a compressor or with "
            f"fp16 (Horovod raises alike). Call it before join(), or after join() returns")
    return bool(low[LIVE] == 0)


def announce_over(transport, what: str) -> None:
    """Announce a call no joined rank can take part in, made over ``transport`` (the
    start-up broadcasts): it raises on every live rank while a rank is in ``join()``,
    where it would wait for that rank; nothing when ``transport`` is not ``hvd.init()``'s
    ranks (they would not all announce)."""
    channel = _STATE["channel"]
    if channel is not None and channel.same_ranks(transport):
        announce(OTHER, what)


def zeros_arrive(optimizer) -> bool:
    """Whether a joined rank's zero gradients reach a DistributedOptimizer's average as
    zeros: not through a compressor other than fp16 (sign's zeros are signs), Marsit's
    optimizer or error feedback (the joined rank's residual would arrive)."""
    compressor = getattr(optimizer.compressor, "name", None)
    return (compressor in COMPRESSIONS and optimizer.rule is None
            and not optimizer.options.error_feedback)


def join(mirror_allreduce, finish) -> int:
    """Steps 2-4 on the rank that calls ``hvd.join()``: answer announcements, mirroring
    each with ``mirror_allreduce(kind, count, dtype, mode, (prescale, postscale, name
    key))`` or an optimizer's zero step,
    until every rank has joined; then ``finish()`` (the mirrored asynchronous calls) and
    return the rank that joined last."""
    channel = _STATE["channel"]
    if channel is None:
        raise ValueError("ringcomp.torch: call init() first (Horovod's hvd.init())")
    if channel.size == 1:
        return 0
    busy = [o for o in (ref() for ref in _STATE["optimizers"])
            if o is not None and o.step_in_flight()]
    failed = int(bool(busy))
    joiner, last = channel.rank, -1
    while True:
        low, high = channel.agree([0, joiner, -1, -1, -1, -1, failed, _NOTHING, _NOTHING,
                                   _NOTHING])
        if high[FAILED]:
            break
        joiner = -1
        last = int(high[JOINER]) if high[JOINER] >= 0 else last  # this round's joiners
        if high[LIVE] == 0:  # every rank is in join()
            break
        kind = int(high[KIND])
        if kind in (ALLREDUCE, ALLREDUCE_ASYNC):
            factors = np.array(high[PRESCALE:POSTSCALE + 1], np.int64).view(np.float64)
            mirror_allreduce(kind, int(high[COUNT]), int(high[DTYPE]), int(high[MODE]),
                             (float(factors[0]), float(factors[1]), int(high[NAME])))
        elif kind in (OPTIMIZER_STEP, OPTIMIZER_DISCARD):
            number = int(high[COUNT])
            known = _STATE["optimizers"]
            optimizer = known[number]() if number < len(known) else None
            if optimizer is None:  # closed and collected here, or made before hvd.init()
                raise RuntimeError("ringcomp.torch.join: the live ranks stepped a "
                                   "DistributedOptimizer this rank does not have (every "
                                   "rank must make the same ones, after hvd.init())")
            # where zeros do not arrive as zeros the live ranks drop the step: so does this
            optimizer.mirror_step(discard=kind == OPTIMIZER_DISCARD or not high[MODE])
    finish()
    if busy:
        raise RuntimeError("ringcomp.torch.join: called between backward() and step(): this "
                           "rank's gradients are already on their way. Call join() after "
                           "step() (or discard())")
    if high[FAILED]:
        raise RuntimeError("ringcomp.torch.join: another rank's join() failed (it raised "
                           "the reason there)")
    return last


def zeros(count: int, dtype: int, mode: int, gpu: int = -1) -> tuple[torch.Tensor, str,
                                                                     object]:
    """A joined rank's part of an announced all-reduce: (zeros, op, compression); a
    device all-reduce's zeros on GPU ``gpu`` (-1: the current one)."""
    torch_dtype, op, compression, device = decode_mode(dtype, mode)
    if device == "cuda":
        target = torch.device("cuda", gpu if gpu >= 0 else torch.cuda.current_device())
    else:
        target = torch.device("cpu")
    return torch.zeros(count, dtype=torch_dtype, device=target), op, compression

