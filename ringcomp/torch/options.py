"""The options ringcomp.torch takes, checked alike on every rank, and the reducer they make."""

from __future__ import annotations

import types

from ringcomp.compression import ErrorFeedback, get_compressor
from ringcomp.kernels import backends
from ringcomp.training.combination import check_combination
from ringcomp.training.config import RULES, agree, collective_options
from ringcomp.training.engine import CommEngine
from ringcomp.training.reducer import Reducer

#: option -> default, for the DistributedOptimizer (the DDP hook takes HOOK_OPTIONS)
DEFAULTS = {"algorithm": "ring", "compressor": "none", "error_feedback": False, "seed": 0,
            "segment_bytes": 0, "shadow": False, "bucket_mb": 1.0, "small_tensor": 1024,
            "backward_passes_per_step": 1, "warmup_steps": 0, "torus": None}
HOOK_OPTIONS = ("algorithm", "compressor", "error_feedback", "seed", "segment_bytes", "shadow",
                "torus")


def checked(transport, options: dict, allowed, who: str, marsit_optimizer: bool):
    """``options`` over the defaults as a namespace, with its compressor, after refusing
    unknown names (TypeError), nonsense values and meaningless combinations (ValueError)
    and agreeing across ranks (a ValueError on every rank naming what differs)."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"{who} got unknown options {unknown}; known: {sorted(allowed)}")
    o = types.SimpleNamespace(**{**{k: DEFAULTS[k] for k in allowed}, **options})
    for name in ("bucket_mb", "small_tensor", "seed", "segment_bytes", "warmup_steps"):
        if name in allowed:
            rule, text = RULES[name]
            if not rule(getattr(o, name)):
                raise ValueError(f"{name}={getattr(o, name)!r}: must be {text}")
    if getattr(o, "backward_passes_per_step", 1) < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got "
                         f"{o.backward_passes_per_step}")
    agree(transport, o)
    compressor = get_compressor(o.compressor)
    check_combination(compressor, o.algorithm, marsit_optimizer, o.error_feedback, o.torus,
                      transport.size)
    if o.shadow and compressor is None:
        raise ValueError("shadow=True needs a compressor (it records compressed hops' "
                         "error against the exact sums)")
    if getattr(o, "warmup_steps", 0) and compressor is None:
        raise ValueError("warmup_steps acts only with a compressor")
    return o, compressor


def reducer(transport, o, compressor, buckets, xp, tracer=None, *, rule=None,
            rebuckets: bool = False) -> Reducer:
    """The step's core (``ringcomp.training.reducer``) over a background engine running
    the collectives the options ask for; ``tracer`` (a ``ringcomp.trace.Tracer``; tracing
    is each rank's own choice) records every hop, with the shadow error where asked.
    ``rule``: Marsit's flat update rule, or None (the torch optimizer applies the averaged
    gradients). ``rebuckets``: bucket sizes change by design (DDP rebuilds its buckets
    after the first iteration), so a replaced residual is not warned about."""
    backends.quiet_threads()  # Numba's OpenMP threads would spin beside PyTorch's
    feedback = ErrorFeedback(warn_on_replace=not rebuckets) if o.error_feedback else None
    engine = CommEngine(transport.comm, algorithm=o.algorithm, compressor=compressor,
                        error_feedback=feedback or False, seed=o.seed,
                        options=collective_options(o), tracer=tracer, shadow=o.shadow)
    return Reducer(engine, buckets, compressor, feedback, xp, rule=rule,
                   warmup_steps=getattr(o, "warmup_steps", 0))
