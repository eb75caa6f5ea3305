"""The step's core, framework-neutral: buckets -> background all-reduce -> optimizer rule."""

from __future__ import annotations

import contextlib

from ringcomp.compression import ErrorFeedback
from ringcomp.training.config import collective_options
from ringcomp.training.engine import CommEngine, load_kernels

#: the largest exact bucket that rides in the compressed call before it (``_rider_after``):
#: below this a call's cost is its latency, which riding saves
RIDER_BYTES = 64 << 10


class Reducer:
    """What a data-parallel step does between backward and the update, in Horovod's verbs,
    for the NumPy trainer, ``ringcomp.torch.DistributedOptimizer`` and the DDP hook alike
    (as PyTorch DDP's one C++ ``Reducer`` under its Python bindings). A binding gathers a
    bucket's gradient from its own storage and says when; the reducer does the rest.

    1. ``submit(bucket, gradient, params, step)`` once the bucket's last gradient is final:
       whether it compresses (``compresses``: not in warm-up, not on Marsit-K's full
       rounds), the rule's preparation (Marsit's ``lr·g + c``), and the hand-off to the
       background engine, which all-reduces buckets in submission order; a compressed
       bucket followed by the step's last bucket, exact and small, waits for it and
       carries it in its call (``_rider_after``).
    2. ``synchronize()``: wait for every submitted bucket, in order.
    3. ``apply(params, reduced, step)``: the rule's update from the reduced buckets; or
       ``skip(reduced)`` / ``discard()`` to give the step up on every rank alike.

    Invariants: every rank submits the same buckets in the same order (the bindings submit
    in bucket order); a bucket's error-feedback residual and the compressor's state belong
    to the bucket layout, so ``rebucket`` moves the residuals with their elements and
    starts the compressor afresh.

    ``rule``: an optimizer rule with ``prepare``/``apply``/``skip`` over flat slices
    (``ringcomp.training.optim``), or None where the framework's own optimizer applies the
    averaged gradients (the binding divides them).
    """

    def __init__(self, engine, buckets, compressor, feedback: ErrorFeedback | None, xp, *,
                 rule=None, warmup_steps: int = 0, marsit_k: int = 0):
        self.engine, self.compressor, self.feedback, self.xp = engine, compressor, feedback, xp
        self.rule, self.warmup_steps, self.marsit_k = rule, warmup_steps, marsit_k
        self.pending: list = []  # (bucket, compressed, future), in submission order
        self.held = None  # (bucket, gradient, step, before): waits for its rider
        self.set_buckets(buckets)

    def set_buckets(self, buckets) -> None:
        """Fuse gradients into ``buckets`` from the next step on (residuals stay keyed by
        the old ones: ``rebucket`` moves them)."""
        if self.pending or self.held is not None:
            raise RuntimeError("new buckets between backward and the update: buckets of "
                               "this step are already travelling")
        self.buckets = list(buckets)
        self.bucket_of = {m: b for b in self.buckets for m in b.members}

    def compresses(self, step: int) -> bool:
        """Whether ``step`` compresses: with a compressor, after the warm-up, and not on
        Marsit-K's full-precision rounds (every ``marsit_k``-th step)."""
        if self.compressor is None or step < self.warmup_steps:
            return False
        return not (self.marsit_k and (step + 1) % self.marsit_k == 0)

    # -- the verbs ---------------------------------------------------------------------
    def submit(self, bucket, gradient, params, step: int, before=None) -> None:
        """Hand ``bucket``'s ``gradient`` (its pieces side by side, as ``bucket.gather``
        gives them; not written again by the caller) to the engine, prepared by the rule.
        ``params``: the flat parameters the rule reads (None without a rule); ``before``:
        called on the engine's thread ahead of the collective (a GPU stream hand-over)."""
        compressed = bucket.compressed and self.compresses(step)
        if self.rule is not None:
            parts = [self.rule.prepare(part, params[lo:hi], lo, hi, compressed)
                     for lo, hi, part in bucket.split(gradient)]
            gradient = parts[0] if len(parts) == 1 else self.xp.concatenate(parts)
        if self.held is not None and (bucket.index != self.held[0].index + 1 or compressed
                                      or step != self.held[2]):
            self._send_held()  # not the rider it waited for (a binding out of order): alone
        if self.held is not None:  # the rider this compressed bucket waited for
            carrier, carried, _, carrier_before = self.held
            self.held = None
            futures = self.engine.submit(carried, step=step, bucket=carrier.index,
                                         compressed=True, before=carrier_before,
                                         rider=(gradient, bucket.index, before))
            self.pending += [(carrier, True, futures[0]), (bucket, False, futures[1])]
        elif compressed and self._rider_after(bucket, gradient.dtype.itemsize):
            self.held = (bucket, gradient, step, before)
        else:
            self.pending.append((bucket, compressed,
                                 self.send(gradient, bucket.index, step, compressed, before)))

    def _rider_after(self, bucket, itemsize: int) -> bool:
        """Whether compressed ``bucket`` waits for the bucket after it, to carry it in its
        call (``CommEngine.submit(rider=...)``): when that one is the step's last, exact
        and small (``RIDER_BYTES``; the small tensors' bucket, ready at the end of backward,
        whose own call would cost its whole latency again: at 4 ranks on 2 cores, Marsit's
        default MLP job took 1.6x the exact one's time with it, 1.3x riding,
        docs/records/train-time-p4.json). The
        wait is bounded by the backward of the layers after ``bucket``'s last tensor,
        which are all in that small bucket. Decided by the bucket layout alone, so every
        rank decides alike."""
        after = bucket.index + 1
        return (after == len(self.buckets) - 1 and not self.buckets[after].compressed
                and self.buckets[after].size * itemsize <= RIDER_BYTES
                and self.engine.carries_riders)

    def _send_held(self) -> None:
        """A compressed bucket still waiting for its rider goes alone (a binding that
        synchronizes before submitting every bucket)."""
        if self.held is not None:
            bucket, gradient, step, before = self.held
            self.held = None
            self.pending.append((bucket, True, self.send(gradient, bucket.index, step, True,
                                                         before)))

    def send(self, gradient, index: int, step: int, compressed: bool, before=None):
        """The all-reduce of one bucket's ``gradient`` queued on the engine, outside the
        step's bookkeeping: a Future of the sum. For a binding whose framework keeps its
        own buckets and waits itself (the DDP comm hook)."""
        return self.engine.submit(gradient, step=step, bucket=index, compressed=compressed,
                                  before=before)

    def synchronize(self) -> list:
        """Wait for every submitted bucket: [(bucket, compressed, reduced sum)]."""
        self._send_held()
        pending, self.pending = self.pending, []
        return [(b, compressed, future.result()) for b, compressed, future in pending]

    def apply(self, params, reduced: list, step: int) -> None:
        """The rule's update of the flat ``params`` from ``synchronize``'s result."""
        ranks = self.engine.transport.size
        for b, compressed, array in reduced:
            for lo, hi, part in b.split(array):
                self.rule.apply(params[lo:hi], part, lo, hi, ranks, step, compressed)

    def skip(self, buckets) -> None:
        """Tell the rule these buckets' step is given up (Marsit drops what it prepared)."""
        if self.rule is not None:
            for b in buckets:
                for lo, _ in b.pieces:
                    self.rule.skip(lo)

    def discard(self) -> None:
        """Give the step up: wait for every submitted bucket (all ranks stay in step) and
        drop the results - a refusal every rank raised alike (NaN in a compressed bucket)
        included; transport failures still propagate."""
        self._send_held()
        pending, self.pending = self.pending, []
        for _, _, future in pending:
            with contextlib.suppress(ValueError, FloatingPointError):
                future.result()
        self.skip(b for b, _, _ in pending)

    # -- layout and state --------------------------------------------------------------
    def flat_residuals(self, size: int):
        """This rank's worker error-feedback residuals laid out like the ``size`` flat
        parameters (zeros where a bucket has none)."""
        flat = self.xp.zeros(size, "float32")
        for b in self.buckets:
            residual = self.feedback.residuals.get(ErrorFeedback.key(b.index, b.size))
            if residual is not None:
                for lo, hi, part in b.split(residual):
                    flat[lo:hi] = part
        return flat

    def rebucket(self, buckets, size: int) -> None:
        """Switch to new buckets between steps. Worker error-feedback residuals move with
        their elements (scattered to the flat layout of ``size`` elements, gathered into
        the new buckets); the two-stage server residuals and PowerSGD's warm start are
        tied to the old buckets' chunks and start afresh."""
        if self.feedback is not None:
            flat = self.flat_residuals(size)
            self.feedback.load_state_dict({ErrorFeedback.key(b.index, b.size): b.gather(flat)
                                           for b in buckets if b.compressed})
        if self.compressor is not None:
            self.compressor.load_state_dict({})
        self.set_buckets(buckets)

    def state_dict(self) -> dict:
        """Error-feedback residuals and compressor state (PowerSGD's warm start), arrays
        where they live."""
        return {"feedback": self.feedback.state_dict() if self.feedback else {},
                "compressor": self.compressor.state_dict() if self.compressor else {}}

    def load_state_dict(self, state: dict, local=lambda arrays: arrays) -> None:
        """Take over ``state_dict``'s result; ``local`` moves its arrays where this run
        keeps them (onto its GPU, say)."""
        if self.feedback is not None:
            self.feedback.load_state_dict(local(state.get("feedback", {})))
        if self.compressor is not None:
            self.compressor.load_state_dict(local(state.get("compressor", {})))

    def close(self) -> None:
        self.engine.close()


def make_reducer(comm, options, compressor, buckets, xp, *, tracer=None, rule=None,
                 on_start=None, rebuckets: bool = False) -> Reducer:
    """The one way a reducer is made, for the NumPy trainer, the DistributedOptimizer and
    the DDP hook alike: a background engine on ``comm`` running the collectives
    ``options`` asks for (``algorithm``, ``seed``, ``shadow``, ``segment_bytes``, ``torus``,
    ``error_feedback``; ``warmup_steps`` and ``marsit_k`` where the caller has them), with
    the job's one ``compressor`` (resolved once, by the caller's option check).

    ``tracer`` records every hop; ``rule``: the flat update rule, or None where the
    framework's optimizer applies the averaged gradients; ``on_start``: run first on the
    engine's thread (binding the rank's GPU); ``rebuckets``: bucket sizes change by design
    (DDP rebuilds its buckets after the first iteration), so a replaced residual is not
    warned about."""
    feedback = (ErrorFeedback(warn_on_replace=not rebuckets) if options.error_feedback
                else None)

    def start():  # on the engine's thread, before the first bucket: nothing of it is timed
        if on_start is not None:
            on_start()
        load_kernels(compressor, xp, options.algorithm)

    engine = CommEngine(comm, algorithm=options.algorithm, compressor=compressor,
                        error_feedback=feedback or False, seed=options.seed,
                        options=collective_options(options), tracer=tracer,
                        shadow=options.shadow, on_start=start)
    return Reducer(engine, buckets, compressor, feedback, xp, rule=rule,
                   warmup_steps=getattr(options, "warmup_steps", 0),
                   marsit_k=getattr(options, "marsit_k", 0))
