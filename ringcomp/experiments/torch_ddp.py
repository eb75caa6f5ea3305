"""``python -m ringcomp.experiments torch``: a PyTorch model trained through ringcomp's
DistributedOptimizer and DDP comm hook, next to DDP's own gloo all-reduce and PyTorch's
built-in fp16 and PowerSGD hooks - step time, test accuracy, bytes on the wire.

Every method trains the same model from the same seed on the same batches (digits, the
trainer's shards) with SGD (momentum 0.9), Marsit with its own optimizer (the same local
momentum). A step is timed from zero_grad to the end of the optimizer's step (median over
the steps after the first ``--warmup``); compute threads are shared out among the node's
ranks for every method.
Wire bytes per step and rank: ringcomp counts what its transport sent; for DDP's hooks the
payload handed to ``all_reduce`` is counted (patched in for the run; DDP's own C++
all-reduce and ringcomp's ``algorithm="mpi"`` send every gradient) and multiplied by
2(p-1)/p, what a ring all-reduce sends per rank.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

import ringcomp.torch as rt
from ringcomp.devices.placement import share_host_cores
from ringcomp.experiments.torch_tables import METHODS, format_tables
from ringcomp.log import Heartbeat
from ringcomp.plans.call import allreduce
from ringcomp.results.record import machine_load, provenance, write
from ringcomp.torch.models import build_torch_model
from ringcomp.training import data
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)

class CountingAllReduce:
    """While active, counts the bytes handed to ``torch.distributed.all_reduce``."""

    def __enter__(self):
        self.payload, self.original = 0, dist.all_reduce

        def counting(tensor, *args, **kwargs):
            self.payload += tensor.numel() * tensor.element_size()
            return self.original(tensor, *args, **kwargs)

        dist.all_reduce = counting
        return self

    def __exit__(self, *exc) -> None:
        dist.all_reduce = self.original


def _ddp(model, hook: str | None, transport, bucket_mb: float, group=None):
    wrapped = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb,
                                                        process_group=group)
    state = None
    if hook is not None and hook.startswith("ringcomp"):
        _, _, compressor = hook.partition(":")
        state = rt.HookState(transport, **({"compressor": compressor, "error_feedback": True}
                                           if compressor else {}))
        wrapped.register_comm_hook(state, rt.ringcomp_hook)
    elif hook == "fp16":
        wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, random_seed=0)
        wrapped.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return wrapped, state


def train(method: str, args, transport, dataset, model_spec: str, steps: int,
          progress=lambda label: None, groups=None) -> dict:
    """Train with ``method`` for ``steps`` steps; the median step time with its spread
    over the timed steps, bytes per step and the test accuracy, agreed across ranks.
    ``groups``: a backend's name -> its process group over every rank (DDP's)."""
    how = METHODS[method]
    model = build_torch_model(model_spec, dataset.features, dataset.classes, args.seed)
    inner = (rt.Marsit(model.parameters(), lr=args.lr, momentum=0.9) if how.get("marsit")
             else torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9))
    state = opt = None
    if "opt" in how:
        opt = rt.DistributedOptimizer(inner, model.named_parameters(), comm=transport,
                                      bucket_mb=args.bucket_mb, **how["opt"])
        net = model
    else:
        net, state = _ddp(model, how["ddp"], transport, args.bucket_mb,
                          (groups or {}).get(how.get("backend")))
        opt = inner
    shards = data.Shards(len(dataset.x_train), args.batch_size, transport.size,
                         transport.rank, args.seed)
    x_all, y_all = torch.from_numpy(dataset.x_train), torch.from_numpy(dataset.y_train)
    # ringcomp's engine, where ringcomp reduces (its optimizer, or the DDP hook's state;
    # another hook's state, PyTorch's PowerSGD, has none)
    holder = opt if "opt" in how else state
    engine = getattr(getattr(holder, "reducer", None), "engine", None)
    times, sent0 = [], engine.wire_bytes if engine else 0
    with CountingAllReduce() as counted:
        for step in range(steps):
            idx = torch.from_numpy(shards.indices(step))
            transport.barrier()  # every method's step starts together
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(net(x_all[idx]), y_all[idx]).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            progress(f"{method} on {model_spec}")
    p = transport.size
    payload = counted.payload
    native = how.get("ddp", "") is None or how.get("opt", {}).get("algorithm") == "mpi"
    if native:  # DDP's built-in all-reduce and MPI's own run in C, unseen by the
        # counters: they send every gradient
        payload = steps * 4 * sum(q.numel() for q in model.parameters())
    wire = engine.wire_bytes - sent0 if engine and not native else payload * 2 * (p - 1) / p
    for closing in (opt if "opt" in how else None, state):
        if hasattr(closing, "close"):
            closing.close()
    model.eval()
    with torch.no_grad():
        lo = len(dataset.x_test) * transport.rank // p
        hi = len(dataset.x_test) * (transport.rank + 1) // p
        right = float((model(torch.from_numpy(dataset.x_test[lo:hi])).argmax(1)
                       == torch.from_numpy(dataset.y_test[lo:hi])).sum())
    timed = times[args.warmup:]
    # per rank: median, fastest and slowest timed step; then the slowest rank's of each
    slowest = allreduce(np.array([np.median(timed), wire / steps, min(timed), max(timed)]),
                        algorithm="mpi", op="max", comm=transport)
    total = allreduce(np.array([right, hi - lo]), algorithm="mpi", comm=transport)
    return {"method": method, "step_ms": 1e3 * slowest[0], "wire_bytes": slowest[1],
            "step_min_ms": 1e3 * slowest[2], "step_max_ms": 1e3 * slowest[3],
            "timed_steps": len(timed), "test_acc": total[0] / total[1]}


def main(args) -> int:
    transport = get_transport()
    before = machine_load() if transport.rank == 0 else None
    share_host_cores(transport.local_size)  # OMP_NUM_THREADS & co win where set
    if not dist.is_initialized():
        rt.init_process_group(transport)
    groups = {}
    if any(METHODS[m].get("backend") == "ringcomp" for m in
           args.speed_methods + args.methods):
        import ringcomp.torch.distributed  # noqa: F401 - registers the backend

        groups["ringcomp"] = dist.new_group(list(range(transport.size)), backend="ringcomp")
    dataset = data.load("digits", 0, 0, 64)  # the split of ringcomp.train's --data-seed 0
    params = sum(p.numel() for p in build_torch_model(
        args.speed_model, dataset.features, dataset.classes, 0).parameters())
    progress = Heartbeat(log, "torch: steps", len(args.speed_methods) * args.speed_steps
                         + len(args.methods) * args.steps)
    speed = [train(m, args, transport, dataset, args.speed_model, args.speed_steps, progress,
                   groups) for m in args.speed_methods]
    table = [train(m, args, transport, dataset, args.model, args.steps, progress, groups)
             for m in args.methods]
    if transport.rank != 0:
        return 0
    result = {"ranks": transport.size, "speed_model": args.speed_model, "parameters": params,
              "batch_size": args.batch_size, "threads": torch.get_num_threads(),
              "speed": speed, "model": args.model, "steps": args.steps, "lr": args.lr,
              "seed": args.seed, "table": table}
    print(format_tables(result))
    prov = provenance(["mpiexec", "-n", str(transport.size), *args.command_line],
                      mpi_facts()["mpi_library"], before, ranks=transport.size,
                      placement="one node")
    write(f"{args.out}.json", "torch-ddp", prov, result)
    log.info(f"wrote {args.out}.json")
    return 0
