"""The training job, for the ``train`` tool and the studies alike: the trainer (NumPy or
PyTorch, by ``--model``), its checkpoint directory, the loop, metrics, the progress bar and
the interval log."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import time

from tqdm import tqdm

from ringcomp.checks import probe_directory, probe_writable
from ringcomp.errors import EverywhereError
from ringcomp.torch.job import make_trainer
from ringcomp.training import checkpoint
from ringcomp.training.trainer import NonFinite
from ringcomp.transport.agree import everywhere
from ringcomp.version import __version__, source_commit

log = logging.getLogger(__name__)


def run_header(args, ranks: int, step: int) -> dict:
    """The record a ``--metrics`` file starts with: the run's options, the ringcomp version
    and commit it ran, its ranks, and the step it started (or resumed) at."""
    return {"version": __version__, "commit": source_commit(), "ranks": ranks,
            "from_step": step, "command": " ".join(sys.argv),
            "options": json.loads(json.dumps(dataclasses.asdict(args), default=str))}


class Metrics:
    """JSONL records on rank 0 (appended when resuming), flushed record by record."""

    def __init__(self, path: str | None, rank: int, resume: bool, run: dict | None = None):
        # kept open for the whole run: one record per step, flushed as written
        self.f = (open(path, "a" if resume else "w")  # noqa: SIM115
                  if path and rank == 0 else None)
        if run is not None:  # first (and again where a resumed run goes on): what ran
            self.write({"run": run})

    def write(self, record: dict) -> None:
        if self.f is not None:
            self.f.write(json.dumps(record) + "\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


class IntervalLog:
    """Progress where stderr is not a terminal (a Slurm log, a pipe): one line every tenth
    of the run or every ``seconds``, whichever comes first, instead of a bar redrawn per
    step (which a file keeps as hundreds of lines). Speaks tqdm's update/set_postfix/close."""

    def __init__(self, total: int, initial: int, file, seconds: float = 30.0):
        self.total, self.done, self.file, self.seconds = total, initial, file, seconds
        self.every = max(1, total // 10)
        self.start = self.last = time.monotonic()
        self.postfix: dict = {}

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.done % self.every == 0 or now - self.last >= self.seconds \
                or self.done == self.total:
            self.last = now
            fields = " ".join(f"{k} {v}" for k, v in self.postfix.items())
            print(f"# step {self.done}/{self.total} ({100 * self.done / self.total:.0f}%) "
                  f"{now - self.start:.1f} s {fields}", file=self.file, flush=True)

    def set_postfix(self, refresh: bool = True, **fields) -> None:
        self.postfix = fields

    def close(self) -> None:
        pass


def progress_bar(trainer, mode: str, stream=None):
    """Rank 0's progress (``--progress``): ``bar`` a tqdm bar, ``lines`` an IntervalLog,
    ``auto`` the bar on a terminal and the lines elsewhere (nothing under ``--quiet``),
    ``none`` nothing. Under mpiexec stderr is a pipe, never a terminal: ``bar`` draws there
    anyway (mpiexec passes the redraws through to the terminal it runs on)."""
    if mode == "none" or trainer.t.rank != 0:
        return None
    stream = sys.stderr if stream is None else stream
    if mode == "auto":
        if not logging.getLogger("ringcomp").isEnabledFor(logging.INFO):
            return None
        mode = "bar" if stream.isatty() else "lines"
    if mode == "lines":
        return IntervalLog(trainer.total_steps, trainer.step, stream)
    # no monitor thread: it would exist on rank 0 only and shift the automatic names
    # ("Thread-N") of threads created later, which collectives compare across ranks
    tqdm.monitor_interval = 0
    return tqdm(total=trainer.total_steps, initial=trainer.step, unit="step",
                dynamic_ncols=True, file=stream)


def train_loop(trainer, args, metrics: Metrics, bar) -> dict:
    """Steps until the end, evaluating and checkpointing on schedule; returns the totals
    and the last loss and test accuracy."""
    steps_per_epoch = trainer.shards.steps_per_epoch
    eval_every = args.eval_every or steps_per_epoch
    totals = {"compute_s": 0.0, "exposed_comm_s": 0.0, "update_s": 0.0, "wall_s": 0.0,
              "test_acc": None, "loss": None, "evaluations": []}
    while trainer.step < trainer.total_steps:
        step = trainer.step
        t0, comm_before, wire_before = (time.perf_counter(), trainer.reducer.engine.comm_s,
                                        trainer.reducer.engine.wire_bytes)
        record = trainer.train_step(step)
        trainer.step, totals["loss"] = step + 1, record["loss"]
        wall = time.perf_counter() - t0
        record.update(step=step, epoch=step // steps_per_epoch, wall_s=wall,
                      samples_per_s=record.pop("samples") / wall,
                      comm_s=trainer.reducer.engine.comm_s - comm_before,
                      wire_bytes=trainer.reducer.engine.wire_bytes - wire_before)
        reached = False
        if not trainer.replay and (trainer.step % eval_every == 0
                                   or trainer.step == trainer.total_steps):
            record["test_acc"] = totals["test_acc"] = trainer.evaluate()
            totals["evaluations"].append([trainer.step, record["test_acc"]])
            # the accuracy is one all-reduced number, so every rank stops at the same step
            reached = args.stop_at > 0 and record["test_acc"] >= args.stop_at
        for key in ("compute_s", "exposed_comm_s", "update_s", "wall_s"):
            totals[key] += record[key]
        message = trainer.after_step(wall)
        if message:
            log.info(message)
        metrics.write(record)
        if bar is not None:  # this step's numbers first: update() prints the line
            test_acc = totals["test_acc"]
            bar.set_postfix(loss=f"{record['loss']:.3f}", **({} if trainer.replay else {
                "acc": f"{record['train_acc']:.2f}",
                "test": f"{test_acc:.3f}" if test_acc is not None else "-"}),
                sps=f"{record['samples_per_s']:.0f}", refresh=False)
            bar.update(1)
        if reached:
            totals["reached_step"] = trainer.step
            break
        every = args.checkpoint_every
        if every and trainer.step % every == 0 and trainer.step < trainer.total_steps:
            trainer.save()
    return totals


def run(args, transport) -> dict:
    """Train for the configured steps; returns the summary record (on every rank).

    A run stopped by a non-finite loss or gradient (all ranks stop at the same step) still
    ends its metrics file with a summary record saying so, then raises NonFinite."""
    trainer = everywhere(transport, lambda: make_trainer(args, transport))
    def check_outputs():  # after the checkpoint directory is made (the metrics file may
        # be inside it), before --overwrite deletes anything there
        everywhere(transport, lambda: probe_outputs(args, trainer, transport.rank))

    with contextlib.ExitStack() as held:
        if args.checkpoint_dir:  # before any work: this job's alone (for its lifetime),
            # writable, and no other run's checkpoints
            held.enter_context(checkpoint.prepare(transport, args.checkpoint_dir,
                                                  resume=args.resume, overwrite=args.overwrite,
                                                  check_outputs=check_outputs))
        else:
            check_outputs()
        return _train(args, transport, trainer)


def probe_outputs(args, trainer, rank: int) -> None:
    """Before the first step, what the run writes (``--metrics`` on rank 0, ``--trace``'s
    files on every rank) can be written: a run must not go by and then fail to write its
    results (checkpoints: ``checkpoint.prepare``)."""
    if args.metrics and rank == 0:
        probe_writable(args.metrics)
    if trainer.tracer is not None:
        probe_directory(trainer.tracer.directory, trainer.tracer.outputs(rank))


def _train(args, transport, trainer) -> dict:
    """``run``'s steps once the trainer and the checkpoint directory are ready."""
    trainer.apply_plan()
    if trainer.planned is not None:
        log.info(trainer.planned.describe(args.plan))
    try:
        resumed = args.resume and trainer.restore()
    except ValueError as exc:  # a foreign or corrupt checkpoint: the same on every rank
        raise EverywhereError(str(exc)) from exc
    if args.resume and not resumed:
        log.warning(f"--resume: no complete checkpoint in {args.checkpoint_dir}; starting at "
                    "step 0")
    writes = args.metrics and transport.rank == 0  # only rank 0 asks git for the commit
    metrics = Metrics(args.metrics, transport.rank, args.resume and trainer.step > 0,
                      run_header(args, transport.size, trainer.step) if writes else None)
    bar = progress_bar(trainer, args.progress)
    engine = trainer.reducer.engine
    comm0, wire0, start = engine.comm_s, engine.wire_bytes, time.perf_counter()
    try:
        totals = train_loop(trainer, args, metrics, bar)
        trainer.save()
    except NonFinite as err:  # every rank stops here at the same step, nothing in flight
        trainer.reducer.close()
        metrics.write({"summary": True, "steps": trainer.step, "ranks": transport.size,
                       "stopped": str(err)})
        metrics.close()
        if bar is not None:
            bar.close()
        raise
    # (any other error propagates as is: closing the engine could wait on a collective a
    # failed rank never joins; the abort handler ends the job instead)
    trainer.reducer.close()
    if bar is not None:
        bar.close()
    summary = {"summary": True, "steps": trainer.step, "ranks": transport.size,
               "test_acc": totals["test_acc"], "loss": totals["loss"],
               # [steps taken, accuracy] of this run's evaluations (since a resume): what a
               # sustained crossing of a target is judged on (experiments.crossing)
               "evaluations": totals["evaluations"],
               "wall_s": time.perf_counter() - start, "comm_s": engine.comm_s - comm0,
               "wire_bytes": engine.wire_bytes - wire0,
               **{k: totals[k] for k in ("compute_s", "exposed_comm_s", "update_s")},
               "buckets": len(trainer.reducer.buckets),
               "compressed_buckets": sum(b.compressed for b in trainer.reducer.buckets),
               "parameters": trainer.store.size,
               **({"stop_at": args.stop_at, "reached_step": totals.get("reached_step")}
                  if args.stop_at else {}),
               **(trainer.planned.summary(args.plan) if trainer.planned else {})}
    metrics.write(summary)
    metrics.close()
    if trainer.tracer is not None:
        trainer.tracer.write(trainer.reducer.engine.transport)
    return summary
