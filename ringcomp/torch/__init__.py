"""ringcomp for PyTorch: Horovod's DistributedOptimizer and broadcasts over ringcomp's
collectives and compressors (``pip install ringcomp[torch]``)."""

from ringcomp.torch.broadcast import broadcast_optimizer_state, broadcast_parameters
from ringcomp.torch.marsit import Marsit
from ringcomp.torch.optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer", "Marsit", "broadcast_optimizer_state",
           "broadcast_parameters"]
