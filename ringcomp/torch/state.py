"""A DistributedOptimizer's own state as PyTorch saves it: CPU tensors and plain values,
with the options and rank count that must match when it is loaded."""

from __future__ import annotations

import numpy as np
import torch

from ringcomp.kernels.arrays import to_numpy
from ringcomp.torch.options import DEFAULTS
from ringcomp.training.config import TRAJECTORY

#: the adapter's options that shape the trajectory: those ``train --resume`` compares
#: (``training.config.TRAJECTORY``), plus gradient accumulation, which ``train`` lacks. A
#: state saved under others is refused; ``shadow`` only measures, so it may differ.
TRAJECTORY_OPTIONS = tuple(sorted(k for k in DEFAULTS
                                  if k in TRAJECTORY or k == "backward_passes_per_step"))


def as_tensors(state: dict) -> dict:
    """``state``'s arrays (host or device) as CPU tensors of their own memory: what
    ``torch.load(weights_only=True)`` reads back."""
    return {k: torch.from_numpy(np.array(to_numpy(v))) for k, v in state.items()}


def as_arrays(state: dict) -> dict:
    """The inverse of ``as_tensors`` (tensors or arrays in, host NumPy arrays out)."""
    return {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
            for k, v in state.items()}


def saved_options(opt) -> dict:
    """The options of ``opt`` a saved state must share, and its rank count."""
    o = opt.options
    # the compressor as its canonical spec ("topk" and "topk:ratio=0.01" are one choice)
    return {**{k: getattr(o, k) for k in TRAJECTORY_OPTIONS},
            "compressor": opt.compressor.spec() if opt.compressor is not None else "none",
            "ranks": opt.transport.size}


def ringcomp_state(opt) -> dict:
    """What ``state_dict()`` keeps under ``"ringcomp"`` (``rank``: whose per-rank state -
    residuals, Marsit's compensation - it holds)."""
    return {"options": saved_options(opt), "steps": opt.steps, "rank": opt.transport.rank,
            "marsit": as_tensors(opt.rule.state) if opt.rule else {},
            "feedback": (as_tensors(opt.reducer.feedback.state_dict())
                         if opt.reducer.feedback else {}),
            "compressor": as_tensors(opt.compressor.state_dict()) if opt.compressor else {}}


def check_saved_options(ours: dict, current: dict) -> None:
    """Refuse a state saved under other options or another rank count, naming them (a
    state without options, e.g. built by hand from a checkpoint, is not checked)."""
    saved = ours.get("options")
    if saved is None:
        return
    differing = [k for k in current if saved.get(k) != current[k]]
    if differing:
        raise ValueError("ringcomp.torch: this optimizer state was saved with other options: "
                         + ", ".join(f"{k}={saved.get(k)!r} (now {current[k]!r})"
                                     for k in differing)
                         + ". Make the optimizer with the saved options to resume")


#: the recipe that resumes a run with per-rank state (docs/torch.md)
PER_RANK_RECIPE = ("save one file per rank (torch.save(opt.state_dict(), f'opt-{rank}.pt') on "
                   "every rank) and have each rank load its own")


def per_rank_content(ours: dict) -> list[str]:
    """What in a saved ringcomp state belongs to the rank that saved it: each rank's
    error-feedback residuals and Marsit's compensation differ (they are what that rank's
    compression lost); [] when there is none (a fresh optimizer, an exact one)."""
    return [name for name, key in (("error-feedback residuals", "feedback"),
                                   ("Marsit's compensation", "marsit")) if ours.get(key)]


def check_own_rank(ours: dict, rank: int) -> None:
    """Refuse to load another rank's per-rank state: it would resume a trajectory that
    never was, without a word (a state without a rank, built by hand, is not checked)."""
    saved = ours.get("rank")
    content = per_rank_content(ours)
    if saved is not None and saved != rank and content:
        raise ValueError(f"ringcomp.torch: this optimizer state was saved on rank {saved} and "
                         f"holds its {' and '.join(content)}; loaded on rank {rank} the run "
                         f"would go on from another rank's state. To resume, {PER_RANK_RECIPE}")
