"""The ResNet-50 study's runs (``resnet50`` has its options and table): each method through
``ringcomp.train``'s trainer, untraced for the step times and traced for the codec, then
PyTorch's DDP on the same model, data and batches."""

from __future__ import annotations

import logging
import os
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling

import ringcomp.torch as rt
from ringcomp.devices import placement
from ringcomp.devices.placement import share_host_cores
from ringcomp.experiments.codecs import CODEC
from ringcomp.experiments.resnet50 import DDP, METHODS, format_table
from ringcomp.plans.call import allreduce
from ringcomp.results.record import machine_load, provenance, write
from ringcomp.torch.job import make_trainer
from ringcomp.torch.models import build_torch_model
from ringcomp.training import data
from ringcomp.training.config import parse
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import mpi_facts

log = logging.getLogger(__name__)
#: the tracer's kinds of a device buffer's copies through host memory
STAGING = ("stage-out", "stage-in")


def _train_options(args, method: str, steps: int, trace: str | None):
    return parse(["--model", "torch:resnet50", "--dataset", "images", "--features",
                  str(3 * args.side ** 2), "--samples", str(args.samples), "--batch-size",
                  str(args.batch_size), "--steps", str(steps), "--device", args.device,
                  "--lr", "0.01", "--progress", "none", "--bucket-mb", f"{args.bucket_mb:g}",
                  *(["--segment-bytes", str(args.segment_bytes)] if args.segment_bytes else []),
                  *(["--trace", trace] if trace else []),
                  *METHODS[method]])


def _sync(device: str) -> None:
    """Wait for the GPU's queued work, so that a step's time includes all of it."""
    if device == "gpu":
        torch.cuda.synchronize()


def _timed_steps(trainer, first: int, count: int, device: str) -> list[dict]:
    """Steps first .. first+count-1: the trainer's own split, the thread's communication
    time and bytes, and, when traced, its codec and staging seconds."""
    rows, tracer = [], trainer.tracer
    for step in range(first, first + count):
        comm0, wire0 = trainer.reducer.engine.comm_s, trainer.reducer.engine.wire_bytes
        seen = len(tracer.records) if tracer else 0
        _sync(device)
        t0 = time.perf_counter()
        record = trainer.train_step(step)
        _sync(device)
        row = {"step_s": time.perf_counter() - t0, "compute_s": record["compute_s"],
               "exposed_s": record["exposed_comm_s"], "update_s": record["update_s"],
               "comm_s": trainer.reducer.engine.comm_s - comm0,
               "wire_bytes": trainer.reducer.engine.wire_bytes - wire0}
        if tracer is not None:
            hops = [h for h in tracer.records[seen:] if h["type"] == "hop"]
            row["codec_s"] = sum(h["t1"] - h["t0"] for h in hops if h["kind"] in CODEC)
            if device == "gpu":  # (host buffers are never staged)
                row["staging_s"] = sum(h["t1"] - h["t0"] for h in hops
                                       if h["kind"] in STAGING)
            row["timeline"] = _timeline(record, tracer.records[seen:], t0)
        trainer.step = step + 1
        rows.append(row)
    return rows


def _timeline(record: dict, traced: list[dict], t0: float) -> dict:
    """When a traced step's all-reduces ran against its forward and backward: ms from the
    step's start (the engine's thread records each collective's start and end)."""
    return {"compute_ms": 1e3 * record["compute_s"],
            "ops": [[r["bytes"], 1e3 * (r["t0"] - t0), 1e3 * (r["t1"] - t0)]
                    for r in traced if r["type"] == "op"]}


def _run(args, method: str, steps: int, skipped: int, trace: str | None) -> list[dict]:
    """A trainer's ``steps`` steps after ``skipped`` untimed ones; the trainer (a model, its
    state and a copy of the data on the GPU) is let go before the next one is made."""
    trainer = make_trainer(_train_options(args, method, skipped + steps, trace),
                           get_transport())
    try:
        return _timed_steps(trainer, 0, skipped + steps, args.device)[skipped:]
    finally:
        trainer.reducer.close()
        del trainer
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_method(method: str, args, transport) -> dict:
    """The untimed warm-up and timed steps, then a traced trainer's steps (one untimed)."""
    timed = _run(args, method, args.steps, args.warmup, None)
    with tempfile.TemporaryDirectory() as folder:  # (nothing is written: no runner)
        traced = _run(args, method, args.trace_steps, 1, os.path.join(folder, "trace"))
    return _agreed(method, transport, timed, traced, timeline=traced[-1]["timeline"])


def _agreed(method: str, transport, timed: list[dict], traced: list[dict] | None,
            **extra) -> dict:
    """Per rank the median of each part over its steps (and the fastest and slowest
    step), then the slowest rank's of each; ``extra`` as this rank has it (rank 0's is
    recorded: the last traced step's timeline)."""
    parts = ["step_s", "compute_s", "exposed_s", "update_s", "comm_s", "wire_bytes"]
    mine = [np.median([r[k] for r in timed]) if k in timed[0] else -1.0 for k in parts]
    mine += [min(r["step_s"] for r in timed), max(r["step_s"] for r in timed)]
    mine += [np.median([r[k] for r in traced]) if traced and k in traced[0] else -1.0
             for k in ("codec_s", "staging_s")]
    worst = allreduce(np.array(mine, float), algorithm="mpi", op="max", comm=transport)
    ms = [None if v < 0 else 1e3 * v for v in worst]
    return {"method": method, "step_ms": ms[0], "compute_ms": ms[1], "exposed_ms": ms[2],
            "update_ms": ms[3], "comm_ms": ms[4], "wire_bytes": worst[5],
            "step_min_ms": ms[6], "step_max_ms": ms[7], "codec_ms": ms[8],
            "staging_ms": ms[9], **extra}


def _ddp_backend(args, transport) -> tuple[str, str]:
    """NCCL where every rank of the node has a GPU of its own; gloo otherwise (NCCL refuses
    two ranks on one GPU), and why."""
    if args.device == "cpu":
        return "gloo", "CPU tensors"
    gpus = torch.cuda.device_count()
    if gpus >= transport.local_size:
        return "nccl", f"a GPU per rank ({gpus} GPUs)"
    return "gloo", (f"{transport.local_size} ranks share {gpus} GPU(s), which NCCL refuses; "
                    f"gloo stages CUDA tensors through host memory")


def run_ddp(args, transport) -> dict:
    """DDP on the same model, initialisation, data and batches (SGD, momentum 0.9)."""
    backend, why = _ddp_backend(args, transport)
    if not dist.is_initialized():
        rt.init_process_group(transport, backend=backend)
    where = torch.device("cpu")
    if args.device == "gpu":
        where = torch.device("cuda", placement.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(where)
    dataset = data.load("images", 0, args.samples, 3 * args.side ** 2)
    model = build_torch_model("torch:resnet50", dataset.features, dataset.classes, 0, where)
    net = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[where] if args.device == "gpu" else None,
        bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    shards = data.Shards(len(dataset.x_train), args.batch_size, transport.size,
                         transport.rank, 0)
    x_all = torch.from_numpy(dataset.x_train).to(where)
    y_all = torch.from_numpy(dataset.y_train).to(where)
    gradients = 4 * sum(q.numel() for q in model.parameters())
    rows = []
    for step in range(args.warmup + args.steps):
        idx = torch.from_numpy(shards.indices(step)).to(where)
        _sync(args.device)
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(net(x_all[idx]), y_all[idx]).backward()
        opt.step()
        _sync(args.device)
        # DDP's C++ all-reduce sends every gradient: a ring's 2(p-1)/p of them per rank
        rows.append({"step_s": time.perf_counter() - t0,
                     "wire_bytes": gradients * 2 * (transport.size - 1) / transport.size})
    del net, model, opt
    dist.destroy_process_group()
    return _agreed(DDP, transport, rows[args.warmup:], None, backend=backend, why=why)


def main(args) -> int:
    transport = get_transport()
    before = machine_load() if transport.rank == 0 else None
    if args.device == "cpu":
        share_host_cores(transport.local_size)  # OMP_NUM_THREADS & co win where set
    rows = [run_ddp(args, transport) if method == DDP else run_method(method, args, transport)
            for method in args.methods]
    if transport.rank != 0:
        return 0
    params = sum(p.numel() for p in build_torch_model(
        "torch:resnet50", 3 * args.side ** 2, data.IMAGE_CLASSES, 0).parameters())
    result = {"ranks": transport.size, "device": args.device, "side": args.side,
              "samples": args.samples, "batch_size": args.batch_size, "steps": args.steps,
              "warmup": args.warmup, "trace_steps": args.trace_steps,
              "bucket_mb": args.bucket_mb, "segment_bytes": args.segment_bytes,
              "parameters": params,
              "rows": rows}
    print(format_table(result))
    prov = provenance(["mpiexec", "-n", str(transport.size), *args.command_line],
                      mpi_facts()["mpi_library"], before, ranks=transport.size,
                      placement="one node", device=args.device)
    write(f"{args.out}.json", "resnet50", prov, result)
    log.info(f"wrote {args.out}.json")
    return 0
