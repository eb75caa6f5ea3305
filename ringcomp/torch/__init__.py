"""ringcomp for PyTorch: Horovod's DistributedOptimizer and broadcasts over ringcomp's
collectives and compressors (``pip install ringcomp[torch]``)."""

from ringcomp.torch.broadcast import broadcast_optimizer_state, broadcast_parameters
from ringcomp.torch.ddp import HookState, init_process_group, ringcomp_hook
from ringcomp.torch.marsit import Marsit
from ringcomp.torch.optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer", "HookState", "Marsit", "broadcast_optimizer_state",
           "broadcast_parameters", "init_process_group", "ringcomp_hook"]
