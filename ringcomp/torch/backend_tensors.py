"""The ``"ringcomp"`` backend's tensors as NumPy views, and its refusals."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist


def refused(call: str, why: str) -> dist.DistBackendError:
    """torch's own error type for what the backend does not do, naming the call."""
    return dist.DistBackendError(f"ringcomp backend: {call}: {why}")


def host(tensor: torch.Tensor, call: str) -> np.ndarray:
    """``tensor``'s memory as a NumPy array (no copy), or refused: a CPU, contiguous
    tensor of a dtype NumPy has (bfloat16 has none)."""
    if tensor.device.type != "cpu":
        raise refused(call, f"a {tensor.device.type} tensor (this backend serves CPU "
                            f"tensors)")
    if not tensor.is_contiguous():
        raise refused(call, "a non-contiguous tensor (call .contiguous() first)")
    try:
        return tensor.detach().numpy()
    except TypeError as err:  # bfloat16 and the other dtypes NumPy lacks
        raise refused(call, f"dtype {tensor.dtype} ({err})") from None
