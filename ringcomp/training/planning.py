"""``train --plan``: profile the job (or read its profile), plan the buckets, compare planners."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from ringcomp.checks import probe_writable
from ringcomp.plans.call import allreduce
from ringcomp.sched import PLANNERS, iteration_time, make_plan
from ringcomp.sched.profile_record import Profile
from ringcomp.sched.search import MergeCompSearch
from ringcomp.training.buckets import Bucket, buckets_from_plan
from ringcomp.training.measure import agree_medians, measure_costs
from ringcomp.transport.agree import everywhere

#: planners compared in the report (fixed at Horovod's and DDP's defaults)
COMPARED = ("layerwise", "modelwise", "fixed:25", "mgwfbp", "layerfusion", "optimal")


def time_second_pass(update, synchronize) -> float:
    """Seconds of the second of two ``update()`` calls, each between two
    ``synchronize()`` calls (the first creates the optimizer's state buffers)."""
    for _ in range(2):
        synchronize()
        start = time.perf_counter()
        update()
        synchronize()
        elapsed = time.perf_counter() - start
    return elapsed


def time_rule(rule, params, placement, compressed: bool, ranks: int) -> float:
    """Seconds of one prepare + apply of an update ``rule`` (``training.optim``) over the
    whole of ``params``, on a scratch twin with its own state and on a copy of the
    parameters, so the run stays untouched (transiently one more copy of both)."""
    n = params.size
    # the whole model, not a scaled slice: a slice fits the caches and was measured 40%
    # faster than the memory-bound whole (Marsit, VGG-16 at 0.1 scale, 4 ranks)
    optimizer, params = rule.scratch(n), params.copy()
    grad = placement.xp.full(n, 1e-3, np.float32)  # the values do not matter

    def update() -> None:
        sent = optimizer.prepare(grad, params, 0, n, compressed)
        optimizer.apply(params, sent, 0, n, ranks, 0, compressed)  # as if reduced

    return time_second_pass(update, placement.synchronize)


def time_update(binding, transport) -> float:
    """Seconds of what a step does besides forward, backward and the buckets' all-reduces:
    the optimizer's update over the whole model (``binding.time_optimizer()``) and the
    statistics all-reduce of a step."""
    optimizing = binding.time_optimizer()
    transport.barrier()  # time the all-reduce alone, not the ranks' skew before it
    start = time.perf_counter()
    allreduce(np.zeros(4), algorithm="mpi", comm=transport)
    return optimizing + time.perf_counter() - start


def profile_path(args) -> str | None:
    """``--profile``, else the checkpoint directory's profile.json, else None."""
    return args.profile or (os.path.join(args.checkpoint_dir, "profile.json")
                            if args.checkpoint_dir else None)


def save_profile(transport, profile: Profile | None, path: str | None) -> None:
    """Rank 0 writes the profile (every rank raises if it fails); with ``profile`` None,
    only checks now that it could (before the measurement it would end)."""
    def save():
        if transport.rank == 0:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            probe_writable(path) if profile is None else profile.save(path)
    if path:
        everywhere(transport, save)


def load_or_measure(args, t, binding, where, time_passes) -> Profile:
    """The profile at ``--profile`` when that file exists (checked against the model of
    ``binding``), else a new measurement (``time_passes(steps)``, the binding's update and
    the collectives' costs at ``where``; saved there by rank 0 when a path was given).
    With ``--checkpoint-dir`` and no ``--profile`` it lives in the checkpoint directory,
    so a resumed run plans the same buckets."""
    infos, compressed = binding.store.infos, binding.reducer.compressor is not None
    names, sizes = [i.name for i in infos], [4 * i.size for i in infos]
    path = profile_path(args)
    seen = t.allgather_obj(bool(path) and os.path.exists(path))
    if any(seen) and not all(seen):
        raise ValueError(f"profile {path} exists on ranks {[r for r, s in enumerate(seen) if s]}"
                         f" only: put it on a file system every rank sees")
    if all(seen):
        profile = everywhere(t, lambda: Profile.load(path))
        if profile.sizes != sizes or profile.names != names:
            raise ValueError(f"profile {path} was measured for another model "
                             f"({len(profile.sizes)} tensors, {sum(profile.sizes)} bytes; "
                             f"this one: {len(sizes)}, {sum(sizes)})")
        compressor = args.compressor if compressed else None
        setting = {"ranks": t.size, "algorithm": args.algorithm, "compressor": compressor}
        other = {k: v for k, v in setting.items() if getattr(profile, k) != v}
        if other:
            raise ValueError(f"profile {path} was measured with other settings: " + ", ".join(
                f"{k}={getattr(profile, k)!r} (now {v!r})" for k, v in other.items()) +
                "; measure a new one (another --profile path)")
        return profile
    save_profile(t, None, path)  # a measurement must not end in a write that fails
    forward, *backward = agree_medians(t, time_passes(max(1, args.profile_steps)))
    [update] = agree_medians(t, [[time_update(binding, t)] for _ in range(3)])
    compressor = args.compressor if compressed else None
    profile = Profile(t.size, args.algorithm, compressor, names, sizes, backward,
                      **measure_costs(t, args.algorithm, compressor, where=where),
                      forward_s=forward, update_s=update)
    save_profile(t, profile, path)
    return profile


@dataclass
class Planned:
    """What ``--plan`` decided: the buckets, every compared planner's modelled time
    (seconds from the start of backward until the last gradient is all-reduced), the
    profile (a step is predicted to take its ``forward_s`` + the plan's modelled time + its
    ``update_s``), and
    for ``mergecomp`` the online search that may still change the buckets."""

    buckets: list[Bucket]
    modelled: dict
    profile: Profile
    search: MergeCompSearch | None = None

    def describe(self, plan: str) -> str:
        """One line: the plan's buckets and every compared planner against the optimum."""
        best = self.modelled["optimal"]
        return (f"plan {plan}: {len(self.buckets)} buckets "
                f"({sum(b.compressed for b in self.buckets)} compressed); modelled backward "
                f"+ communication per step: " + ", ".join(
                    f"{name} {1e3 * s:.2f} ms ({s / best:.2f}x)"
                    for name, s in self.modelled.items()))

    def summary(self, plan: str) -> dict:
        """The fields a run's summary record gains."""
        search = None if self.search is None else {"groups": self.search.current,
                                                   "measured_s": self.search.measured}
        return {"plan": plan, "modelled_s": self.modelled, "mergecomp": search,
                "predicted_step_s": (self.profile.forward_s + self.modelled[plan]
                                     + self.profile.update_s)}


def plan_buckets_from_profile(args, transport, binding, where, time_passes) -> Planned:
    """``--plan``'s buckets for the model of ``binding`` (its layout and reducer), from
    the profile ``load_or_measure`` gives; no trainer is needed or called back."""
    profile = load_or_measure(args, transport, binding, where, time_passes)
    small = 4 * args.small_tensor if binding.reducer.compressor is not None else 0
    problem = profile.problem(small)
    search = None
    if args.plan == "mergecomp":  # measured online, starting from the model's best guess
        search = MergeCompSearch(problem, args.mergecomp_steps,
                                 chosen=profile.mergecomp_groups)
        plan = search.plan()
    else:
        plan = make_plan(args.plan, problem)
    modelled = {name: iteration_time(problem, make_plan(name, problem))
                for name in dict.fromkeys((*COMPARED, args.plan))
                if name.partition(":")[0] in PLANNERS}
    return Planned(buckets_from_plan(binding.store.infos, plan), modelled, profile, search)
