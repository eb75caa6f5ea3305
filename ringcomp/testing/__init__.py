"""The compressor kit: check a compressor against its contract (docs/compressors.md).

``check_compressor(spec)`` runs every check on every rank of a communicator and raises
``ContractViolation`` - on every rank, naming the property - at the first one broken. Under
pytest, subclass ``ringcomp.testing.contract.CompressorContract`` (one test per property), or
name the compressor on the command line: ``mpiexec -n 3 python -m pytest --with-mpi
--compressor-contract SPEC`` (the ``ringcomp.testing.plugin`` pytest plugin, installed with
ringcomp)."""

from __future__ import annotations

from ringcomp.testing.codec_checks import (
    bytes_as_declared,
    codecs,
    decodes_into_out,
    finite_within_range,
    pure,
    unbiased,
)
from ringcomp.testing.collective_checks import (
    error_feedback_invariant,
    hop_rule_as_declared,
    matches_replay,
    refuses_non_finite,
    state_round_trip,
)
from ringcomp.testing.verdict import ContractViolation

#: every check, in the order a failure is most telling: the codec alone, then in the
#: collectives (each a function ``check(spec, comm=None)``)
CHECKS = {"bytes as declared": bytes_as_declared, "decode fills out": decodes_into_out,
          "encode is pure": pure, "finite within its range": finite_within_range,
          "unbiased": unbiased, "hop rule as declared": hop_rule_as_declared,
          "hop composition": matches_replay, "error feedback's invariant":
          error_feedback_invariant, "state dict round trip": state_round_trip,
          "non-finite refused": refuses_non_finite}


def not_applicable(prop: str, comp) -> str | None:
    """Why ``prop`` does not apply to the compressor ``comp`` (a reason to skip), or None."""
    if prop == "unbiased" and not comp.unbiased:
        return "the compressor does not claim unbiased"
    if prop == "hop rule as declared" and comp.wraps_exact:
        return "no hop rule: it wraps an exact all-reduce"
    if prop == "error feedback's invariant" and comp.signs_only:
        return "signs only: Marsit's global compensation, not error feedback"
    return None


def check_compressor(spec: str, comm=None) -> list[str]:
    """Run every check on ``spec`` (a registered compressor's spec string) on every rank of
    ``comm`` (default: the world); returns the properties checked (those that apply).
    Raises ``ContractViolation`` on every rank at the first property broken."""
    comp, checked = codecs(spec), []
    for prop, check in CHECKS.items():
        if not_applicable(prop, comp) is None:
            check(spec, comm)
            checked.append(prop)
    return checked


__all__ = ["CHECKS", "ContractViolation", "check_compressor", "not_applicable"]
