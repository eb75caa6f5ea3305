"""What the suites run over, read from the registries: a new compressor or algorithm is
covered without editing a test."""

from __future__ import annotations

import ringcomp
from ringcomp.collectives import compressed_algorithms
from ringcomp.compression import get_compressor

#: specs for the small vectors of the suites where a compressor's defaults keep too little
#: to tell anything (1% of 777 elements is 7); any registered name not listed runs as named
SMALL_VECTOR_SPECS = {"topk": "topk:ratio=0.1", "randomk": "randomk:ratio=0.3",
                      "qsgd": "qsgd:levels=8", "countsketch": "countsketch:ratio=0.5:rows=3:keep=1"}


def hop_compressors() -> list[str]:
    """Every registered compressor whose payloads the hops carry (all but ``none`` and
    those that wrap an exact all-reduce, as PowerSGD's factors), as a spec for small
    vectors."""
    return [SMALL_VECTOR_SPECS.get(name, name) for name in ringcomp.compressors()
            if name != "none" and not get_compressor(name).wraps_exact]


def all_compressors() -> list[str]:
    """Every registered compressor but ``none``, as a spec for small vectors."""
    return [SMALL_VECTOR_SPECS.get(name, name) for name in ringcomp.compressors()
            if name != "none"]


def exact_algorithms() -> list[str]:
    """Every registered all-reduce algorithm."""
    return ringcomp.algorithms()


def compressed_schemes() -> list[str]:
    """Every algorithm with a compressed form."""
    return compressed_algorithms()
