"""The training job, one for every framework: data shard, model binding, plan, step, scores,
checkpoints."""

from __future__ import annotations

import logging
import time

import numpy as np

from ringcomp.compression import get_compressor
from ringcomp.devices import placement
from ringcomp.plans.call import allreduce
from ringcomp.plans.plan import allreduce_init
from ringcomp.sched.planners import check_spec
from ringcomp.trace import Tracer
from ringcomp.training import checkpoint, data, skew
from ringcomp.training.buckets import buckets_from_plan
from ringcomp.training.combination import check_combination
from ringcomp.training.config import OPTIONS, TRAJECTORY
from ringcomp.training.model_binding import NumpyBinding
from ringcomp.training.optim import OPTIMIZERS
from ringcomp.training.planning import (
    load_or_measure,
    plan_buckets_from_profile,
    profile_path,
    save_profile,
)

log = logging.getLogger(__name__)


class NonFinite(FloatingPointError):
    pass


class Trainer:
    """One training job: data shard, model binding, plan, the step loop's verbs, scoring
    and checkpoints - for every framework alike. What touches the model is the binding's
    (``model_binding.ModelBinding``: ``NumpyBinding`` here, ``ringcomp.torch.trainer_binding.
    TorchBinding`` for ``--model torch:<net>``), and both drive one ``Reducer``.

    Every rank initialises the model from ``--seed`` (no broadcast needed) and stays
    bit-identical.
    """

    def __init__(self, args, transport, binding=NumpyBinding):
        self.args, self.t = args, transport
        self._stats_plan = None  # the step's statistics' all-reduce, made at step 0
        self.placement = placement.place(args.device)
        self.xp = self.placement.xp
        self.replay = args.model.startswith("replay:")
        # host arrays: the binding places them (on this rank's GPU, as tensors, ...)
        self.data = None if self.replay else data.load_shared(
            transport, args.dataset, args.data_seed, args.samples, args.features, args.eval_on)
        self.comp = get_compressor(args.compressor)
        self._check_combination()
        self.tracer = Tracer(args.trace) if args.trace else None
        self.binding = binding(args, transport, self.placement, self.data, self.tracer,
                               self.comp)
        self.reducer = self.binding.reducer  # its compressor: self.comp, resolved once
        self.planned = None  # with --plan: set by apply_plan
        samples = (args.batch_size * transport.size if self.replay
                   else len(self.data.x_train))
        owned = None if self.replay else skew.owned_by(
            self.data.y_train, transport.size, transport.rank, args.partition, args.seed)
        self.shards = data.Shards(samples, args.batch_size, transport.size, transport.rank,
                                  args.seed, owned)
        self.total_steps = args.steps or args.epochs * self.shards.steps_per_epoch
        self.step = 0

    @property
    def model(self):
        return self.binding.model

    @property
    def store(self):
        return self.binding.store

    @property
    def optimizer(self):
        return self.binding.optimizer

    def apply_plan(self) -> None:
        """``--plan``: profile the job (collectively) or read its profile, and replace the
        buckets by the plan's. Call on every rank before training or restoring."""
        if self.args.plan:
            self.planned = plan_buckets_from_profile(*self._profiling())
            self.binding.set_buckets(self.planned.buckets)

    def profile(self):
        """The job's profile: read from ``--profile`` or measured (collectively)."""
        return load_or_measure(*self._profiling())

    def _profiling(self) -> tuple:
        """What planning reads: the options, the transport, the binding (layout and
        reducer), where the buffers live, and a timer of passes on this job's batches."""
        return (self.args, self.t, self.binding, self.placement,
                lambda steps: self.binding.time_passes(steps, self._indices))

    def after_step(self, wall_s: float) -> str | None:
        """Feed MergeComp's online search the step's time (agreed: the slowest rank's);
        re-bucket when it moves on. Returns a message when the search has finished."""
        search = self.planned.search if self.planned else None
        if search is None or search.done:
            return None
        agreed = float(allreduce(np.array([wall_s]), algorithm="mpi", op="max",
                                 comm=self.t)[0])
        if search.record(agreed):
            self.rebucket(buckets_from_plan(self.store.infos, search.plan()))
        if not search.done:
            return None
        self.planned.profile.mergecomp_groups = search.current
        save_profile(self.t, self.planned.profile, profile_path(self.args))
        return (f"mergecomp: chose {search.current} groups after probing " + ", ".join(
            f"{y}: {1e3 * t:.1f} ms" for y, t in sorted(search.measured.items())) +
                f" (the model's first guess: {min(search.modelled, key=search.modelled.get)})")

    def rebucket(self, buckets) -> None:
        """Switch to new buckets between steps, residuals moving with their elements
        (``Reducer.rebucket``)."""
        self.binding.rebucket(buckets)

    def _check_combination(self) -> None:
        args = self.args
        if args.plan:
            check_spec(args.plan)  # before any profiling: same verdict on every rank
        if args.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {args.optimizer!r}; known: "
                             f"{', '.join(OPTIMIZERS)}")
        check_combination(self.comp, args.algorithm, args.optimizer == "marsit",
                          args.error_feedback, args.torus, self.t.size)

    def compressed_step(self, step: int) -> bool:
        """Whether this step compresses (not during warm-up, not on Marsit-K's full rounds)."""
        return self.binding.compresses(step)

    # -- one step --------------------------------------------------------------------
    def _indices(self, step: int):
        return None if self.replay else self.shards.indices(step)

    def train_step(self, step: int) -> dict:
        """One step in Horovod's three verbs: forward, then backward with each full bucket
        handed to the reducer at once (``submit``, the binding's), the step's statistics
        agreed, the reduced buckets awaited (``synchronize``) and the update made
        (``apply``) - or, after a non-finite loss or gradient on any rank, the step given
        up everywhere (``--skip-nonfinite``) or NonFinite raised.

        Returns the step's statistics, already agreed across ranks (one small all-reduce
        that also tells every rank whether any rank saw a non-finite loss or gradient)."""
        t0 = time.perf_counter()
        compress = self.compressed_step(step)
        loss, correct, bad_layer = self.binding.forward_backward(step, self._indices(step))
        compute = time.perf_counter() - t0
        stats, worst = self._agree_statistics(loss, correct, bad_layer)
        t1 = time.perf_counter()
        self.binding.synchronize(give_up=worst >= 0)
        t2 = time.perf_counter()
        if worst >= 0 and not self.args.skip_nonfinite:
            raise NonFinite(f"step {step}: {self.binding.bad_place(worst)} is NaN or Inf on "
                            f"some rank (lower --lr, or --skip-nonfinite to skip such steps)")
        if worst < 0:
            self.binding.update(step)
        return {"loss": stats[0] / stats[2] if worst < 0 else float("nan"),
                "train_acc": None if self.replay else stats[1] / stats[2],
                "samples": int(stats[2]),
                "compute_s": compute, "exposed_comm_s": t2 - t1,
                "update_s": time.perf_counter() - t2, "skipped": bool(worst >= 0),
                "compressed": compress}

    def _agree_statistics(self, loss, correct, bad_layer: int):
        """(summed [loss·batch, correct, samples, any rank bad], the worst bad layer or
        -1); the layer is asked only when some rank saw one (rare)."""
        mine = np.array([loss * self.args.batch_size if bad_layer < 0 else 0.0, correct,
                         self.args.batch_size, bad_layer >= 0])
        if self._stats_plan is None:
            # every step's call is the same four float64 (built here): agreed once, then
            # one MPI call a step rather than two (a NaN loss adds up as in MPI)
            self._stats_plan = allreduce_init(mine, algorithm="mpi", comm=self.t, check=False)
        stats = self._stats_plan(mine)
        worst = -1
        if stats[3]:
            worst = int(allreduce(np.array([bad_layer]), algorithm="mpi", op="max",
                                  comm=self.t)[0])
        return stats, worst

    def evaluate(self) -> float:
        """Test accuracy: each rank scores its share of the test set, counts summed."""
        n = len(self.data.x_test)
        lo, hi = (n * self.t.rank) // self.t.size, (n * (self.t.rank + 1)) // self.t.size
        right = self.binding.correct(lo, hi) if hi > lo else 0.0
        total = allreduce(np.array([right, hi - lo], float), algorithm="mpi",
                          comm=self.t)
        return total[0] / total[1]

    # -- checkpoints -----------------------------------------------------------------
    def state(self) -> dict:
        """Everything a resumed run needs (arrays where they live; checkpoint.save copies
        device arrays to the host, so a checkpoint loads on either device)."""
        return {**self.binding.state(), "step": np.array(self.step)}

    def meta(self) -> dict:
        return {k: getattr(self.args, k) for k in sorted(TRAJECTORY)}

    def save(self) -> None:
        if self.args.checkpoint_dir:
            checkpoint.save(self.t, self.args.checkpoint_dir, self.step, self.state(),
                            self.meta(), self.args.keep)

    def restore(self) -> bool:
        """Load the newest complete checkpoint (collectively); False when there is none."""
        directory = self.args.checkpoint_dir
        if not directory:
            return False
        found = checkpoint.load_newest_intact(self.t, directory,
                                              say=log.warning)
        if found is None:
            return False
        step, state, meta = found
        meta = before_options_existed(meta)
        changed = sorted(k for k, v in self.meta().items() if meta.get(k) != v)
        if changed:
            raise ValueError(f"checkpoint step {step} in {directory} was written with other "
                             f"options: " + ", ".join(f"{k}={meta.get(k)!r} (now "
                                                      f"{getattr(self.args, k)!r})"
                                                      for k in changed))
        self.load_state(state)
        return True

    def load_state(self, state: dict) -> None:
        """Take over a checkpoint's ``state`` (host arrays, as ``state()`` wrote them)."""
        self.binding.load_state(state)
        self.step = int(state["step"])


def before_options_existed(meta: dict) -> dict:
    """A checkpoint's options with those added since it was written filled in with the
    value that reproduces the run it came from: a checkpoint from before --data-seed split
    the data by --seed; any other option took its default (it did not exist to change
    anything: --eval-on's test set, say). A checkpoint that names an option keeps its own
    value."""
    return {**{k: OPTIONS[k][0] for k in TRAJECTORY}, "data_seed": meta.get("seed"), **meta}
