"""One posted send or receive of a transport: what completing it needs and keeps alive."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Pending:
    """One posted send or receive; ``finish`` runs after completion (unstaging a GPU recv).

    A send of a CuPy buffer is held (``request`` None) until its ``ready`` event passed:
    the transport posts it, with ``message``, once the GPU got there (``Transport.isend``).
    """

    request: object
    kind: str
    peer: int
    nbytes: int
    tag: int
    finish: object = None
    t_post: float = 0.0
    keep: object = None  # a host staging copy that must outlive the send
    ready: object = None  # the CUDA event a held send waits for
    message: object = None  # a held send's MPI message spec
    counted: bool = False  # a receive whose arrived bytes were checked (``Transport``)
