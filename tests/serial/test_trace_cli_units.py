"""Trace merging and the small helpers, without MPI processes."""

from __future__ import annotations

import json

import pytest

from ringcomp import cli, trace
from ringcomp.transport.agree import options_hash


def test_parse_sizes():
    assert cli.parse_sizes("8,4K,64K,1M,16M,64m") == [8, 4096, 65536, 1 << 20, 16 << 20,
                                                        64 << 20]
    with pytest.raises(Exception, match="bad size"):
        cli.parse_size("12Q")


def test_options_hash_is_order_free():
    assert options_hash({"a": 1, "b": "x"}) == options_hash({"b": "x", "a": 1})
    assert options_hash({"a": 1}) != options_hash({"a": 2})
    assert 0 <= options_hash({"a": 1}) < 2**62


def test_options_hash_remembers_by_value_and_type():
    """The remembered hashes never let equal-comparing options of other types meet (1, 1.0
    and True are one dictionary key), and unhashable values are hashed afresh."""
    hashes = [options_hash({"a": v}) for v in (1, 1.0, True, 1, 1.0, True)]
    assert hashes[:3] == hashes[3:] and len(set(hashes[:3])) == 3
    assert options_hash({"a": [1, 2]}) == options_hash({"a": [1, 2]}) \
        != options_hash({"a": [1, 3]})


def test_merge_writes_one_track_per_rank(tmp_path):
    for r in range(3):
        recs = [{"type": "hop", "alg": "ring", "phase": "all-gather", "kind": "recv",
                 "src": (r - 1) % 3, "dst": r, "bytes": 8, "t0": 0.0, "t1": 1.0,
                 "ts_us": 1e6 + r, "dur_us": 5.0, "rank": r}]
        (tmp_path / f"rank-{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    path = trace.merge(str(tmp_path), 3, [[], [], []])
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert sorted(e["tid"] for e in slices) == [0, 1, 2]
    assert min(e["ts"] for e in slices) == 0
    assert (tmp_path / "summary.json").exists()


def test_summary_groups_by_phase():
    t = trace.Tracer()
    for i in range(3):
        t.hop(alg="ring", phase="reduce-scatter", kind="recv", bytes=10, t0=i, t1=i + 0.5,
              wait=0.1)
    t.hop(alg="ring", phase="all-gather", kind="recv", bytes=4, t0=0, t1=1, wait=0)
    rows = {r["phase"]: r for r in t.summary()}
    assert rows["reduce-scatter"]["hops"] == 3 and rows["reduce-scatter"]["bytes"] == 30
    assert rows["reduce-scatter"]["wait_s"] == pytest.approx(0.3)
    assert "reduce-scatter" in trace.format_summary(t.summary())


def test_report_hops_table_and_plots(tmp_path, capsys):
    from ringcomp import report

    trace_dir = tmp_path / "run"
    trace_dir.mkdir()
    recs = [{"type": "op", "op": 1, "bytes": 4096}]
    for k, err in ((2, 0.5), (3, 0.6), (3, 0.8)):
        recs.append({"type": "hop", "kind": "shadow", "op": 1, "alg": "ring+sign",
                     "contributors": k, "rel_err": err, "cosine": 0.5, "rel_err_signs": 1.0,
                     "sign_agree": 0.8})
    (trace_dir / "rank-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert report.main(["hops", str(trace_dir), "--out", str(tmp_path / "h")]) == 0
    out = capsys.readouterr().out
    assert "ring+sign" in out and "0.700" in out  # mean of the two 3-rank hops
    assert (tmp_path / "h.png").stat().st_size > 1000 and (tmp_path / "h.svg").exists()
    with pytest.raises(SystemExit, match="no rank-"):
        report.main(["hops", str(tmp_path / "missing")])


def test_staging_copies_belong_to_the_traced_call_that_made_them(monkeypatch):
    """A traced call's ``op`` gets the staging copies made since its ``now`` on this thread;
    a call that raised before its ``op`` (its list left open) neither leaks its copies
    into the next traced call nor lets untraced calls after it grow the list without
    bound; no listening, no copies kept."""
    from types import SimpleNamespace

    from ringcomp.devices import device

    ctx = SimpleNamespace(op_id=1, algorithm="ring", rank=0, chosen=None, size=2,
                          buf=SimpleNamespace(size=4, dtype="float32", nbytes=16),
                          t=SimpleNamespace(call_t0=0.0))
    tracer = trace.Tracer()
    device._staged("stage-out", 8, 0.0)  # no traced call: nothing is kept
    t0 = tracer.now()
    device._staged("stage-out", 8, t0)
    device._staged("stage-in", 8, t0)
    tracer.op(ctx, "allreduce", t0)
    kinds = [(r["kind"], r["phase"], r["bytes"]) for r in tracer.records if r["type"] == "hop"]
    assert kinds == [("stage-out", "staging", 8), ("stage-in", "staging", 8)]
    assert device.staged_copies() == []  # the call took them; listening stopped
    tracer.now()  # a call that raises before its op ...
    device._staged("stage-out", 99, 0.0)
    monkeypatch.setattr(device, "COPIES_KEPT", 3)
    for _ in range(10):  # ... then untraced calls: the open list stops growing
        device._staged("stage-in", 99, 0.0)
    assert len(device._listening.copies) == 3
    tracer = trace.Tracer()
    t0 = tracer.now()  # the next traced call starts afresh
    device._staged("stage-in", 16, t0)
    tracer.op(ctx, "allreduce", t0)
    assert [r["bytes"] for r in tracer.records if r["type"] == "hop"] == [16]


def test_gpu_hops_are_timed_by_their_events_read_when_the_call_ends(monkeypatch):
    """A traced hop on a CuPy buffer records CUDA events around its kernels and does not
    wait for them (the next hop's messages overlap its kernels, as untraced); the call's
    end reads the kernels' time from the events."""
    from types import SimpleNamespace

    import numpy as np
    from fakedevice import install_lazy_cupy

    from ringcomp.collectives.hops import Hops

    stream, ndarray = install_lazy_cupy(monkeypatch)
    buf = ndarray(np.zeros(4, np.float32))
    tracer = trace.Tracer()
    ctx = SimpleNamespace(op_id=1, algorithm="ring", rank=0, chosen=None, size=2, buf=buf,
                          tracer=tracer, compressor=None, key=None,
                          t=SimpleNamespace(call_t0=0.0))
    hops = Hops(ctx)

    def kernels(count):  # a codec operation: ``count`` kernels queued, none run
        for _ in range(count):
            stream.queue.append(lambda: None)
        return buf

    t0 = tracer.now()
    hops.timed("merge", "reduce-scatter", 0, 0, kernels, 3)
    hops.timed("decode", "all-gather", 0, 0, kernels, 2)
    assert stream.syncs == 0 and stream.ran == 0  # the host waited for no kernel
    tracer.op(ctx, "allreduce", t0)
    merge, decode = [r for r in tracer.records if r["type"] == "hop"]
    assert merge["t1"] - merge["t0"] == pytest.approx(3e-3)  # 3 "ms" of kernels, in s
    assert decode["t1"] - decode["t0"] == pytest.approx(2e-3)
    # a call that raised before its end: the summary still reads its hop's events
    hops.timed("merge", "reduce-scatter", 1, 0, kernels, 4)
    summary = tracer.summary()
    assert [g["time_s"] for g in summary if g["kind"] == "merge"] == [pytest.approx(7e-3)]
