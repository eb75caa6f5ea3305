"""Horovod's DistributedOptimizer over ringcomp: buckets all-reduced during backward, any
algorithm x compressor, averaged before the wrapped optimizer's step."""

from __future__ import annotations

import contextlib
import warnings

import torch

from ringcomp.torch import joining, timeline
from ringcomp.torch.flat import FlatGradients, handover
from ringcomp.torch.marsit_optimizer import Marsit
from ringcomp.torch.options import DEFAULTS, checked, reducer
from ringcomp.torch.state import (
    as_arrays,
    check_own_rank,
    check_saved_options,
    ringcomp_state,
    saved_options,
)
from ringcomp.training.buckets import plan_buckets
from ringcomp.training.optim import MarsitRule
from ringcomp.transport.agree import everywhere
from ringcomp.transport.cache import get_transport


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, *,
                         comm=None, tracer=None, **options):  # noqa: N802 - Horovod's name
    """Make ``optimizer`` data-parallel over MPI, as Horovod's function of the same name.

    The result is an instance of a subclass of ``optimizer``'s class that takes over its
    state (use it instead of ``optimizer``): gradient hooks hand a bucket to ringcomp's
    background engine as soon as its last gradient is ready (wait-free backward), ``step``
    waits for every bucket, averages over ranks and then runs the wrapped step.

    Args:
        optimizer: any ``torch.optim.Optimizer`` over float32 parameters on one device.
        named_parameters: ``model.named_parameters()``, for names in errors and state;
            default: the optimizer's parameters, named by position.
        comm: an mpi4py communicator, a ``ringcomp.Transport``, or None (the world).
        tracer: a ``ringcomp.trace.Tracer`` recording every hop of every bucket (this
            rank's choice; write it with ``tracer.write(opt.reducer.engine.transport)``).
        algorithm: ``ringcomp.algorithms()`` name (default ring).
        compressor: name or spec, e.g. ``"topk:ratio=0.01"`` (default none: exact), or a
            ``ringcomp.Compressor`` object, used as given. Horovod's ``compression=``
            (``ringcomp.torch.Compression.none`` / ``.fp16``) is taken for it.
        error_feedback: keep each rank's compression residual per bucket.
        bucket_mb: fusion bucket size in MB (0: one bucket per tensor; ``"all"``: one
            bucket for the model).
        small_tensor: tensors with fewer elements travel uncompressed (as the trainer's;
            0 where Horovod's ``compression=`` is given: Horovod compresses every tensor).
        seed: keys every random choice of the compressors.
        backward_passes_per_step: local backward passes (gradient accumulation) per step;
            gradients are summed over passes and averaged over ranks.
        segment_bytes: the collective's pipelining segment (0: its default).
        shadow: with a compressor and a tracer, also record each compressed hop's error
            against the exact partial sum of the same ranks.
        warmup_steps: the first steps travel uncompressed (with a compressor).
        torus: with ``algorithm="torus"``, its shape "RxC" (default: one row per node).
        op: Horovod's ``op=``: ``ringcomp.torch.Average`` (default) or ``Sum`` over ranks
            (Adasum is refused).
        gradient_predivide_factor: Horovod's: with Average, the gradients are divided by
            it before the all-reduce and multiplied by it over the ranks' number after.

    Every rank must pass the same options (checked: a ValueError on every rank names the
    differing ones); combinations without meaning are refused as by ``ringcomp.train``.
    """
    if "compression" in options:  # Horovod's keyword: hvd.Compression.none / .fp16
        if "compressor" in options:
            raise TypeError("DistributedOptimizer: give compressor= or Horovod's compression=, "
                            "not both")
        compression = options.pop("compression")
        if compression is not None:
            options["compressor"] = compression
            # Horovod's fp16 compresses every tensor: ringcomp's own default leaves those
            # under small_tensor elements exact (their codec costs more than it saves)
            options.setdefault("small_tensor", 0)
    # (``ringcomp.train``'s binding hands over its options checked and agreed already,
    # ``options.resolved``: they are not validated and agreed a second time)
    resolved = options.pop("_resolved", None)
    cls = type(type(optimizer).__name__, (_Distributed, type(optimizer)), {})
    distributed = cls.__new__(cls)
    distributed.__dict__.update(optimizer.__dict__)  # param_groups, state, defaults, hooks
    distributed.wrapped_class = type(optimizer)
    distributed._ringcomp_setup(named_parameters, comm, tracer, options, resolved)
    return distributed


class _Distributed:
    """The methods a DistributedOptimizer adds to (or puts before) the wrapped class's."""

    def _ringcomp_setup(self, named_parameters, comm, tracer, options: dict,
                        resolved=None) -> None:
        self._given = (dict(options), tracer, resolved)  # what rebuild() sets up again
        self.transport = transport = get_transport(comm)
        self.options, self.compressor = resolved or checked(
            transport, options, DEFAULTS, "DistributedOptimizer", isinstance(self, Marsit),
            tracer)
        o = self.options
        # the parameters are checked on each rank: a problem on one is raised on all (the
        # engine below duplicates the communicator, which would wait for a failed rank)
        self.flat = everywhere(transport, lambda: FlatGradients(_named(
            self, named_parameters)), raise_as=ValueError)
        # Marsit's rule updates flat slices of the parameters from the aggregated signs
        self.rule, self.params = None, None
        if isinstance(self, Marsit):
            group = self.param_groups[0]
            self.rule = MarsitRule(self.flat.size, group["lr"], group["global_lr"],
                                   group["momentum"], group["weight_decay"], xp=self.flat.xp)
            self.params = self.flat.flatten_parameters()
        bucket = None if o.bucket_mb == "all" else float(o.bucket_mb) * (1 << 20)
        if tracer is None:  # hvd.start_timeline() records its buckets (``timeline``)
            tracer = timeline.follow(self)
        self.reducer = reducer(transport, o, self.compressor, plan_buckets(
            self.flat.infos, bucket, o.small_tensor if self.compressor is not None else 0),
            self.flat.xp, tracer, rule=self.rule)
        self._new_step()
        self.steps, self._skip, self._synchronized, self.closed = 0, False, False, False
        # after hvd.init(): each step is announced to ranks in hvd.join() (``joining``)
        self.join_number, self._mirroring = joining.register(self), False
        self.handles = [p.register_post_accumulate_grad_hook(self._grad_ready)
                        for _, p in self.flat.named]
        # before each accumulation into p.grad (and only then: not for autograd.grad):
        # kept alive here, as Horovod keeps its gradient accumulators
        self.accumulators = [_accumulator(p) for _, p in self.flat.named]
        self.handles += [node.register_prehook(self._before_accumulation(i))
                         for i, node in enumerate(self.accumulators)]

    def set_buckets(self, buckets) -> None:
        """Fuse gradients into ``buckets`` (``ringcomp.training.buckets.Bucket``s over the
        flat layout, e.g. a ``--plan``'s) from the next step on; every rank the same.
        Call it between steps (not between backward and ``step``)."""
        self.reducer.set_buckets(buckets)
        self._new_step()

    def rebucket(self, buckets) -> None:
        """``set_buckets``, with each rank's error-feedback residuals moved along with
        their elements and the compressor's state (PowerSGD's warm start, tied to the old
        buckets) started afresh."""
        self.reducer.rebucket(buckets, self.flat.size)
        self._new_step()

    # -- backward: buckets leave as soon as they are complete, in bucket order ----------
    def rebuild(self, named_parameters=None) -> None:
        """Take the wrapped optimizer's parameters as they are now - after
        ``add_param_group``, or a layer frozen or unfrozen (``requires_grad``) - on every
        rank alike, between steps: a new flat buffer, buckets and engine. The step count
        goes on; error-feedback residuals and compressor state (per bucket of the old
        layout) start afresh. A step over parameters that changed without it is refused
        (``_check_parameters``)."""
        self._refuse_if_closed("rebuild()")
        if self.step_in_flight():
            raise RuntimeError("ringcomp.torch: rebuild() between backward() and step(): "
                               "call it between steps")
        steps, (options, tracer, resolved) = self.steps, self._given
        self.close()
        self._ringcomp_setup(named_parameters, self.transport, tracer, options, resolved)
        self.steps = steps

    def _check_parameters(self) -> None:
        """Refuse a step over parameters other than those wrapped (checked once a step,
        before anything of it is accumulated or sent): a parameter group added after
        wrapping, or a layer whose ``requires_grad`` changed, would be stepped on this
        rank's own gradient (or a frozen one on zeros) and the ranks would drift apart
        without a word."""
        now = {id(p) for group in self.param_groups for p in group["params"]
               if p.requires_grad}
        wrapped = self.flat.index.keys()  # the flat buffer's order is backward's: a set
        if now != wrapped:
            added = len(now - wrapped)
            raise RuntimeError(
                f"ringcomp.torch: the optimizer's parameters changed after "
                f"DistributedOptimizer wrapped them ({added} not all-reduced, "
                f"{len(wrapped - now)} no longer trained: add_param_group, or "
                f"requires_grad changed). Nothing of this step was accumulated or sent; call "
                f"opt.rebuild(model.named_parameters()) on every rank, then run the step "
                f"again")
        self._parameters_checked = True  # only once it passed: a retry is checked again

    def _new_step(self) -> None:
        self._parameters_checked = False
        self.passes = [0] * len(self.flat.named)  # backward passes seen per parameter
        self.left = [len(b.members) for b in self.reducer.buckets]  # members not yet final
        self.submitted = 0  # buckets handed to the reducer, in bucket order
        self.reduced: list = []  # (bucket, compressed, sum or signs) for Marsit's step

    def _before_accumulation(self, i: int):
        """The pre-hook of parameter i's gradient accumulator: a backward after
        ``synchronize()`` is refused before autograd adds anything to the averaged
        ``p.grad`` - the first accumulation of that backward raises, so no parameter's
        average has changed and ``step()`` inside ``skip_synchronize()`` still applies
        it. (An accumulator runs for backward only, not for ``torch.autograd.grad``.)"""

        def refuse_after_synchronize(grad_outputs):
            if not self._parameters_checked:
                self._check_parameters()
            if self._synchronized:
                raise RuntimeError(
                    f"ringcomp.torch: backward() reached {self.flat.named[i][0]!r} after "
                    f"synchronize() and before step(): the averaged gradients are left as "
                    f"they were. Call step() (inside skip_synchronize()) before the next "
                    f"backward()")
            return None

        return refuse_after_synchronize

    def _grad_ready(self, p: torch.Tensor) -> None:
        """A backward pass has accumulated ``p``'s gradient: count it, and send every
        bucket that is now complete. A pass the step has no room for is refused: its
        bucket has left, and the all-reduce would overwrite it with the average of the
        earlier passes without a word (Horovod asserts alike). (Checked here, after
        accumulation: the bucket that left runs on a copy, and the step that follows
        applies the average of the declared passes.)"""
        i = self.flat.index[id(p)]
        if self.passes[i] >= self.options.backward_passes_per_step:
            raise RuntimeError(
                f"ringcomp.torch: gradients were computed more than "
                f"backward_passes_per_step={self.options.backward_passes_per_step} times "
                f"before step() ({self.flat.named[i][0]!r}): its bucket is already being "
                f"all-reduced. Call step() after each backward pass, or raise "
                f"backward_passes_per_step to accumulate gradients locally")
        self.flat.settle(i)
        self.passes[i] += 1
        if self.passes[i] == self.options.backward_passes_per_step:
            self.left[self.reducer.bucket_of[i].index] -= 1
            self._submit_ready()

    def _submit_ready(self, force: bool = False) -> None:
        """Submit complete buckets in bucket order (all ranks then run the same sequence
        of collectives even where their backward finishes tensors in another order);
        ``force``: every remaining one (a parameter without a gradient counts as zeros).
        On a GPU the gathering runs on PyTorch's stream, and the engine waits for it."""
        while self.submitted < len(self.reducer.buckets):
            b = self.reducer.buckets[self.submitted]
            if self.left[b.index] and not force:
                return
            with self.flat.stream():
                # a copy, never a view of the live buffer: whatever writes a gradient now
                # (a misused loop, a hook) cannot change a collective already under way
                # (several pieces are gathered into a new array; Marsit prepares a new one)
                send = b.gather(self.flat.array)
                if len(b.pieces) == 1 and self.rule is None:
                    send = send.copy()
                if self.options.gradient_predivide_factor != 1.0:  # Horovod's prescale
                    self.flat.xp.multiply(send, 1.0 / self.options.gradient_predivide_factor,
                                          out=send)
                self._marsit_rates()  # what Marsit sends: lr·g + compensation
                self.reducer.submit(b, send, self.params, self.steps,
                                    before=handover(self.flat.buffer))
            self.submitted += 1

    def _marsit_rates(self) -> None:
        """The rule's rates and Marsit-K's period from the parameter group (an LR
        scheduler may move them)."""
        if self.rule is None:
            return
        group = self.param_groups[0]
        for name in ("lr", "global_lr", "momentum", "weight_decay"):
            setattr(self.rule, name, group[name])
        self.reducer.marsit_k = group["k"]

    def compresses(self) -> bool:
        """Whether the coming step compresses: not during warm-up, not on Marsit-K's
        full-precision rounds."""
        self._marsit_rates()
        return self.reducer.compresses(self.steps)

    # -- step -----------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for every bucket's all-reduce and leave the average over ranks in every
        ``p.grad`` (which remain views of the flat buffer). Call it yourself before
        clipping gradients, then ``step`` inside ``skip_synchronize()``. (With Marsit the
        gradients stay local: the aggregated signs wait for ``step``.) Calling it again
        before ``step`` does nothing: the gradients are synchronized."""
        self._refuse_if_closed("synchronize()")
        if self._synchronized:
            return
        if not self._parameters_checked and not self._mirroring:
            self._check_parameters()
        if self._announce(discard=False):
            self._drop_step()
            raise RuntimeError(
                "ringcomp.torch: DistributedOptimizer.step() while a rank is in hvd.join(): "
                "with this optimizer's compressor (or error feedback, or Marsit) a joined "
                "rank's zeros would not arrive as zeros; the step's all-reduces ran to their "
                "end and were dropped. Join on every rank, or use compression none/fp16 "
                "without error feedback")
        for i in range(len(self.flat.named)):  # parameters backward did not reach
            if self.passes[i] < self.options.backward_passes_per_step:
                self.flat.settle(i)
        self._submit_ready(force=True)
        # Average: the sum over ranks divided by their number; Sum: as it is; with a
        # predivide factor f, Horovod's postscale f (the gradients were divided by f)
        size = self.transport.size if self.options.op == "average" else 1
        factor = self.options.gradient_predivide_factor
        self._new_step()
        with self.flat.stream():
            # complete: collectives return synchronised
            for b, compressed, reduced in self.reducer.synchronize():
                if self.rule is not None:
                    self.reduced.append((b, compressed, reduced))
                    continue
                for lo, hi, part in b.split(reduced):  # in place: no temporary
                    if factor != 1.0:
                        self.flat.xp.multiply(part, factor, out=part)
                    self.flat.xp.divide(part, size, out=self.flat.array[lo:hi])
        self.flat.attach()
        self.steps += 1
        self._synchronized = True

    def discard(self) -> None:
        """Give up this step's gradients: wait for every bucket's all-reduce (so all
        ranks stay in step), drop the results - errors included, e.g. every rank's refusal
        of a NaN in a compressed bucket - and what Marsit prepared; the step count still
        moves on. For a step some rank found non-finite."""
        self._refuse_if_closed("discard()")
        if self._synchronized:  # synchronize() ran: nothing in flight, drop its result
            self._synchronized, self.reduced = False, []
            return
        self._announce(discard=True)
        self._drop_step()

    def _drop_step(self) -> None:
        self._submit_ready(force=True)
        self._new_step()
        self.reducer.discard()
        self.flat.attach()
        self.steps += 1

    # -- hvd.join(): ranks out of data step with zeros -----------------------------------
    def _announce(self, discard: bool) -> bool:
        """Announce this step to ranks in ``hvd.join()``; whether one is and its zeros
        would not arrive as zeros (the step must then be dropped)."""
        if self.join_number is None or self._mirroring:
            return False
        exact = joining.zeros_arrive(self)
        joined = joining.announce(
            joining.OPTIMIZER_DISCARD if discard else joining.OPTIMIZER_STEP,
            "DistributedOptimizer." + ("discard()" if discard else "step()"),
            self.join_number, mode=int(exact))
        return joined and not exact

    def step_in_flight(self) -> bool:
        """Whether a backward pass has begun this step's all-reduces (or synchronize
        ran) and ``step`` has not yet followed."""
        return any(self.passes) or self._synchronized

    def mirror_step(self, discard: bool) -> None:
        """The part of a rank in ``hvd.join()`` in the live ranks' step: all-reduce zero
        gradients (the count of steps moves on, as theirs), leave its parameters alone,
        and its gradients zero."""
        self._mirroring = True
        try:
            with torch.no_grad():
                self.flat.buffer.zero_()
            if discard:
                self.discard()
            else:
                self.synchronize()
                self._synchronized = False
            with torch.no_grad():
                self.flat.buffer.zero_()
        finally:
            self._mirroring = False

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step`` inside this block does not synchronize (you already did)."""
        self._skip = True
        try:
            yield
        finally:
            self._skip = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero every gradient in place - one fill of the flat buffer - and keep each
        ``p.grad`` its view of it (as DDP's ``gradient_as_bucket_view``). ``set_to_none``
        is accepted for the signature and has no effect: a parameter backward does not
        reach is all-reduced as zeros either way, and with None every fresh gradient
        would cost an allocation and a copy into the buffer.

        Refused between ``backward`` and ``step``/``synchronize`` (as Horovod does): the
        buckets of that backward are on their way, and their all-reduce would put the
        gradients back."""
        if any(self.passes) and not self.closed:
            raise RuntimeError(
                "ringcomp.torch: zero_grad() after backward() and before step() or "
                "synchronize(): the buckets of that backward are already being all-reduced "
                "and would overwrite the zeros. Call zero_grad() before backward() (at the "
                "start of the iteration), or after step()")
        with torch.no_grad():
            self.flat.buffer.zero_()
        self.flat.attach()

    def step(self, closure=None):
        """Synchronize (unless inside ``skip_synchronize()`` or already synchronized),
        then the wrapped optimizer's step on the averaged gradients."""
        self._refuse_if_closed("step()")
        if self._synchronized and not self._skip:
            warnings.warn("optimizer.step() called after optimizer.synchronize() outside "
                          "skip_synchronize(): it steps on the gradients synchronize() "
                          "left (no second all-reduce). Wrap the step in `with "
                          "optimizer.skip_synchronize():`", UserWarning, stacklevel=2)
        elif not self._skip:
            self.synchronize()
        elif not self._synchronized:
            raise RuntimeError("ringcomp.torch: step() inside skip_synchronize() without "
                               "synchronize() first: the gradients are not averaged yet")
        self._synchronized = False
        if self.rule is None:
            return super().step(closure)
        if closure is not None:
            raise ValueError("Marsit's step takes no closure (its update needs every "
                             "rank's signs, gathered once per step)")
        self._marsit_rates()
        with self.flat.stream():
            self.reducer.apply(self.params, self.reduced, self.steps)
        self.reduced = []
        return None

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The wrapped optimizer's state plus ringcomp's under ``"ringcomp"``: the options
        and rank count that shape the trajectory, the step count (it keys the compressors'
        random streams), error-feedback residuals and compressor state (PowerSGD's warm
        start), so a resumed run is bit-identical. Everything is CPU tensors and plain
        values: ``torch.save`` / ``torch.load`` (``weights_only=True``) round-trip it, and a
        state saved on a GPU loads on the CPU and the other way."""
        state = super().state_dict()
        with self.flat.stream():
            state["ringcomp"] = ringcomp_state(self)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a ``state_dict()``; one saved with other ringcomp options (algorithm,
        compressor, error feedback, seed, buckets, ...) or another number of ranks is
        refused with a ValueError naming what differs, and so is one saved on another rank
        that holds that rank's own state (residuals, Marsit's compensation)."""
        state_dict = dict(state_dict)
        ours = state_dict.pop("ringcomp", None)
        if ours is not None:
            check_saved_options(ours, saved_options(self))
            check_own_rank(ours, self.transport.rank)
        super().load_state_dict(state_dict)
        if ours is not None:
            self.steps = int(ours["steps"])

            def local(tensors):  # CPU tensors into the buffer's memory (host or GPU)
                return self.flat.local_copies(as_arrays(tensors))

            if self.rule is not None:
                self.rule.state = local(ours["marsit"])
            self.reducer.load_state_dict(ours, local)

    def _refuse_if_closed(self, what: str) -> None:
        if self.closed:
            raise RuntimeError(f"ringcomp.torch: {what} on a closed DistributedOptimizer "
                               f"(close() stopped its engine): make a new one")

    def close(self) -> None:
        """Stop the background engine and remove the gradient hooks: later ``step``,
        ``synchronize`` and ``discard`` are refused at once (a backward pass no longer
        sends anything). Closing twice is fine."""
        if self.closed:
            return
        self.closed = True
        for handle in self.handles:
            handle.remove()
        self.reducer.close()


def _accumulator(p: torch.nn.Parameter):
    """``p``'s gradient accumulator (autograd's AccumulateGrad node)."""
    return p.view_as(p).grad_fn.next_functions[0][0]


def _named(optimizer, named_parameters) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) for every parameter of ``optimizer`` that requires a gradient,
    in the optimizer's order; names from ``named_parameters`` where given."""
    params = [p for group in optimizer.param_groups for p in group["params"]
              if p.requires_grad]
    if named_parameters is None:
        return [(f"param.{i}", p) for i, p in enumerate(params)]
    named_parameters = list(named_parameters)
    seen, duplicates = set(), []
    for name, _ in named_parameters:
        if name in seen and name not in duplicates:
            duplicates.append(name)
        seen.add(name)
    if duplicates:
        raise ValueError(f"parameter names in named_parameters must be unique; found "
                         f"duplicates: {', '.join(map(str, duplicates))}")
    names = {id(p): name for name, p in named_parameters}
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(f"named_parameters lacks {len(missing)} of the optimizer's "
                         f"parameters (positions {missing[:5]})")
    return [(names[id(p)], p) for p in params]
