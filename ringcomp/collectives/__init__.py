"""Collective algorithms, one file each, written against the Transport only."""

from ringcomp.collectives import (  # noqa: F401
    auto,
    dbtree,
    gather,
    mpi,
    rabenseifner,
    rd,
    ring,
    tree,
    twostage,
)
from ringcomp.collectives.base import REGISTRY, Algorithm, Ctx, register

__all__ = ["REGISTRY", "Algorithm", "Ctx", "register"]
