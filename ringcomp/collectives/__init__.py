"""Collective algorithms, one file each, written against the Transport only."""

from ringcomp.collectives import auto, dbtree, mpi, rabenseifner, rd, ring, tree  # noqa: F401
from ringcomp.collectives.base import REGISTRY, Algorithm, Ctx, register

__all__ = ["REGISTRY", "Algorithm", "Ctx", "register"]
