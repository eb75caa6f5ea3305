"""The training job: model, data shard, optimizer, buckets and the overlapped all-reduce."""

from __future__ import annotations

import sys
import time

import numpy as np

from ringcomp import placement
from ringcomp.api import allreduce
from ringcomp.compression import ErrorFeedback, get_compressor
from ringcomp.models import build_model
from ringcomp.models.replay import ReplayModel
from ringcomp.sched.planners import check_spec
from ringcomp.trace import Tracer
from ringcomp.training import checkpoint, data, skew
from ringcomp.training.buckets import buckets_from_plan, plan_buckets
from ringcomp.training.combination import check_combination
from ringcomp.training.config import TRAJECTORY, collective_options
from ringcomp.training.engine import CommEngine
from ringcomp.training.optim import OPTIMIZERS
from ringcomp.training.planning import (
    plan_buckets_from_profile,
    profile_path,
    save_profile,
    time_passes,
    time_rule,
)
from ringcomp.training.reducer import Reducer


class NonFinite(FloatingPointError):
    pass


class Trainer:
    """One training job: model, data shard, optimizer, buckets and communication engine.

    With ``--device gpu`` everything a step touches lives on this rank's GPU (parameters,
    gradients, buckets, optimizer state, compressor residuals, the data set); only the
    step's statistics and checkpoints come to the host.
    """

    def __init__(self, args, transport):
        self.args, self.t = args, transport
        self.placement = placement.place(args.device)
        self.xp = self.placement.xp
        self.replay = args.model.startswith("replay:")
        if self.replay:  # no data: an epoch is one step of batch_size emulated samples
            self.data = None
            self.model = ReplayModel(args.model.partition(":")[2], args.seed, transport.rank,
                                     args.batch_size, args.replay_tflops, args.replay_scale,
                                     self.placement)
            samples = args.batch_size * transport.size
        else:
            self.data = data.load_shared(transport, args.dataset, args.seed, args.samples,
                                         args.features, args.eval_on).placed(self.placement)
            self.model = build_model(args.model, self.data.features, self.data.classes,
                                     args.seed, self.placement)
            samples = len(self.data.x_train)
        # after the model: a PyTorch model has loaded torch's thread pool by now
        self.host_threads = placement.share_host_cores(transport.local_size)
        owned = None if self.replay else skew.owned_by(
            self.data.y_train, transport.size, transport.rank, args.partition, args.seed)
        self.store = self.model.store
        self.comp = get_compressor(args.compressor)
        self._check_combination()
        self.optimizer = self._optimizer()
        bucket = None if args.bucket_mb == "all" else float(args.bucket_mb) * (1 << 20)
        self.planned = None  # with --plan: set by apply_plan
        self.tracer = Tracer(args.trace) if args.trace else None
        feedback = ErrorFeedback() if args.error_feedback else None
        self.reducer = Reducer(
            CommEngine(transport.comm, algorithm=args.algorithm, compressor=self.comp,
                       error_feedback=feedback or False, seed=args.seed,
                       options=collective_options(args), tracer=self.tracer,
                       shadow=args.shadow, on_start=self.placement.bind_thread),
            plan_buckets(self.store.infos, bucket,
                         args.small_tensor if self.comp is not None else 0),
            self.comp, feedback, self.xp, rule=self.optimizer,
            warmup_steps=args.warmup_steps, marsit_k=args.marsit_k)
        self.shards = data.Shards(samples, args.batch_size, transport.size, transport.rank,
                                  args.seed, owned)
        self.total_steps = args.steps or args.epochs * self.shards.steps_per_epoch
        self.step = 0

    @property
    def engine(self):
        return self.reducer.engine

    @property
    def feedback(self):
        return self.reducer.feedback

    @property
    def buckets(self):
        return self.reducer.buckets

    def apply_plan(self) -> None:
        """``--plan``: profile the job (collectively) or read its profile, and replace the
        buckets by the plan's. Call on every rank before training or restoring."""
        if self.args.plan:
            self.planned = plan_buckets_from_profile(self)
            self.set_buckets(self.planned.buckets)

    def time_passes(self, steps: int) -> list[list[float]]:
        """``--plan``'s timing of forward and of backward per tensor (planning.py)."""
        return time_passes(self, steps)

    def time_optimizer(self) -> float:
        """``--plan``'s timing of one optimizer update over the whole model."""
        return time_rule(self.optimizer, self.store.flat, self.placement,
                         self.comp is not None, self.t.size)

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

    def set_buckets(self, buckets) -> None:
        """Fuse gradients into ``buckets`` from the next step on (before training)."""
        self.reducer.set_buckets(buckets)

    def rebucket(self, buckets) -> None:
        """Switch to new buckets between steps, residuals moving with their elements
        (``Reducer.rebucket``)."""
        self.reducer.rebucket(buckets, self.store.size)

    def _check_combination(self) -> None:
        args = self.args
        if args.plan:
            check_spec(args.plan)  # before any profiling: same verdict on every rank
        if args.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {args.optimizer!r}; known: "
                             f"{', '.join(OPTIMIZERS)}")
        check_combination(self.comp, args.algorithm, args.optimizer == "marsit",
                          args.error_feedback, args.torus, self.t.size)

    def _optimizer(self):
        a, size, xp = self.args, self.store.size, self.xp
        if a.optimizer == "sgd":
            return OPTIMIZERS["sgd"](size, a.lr, a.momentum, a.weight_decay, xp=xp)
        if a.optimizer == "adam":
            return OPTIMIZERS["adam"](size, a.lr, weight_decay=a.weight_decay, xp=xp)
        return OPTIMIZERS["marsit"](size, a.lr, a.global_lr, a.momentum, a.weight_decay,
                                    xp=xp)

    def compressed_step(self, step: int) -> bool:
        """Whether this step compresses (not during warm-up, not on Marsit-K's full rounds)."""
        return self.reducer.compresses(step)

    # -- one step --------------------------------------------------------------------
    def forward(self, step: int):
        """Forward pass of ``step``'s batch: (loss, correct predictions, the backward
        generator yielding parameter indices as their gradients become final)."""
        if self.replay:
            return self.model.begin(step), 0, self.model.backward()
        idx = self.placement.put(self.shards.indices(step))
        loss, dlogits, correct = self.model.loss(self.data.x_train[idx], self.data.y_train[idx])
        return loss, correct, self.model.backward(dlogits)

    def train_step(self, step: int) -> dict:
        """One step in Horovod's three verbs: forward, then backward with each full bucket
        handed to the engine at once (``submit``), the step's statistics agreed, the
        reduced buckets awaited (``synchronize``) and the update made (``apply``).

        Returns the step's statistics, already agreed across ranks (one small all-reduce
        that also tells every rank whether any rank saw a non-finite loss or gradient)."""
        t0 = time.perf_counter()
        loss, correct, gradients = self.forward(step)
        compress = self.compressed_step(step)
        bad_layer = self.submit(step, gradients,
                                -1 if np.isfinite(loss) else len(self.model.layers))
        compute = time.perf_counter() - t0
        stats, worst = self._agree_statistics(loss, correct, bad_layer)
        t1 = time.perf_counter()
        reduced = self.reducer.synchronize()
        t2 = time.perf_counter()
        self.apply(step, reduced, worst)
        return {"loss": stats[0] / stats[2] if worst < 0 else float("nan"),
                "train_acc": None if self.replay else stats[1] / stats[2],
                "samples": int(stats[2]),
                "compute_s": compute, "exposed_comm_s": t2 - t1,
                "update_s": time.perf_counter() - t2, "skipped": bool(worst >= 0),
                "compressed": compress}

    def submit(self, step: int, gradients, bad_layer: int) -> int:
        """Walk the backward generator; as soon as a bucket's last gradient is final,
        prepare it (the optimizer's part, e.g. Marsit's compensation) and hand it to the
        engine. A non-finite bucket is sent as zeros (the collective still runs on every
        rank) and its layer noted. Returns the worst bad layer (-1: none)."""
        next_bucket, done = 0, -1
        for indices in gradients:
            done = max(done, *indices)
            while next_bucket < len(self.buckets) and self.buckets[next_bucket].last <= done:
                b = self.buckets[next_bucket]
                grad = b.gather(self.store.grad)
                if not self.xp.isfinite(grad).all():
                    bad_layer = max(bad_layer, self._first_bad_layer(b))
                    grad = self.xp.zeros_like(grad)
                self.reducer.submit(b, grad, self.store.flat, step)
                next_bucket += 1
        return bad_layer

    def _agree_statistics(self, loss, correct, bad_layer: int):
        """(summed [loss·batch, correct, samples, any rank bad], the worst bad layer or
        -1); the layer is asked only when some rank saw one (rare)."""
        stats = allreduce(np.array([loss * self.args.batch_size if bad_layer < 0 else 0.0,
                                    correct, self.args.batch_size, bad_layer >= 0]),
                          algorithm="mpi", comm=self.t)
        worst = -1
        if stats[3]:
            worst = int(allreduce(np.array([bad_layer]), algorithm="mpi", op="max",
                                  comm=self.t)[0])
        return stats, worst

    def apply(self, step: int, reduced: list, worst: int) -> None:
        """The optimizer update from the reduced buckets; with a non-finite value on some
        rank (``worst`` >= 0) raise, or skip the step everywhere (--skip-nonfinite)."""
        if worst < 0:
            self.reducer.apply(self.store.flat, reduced, step)
            return
        where = ("the loss" if worst == len(self.model.layers)
                 else f"the gradient of layer {worst}")
        if not self.args.skip_nonfinite:
            raise NonFinite(f"step {step}: {where} is NaN or Inf on some rank (lower "
                            f"--lr, or --skip-nonfinite to skip such steps)")
        self.reducer.skip(b for b, _, _ in reduced)

    def _first_bad_layer(self, bucket) -> int:
        for info in (self.store.infos[i] for i in bucket.members):
            piece = self.store.grad[info.offset:info.offset + info.size]
            if not self.xp.isfinite(piece).all():
                return info.layer
        return -1

    def evaluate(self) -> float:
        """Test accuracy: each rank scores its share of the test set, counts summed."""
        n = len(self.data.x_test)
        lo, hi = (n * self.t.rank) // self.t.size, (n * (self.t.rank + 1)) // self.t.size
        right = self.correct(lo, hi) if hi > lo else 0.0
        total = allreduce(np.array([right, hi - lo], float), algorithm="mpi",
                          comm=self.t)
        return total[0] / total[1]

    def correct(self, lo: int, hi: int) -> float:
        """Right predictions on test samples ``lo:hi``."""
        x, y = self.data.x_test[lo:hi], self.data.y_test[lo:hi]
        return float((self.model.predict(x) == y).sum())

    # -- checkpoints -----------------------------------------------------------------
    def state(self) -> dict:
        """Everything a resumed run needs (arrays where they live; checkpoint.save copies
        device arrays to the host, so a checkpoint loads on either device)."""
        return {"params": self.store.flat,
                "optimizer": {(k,): v for k, v in self.optimizer.state.items()},
                **self.reducer.state_dict(),
                "step": np.array(self.step)}

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
                                              say=lambda text: print(text, file=sys.stderr))
        if found is None:
            return False
        step, state, meta = found
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
        put = self.placement.put  # host arrays from the file, onto this run's device
        self.store.flat[...] = put(state["params"])
        for (name,), value in state.get("optimizer", {}).items():
            self.optimizer.state[name] = put(np.array(value))
        # checkpoints before the state objects said "powersgd"
        self.reducer.load_state_dict(
            {"feedback": state.get("feedback", {}),
             "compressor": state.get("compressor", state.get("powersgd", {}))},
            local=lambda arrays: {k: put(v) for k, v in arrays.items()})
        self.step = int(state["step"])
