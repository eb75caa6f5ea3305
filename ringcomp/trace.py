"""Hop-by-hop tracing: per-rank JSONL records, a merged Chrome/Perfetto trace, summaries."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

import numpy as np

from ringcomp.devices import device


class Tracer:
    """Collects one record per collective call (``type: op``) and per message (``type: hop``).

    Pass it as ``tracer=`` to any collective; leave it out and no record is made (the hot
    path only tests ``tracer is None``). ``write(transport)`` writes ``DIR/rank-<r>.jsonl``
    on every rank, then rank 0 merges them into ``DIR/trace.json`` (one track per rank, open
    it in https://ui.perfetto.dev or chrome://tracing) and ``DIR/summary.json``.

    Hop fields: op, alg, phase, step, chunk (ring chunk index, -1 elsewhere), seg (segment
    within the chunk or step), kind (send/recv; encode/merge/decode for a compressor's
    codec; stage-out/stage-in for a device buffer's copies through host memory), src, dst,
    bytes, t0 (posted), t1 (completed), wait (seconds blocked waiting for it). Times are
    seconds on this rank's ``time.perf_counter`` clock; ``write`` converts them to
    wall-clock microseconds.
    """

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = None if directory is None else os.fspath(directory)
        self.records: list[dict] = []
        self._on_gpu: list[tuple[dict, tuple]] = []  # hops whose t1 CUDA events will give
        self._perf0 = time.perf_counter()
        self._wall0 = time.time()

    def now(self) -> float:
        """The start of a traced collective call: its time; from here the calling thread's
        staging copies of device buffers are recorded, until ``op`` ends the call."""
        device.listen_staging()
        return time.perf_counter()

    def hop(self, gpu_events=None, **fields) -> None:
        """Record one hop. ``gpu_events``: (start, end) CUDA events around its kernels; its
        ``t1`` then becomes ``t0`` plus their elapsed time when the call ends (``op``),
        read then so that the host need not wait for the kernels hop by hop."""
        fields["type"] = "hop"
        self.records.append(fields)
        if gpu_events:
            self._on_gpu.append((fields, gpu_events))

    def _settle_gpu_times(self) -> None:
        """The GPU hops' durations from their events (waits for the last one)."""
        for fields, events in self._on_gpu:
            fields["t1"] = fields["t0"] + device.elapsed_s(*events)
        self._on_gpu.clear()

    def op(self, ctx, name: str, t0: float) -> None:
        """Record a finished collective call that started at ``t0``, and the staging
        copies it made (hops of kind ``stage-out``/``stage-in``, phase ``staging``: on a
        GPU without a CUDA-aware MPI, the part of a message's cost that is neither the
        codec nor the wire; a receive's span includes its ``stage-in``)."""
        self._settle_gpu_times()
        for kind, nbytes, start, end in device.staged_copies():
            self.hop(op=ctx.op_id, alg=ctx.algorithm, phase="staging", step=-1, chunk=-1,
                     seg=-1, kind=kind, src=ctx.rank, dst=ctx.rank, bytes=nbytes, t0=start,
                     t1=end, wait=0.0)
        self.records.append({
            "type": "op", "op": ctx.op_id, "name": name, "alg": ctx.algorithm,
            "chosen": ctx.chosen or ctx.algorithm, "rank": ctx.rank,
            "size": ctx.size, "n": int(ctx.buf.size), "dtype": str(ctx.buf.dtype),
            "bytes": int(ctx.buf.nbytes), "t_call": min(ctx.t.call_t0, t0), "t0": t0,
            "t1": time.perf_counter()})

    def wall_us(self, t: float) -> float:
        return (self._wall0 + (t - self._perf0)) * 1e6

    def summary(self) -> list[dict]:
        """Per (algorithm, phase, kind): hops, bytes, seconds in flight, seconds waited."""
        self._settle_gpu_times()  # a call that raised never reached ``op``
        groups: dict[tuple, dict] = defaultdict(
            lambda: {"hops": 0, "bytes": 0, "time_s": 0.0, "wait_s": 0.0})
        for rec in self.records:
            if rec["type"] != "hop":
                continue
            g = groups[(rec["alg"], rec["phase"], rec["kind"])]
            g["hops"] += 1
            g["bytes"] += rec["bytes"]
            g["time_s"] += rec["t1"] - rec["t0"]
            g["wait_s"] += rec["wait"]
        return [{"alg": a, "phase": ph, "kind": k, **v} for (a, ph, k), v in sorted(groups.items())]

    def outputs(self, rank: int) -> list[str]:
        """The files ``write`` makes in the directory on ``rank`` (rank 0 merges)."""
        return [f"rank-{rank}.jsonl"] + (["trace.json", "summary.json"] if rank == 0 else [])

    def write(self, transport) -> str | None:
        """Write this rank's JSONL (collective: every rank calls it); rank 0 merges.

        Returns the merged trace's path on rank 0, None elsewhere (or without a directory).
        """
        if self.directory is None:
            return None
        os.makedirs(self.directory, exist_ok=True)
        self._settle_gpu_times()
        path = os.path.join(self.directory, f"rank-{transport.rank}.jsonl")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            for rec in self.records:
                out = dict(rec, rank=transport.rank, ts_us=self.wall_us(rec["t0"]),
                           dur_us=(rec["t1"] - rec["t0"]) * 1e6)
                f.write(json.dumps(out) + "\n")
        os.replace(tmp, path)
        summaries = transport.allgather_obj(self.summary())
        transport.barrier()
        if transport.rank != 0:
            return None
        return merge(self.directory, transport.size, summaries)


def merge(directory: str, size: int, summaries: list | None = None) -> str:
    """Merge ``rank-*.jsonl`` into ``trace.json`` (Chrome trace events) and ``summary.json``."""
    events, wall0 = [], None
    per_rank = []
    for r in range(size):
        with open(os.path.join(directory, f"rank-{r}.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        per_rank.append(recs)
        for rec in recs:
            wall0 = rec["ts_us"] if wall0 is None else min(wall0, rec["ts_us"])
    wall0 = wall0 or 0.0
    for r, recs in enumerate(per_rank):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r,
                       "args": {"name": f"rank {r}"}})
        for rec in recs:
            if rec["type"] == "op":
                name = f"{rec['name']}[{rec['chosen']}] {rec['bytes']} B"
            else:
                peer = rec["src"] if rec["kind"] == "recv" else rec["dst"]
                name = f"{rec['phase']} {rec['kind']} {'<-' if rec['kind'] == 'recv' else '->'}" \
                       f" {peer}"
            args = {k: v for k, v in rec.items() if k not in ("t0", "t1", "ts_us", "dur_us")}
            events.append({"name": name, "cat": rec["type"], "ph": "X", "pid": 0, "tid": r,
                           "ts": rec["ts_us"] - wall0, "dur": rec["dur_us"], "args": args})
    out = os.path.join(directory, "trace.json")
    with open(out + ".tmp", "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    os.replace(out + ".tmp", out)
    if summaries is not None:
        with open(os.path.join(directory, "summary.json.tmp"), "w") as f:
            json.dump([{"rank": r, "phases": s} for r, s in enumerate(summaries)], f, indent=1)
        os.replace(os.path.join(directory, "summary.json.tmp"),
                   os.path.join(directory, "summary.json"))
    return out


#: the hop kinds that are codec work (a compressor's encode, hop rule, decode)
CODEC_KINDS = ("encode", "merge", "decode")


def call_split(records: list[dict]) -> list[dict]:
    """Where each traced call's time went, one dict per call: ``checks_s`` (from the call's
    entry to its collective's start: argument checks, the agreement across ranks,
    resolving the compressor), ``codec_s`` (its encode, merge and decode hops),
    ``wait_s`` (blocked waiting for its messages), ``rest_s`` (the rest of the collective:
    posting messages, the walk's Python, exact reductions, copies), ``total_s``, and
    ``hops``: the messages it received (a ring's 2(p - 1) per segment of a chunk).
    Tracing adds its own cost to ``rest_s``."""
    ops = {r["op"]: r for r in records if r["type"] == "op"}
    parts = {op: {"codec_s": 0.0, "wait_s": 0.0, "hops": 0} for op in ops}
    for rec in records:
        part = parts.get(rec["op"]) if rec["type"] == "hop" else None
        if part is None:
            continue
        if rec["kind"] in CODEC_KINDS:
            part["codec_s"] += rec["t1"] - rec["t0"]
        else:
            part["wait_s"] += rec["wait"]
            part["hops"] += rec["kind"] == "recv"
    rows = []
    for op, rec in ops.items():
        inside = rec["t1"] - rec["t0"]
        codec, wait = parts[op]["codec_s"], parts[op]["wait_s"]
        rows.append({"alg": rec["alg"], "bytes": rec["bytes"], "rank": rec["rank"],
                     "checks_s": rec["t0"] - rec.get("t_call", rec["t0"]), "codec_s": codec,
                     "wait_s": wait, "rest_s": max(0.0, inside - codec - wait),
                     "total_s": rec["t1"] - rec.get("t_call", rec["t0"]),
                     "hops": parts[op]["hops"]})
    return rows


SPLIT_PARTS = ("checks_s", "codec_s", "wait_s", "rest_s", "total_s")


def split_table(calls: list[dict]) -> list[dict]:
    """``call_split``'s calls (any ranks') grouped by (algorithm, bytes): the median of
    each part, and how many calls."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for call in calls:
        groups[(call["alg"], call["bytes"])].append(call)
    return [{"alg": alg, "bytes": nbytes, "calls": len(group),
             **{part: float(np.median([c[part] for c in group])) for part in SPLIT_PARTS},
             "hops": int(np.median([c["hops"] for c in group])),
             "per_hop_s": _per_hop(group)}
            for (alg, nbytes), group in sorted(groups.items(), key=lambda kv: (kv[0][1],
                                                                                kv[0][0]))]


def _per_hop(calls: list[dict]) -> float | None:
    """The median over ``calls`` that received messages of their time after the checks per
    message; None where none did (MPI's own, one rank)."""
    per_hop = [(c["total_s"] - c["checks_s"]) / c["hops"] for c in calls if c["hops"]]
    return float(np.median(per_hop)) if per_hop else None


def format_split(rows: list[dict]) -> str:
    """``split_table``'s rows as text, in microseconds; with the messages a call received
    (``hops``) and the collective's time per hop (its time after the checks over its hops)
    where the rows have them (records written before they were kept do not)."""
    hops = all("hops" in r for r in rows)
    lines = [f"{'size(B)':>10} {'call':<20} {'calls':>6} {'checks_us':>10} {'codec_us':>9} "
             f"{'wait_us':>9} {'rest_us':>9} {'total_us':>9}"
             + (f" {'hops':>5} {'us/hop':>7}" if hops else "")]
    for r in rows:
        lines.append(f"{r['bytes']:>10} {r['alg']:<20} {r['calls']:>6} "
                     + " ".join(f"{r[p] * 1e6:>{w}.1f}" for p, w in
                                zip(SPLIT_PARTS, (10, 9, 9, 9, 9), strict=True))
                     + (f" {r['hops']:>5} " + (f"{r['per_hop_s'] * 1e6:>7.1f}" if
                                               r["per_hop_s"] is not None else f"{'-':>7}")
                        if hops else ""))
    return "\n".join(lines)


def format_summary(summary: list[dict]) -> str:
    """A small text table of ``Tracer.summary()``."""
    lines = [f"{'algorithm':<13}{'phase':<22}{'kind':<6}{'hops':>7}{'bytes':>14}"
             f"{'time ms':>10}{'wait ms':>10}"]
    for row in summary:
        lines.append(f"{row['alg']:<13}{row['phase']:<22}{row['kind']:<6}{row['hops']:>7}"
                     f"{row['bytes']:>14}{row['time_s'] * 1e3:>10.3f}{row['wait_s'] * 1e3:>10.3f}")
    return "\n".join(lines)


def shadow_table(records: list[dict]) -> list[dict]:
    """Mean shadow error per (algorithm+compressor, bytes, contributors) over all records
    given (pass every rank's): the hop-by-hop error curve of each method."""
    sizes = {r["op"]: r["bytes"] for r in records if r["type"] == "op"}
    groups: dict[tuple, list] = defaultdict(list)
    for r in records:
        if r["type"] == "hop" and r["kind"] == "shadow":
            groups[(r["alg"], sizes.get(r["op"], -1), r["contributors"])].append(r)
    rows = []
    for (alg, nbytes, k), recs in sorted(groups.items()):
        rows.append({"alg": alg, "bytes": nbytes, "contributors": k, "hops": len(recs),
                     **{f: sum(x[f] for x in recs) / len(recs)
                        for f in ("rel_err", "cosine", "rel_err_signs", "sign_agree")}})
    return rows


def format_shadow(rows: list[dict]) -> str:
    lines = [f"{'method':<16}{'bytes':>12}{'ranks':>7}{'rel_err':>9}{'cosine':>8}"
             f"{'vs_signs':>10}{'sign_agree':>11}"]
    lines += [f"{r['alg']:<16}{r['bytes']:>12}{r['contributors']:>7}{r['rel_err']:>9.3f}"
              f"{r['cosine']:>8.3f}{r['rel_err_signs']:>10.3f}{r['sign_agree']:>11.3f}"
              for r in rows]
    return "\n".join(lines)
