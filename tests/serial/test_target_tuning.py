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
from ringcomp.runs import load_run, steps_to

TINY = ("--model mlp:64x64 --dataset synthetic --samples 2048 --features 16 --epochs 1 "
        "--batch-size 8 --eval-every 8")


def test_the_fewest_steps_win_one_variant_of_each_family_goes_on(monkeypatch, tmp_path):
    """With fake runs: the ring's accuracy sets both targets; every method is then tuned
    for the fewest steps to them, the exact ring's variants too; a rate that misses the
    target on one sweep seed scores nothing; the rate grid and Marsit's ratio grid grow
    past their edges; the fastest exact variant and the fastest Marsit variant go on,
    Marsit at the paper's default ratio too, the others and a method that never reaches
    the target do not; each family's configurations are counted."""
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
        if method == "ring" and "--stop-at" not in options:  # tuned for accuracy
            return {"test_acc": 0.80 if lr == 0.1 else 0.70 + seed / 1000}
        if method == "ring":  # tuned for the target: momentum 0.5 fastest, at lr 0.03
            return {"reached_step": round(30 + 20 * (momentum != 0.5)
                                          + 100 * abs(math.log(lr / 0.03)))}
        if method == "ring+topk+ef":
            return {"reached_step": None}  # never gets there
        if method == "ring+sign":  # 0.1 fastest on one seed, missing on the other
            fast = {0.01: 90, 0.03: 60, 0.1: 40 if seed == 1 else None}.get(lr, 70)
            return {"reached_step": fast}
        ratio = (float(options[options.index("--global-lr") + 1]) / lr
                 if "--global-lr" in options else 0.1)  # ring+marsit: the trainer's lr/10
        # the smaller eta_s, the sooner; fastest at lr 0.03
        return {"reached_step": round(100 * ratio + 10 + 10 * abs(math.log(lr / 0.03)))}

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
    assert result["baseline"]["lr"] == 0.1
    assert sorted(map(float, result["baseline"]["validation"])) == [0.01, 0.03, 0.1, 0.333]
    # its finals agree (0.80 on both seeds): the interval is 0 and --near is the margin
    assert result["baseline"]["margin"] == pytest.approx(0.01)
    assert result["target_validation"] == pytest.approx(0.80 - 0.01)
    assert result["target_test"] == pytest.approx(0.80 - 0.01)
    tuned = result["tuned"]
    assert tuned["ring"]["lr"] == tuned["ring-m0.5"]["lr"] == 0.03
    assert tuned["ring-m0.5"]["steps"]["0.03"] == 30 and tuned["ring"]["steps"]["0.03"] == 50
    # ring+sign: 0.1 missed on seed 2, so 0.03 (60 steps) beats 0.01 (90)
    assert tuned["ring+sign"]["lr"] == 0.03 and tuned["ring+sign"]["steps"]["0.1"] is None
    assert not tuned["ring+topk+ef"]["reached"]
    # Marsit's ratios 0.1 and 0.03: the smaller wins, so 0.009 and 0.0027 are added
    assert list(tuned)[-2:] == ["ring+marsit-s0.009", "ring+marsit-s0.0027"]
    assert all(tuned[m]["lr"] == 0.03 for m in tuned if "marsit" in m)
    assert result["marsit"] == "ring+marsit-s0.0027" and result["exact"] == "ring-m0.5"
    assert result["methods"] == ["ring-m0.5", "ring+sign", "ring+marsit",
                                 "ring+marsit-s0.0027"]
    # every family swept as often as Marsit's (4 ratios x 3 rates): exact had 2 x 3,
    # ring+sign 3, top-k 3 + 2 (its grid grew twice); rates were added to the fastest
    # variant, bisecting around its best rate, the wider gap beside it first
    assert result["configurations"] == {"exact": 12, "marsit": 12, "ring+sign": 12,
                                        "ring+topk+ef": 12}
    refined = result["refined"]
    assert refined["marsit"] == [] and len(refined["ring+sign"]) == 9
    assert len(refined["ring+topk+ef"]) == 7
    assert refined["exact"] == [["ring-m0.5", r] for r in (0.0548, 0.0173, 0.0405, 0.0228,
                                                             0.0349, 0.0262)]
    assert sorted(map(float, tuned["ring-m0.5"]["steps"])) == sorted(
        [0.01, 0.03, 0.1, 0.0548, 0.0173, 0.0405, 0.0228, 0.0349, 0.0262])
    # final runs: the ring to full length (its accuracy), then those timed stop at the
    # target, each with its own options
    finals = [(m, lr, mom, stop) for m, lr, mom, stop, metrics in ran if metrics]
    assert finals == [("ring", 0.1, 0.9, False)] * 2 + [("ring", 0.03, 0.5, True)] * 2 + [
        ("ring+sign", 0.03, 0.9, True)] * 2 + [("marsit", 0.03, 0.9, True)] * 4
    assert all("target-" in p for runs_ in result["finals"].values() for p in runs_.values())


def test_a_refined_rate_bisects_around_the_best_one():
    """The rate added to even a family's budget: the midpoint (in log, 3 significant
    digits) of the wider gap beside the fastest rate, then the nearer; around the middle
    rate when none reached; half a decade either side of a single rate; never one swept,
    never inside a gap under 1.2x (its rates' steps are noise apart)."""
    refine = target_tuning_choice.refine_rate
    # best 0.03; gaps 0.01-0.03 (3x) and 0.03-0.1 (3.33x): the wider first
    assert refine({"0.01": 90, "0.03": 40, "0.1": 70}) == 0.0548
    assert refine({"0.01": 90, "0.03": 40, "0.0548": 50, "0.1": 70}) == 0.0173
    # a rate that missed is no best; none reached: around the middle rate
    assert refine({0.01: None, 0.03: 40, 0.1: None}) == 0.0548
    assert refine({0.01: None, 0.03: None, 0.1: None}) == 0.0548
    # best at an edge: its one gap
    assert refine({0.003: 20, 0.01: 30}) == 0.00548
    # equal gaps: toward the faster end
    assert refine({0.01: 50, 0.1: 20, 1.0: 30}) == 0.316
    assert refine({0.01: 30, 0.1: 20, 1.0: 50}) == 0.0316
    assert refine({"0.1": None}) == 0.0316 and refine({0.1: 5}) == 0.0316
    # the gaps beside the best narrower than MIN_GAP (1.2x): the nearest other gap
    assert target_tuning_choice.MIN_GAP == 1.2
    assert refine({0.0999: 9, 0.1: 5, 0.1001: 9, 1.0: 9}) == 0.316
    assert refine({0.01: 9, 0.09: 9, 0.1: 5, 0.11: 9, 1.0: 9}) == 0.332
    assert refine({0.1: 5, 0.119: 9}) is None and refine({0.1: 5, 0.121: 9}) == 0.11


def test_the_target_sits_below_the_exact_rings_seed_to_seed_interval(monkeypatch,
                                                                      tmp_path):
    """Finals that spread more than --near: the margin is their 95% interval's
    half-width, and both targets move down by it."""
    monkeypatch.setattr(target_tuning, "_summary", lambda transport, options: (
        {"reached_step": 10} if "--stop-at" in options else
        {"test_acc": 0.80 + 0.02 * int(options[options.index("--seed") + 1])}))
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
    """Real runs at 2 ranks: the target is the ring's mean final test accuracy minus
    --near, and a final run of a method that goes on reaches it where its metrics say."""
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
        records = load_run(result["finals"][method]["0"])["records"]
        reached = steps_to(records, result["target_test"])
        assert reached == len(records)  # stopped at the evaluation that reached it
        # and the record keeps those steps itself, for a clone without the metrics files
        assert result["final_steps"][method]["0"] == reached
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
    assert [tta.tuned_steps(args.tuned_record, m, 0) for m in args.methods] == [
        result["final_steps"][m]["0"] for m in args.methods]
    # a tuning from before the steps were recorded needs its files, and says how
    old = dict(result)
    del old["final_steps"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(SystemExit):
        check("--hosts", "2", "--tuned", str(tmp_path / "old.json"))
    assert "run its tuning again first: mpiexec -n 2" in capsys.readouterr().err
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
