"""The options ringcomp.torch takes, checked alike on every rank, and the reducer they make."""

from __future__ import annotations

import types

from ringcomp.compression import Compressor, get_compressor
from ringcomp.kernels import backends
from ringcomp.training.combination import check_combination
from ringcomp.training.config import OPTIONS, agree, job
from ringcomp.training.reducer import Reducer, make_reducer

#: the adapter's options that are training options too: their defaults and rules are
#: ``train``'s (``training.config.OPTIONS``), defined there once
JOB_OPTIONS = ("algorithm", "compressor", "error_feedback", "seed", "segment_bytes", "shadow",
               "bucket_mb", "small_tensor", "warmup_steps", "torus")
#: option -> default, for the DistributedOptimizer (the DDP hook takes HOOK_OPTIONS)
DEFAULTS = {**{name: OPTIONS[name][0] for name in JOB_OPTIONS}, "backward_passes_per_step": 1,
            "op": "average", "gradient_predivide_factor": 1.0}
#: the reductions Horovod's DistributedOptimizer takes (``op=``), as ringcomp names them
#: (``ringcomp.torch.Average`` / ``Sum``); its Adasum is refused by name
OPTIMIZER_OPS = ("average", "sum")
HOOK_OPTIONS = ("algorithm", "compressor", "error_feedback", "seed", "segment_bytes", "shadow",
                "torus")


def checked(transport, options: dict, allowed, who: str, marsit_optimizer: bool,
            tracer=None):
    """``options`` over the defaults as a namespace, with its compressor, after refusing
    unknown names (TypeError), nonsense values and options that would not act, in the
    words ``ringcomp.train`` uses (``training.config.job``: the same rules), meaningless
    combinations (ValueError), and agreeing across ranks (a ValueError on every rank
    naming what differs)."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"{who} got unknown options {unknown}; known: {sorted(allowed)}")
    o = types.SimpleNamespace(**{**{k: DEFAULTS[k] for k in allowed}, **options})
    # a Compressor object is used as given (resolved once per job: ringcomp.train's
    # trainer hands over the one it checked); its spec stands for it in the checks and
    # the agreement across ranks
    instance = o.compressor if isinstance(o.compressor, Compressor) else None
    if instance is not None:
        o.compressor = instance.spec()
    given = {k: getattr(o, k) for k in JOB_OPTIONS if k in allowed}
    if isinstance(given.get("torus"), (tuple, list)):  # (R, C): the command line's "RxC"
        given["torus"] = "x".join(map(str, given["torus"]))
    job(**given, optimizer="marsit" if marsit_optimizer else "sgd",
        trace="tracer" if tracer is not None else None)
    if "bucket_mb" in allowed and o.bucket_mb != "all":  # one value however it was written
        o.bucket_mb = float(o.bucket_mb)  # (1, 1.0 and train's "1"): states compare it
    if getattr(o, "backward_passes_per_step", 1) < 1:
        raise ValueError(f"backward_passes_per_step={o.backward_passes_per_step!r}: must "
                         f"be >= 1")
    if "op" in allowed:
        _check_reduction(o, who, marsit_optimizer)
    agree(transport, o)
    compressor = get_compressor(instance if instance is not None else o.compressor)
    check_combination(compressor, o.algorithm, marsit_optimizer, o.error_feedback, o.torus,
                      transport.size)
    return o, compressor


def resolved(options: dict, compressor) -> tuple:
    """``checked``'s result for options the caller checked and agreed across ranks already
    (``ringcomp.train``'s, through ``training.config``, and its compressor instance,
    resolved once): the namespace over the defaults, nothing validated or agreed again."""
    o = types.SimpleNamespace(**{**DEFAULTS, **options})
    o.compressor = "none" if compressor is None else compressor.spec()
    if o.bucket_mb != "all":
        o.bucket_mb = float(o.bucket_mb)
    return o, compressor


def _check_reduction(o, who: str, marsit_optimizer: bool) -> None:
    """Horovod's ``op=`` and ``gradient_predivide_factor=`` with Horovod's meaning: the
    gradients averaged (default) or summed over ranks; with a factor f, divided by f
    before the all-reduce and multiplied by f / size after (Average only, as Horovod)."""
    if o.op == "adasum":
        raise ValueError(f"{who}: op=Adasum is Horovod's own reduction; ringcomp does not "
                         f"have it (use Average or Sum, with a compressor if you like)")
    if o.op not in OPTIMIZER_OPS:
        raise ValueError(f"{who}: op={o.op!r}; the optimizer reduces with Average or Sum")
    factor = o.gradient_predivide_factor
    if (isinstance(factor, bool) or not isinstance(factor, (int, float))
            or not 0 < factor < float("inf")):
        raise ValueError(f"{who}: gradient_predivide_factor={factor!r}: must be a finite "
                         f"number > 0")
    o.gradient_predivide_factor = float(factor)
    if factor != 1.0 and o.op != "average":
        raise ValueError(f"{who}: gradient_predivide_factor acts only with op=Average (as "
                         f"in Horovod)")
    if marsit_optimizer and (o.op != "average" or factor != 1.0):
        raise ValueError(f"{who}: op= and gradient_predivide_factor= do not act with Marsit "
                         f"(its ranks exchange signs, not gradients to average)")


def reducer(transport, o, compressor, buckets, xp, tracer=None, *, rule=None,
            rebuckets: bool = False) -> Reducer:
    """``training.reducer.make_reducer`` for the adapter, after quieting Numba's OpenMP
    threads (they would spin beside PyTorch's)."""
    backends.quiet_threads()
    return make_reducer(transport.comm, o, compressor, buckets, xp, tracer=tracer, rule=rule,
                        rebuckets=rebuckets)
