"""Which trainer runs a job: the NumPy one, or the PyTorch one for ``torch:<net>`` models."""

from __future__ import annotations

from ringcomp.training.trainer import Trainer


def make_trainer(args, transport) -> Trainer:
    """The trainer for ``args.model``; collective (both construct engines)."""
    if not args.model.startswith("torch:"):
        return Trainer(args, transport)
    # imported here: torch is an optional dependency, needed by torch: models only
    from ringcomp.torch.trainer import TorchTrainer

    return TorchTrainer(args, transport)
