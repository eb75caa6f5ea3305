"""Which algorithm x compressor x optimizer x error-feedback combinations mean something."""

from __future__ import annotations

import functools
import warnings

import numpy as np

from ringcomp.api import algorithm_options, algorithms
from ringcomp.checks import LocalError, parse_torus
from ringcomp.compression.base import Key, get_compressor

#: elements of the seeded vector error feedback's contraction is probed on
PROBE_ELEMENTS = 16384


def contraction(comp) -> float:
    """``||x - decode(encode(x))|| / ||x||`` for a seeded standard normal ``x`` (the same
    on every rank). Error feedback keeps that difference as its residual: below 1 the
    residual stays bounded; at or above 1 it grows every step, at any learning rate,
    until training diverges (a Gaussian vector has no heavy hitters: the hardest case for
    a compressor that keeps the largest values). Probed once per spec, on a compressor of
    its own: the caller's (and any state it keeps) is never touched."""
    return _contraction(comp.spec())


@functools.cache
def _contraction(spec: str) -> float:
    comp = get_compressor(spec)
    x = np.random.default_rng(0).standard_normal(PROBE_ELEMENTS).astype(np.float32)
    y = comp.decode(comp.encode(x, Key(seed=0)), x.size, np.empty_like(x))
    return float(np.linalg.norm(x - y) / np.linalg.norm(x))


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
    if error_feedback and (ratio := contraction(comp)) >= 1:
        warnings.warn(f"error feedback with {comp.spec()} amplifies the error it keeps "
                      f"(||x - C(x)|| = {ratio:.2f} ||x|| on a Gaussian vector): its "
                      f"residual grows every step and training may diverge at any rate; "
                      f"keep fewer values or use a compressor that is contractive",
                      RuntimeWarning, stacklevel=2)
    if algorithm not in algorithms():
        raise ValueError(f"unknown algorithm {algorithm!r}; known: "
                         f"{', '.join(algorithms())}")
    if torus is not None:
        if "torus" not in algorithm_options(algorithm):
            raise ValueError("a torus shape (--torus, torus=) acts only with the torus "
                             "algorithm")
        try:
            parse_torus(torus, ranks)
        except LocalError as exc:
            raise ValueError(str(exc)) from None
