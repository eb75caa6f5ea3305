"""One flat gradient buffer for a torch model: every ``p.grad`` a view of it, in backward
order; and the hand-over of CUDA tensors between PyTorch's streams and ringcomp's."""

from __future__ import annotations

import contextlib

import torch

from ringcomp.kernels.arrays import array_module
from ringcomp.models.params import ParamInfo


def tensor_as_array(t: torch.Tensor):
    """The memory of contiguous tensor ``t`` as an array, without a copy: a NumPy view for
    a CPU tensor, a CuPy view (DLPack) for a CUDA tensor."""
    if t.device.type == "cpu":
        return t.detach().numpy()
    import cupy

    with cupy.cuda.Device(t.device.index):
        return cupy.from_dlpack(t.detach())


def on_torch_stream(t: torch.Tensor):
    """Context in which CuPy work of the calling thread is queued on PyTorch's current
    stream of ``t``'s GPU, so it is ordered with the kernels PyTorch queued there before
    and after (a user's own ``torch.cuda.stream`` included); nothing for a CPU tensor."""
    if t.device.type != "cuda":
        return contextlib.nullcontext()
    import cupy

    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(t.device.index))
    stack.enter_context(cupy.cuda.ExternalStream(
        torch.cuda.current_stream(t.device).cuda_stream, t.device.index))
    return stack


def handover(t: torch.Tensor):
    """For a CUDA tensor, a function for ringcomp's engine thread to call before its
    collective touches ``t``: it makes ``t``'s GPU the thread's current device and waits
    for the work PyTorch has queued so far on its current stream (the kernels still
    producing ``t``), recorded now as an event. None for a CPU tensor."""
    if t.device.type != "cuda":
        return None
    import cupy

    index = t.device.index
    produced = torch.cuda.Event()
    produced.record(torch.cuda.current_stream(t.device))

    def wait() -> None:
        cupy.cuda.Device(index).use()
        produced.synchronize()

    return wait


class FlatGradients:
    """Gradients of ``params`` laid out in one contiguous float32 tensor.

    1. Order: the reverse of ``params`` (the order a sequential model's backward produces
       them; DDP makes the same guess), so a bucket of gradients finished together is one
       contiguous slice.
    2. ``attach`` points every ``p.grad`` at its slice; autograd then accumulates into the
       buffer in place (as DDP's ``gradient_as_bucket_view``), so buckets are views and
       nothing is copied between backward and the all-reduce.
    3. A ``p.grad`` replaced (``zero_grad(set_to_none=True)``, then a fresh gradient from
       autograd) is put back by ``settle``, its values copied in.

    Invariant: all parameters share one device and dtype float32 (checked, ValueError).
    """

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]]):
        if not named:
            raise ValueError("no parameters that require gradients")
        devices = {p.device for _, p in named}
        dtypes = {p.dtype for _, p in named}
        if len(devices) > 1 or dtypes != {torch.float32}:
            raise ValueError(f"ringcomp.torch needs float32 parameters on one device; got "
                             f"{sorted(map(str, dtypes))} on {sorted(map(str, devices))}")
        self.named = list(reversed(named))
        self.infos, offset = [], 0
        for i, (name, p) in enumerate(self.named):
            self.infos.append(ParamInfo(name, i, tuple(p.shape), offset))
            offset += p.numel()
        self.device = next(iter(devices))
        self.buffer = torch.zeros(offset, dtype=torch.float32, device=self.device)
        self.array = tensor_as_array(self.buffer)
        self.xp = array_module(self.array)
        self.index = {id(p): i for i, (_, p) in enumerate(self.named)}
        self.attach()

    @property
    def size(self) -> int:
        return self.buffer.numel()

    def stream(self):
        """``on_torch_stream`` for the buffer's device."""
        return on_torch_stream(self.buffer)

    def local_copies(self, state: dict) -> dict:
        """``state``'s arrays copied into the buffer's memory (host or its GPU)."""
        with self.stream():
            return {k: self.xp.array(v) for k, v in state.items()}

    def view(self, i: int) -> torch.Tensor:
        info = self.infos[i]
        return self.buffer[info.offset:info.offset + info.size].view(info.shape)

    def settle(self, i: int) -> None:
        """Make parameter i's ``p.grad`` its view of the buffer: a gradient tensor of its
        own (after ``zero_grad(set_to_none=True)``) is copied in, a missing one reads as
        zeros."""
        p, view = self.named[i][1], self.view(i)
        with torch.no_grad():
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
        p.grad = view

    def attach(self) -> None:
        for i in range(len(self.named)):
            self.settle(i)

    def flatten_parameters(self):
        """Move the parameters' values into one flat buffer laid out like the gradients
        (each ``p.data`` becomes its view) and return it as an array: for update rules
        that work on flat slices (Marsit's)."""
        flat = torch.empty_like(self.buffer)
        for i, (_, p) in enumerate(self.named):
            info = self.infos[i]
            view = flat[info.offset:info.offset + info.size].view(info.shape)
            view.copy_(p.detach())
            p.data = view
        return tensor_as_array(flat)
