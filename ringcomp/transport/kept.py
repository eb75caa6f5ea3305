"""What a transport keeps from one call to the next for the layers above it (caches)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True)
class Kept:
    """What a transport keeps from one call to the next, one typed field per use (slots:
    a misspelt field is an error, not a second copy)."""

    local_size: int | None = None  # ranks of the communicator on this node
    local_rank: int | None = None  # this rank's position among them
    node_leader: int | None = None  # the lowest rank on this node
    kernel_threads: int | None = None  # Numba threads per rank (the node's cores shared)
    compressors: OrderedDict = field(default_factory=OrderedDict)  # spec -> Compressor
    plans: OrderedDict = field(default_factory=OrderedDict)  # a plain call's key -> its plan
    error_feedback: object = None  # the ErrorFeedback of error_feedback=True calls
    auto_costs: dict | None = None  # auto's calibrated constants per algorithm
    auto_choices: dict = field(default_factory=dict)  # (bytes, candidates) -> choice
    auto_last: str | None = None  # what auto ran last (for benchmarks and tests)
    torus_auto: tuple | None = None  # torus="auto"'s (rows, columns)
    scratch: dict = field(default_factory=dict)  # (slot, array module, dtype) -> array
    walk_buffers: dict = field(default_factory=dict)  # ranks -> a compiled walk's buffers
