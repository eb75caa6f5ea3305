"""The compressor kit's verdicts: a property's problem found on any rank, raised on every rank."""

from __future__ import annotations

from ringcomp.transport.cache import get_transport


class ContractViolation(AssertionError):
    """A compressor broke a property of its contract (docs/compressors.md); the message
    names the property, the compressor and what was seen."""


def judged(comm, spec: str, prop: str, find) -> None:
    """Run ``find()`` - a problem's description, or None - on every rank of ``comm``; if
    any rank found one (or ``find`` raised there), raise ``ContractViolation`` on every rank
    naming ``prop``, ``spec`` and the lowest such rank's problem: the ranks stay in step
    whatever the verdict (a check failing on one rank alone would leave the others in
    the next check's collective)."""
    try:
        problem = find()
    except Exception as exc:  # a compressor that raises breaks the property too
        problem = f"raised {type(exc).__name__}: {exc}"
    transport = get_transport(comm)
    found = [(rank, text) for rank, text in enumerate(transport.allgather_obj(problem))
             if text]
    if found:
        rank, text = found[0]
        where = f" on rank {rank}" if transport.size > 1 else ""
        raise ContractViolation(f"{prop}: compressor {spec!r}{where}: {text}")
