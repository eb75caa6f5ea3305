"""The performance model: cost formulas, predictions, break-even bandwidth, the simulator."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from test_cli import env

from ringcomp import alphabeta, simulate
from ringcomp.compression import get_compressor
from ringcomp.perfmodel import DEFAULT_METHODS
from ringcomp.sched.costs import Codec, Network, compressed_cost, exact_cost, parse_method
from ringcomp.sched.predict import break_even, predict
from ringcomp.sched.workload import Workload, from_network

NET = Network(alpha=1e-5, beta=1e-9, gamma=1e-10)
CODEC = Codec(2e-5, 1e-9)


def test_closed_forms():
    assert exact_cost("ring", 4, 4000, NET) == pytest.approx(6 * (1e-5 + 1000e-9) + 3 * 1e-7)
    assert exact_cost("tree", 5, 4000, NET) == pytest.approx(6 * (1e-5 + 4e-6) + 3 * 4e-7)
    assert exact_cost("ring", 1, 4000, NET) == 0.0
    sign = get_compressor("sign")
    wire = sign.nbytes(1000)
    assert compressed_cost("ring", 4, 4000, NET, sign, CODEC) == pytest.approx(
        CODEC(1000) + 6 * (1e-5 + wire / 4 * 1e-9) + 3 * CODEC(250))
    # an all-gather decodes and adds each payload it receives, encoding none of them again
    assert compressed_cost("allgather", 4, 4000, NET, sign, CODEC) == pytest.approx(
        CODEC(1000) + 3 * (1e-5 + wire * 1e-9) + 3 * (CODEC(1000) + 4000 * 1e-10))
    split = Codec(2e-5, 1e-9, decode=(1e-6, 1e-10))
    assert compressed_cost("allgather", 4, 4000, NET, sign, split) == pytest.approx(
        split(1000) + 3 * (1e-5 + wire * 1e-9) + 3 * (1e-6 + 1e-7 + 4000 * 1e-10))
    assert compressed_cost("ring", 4, 4000, NET, sign, split) == pytest.approx(
        split(1000) + 6 * (1e-5 + wire / 4 * 1e-9) + 3 * split(250))  # cascades re-encode
    assert split.scaled(0.5) == Codec(1e-5, 5e-10, (5e-7, 5e-11))
    # one table of formulas (alphabeta.COSTS): auto's models price here too
    for algorithm in ("dbtree", "rd", "rabenseifner"):
        a, b, g = alphabeta.coefficients(algorithm, 4, 4000)
        assert exact_cost(algorithm, 4, 4000, NET) == pytest.approx(
            a * NET.alpha + b * NET.beta + g * NET.gamma)
    with pytest.raises(ValueError, match="no cost formula"):
        exact_cost("mpi", 4, 4000, NET)
    with pytest.raises(ValueError, match="no cost formula"):
        compressed_cost("dbtree", 4, 4000, NET, sign, CODEC)


def test_methods_go_where_they_are_summable():
    assert parse_method("topk")[0] == "allgather" and parse_method("sign")[0] == "allgather"
    assert parse_method("ring+topk")[0] == "ring"  # cascading, asked for
    assert parse_method("marsit")[0] == "ring" and parse_method("countsketch")[0] == "ring"
    assert parse_method("none") == ("ring", None)


def one_tensor(nbytes=4 << 20, backward=0.05, forward=0.02) -> Workload:
    return Workload("one", (nbytes,), (backward,), forward)


def test_predictions_on_trivial_workloads():
    work = one_tensor()
    alone = predict(work, "none", 1, NET, None)
    assert alone["iter_s"] == pytest.approx(work.compute_s) and alone["wire_MB"] == 0
    for plan in ("layerwise", "optimal", "mgwfbp", "modelwise"):
        row = predict(work, "none", 8, NET, None, plan)  # one tensor: nothing to overlap
        want = work.compute_s + exact_cost("ring", 8, 4 << 20, NET)
        assert row["iter_s"] == pytest.approx(want) and row["no_overlap_s"] == pytest.approx(want)
        assert row["wire_MB"] == pytest.approx(2 * 7 / 8 * (4 << 20) / 1e6)
    two = Workload("two", (4 << 20, 4 << 20), (0.05, 0.05), 0.02)  # first message hides
    row = predict(two, "none", 8, NET, None, "layerwise")
    assert row["iter_s"] == pytest.approx(0.02 + 0.1 + exact_cost("ring", 8, 4 << 20, NET))


def test_break_even_bandwidth_matches_the_closed_form():
    """One tensor: compression pays iff 2(p-1)/p·(m - m_c)·8/B + (p-1)·m/p·gamma (the exact
    ring's additions) > c(n) + (p-1)·c(n/p)."""
    work, p, m = one_tensor(), 8, 4 << 20
    marsit = get_compressor("marsit")
    saved_bits = 2 * (p - 1) / p * (m - marsit.nbytes(m // 4)) * 8
    extra = CODEC(m // 4) + (p - 1) * CODEC(m // 4 / p) - (p - 1) * m / p * NET.gamma
    want = saved_bits / extra
    got = break_even(work, "marsit", p, NET.alpha, NET.gamma, CODEC)
    assert got == pytest.approx(want, rel=1e-6)
    net = Network.of(want / 2, NET.alpha, NET.gamma)  # below break-even: compression helps
    assert (predict(work, "marsit", p, net, CODEC)["iter_s"]
            < predict(work, "none", p, net, None)["iter_s"])
    assert break_even(work, "marsit", p, NET.alpha, NET.gamma, Codec(10.0, 0)) is None


def test_simulated_scaling_reproduces_the_published_shape():
    args = simulate.parser().parse_args([
        "--workers", "4,64,1024", "--bandwidth", "1Gbps,100Gbps", "--codec", "3e-5,2e-9",
        "--codec-speedup", "1", "--compressors", "none,marsit,topk"])
    records = simulate.simulate(args)["rows"]
    assert len(records) == 3 * 2 * 5 * 3
    eff = {(r["workers"], r["bandwidth_bps"], r["plan"], r["compressor"]):
           r["scaling_efficiency"] for r in records}
    for (w, rate, _, comp), e in eff.items():
        assert 0 < e <= 1
        assert eff[(w, rate, "optimal", comp)] >= e - 1e-12  # optimal beats every plan
    for w in (4, 64, 1024):
        for rate in (1e9, 1e11):  # merging beats plain WFBP
            assert eff[(w, rate, "mgwfbp", "none")] >= eff[(w, rate, "wfbp", "none")]
        # compression helps on the slow link...
        assert eff[(w, 1e9, "optimal", "marsit")] > 2 * eff[(w, 1e9, "optimal", "none")]
    # ...not on the fast one at small scale, and all-gather compressors scale worst
    assert eff[(4, 1e11, "optimal", "none")] >= eff[(4, 1e11, "optimal", "marsit")]
    assert eff[(4, 1e11, "wfbp", "none")] > eff[(4, 1e11, "syncea", "none")]
    topk = [eff[(w, 1e9, "optimal", "topk")] for w in (4, 64, 1024)]
    assert topk == sorted(topk, reverse=True) and topk[-1] < 0.05


def test_model_and_simulate_commands(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ringcomp.perfmodel", "--model", "bert-base",
                          "--workers", "8", "--bandwidth", "1Gbps", "--methods",
                          "marsit,topk", "--codec", "1e-5,1e-9", "--json",
                          str(tmp_path / "m.json")], capture_output=True, text=True,
                         timeout=300, env=env())
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "m.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["none", "marsit", "topk"]
    assert rows[1]["speedup"] > 1 and "pays off" in out.stdout
    out = subprocess.run([sys.executable, "-m", "ringcomp.simulate", "--workers", "4,16",
                          "--plans", "wfbp,optimal", "--codec", "1e-5,1e-9", "--json",
                          str(tmp_path / "s.json"), "--out", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=300, env=env())
    assert out.returncode == 0, out.stderr
    assert len(json.loads((tmp_path / "s.json").read_text())) == 2 * 2 * 3
    assert (tmp_path / "s.png").stat().st_size > 1000
    out = subprocess.run([sys.executable, "-m", "ringcomp.perfmodel", "--model", "alexnet"],
                         capture_output=True, text=True, timeout=60, env=env())
    assert out.returncode == 2 and "unknown network 'alexnet'" in out.stderr


def test_model_command_runs_as_documented_with_measured_codecs():
    """``python -m ringcomp.perfmodel`` bare, the first command docs/training.md shows: codecs
    measured on this machine (it crashed with an AttributeError after a function moved)."""
    out = subprocess.run([sys.executable, "-m", "ringcomp.perfmodel"], capture_output=True,
                         text=True, timeout=300, env=env())
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("method"))
    rows = [line.split() for line in lines[header + 1:] if line.strip()]
    assert [r[0] for r in rows[:8]] == DEFAULT_METHODS.split(","), out.stdout
    assert all(float(r[3]) > 0 for r in rows[:8]), out.stdout  # iteration ms


def test_a_decode_alone_is_timed_without_its_encode(monkeypatch):
    """``time_codec(decode_only=True)`` times the decode and not the encode before it, and
    ``measure_codec`` fits both parts (on a clock that the codec's calls advance: encode 10
    units per element, decode 1, so no timing is asserted)."""
    from ringcomp.training import measure

    clock = [0.0]

    class Codec10To1:
        def encode(self, x, key):
            clock[0] += 10.0 * x.size
            return x

        def decode(self, payload, n, out):
            clock[0] += 1.0 * n
            return out

    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])
    assert measure.time_codec(Codec10To1(), 4096, repeats=2) == 11 * 1024
    assert measure.time_codec(Codec10To1(), 4096, repeats=2, decode_only=True) == 1024
    codec = measure.measure_codec(Codec10To1(), repeats=2, speedup=2.0)
    assert codec.b == pytest.approx(11 / 2) and codec.a == pytest.approx(0)
    assert codec.decode == pytest.approx((0, 1 / 2))
    assert codec.decoding(1000) == pytest.approx(500) and codec(1000) == pytest.approx(5500)


def test_codec_costs_given_or_refused():
    from ringcomp.training.whatif import parse_codec

    assert parse_codec("measured") is None
    assert parse_codec("1e-5,2e-9") == Codec(1e-5, 2e-9)
    assert parse_codec("1e-5,2e-9,0,1e-10") == Codec(1e-5, 2e-9, (0.0, 1e-10))
    for text in ("1,2,3", "-1,2", "1,nan", "a,b", "1,2,3,-4", "1,inf"):
        with pytest.raises(argparse.ArgumentTypeError, match="bad codec"):
            parse_codec(text)
    out = subprocess.run([sys.executable, "-m", "ringcomp.perfmodel", "--codec=-1,2"],
                         capture_output=True, text=True, timeout=60, env=env())
    assert out.returncode == 2 and "bad codec" in out.stderr, out.stderr


def test_model_record_renders_the_printed_table(tmp_path):
    """``--record``: the table with its provenance, rendered exactly as printed."""
    from ringcomp.results import record as records
    from ringcomp.results.perftable import render

    path = tmp_path / "new" / "pm.json"
    out = subprocess.run([sys.executable, "-m", "ringcomp.perfmodel", "--methods",
                          "marsit,topk", "--codec", "1e-5,1e-9", "--record", str(path)],
                         capture_output=True, text=True, timeout=300, env=env())
    assert out.returncode == 0, out.stderr
    record = records.load(str(path))
    assert record["kind"] == "perfmodel"
    assert record["provenance"]["command"].startswith("python -m ringcomp.perfmodel --methods")
    table = [ln for ln in out.stdout.splitlines() if ln.startswith(("none", "marsit", "topk"))]
    assert len(table) == 3 and all(line in render(record) for line in table)


def test_simulate_record_renders_the_printed_table(tmp_path):
    """``simulate --record``: every link x plan x compressor row the command prints, with
    the same efficiencies, and the codec costs it assumed named above the table."""
    from ringcomp.results import record as records
    from ringcomp.results.simtable import render

    path = tmp_path / "new" / "sim.json"
    out = subprocess.run([sys.executable, "-m", "ringcomp.simulate", "--workers", "4,64",
                          "--bandwidth", "1Gbps,10Gbps", "--plans", "wfbp,optimal",
                          "--compressors", "none,marsit", "--codec", "1e-5,1e-9",
                          "--codec-speedup", "2", "--record", str(path),
                          "--out", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=300, env=env())
    assert out.returncode == 0, out.stderr
    record = records.load(str(path))
    assert record["kind"] == "simulate"
    assert record["provenance"]["command"].startswith("python -m ringcomp.simulate --workers")
    assert record["codecs"] == {"marsit": [5e-6, 5e-10]}  # divided by the speed-up
    printed = [ln.split() for ln in out.stdout.splitlines()
               if ln.startswith(("wfbp", "optimal"))]
    rendered = [[c.strip() for c in ln.strip("|").split("|")][1:]
                for ln in render(record).splitlines() if ln.startswith("| 1")]
    assert len(printed) == len(rendered) == 2 * 2 * 2
    assert printed == rendered
    assert "marsit: 5 us + 0.5 ns/element" in render(record)


def test_network_workloads_add_up():
    work = from_network("resnet50", batch=32, tflops=10)
    assert sum(work.sizes) == 4 * 25_557_032 and len(work.sizes) == 161
    assert work.compute_s == pytest.approx(3 * 8.2228e9 * 32 / 10e12, rel=1e-3)
