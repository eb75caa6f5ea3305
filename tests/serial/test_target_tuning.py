"""Tuning for a target (time-to-accuracy's first half): the exact ring sets the target,
every method's rate is the one with the fewest steps to it (the exact ring's own), the
fastest variant of the exact ring and of Marsit go on."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from test_cli import mpirun

from ringcomp.experiments import target_tuning, target_tuning_choice
from ringcomp.experiments.crossing import sustained_step
from ringcomp.runs import load_run

TINY = ("--model mlp:64x64 --dataset synthetic --samples 2048 --features 16 --epochs 1 "
        "--batch-size 8 --eval-every 8")


def curve(first: int | None, level: float = 0.85, every: int = 10, steps: int = 400):
    """Evaluations of a fake run: nothing before step ``first``, ``level`` from it on
    (never: ``first`` None); its sustained crossing of a target under ``level`` is the
    third evaluation from ``first`` on (the window is 3)."""
    return {"evaluations": [[s, level if first is not None and s >= first else 0.0]
                            for s in range(every, steps + 1, every)]}


def crossing(first: int) -> int:
    return -(-first // 10) * 10 + 20


def test_the_fewest_steps_win_one_variant_of_each_family_goes_on(monkeypatch, tmp_path):
    """With fake runs: the ring's final level sets both targets; every method is then
    tuned for the fewest steps to their sustained crossing, the exact ring's variants too;
    a rate where more sweep seeds get there beats a faster one where fewer do; the rate
    grid and Marsit's ratio grid grow past their edges; every method that goes on is
    refined to 1.4x around its best; the fastest exact variant and the fastest Marsit
    variant go on, Marsit at the default ratio too at the rate where it got there most
    often, a method that never got there does not; every run is full length."""
    ran = []

    def fake(transport, options):
        method = ("ring+sign" if "sign" in options else
                  "ring+topk+ef" if "topk" in options else
                  "marsit" if "marsit" in options else "ring")
        lr = float(options[options.index("--lr") + 1])
        seed = int(options[options.index("--seed") + 1])
        momentum = (float(options[options.index("--momentum") + 1])
                    if "--momentum" in options else 0.9)
        ran.append((method, lr, momentum, "--stop-at" in options, "--metrics" in options))
        if method == "ring" and momentum == 0.9:  # the best final level at lr 0.1
            return curve(100, 0.80) if lr == 0.1 else curve(100, 0.70 + seed / 1000)
        if method == "ring":  # momentum 0.5: fastest at lr 0.03
            return curve(round(30 + 100 * abs(math.log(lr / 0.03))))
        if method == "ring+topk+ef":
            return curve(None)  # never gets there
        if method == "ring+sign":  # 0.1 fastest on one seed, missing on the other
            return curve({0.01: 90, 0.03: 60, 0.1: 40 if seed == 1 else None}.get(lr, 70))
        ratio = (float(options[options.index("--global-lr") + 1]) / lr
                 if "--global-lr" in options else 0.1)  # ring+marsit: the trainer's lr/10
        if ratio == pytest.approx(0.1):  # the default ratio: only seed 1, only at 0.01
            return curve(50 if seed == 1 and lr == 0.01 else None)
        # the smaller eta_s, the sooner; fastest at lr 0.03
        return curve(round(100 * ratio + 10 + 10 * abs(math.log(lr / 0.03))))

    monkeypatch.setattr(target_tuning, "_summary", fake)
    monkeypatch.setattr(target_tuning, "sweep_length", lambda base, ranks: [])
    args = SimpleNamespace(methods=["ring", "ring-m0.5", "ring+marsit", "ring+marsit-s0.03",
                                    "ring+sign", "ring+topk+ef"], lrs=[0.01, 0.03, 0.1],
                           sweep_seeds=[1, 2], seeds=[0, 1], near=0.01, base="",
                           base_options=[], out=str(tmp_path / "t"), command_line=["x"],
                           digests={"train:exact@4": "d"})
    assert target_tuning.main(args) == 0
    result = json.loads((tmp_path / "t.json").read_text())
    assert result["provenance"]["digests"] == {"train:exact@4": "d"}  # what it was handed
    # the ring: best at 0.1, the grid's top, so one step past it was swept too (0.7 there)
    base = result["baseline"]
    assert base["lr"] == 0.1 and base["window"] == 3
    assert sorted(map(float, base["validation"])) == [0.01, 0.03, 0.1, 0.333]
    # its finals agree (0.80 on both seeds): --near is the margin, half of it is below
    # the lowest seed
    assert base["margin"] == pytest.approx(0.01) and base["test_acc_min"] == 0.80
    assert result["target_validation"] == pytest.approx(0.80 - 0.01)
    assert result["target_test"] == pytest.approx(0.80 - 0.01)
    tuned = result["tuned"]
    assert tuned["ring"]["lr"] == 0.1 and tuned["ring-m0.5"]["lr"] == 0.03
    assert tuned["ring-m0.5"]["steps"]["0.03"] == crossing(30)
    assert tuned["ring"]["steps"]["0.1"] == crossing(100)
    # ring+sign: 0.1 reached on one seed only, so 0.03 (both) beats it though slower
    assert tuned["ring+sign"]["lr"] == 0.03 and tuned["ring+sign"]["steps"]["0.1"] == 60
    assert tuned["ring+sign"]["steps_seeds"]["0.1"] == [60, None]
    assert not tuned["ring+topk+ef"]["reached"] and not tuned["ring+topk+ef"]["reached_seeds"]
    # Marsit's ratios 0.1 and 0.03: the smaller wins, so 0.009 and 0.0027 are added
    assert list(tuned)[-2:] == ["ring+marsit-s0.009", "ring+marsit-s0.0027"]
    assert result["marsit"] == "ring+marsit-s0.0027" and result["exact"] == "ring-m0.5"
    # the default ratio goes on at its own best rate: where one sweep seed got there
    assert tuned["ring+marsit"]["lr"] == 0.01 and tuned["ring+marsit"]["reached_seeds"] == 1
    assert result["methods"] == ["ring-m0.5", "ring+sign", "ring+marsit",
                                 "ring+marsit-s0.0027"]
    # every method that goes on refined to 1.4x around its best; none of the others
    from ringcomp.experiments.target_tuning_choice import RESOLUTION

    assert set(result["refined"]) == set(result["methods"])
    for method in result["methods"]:
        assert all(g <= RESOLUTION for g in result["gaps"][method]), method
    assert result["refined"]["ring-m0.5"] == [0.0548, 0.0173, 0.0405, 0.0228]
    assert sorted(map(float, tuned["ring-m0.5"]["steps"])) == [
        0.01, 0.0173, 0.0228, 0.03, 0.0405, 0.0548, 0.1]
    # final runs: the ring to full length (its level), then those timed, at full length
    # too, each with its own options; nothing ever stopped at a target
    finals = [(m, lr, mom) for m, lr, mom, stop, metrics in ran if metrics]
    assert finals == [("ring", 0.1, 0.9)] * 2 + [("ring", 0.03, 0.5)] * 2 + [
        ("ring+sign", 0.03, 0.9)] * 2 + [("marsit", 0.01, 0.9)] * 2 + [
        ("marsit", 0.03, 0.9)] * 2
    assert not any(stop for *_, stop, _ in ran)
    assert result["final_steps"]["ring+marsit"] == {"0": None, "1": crossing(50)}
    assert result["final_accuracy"]["ring+marsit"] == {"0": None, "1": 0.85}
    assert result["final_steps"]["ring-m0.5"] == {"0": crossing(30), "1": crossing(30)}
    assert all("target-" in p for runs_ in result["finals"].values() for p in runs_.values())


def test_a_refined_rate_splits_the_wider_gap_beside_the_best_down_to_the_resolution():
    """The rate added around a timed method's best: the midpoint (in log, 3 significant
    digits) of the wider gap beside it while wider than 1.4x; the best scored by seeds
    reached first; nothing to refine around where no seed got there."""
    refine = target_tuning_choice.refine_rate
    assert target_tuning_choice.RESOLUTION == 1.4
    # best 0.03; gaps 0.01-0.03 (3x) and 0.03-0.1 (3.33x): the wider first
    assert refine({0.01: [90], 0.03: [40], 0.1: [70]}) == 0.0548
    assert refine({0.01: [90], 0.03: [40], 0.0548: [50], 0.1: [70]}) == 0.0173
    # a faster rate where fewer seeds got there is not the best
    assert refine({0.01: [60, 60], 0.03: [40, None], 0.1: [70, 70]}) == 0.0173
    # best at an edge: its one gap; narrow gaps: done
    assert refine({0.003: [20], 0.01: [30]}) == 0.00548
    assert refine({0.01: [50], 0.013: [20], 0.0169: [50]}) is None
    assert refine({0.01: [None], 0.1: [None]}) is None
    assert target_tuning_choice.gaps_beside({0.01: [9], 0.013: [5], 0.1: [9]}) == [
        pytest.approx(1.3), pytest.approx(0.1 / 0.013)]


def test_the_target_sits_below_the_exact_rings_seed_to_seed_interval(monkeypatch,
                                                                      tmp_path):
    """Finals that spread more than --near: the margin is their 95% interval's
    half-width, and both targets move down by it."""
    monkeypatch.setattr(target_tuning, "_summary", lambda transport, options: curve(
        10, 0.80 + 0.02 * int(options[options.index("--seed") + 1])))
    monkeypatch.setattr(target_tuning, "sweep_length", lambda base, ranks: [])
    args = SimpleNamespace(methods=["ring"], lrs=[0.1], sweep_seeds=[5], seeds=[0, 1, 2],
                           near=0.01, base="", base_options=[], out=str(tmp_path / "t"),
                           command_line=["x"], digests={})
    assert target_tuning.main(args) == 0
    result = json.loads((tmp_path / "t.json").read_text())
    half = 4.302653 * 0.02 / math.sqrt(3)  # t(0.975, 2) x sd 0.02 / sqrt(3)
    assert result["baseline"]["margin"] == pytest.approx(half, rel=1e-5)
    assert result["target_test"] == pytest.approx(0.82 - half)
    assert result["methods"] == ["ring"] and result["exact"] == "ring"


def test_tune_for_target_under_mpi(tmp_path, capsys):
    """Real runs at 2 ranks: the target is the ring's final test level minus --near, and
    a final run of a method that goes on crosses it for good where its metrics say."""
    out = mpirun(2, ["-m", "ringcomp.experiments", "tune-for-target", "--base", TINY,
                     "--methods", "ring+sign", "--lrs", "0.03", "--seeds", "0",
                     "--sweep-seeds", "1", "--near", "0.05", "--out", str(tmp_path / "t")])
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "t.json").read_text())
    assert result["kind"] == "target-tuning"
    assert result["provenance"]["command"].startswith("mpiexec -n 2 python -m ringcomp.exp")
    base = result["baseline"]
    assert base["test_acc"] == base["seed_test_acc"]["0"]
    assert result["target_test"] == pytest.approx(base["test_acc"] - 0.05)
    assert result["methods"] == ["ring", "ring+sign"]
    for method in result["methods"]:
        run = load_run(result["finals"][method]["0"])
        evaluations = run["summary"]["evaluations"]
        # full length, and the summary's evaluations are the metrics' own
        assert len(run["records"]) == run["summary"]["steps"]
        assert evaluations == [[r["step"] + 1, r["test_acc"]] for r in run["records"]
                               if r.get("test_acc") is not None]
        reached = sustained_step(evaluations, result["target_test"])
        # the record keeps those steps and the accuracy there, for a clone without the
        # metrics files and for the timing runs to reproduce
        assert result["final_steps"][method]["0"] == reached is not None
        assert result["final_accuracy"][method]["0"] == dict(evaluations)[reached]
    import argparse

    for bad, needle in ((["--near", "-0.1"], "--near must be"),
                        (["--base", "--lr 0.1"], "--base must leave --lr")):
        parser = argparse.ArgumentParser()  # refused at parse time, alike on every rank
        target_tuning.add_parser(parser.add_subparsers(dest="study"))
        args = parser.parse_args(["tune-for-target", "--base", TINY, "--methods", "ring",
                                  *bad])
        with pytest.raises(SystemExit):
            target_tuning.check_args(args, parser)
        assert needle in capsys.readouterr().err

    # the timing study takes the tuning as it is (--tuned): its task, methods and seeds,
    # and refuses what would contradict it
    import argparse

    from ringcomp.experiments import time_to_accuracy as tta

    def check(*argv):
        parser = argparse.ArgumentParser()
        tta.add_parser(parser.add_subparsers(dest="study"))
        args = parser.parse_args(["time-to-accuracy", *argv])
        tta.check_args(args, parser)
        return args

    path = str(tmp_path / "t.json")
    args = check("--hosts", "2", "--tuned", path)
    assert args.base == TINY and args.methods == ["ring", "ring+sign"]
    assert args.seeds == [0] and args.tuned_record["target_test"] == result["target_test"]
    # a clone has the record, not the metrics files (docs/records/*-runs/ is ignored)
    import shutil

    shutil.rmtree(tmp_path / "t-runs")
    args = check("--hosts", "2", "--tuned", path)
    assert [tta.tuned_at(args.tuned_record, m, 0) for m in args.methods] == [
        (result["final_steps"][m]["0"], result["final_accuracy"][m]["0"])
        for m in args.methods]
    # a tuning from before sustained crossings counted first ones: refused
    old = dict(result)
    del old["final_accuracy"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(SystemExit):
        check("--hosts", "2", "--tuned", str(tmp_path / "old.json"))
    assert "not a sustained one: tune again" in capsys.readouterr().err
    for argv, needle in ((["--hosts", "2", "--methods", "ring"], "--tuned fixes --methods"),
                         (["--hosts", "3"], "tuned at 2 ranks; the testbeds have 3"),
                         (["--hosts", "2", "--tuned", str(tmp_path / "none.json")],
                          "No such file")):
        with pytest.raises(SystemExit):
            check("--tuned", path, *argv) if "--tuned" not in argv else check(*argv)
        assert needle in capsys.readouterr().err


def test_the_exact_ring_at_another_momentum_is_a_method_of_its_own():
    """``ring-m<momentum>``: the exact ring (no compressor) at that momentum, for any
    momentum in [0, 1); others are unknown names, not a silent default."""
    from ringcomp.experiments.convergence import METHODS, method_options

    assert method_options("ring-m0.5", 0.1) == ["--momentum", "0.5", "--lr", "0.1"]
    assert method_options("ring-m0", 0.1)[:2] == ["--momentum", "0.0"]
    for bad in ("ring-m1", "ring-m1.5", "ring-m", "tree-m0.5"):
        assert bad not in METHODS
        with pytest.raises(KeyError):
            METHODS[bad]
    assert target_tuning_choice.is_exact_variant("ring-m0.95")
    assert not target_tuning_choice.is_exact_variant("ring+marsit")
