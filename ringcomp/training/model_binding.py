"""The model protocol the one ``Trainer`` drives, and its NumPy/CuPy binding."""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from ringcomp.devices import placement as placements
from ringcomp.models import build_model
from ringcomp.models.replay import ReplayModel
from ringcomp.training.buckets import plan_buckets
from ringcomp.training.optim import OPTIMIZERS
from ringcomp.training.planning import time_rule
from ringcomp.training.reducer import make_reducer


class ModelBinding(Protocol):
    """A model and its framework's side of a training step, behind one ``Trainer``: the
    NumPy/CuPy models here, a ``torch.nn.Module`` in ``ringcomp.torch.trainer_binding``. A new
    framework is one class with these members, driving the ``Reducer`` (see
    docs/architecture.md's recipe).

    Members: ``model``; ``store`` (the flat layout: ``infos``, ``size``); ``reducer``;
    ``replay`` (no data: an emulated model).
    """

    def forward_backward(self, step: int, indices) -> tuple[float, float, int]:
        """Forward and backward on samples ``indices``, each bucket handed to the reducer
        once its last gradient is final: (loss, correct predictions, bad layer: -1, a
        layer whose gradient is NaN/Inf, or ``len(layers)`` for the loss)."""

    def compresses(self, step: int) -> bool:
        """Whether ``step`` compresses (the reducer's schedule, as the framework sets it)."""

    def bad_place(self, worst: int) -> str:
        """What a bad-layer number names ('the loss', 'the gradient of layer 3')."""

    def synchronize(self, give_up: bool) -> None:
        """Wait for every bucket of the step (all ranks stay in step); ``give_up``: some
        rank saw a non-finite value, so the results are dropped."""

    def update(self, step: int) -> None:
        """The optimizer's update from the synchronized buckets."""

    def correct(self, lo: int, hi: int) -> float:
        """Right predictions on test samples ``lo:hi``."""

    def time_passes(self, steps: int, indices_of) -> list[list[float]]:
        """Per pass on the samples ``indices_of(step)``: forward seconds, then per tensor
        the backward seconds it ends; nothing communicated or updated."""

    def time_optimizer(self) -> float:
        """Seconds of one optimizer update over the whole model."""

    def set_buckets(self, buckets) -> None: ...

    def rebucket(self, buckets) -> None: ...

    def state(self) -> dict:
        """Everything a resumed run needs besides the step (arrays where they live)."""

    def load_state(self, state: dict) -> None: ...


class NumpyBinding:
    """The NumPy/CuPy models (``models/``) and ringcomp's optimizer rules: backward is a
    generator of parameter indices as their gradients become final, and each full bucket
    goes to the reducer at once (Horovod's ``submit``).

    With ``--device gpu`` everything a step touches lives on this rank's GPU (parameters,
    gradients, buckets, optimizer state, compressor residuals, the data set); only the
    step's statistics and checkpoints come to the host."""

    def __init__(self, args, transport, placement, host_data, tracer, compressor):
        self.args, self.t, self.placement, self.xp = args, transport, placement, placement.xp
        self.replay = host_data is None
        if self.replay:  # no data: an epoch is one step of batch_size emulated samples
            self.data = None
            self.model = ReplayModel(args.model.partition(":")[2], args.seed, transport.rank,
                                     args.batch_size, args.replay_tflops, args.replay_scale,
                                     placement)
        else:
            self.data = host_data.placed(placement)
            self.model = build_model(args.model, self.data.features, self.data.classes,
                                     args.seed, placement)
        # after the model: a PyTorch model has loaded torch's thread pool by now
        self.host_threads = placements.share_host_cores(transport.local_size)
        self.store = self.model.store
        self.optimizer = self._optimizer()
        bucket = None if args.bucket_mb == "all" else float(args.bucket_mb) * (1 << 20)
        self.reducer = make_reducer(
            transport.comm, args, compressor,
            plan_buckets(self.store.infos, bucket,
                         args.small_tensor if compressor is not None else 0),
            self.xp, tracer=tracer, rule=self.optimizer, on_start=placement.bind_thread)
        self.reduced: list = []

    def _optimizer(self):
        a, size, xp = self.args, self.store.size, self.xp
        if a.optimizer == "sgd":
            return OPTIMIZERS["sgd"](size, a.lr, a.momentum, a.weight_decay, xp=xp)
        if a.optimizer == "adam":
            return OPTIMIZERS["adam"](size, a.lr, weight_decay=a.weight_decay, xp=xp)
        return OPTIMIZERS["marsit"](size, a.lr, a.global_lr, a.momentum, a.weight_decay,
                                    xp=xp)

    # -- one step --------------------------------------------------------------------
    def forward(self, step: int, indices):
        """Forward pass on samples ``indices``: (loss, correct predictions, the backward
        generator yielding parameter indices as their gradients become final)."""
        if self.replay:
            return self.model.begin(step), 0, self.model.backward()
        idx = self.placement.put(indices)
        loss, dlogits, correct = self.model.loss(self.data.x_train[idx], self.data.y_train[idx])
        return loss, correct, self.model.backward(dlogits)

    def forward_backward(self, step: int, indices) -> tuple[float, float, int]:
        """Walk the backward generator; as soon as a bucket's last gradient is final, hand
        it to the reducer (which prepares it: Marsit's compensation). A non-finite bucket
        is sent as zeros (the collective still runs on every rank) and its layer noted."""
        loss, correct, gradients = self.forward(step, indices)
        bad_layer = -1 if np.isfinite(loss) else len(self.model.layers)
        buckets, next_bucket, done = self.reducer.buckets, 0, -1
        for ready in gradients:
            done = max(done, *ready)
            while next_bucket < len(buckets) and buckets[next_bucket].last <= done:
                b = buckets[next_bucket]
                grad = b.gather(self.store.grad)
                if not self.xp.isfinite(grad).all():
                    bad_layer = max(bad_layer, self._first_bad_layer(b))
                    grad = self.xp.zeros_like(grad)
                self.reducer.submit(b, grad, self.store.flat, step)
                next_bucket += 1
        return loss, correct, bad_layer

    def _first_bad_layer(self, bucket) -> int:
        for info in (self.store.infos[i] for i in bucket.members):
            piece = self.store.grad[info.offset:info.offset + info.size]
            if not self.xp.isfinite(piece).all():
                return info.layer
        return -1

    def compresses(self, step: int) -> bool:
        return self.reducer.compresses(step)

    def bad_place(self, worst: int) -> str:
        return ("the loss" if worst == len(self.model.layers)
                else f"the gradient of layer {worst}")

    def synchronize(self, give_up: bool) -> None:
        self.reduced = self.reducer.synchronize()
        if give_up:  # Marsit drops what it prepared
            self.reducer.skip(b for b, _, _ in self.reduced)
            self.reduced = []

    def update(self, step: int) -> None:
        self.reducer.apply(self.store.flat, self.reduced, step)
        self.reduced = []

    def correct(self, lo: int, hi: int) -> float:
        x, y = self.data.x_test[lo:hi], self.data.y_test[lo:hi]
        return float((self.model.predict(x) == y).sum())

    # -- --plan's timing -------------------------------------------------------------
    def time_passes(self, steps: int, indices_of) -> list[list[float]]:
        """Per pass: the forward seconds, then the seconds of backward that end with each
        tensor (backward order), for ``steps`` passes on the batches ``indices_of(step)``;
        nothing is communicated or updated. On a GPU each part ends with a stream
        synchronisation, so a part's kernels count where they ran, not where queued."""
        n, per_step, sync = len(self.store.infos), [], self.placement.synchronize
        for step in range(steps):
            sync()
            start = time.perf_counter()
            _, _, gradients = self.forward(step, indices_of(step))
            sync()
            times, last = [0.0] * (n + 1), time.perf_counter()
            times[0] = last - start
            for ready in gradients:
                sync()
                now = time.perf_counter()
                times[1 + min(ready)], last = now - last, now
            per_step.append(times)
        return per_step

    def time_optimizer(self) -> float:
        return time_rule(self.optimizer, self.store.flat, self.placement,
                         self.reducer.compressor is not None, self.t.size)

    # -- layout and state --------------------------------------------------------------
    def set_buckets(self, buckets) -> None:
        self.reducer.set_buckets(buckets)

    def rebucket(self, buckets) -> None:
        self.reducer.rebucket(buckets, self.store.size)

    def state(self) -> dict:
        return {"params": self.store.flat,
                "optimizer": {(k,): v for k, v in self.optimizer.state.items()},
                **self.reducer.state_dict()}

    def load_state(self, state: dict) -> None:
        put = self.placement.put  # host arrays from the file, onto this run's device
        self.store.flat[...] = put(state["params"])
        for (name,), value in state.get("optimizer", {}).items():
            self.optimizer.state[name] = put(np.array(value))
        # checkpoints before the state objects said "powersgd"
        self.reducer.load_state_dict(
            {"feedback": state.get("feedback", {}),
             "compressor": state.get("compressor", state.get("powersgd", {}))},
            local=lambda arrays: {k: put(v) for k, v in arrays.items()})
