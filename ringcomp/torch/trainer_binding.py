"""``train --model torch:<net>``: a PyTorch model behind the one Trainer, through the
DistributedOptimizer (same options, records, checkpoints, traces and plans as the NumPy job)."""

from __future__ import annotations

import math
import time
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling

from ringcomp.torch.marsit_optimizer import Marsit
from ringcomp.torch.models import build_torch_model
from ringcomp.torch.optimizer import DistributedOptimizer
from ringcomp.torch.options import resolved
from ringcomp.torch.state import as_arrays
from ringcomp.training.planning import time_rule, time_second_pass


class TorchBinding:
    """A ``torch.nn.Module`` behind the one ``Trainer`` (``training.model_binding.ModelBinding``):
    autograd's hooks hand each bucket to the reducer as its last gradient is accumulated
    (the DistributedOptimizer), ``synchronize`` averages and the torch optimizer (SGD,
    Adam, or ringcomp's Marsit) applies.

    Only what touches the model is its own: construction, the step, scoring, timing for
    ``--plan`` and the checkpointed state.
    """

    replay = False

    def __init__(self, args, transport, placement, host_data, tracer, compressor):
        # ``compressor``: the job's one instance, checked by the trainer; the optimizer
        # uses it as given
        self.args, self.t, self.placement = args, transport, placement
        gpu = placement.index
        self.device = torch.device("cpu" if gpu is None else f"cuda:{gpu}")
        if gpu is not None:
            torch.cuda.set_device(self.device)
        self.x_train, self.y_train, self.x_test, self.y_test = (
            torch.from_numpy(np.ascontiguousarray(getattr(host_data, name))).to(self.device)
            for name in ("x_train", "y_train", "x_test", "y_test"))
        self.model = build_torch_model(args.model, host_data.features, host_data.classes,
                                       args.seed, str(self.device))
        # the job's options, checked and agreed by ringcomp.train (``training.config``)
        # with its compressor resolved once: handed over as they are
        given = dict(algorithm=args.algorithm, error_feedback=args.error_feedback,
                     seed=args.seed, segment_bytes=args.segment_bytes, shadow=args.shadow,
                     bucket_mb=args.bucket_mb, small_tensor=args.small_tensor,
                     warmup_steps=args.warmup_steps, torus=args.torus)
        self.optimizer = self.opt = DistributedOptimizer(
            self._torch_optimizer(), self.model.named_parameters(), comm=transport,
            tracer=tracer, _resolved=resolved(given, compressor))
        self.reducer, self.store = self.opt.reducer, self.opt.flat

    def set_buckets(self, buckets) -> None:  # --plan's, through the optimizer's hooks
        self.opt.set_buckets(buckets)

    def rebucket(self, buckets) -> None:  # MergeComp's search
        self.opt.rebucket(buckets)

    def _torch_optimizer(self) -> torch.optim.Optimizer:
        a, params = self.args, self.model.parameters()
        if a.optimizer == "sgd":
            return torch.optim.SGD(params, lr=a.lr, momentum=a.momentum,
                                   weight_decay=a.weight_decay)
        if a.optimizer == "adam":
            return torch.optim.Adam(params, lr=a.lr, weight_decay=a.weight_decay)
        return Marsit(params, lr=a.lr, global_lr=a.global_lr, k=a.marsit_k,
                      momentum=a.momentum, weight_decay=a.weight_decay)

    def compresses(self, step: int) -> bool:
        return self.opt.compresses()

    # -- one step --------------------------------------------------------------------
    def forward_backward(self, step: int, indices) -> tuple[float, float, int]:
        """Forward and backward (buckets leave during backward, from autograd's hooks):
        (loss, correct predictions, bad: -1, 0 for a non-finite gradient, or the number
        of tensors for a non-finite loss)."""
        self.model.train()
        idx = torch.from_numpy(indices).to(self.device)
        x, y = self.x_train[idx], self.y_train[idx]
        self.opt.zero_grad(set_to_none=False)  # p.grad stay views of the flat buffer
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        value, correct = float(loss.detach()), int((logits.argmax(1) == y).sum())
        bad = -1 if math.isfinite(value) else len(self.store.infos)
        if bad < 0 and not bool(torch.isfinite(self.store.buffer).all()):
            bad = 0
        return value, correct, bad

    def bad_place(self, worst: int) -> str:
        return f"the {'loss' if worst == len(self.store.infos) else 'gradient'}"

    def synchronize(self, give_up: bool) -> None:
        if give_up:
            self.opt.discard()
        else:
            self.opt.synchronize()

    def update(self, step: int) -> None:
        with self.opt.skip_synchronize():
            self.opt.step()

    def correct(self, lo: int, hi: int) -> float:
        self.model.eval()
        with torch.no_grad():
            predicted = self.model(self.x_test[lo:hi]).argmax(1)
        return float((predicted == self.y_test[lo:hi]).sum())

    # -- --plan's timing ---------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_passes(self, steps: int, indices_of) -> list[list[float]]:
        """Per pass: forward seconds, then per tensor (flat order) the backward seconds
        since the gradient before it was ready, read by hooks on the parameters (a
        synchronisation in each on a GPU); ``autograd.grad`` leaves ``p.grad`` and the
        optimizer's hooks alone, so nothing is communicated or updated."""
        params = [p for _, p in self.store.named]
        per_step = []
        for step in range(steps):
            ready: dict[int, float] = {}
            handles = [p.register_hook(partial(self._mark, ready, i))
                       for i, p in enumerate(params)]
            idx = torch.from_numpy(indices_of(step)).to(self.device)
            x, y = self.x_train[idx], self.y_train[idx]
            self.model.train()
            self._sync()
            start = time.perf_counter()
            loss = F.cross_entropy(self.model(x), y)
            self._sync()
            last = time.perf_counter()
            times = [last - start] + [0.0] * len(params)
            torch.autograd.grad(loss, params, allow_unused=True)
            for handle in handles:
                handle.remove()
            for i in sorted(ready, key=ready.get):
                times[1 + i], last = ready[i] - last, ready[i]
            per_step.append(times)
        return per_step

    def _mark(self, ready: dict, i: int, grad) -> None:
        self._sync()
        ready[i] = time.perf_counter()

    def time_optimizer(self) -> float:
        """One update over the whole model: Marsit's rule on a scratch twin, or the torch
        optimizer's class with the same settings on copies of the parameters."""
        if self.opt.rule is not None:
            return time_rule(self.opt.rule, self.opt.params, self.placement,
                             self.reducer.compressor is not None, self.t.size)
        params = [p.detach().clone() for _, p in self.store.named]
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
        twin = self.opt.wrapped_class(params, **self.opt.defaults)
        return time_second_pass(twin.step, self._sync)

    # -- checkpoints -----------------------------------------------------------------
    def state(self) -> dict:
        full = self.opt.state_dict()
        ours = full.pop("ringcomp")
        return {"model": {(name,): t.detach().cpu().numpy()
                          for name, t in self.model.state_dict().items()},
                "optimizer": {(str(i), k): v.detach().cpu().numpy() if torch.is_tensor(v)
                              else np.array(v)
                              for i, entry in full["state"].items()
                              for k, v in entry.items() if v is not None},
                "marsit": {(k,): v for k, v in as_arrays(ours["marsit"]).items()},
                "feedback": as_arrays(ours["feedback"]),
                "compressor": as_arrays(ours["compressor"])}

    def load_state(self, state: dict) -> None:
        self.model.load_state_dict({name: torch.from_numpy(np.array(v))
                                    for (name,), v in state["model"].items()})
        entries: dict = {}
        for (i, k), v in state.get("optimizer", {}).items():
            entries.setdefault(int(i), {})[k] = torch.from_numpy(np.array(v))
        current = self.opt.state_dict()
        self.opt.load_state_dict({
            "state": entries, "param_groups": current["param_groups"],
            "ringcomp": {"steps": int(state["step"]),
                         "marsit": {k: v for (k,), v in state.get("marsit", {}).items()},
                         "feedback": state.get("feedback", {}),
                         "compressor": state.get("compressor", {})}})
