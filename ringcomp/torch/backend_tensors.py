"""The ``"ringcomp"`` backend's tensors as arrays (NumPy's, CuPy's), and its refusals."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringcomp.torch.flat import tensor_as_array


def refused(call: str, why: str) -> dist.DistBackendError:
    """torch's own error type for what the backend does not do, naming the call."""
    return dist.DistBackendError(f"ringcomp backend: {call}: {why}")


def view(tensor: torch.Tensor, call: str):
    """``tensor``'s memory as an array, without a copy: NumPy's for a CPU tensor, CuPy's for
    a CUDA tensor (DLPack; that GPU made this thread's current one, where the collective
    runs) - or refused: another device, a non-contiguous tensor, a dtype ringcomp lacks
    (bfloat16), a CUDA tensor without CuPy."""
    if tensor.device.type not in ("cpu", "cuda"):
        raise refused(call, f"a {tensor.device.type} tensor (this backend serves CPU and "
                            f"CUDA tensors)")
    if not tensor.is_contiguous():
        raise refused(call, "a non-contiguous tensor (call .contiguous() first)")
    if tensor.dtype == torch.bfloat16:
        raise refused(call, f"dtype {tensor.dtype} (ringcomp has no bfloat16 arrays)")
    if tensor.device.type == "cuda":
        try:
            import cupy
        except ImportError:
            raise refused(call, "a CUDA tensor, and CuPy is not installed here (pip "
                                "install 'ringcomp[gpu]')") from None
        cupy.cuda.Device(tensor.device.index).use()
        return tensor_as_array(tensor)
    try:
        return tensor.detach().numpy()
    except TypeError as err:  # the other dtypes NumPy lacks
        raise refused(call, f"dtype {tensor.dtype} ({err})") from None


def producers_done(items) -> None:
    """Wait for the kernels PyTorch queued on the calling thread's current streams of the
    CUDA tensors among ``items`` (tensors and lists of them, nested): the collective runs
    on the group's thread, which does not see this thread's streams. Nothing for CPU
    tensors."""
    for item in items:
        if isinstance(item, (list, tuple)):
            producers_done(item)
        elif isinstance(item, torch.Tensor) and item.device.type == "cuda":
            torch.cuda.current_stream(item.device).synchronize()
