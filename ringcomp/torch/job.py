"""Which model binding a job needs: the NumPy one, or the PyTorch one for ``torch:<net>``."""

from __future__ import annotations

from ringcomp.training.trainer import Trainer


def make_trainer(args, transport) -> Trainer:
    """The trainer for ``args.model``; collective (the bindings construct engines)."""
    if not args.model.startswith("torch:"):
        return Trainer(args, transport)
    # imported here: torch is an optional dependency, needed by torch: models only
    from ringcomp.torch.trainer_binding import TorchBinding

    return Trainer(args, transport, binding=TorchBinding)
