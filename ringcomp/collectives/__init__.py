"""Collective algorithms, one file each, written against the Transport only."""

from ringcomp.collectives import (  # noqa: F401  (importing registers them)
    auto,
    compressed_dbtree,
    compressed_ring,
    compressed_tree,
    dbtree,
    gather,
    mpi,
    rabenseifner,
    rd,
    ring,
    tree,
    twostage,
)
from ringcomp.collectives.base import (
    REGISTRY,
    Algorithm,
    Ctx,
    compressed_algorithms,
    register,
    register_compressed,
)

__all__ = ["REGISTRY", "Algorithm", "Ctx", "compressed_algorithms", "register",
           "register_compressed"]
