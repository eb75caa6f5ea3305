"""Which algorithm x compressor x optimizer x error-feedback combinations mean something."""

from __future__ import annotations

from ringcomp.api import algorithms
from ringcomp.checks import LocalError, parse_torus


def check_combination(comp, algorithm: str, marsit_optimizer: bool,
                      error_feedback: bool, torus=None, ranks: int = 1) -> None:
    """ValueError (the same on every rank: it depends on options only) for a combination
    without meaning: Marsit's signs without Marsit's update (or the update without the
    signs), error feedback without a compressor or beside Marsit's own compensation, an
    unknown algorithm, a torus shape that is not ``ranks`` or without the torus.
    ``comp`` is a Compressor or None (exact)."""
    marsit = comp is not None and comp.signs_only
    if marsit != marsit_optimizer:
        raise ValueError("the marsit compressor returns signs only: it goes with the Marsit "
                         "optimizer (--optimizer marsit, ringcomp.torch.Marsit), and that "
                         "optimizer with it")
    if error_feedback and (comp is None or marsit):
        raise ValueError("error feedback (--error-feedback, error_feedback=True) needs a "
                         "compressor other than marsit (Marsit keeps its own global "
                         "compensation)")
    if algorithm not in algorithms():
        raise ValueError(f"unknown algorithm {algorithm!r}; known: "
                         f"{', '.join(algorithms())}")
    if torus is not None:
        if algorithm != "torus":
            raise ValueError("a torus shape (--torus, torus=) acts only with the torus "
                             "algorithm")
        try:
            parse_torus(torus, ranks)
        except LocalError as exc:
            raise ValueError(str(exc)) from None
