"""Metrics files of training runs: loading (resumed, stopped, broken), summaries, the table."""

from __future__ import annotations

import json

import pytest

from ringcomp import runs


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def step(i, acc=None, loss=1.0, wall=0.01):
    record = {"step": i, "loss": loss, "wall_s": wall, "wire_bytes": 100, "compute_s": 0.004,
              "exposed_comm_s": 0.003, "update_s": 0.001}
    return record if acc is None else {**record, "test_acc": acc}


def test_resumed_file_keeps_the_later_record_of_each_step(tmp_path):
    path = write(tmp_path / "a.jsonl", [step(0, 0.5), step(1, 0.6), {"summary": True},
                                        step(1, 0.7), step(2, 0.95, loss=0.2),
                                        {"summary": True, "test_acc": 0.95}])
    run = runs.load_run(path)
    assert [r["step"] for r in run["records"]] == [0, 1, 2]
    assert run["records"][1]["test_acc"] == 0.7 and run["summary"]["test_acc"] == 0.95
    assert runs.steps_to(run["records"], 0.7) == 2 and runs.steps_to(run["records"], 0.99) \
        is None


def test_broken_or_empty_files_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(step(0)) + "\n{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:2: not a JSON record"):
        runs.load_run(str(bad))
    with pytest.raises(ValueError, match="no step records"):
        runs.load_run(write(tmp_path / "e.jsonl", [{"summary": True}]))


def test_paired_difference_cancels_what_a_seed_does_to_both(tmp_path):
    def group(name, accs):
        return [runs.load_run(write(tmp_path / f"{name}{s}.jsonl", [step(0, 0.1), step(1, a)]))
                for s, a in enumerate(accs)]

    # seeds differ by 10 points, the method always loses 2: group intervals overlap, the
    # paired one is exact
    reference, method = group("r", [0.95, 0.85, 0.75]), group("m", [0.93, 0.83, 0.73])
    mean, half = runs.paired_difference(method, reference)
    assert mean == pytest.approx(-0.02) and half == pytest.approx(0, abs=1e-12)
    assert runs.ci95([0.93, 0.83, 0.73]) > 0.2
    mean, half = runs.paired_difference(group("n", [0.96, 0.84, 0.77]), reference)
    assert mean == pytest.approx(0.02 / 3)
    assert half == pytest.approx(runs.ci95([0.01, -0.01, 0.02]))
    stopped = runs.load_run(write(tmp_path / "x.jsonl", [step(0, 0.4), {
        "summary": True, "steps": 1, "stopped": "step 1: the loss is NaN"}]))
    assert runs.paired_difference([*method[:2], stopped], reference) is None
    assert runs.paired_difference(method[:2], reference) is None  # unpaired: refused


def test_summary_over_seeds_and_a_diverged_run(tmp_path):
    seeds = [runs.load_run(write(tmp_path / f"s{s}.jsonl",
                                 [step(0, 0.5), step(1, acc), {"summary": True}]))
             for s, acc in ((0, 0.8), (1, 0.9))]
    stopped = runs.load_run(write(tmp_path / "x.jsonl", [step(0, 0.4), {
        "summary": True, "steps": 1, "stopped": "step 1: the loss is NaN"}]))
    at_zero = runs.load_run(write(tmp_path / "z.jsonl", [{
        "summary": True, "steps": 0, "stopped": "step 0: the loss is NaN"}]))
    rows = runs.summarize({"good": seeds, "mixed": [seeds[0], stopped],
                           "bad": [stopped], "at once": [at_zero]}, target=0.85)
    good, mixed, bad, at_once = rows
    assert at_once["diverged_at"] == 0 and at_once["steps"] == 0
    assert good["test_acc"] == pytest.approx(0.85) and good["test_acc_std"] == \
        pytest.approx(0.05)
    assert good["reached"] == 1 and good["steps_to_target"] is None  # one seed never did
    assert good["wall_s"] == pytest.approx(0.01) and good["wire_bytes"] == 100
    assert mixed["diverged"] == 1 and mixed["test_acc"] == pytest.approx(0.8)
    assert bad["diverged"] == 1 and bad["diverged_at"] == 1 and bad["test_acc"] is None
    table = runs.format_rows(rows, 0.85).splitlines()
    assert "1/2 runs" in table[1] and "(1 NaN)" in table[2] and "NaN @1" in table[3]
    assert "NaN @0" in table[4]
    written = runs.plot_runs({"good": seeds, "mixed": [seeds[0], stopped]}, rows[:2],
                             str(tmp_path / "plot"), 0.85)
    assert all((tmp_path / name).stat().st_size > 1000 for name in ("plot.png", "plot.svg"))
    assert len(written) == 2


def test_no_two_series_of_a_figure_look_alike():
    """Every series of a figure differs from every other in colour or marker (the
    convergence figure gave ring and ring+qsgd, ring+sign and twostage+sign+ef one colour
    and marker): series_style for 100 series; method_style for every convergence method,
    in the order the study plots them, by colour, marker and line together; and a
    compressor keeps its colour whatever its algorithm or index."""
    from ringcomp.experiments.convergence import METHODS
    from ringcomp.plots import method_style, series_style

    pairs = {(series_style(i)["color"], series_style(i)["marker"]) for i in range(100)}
    assert len(pairs) == 100
    styles = [method_style(m, i) for i, m in enumerate(METHODS)]
    looks = {(s["color"], s["marker"], str(s["linestyle"])) for s in styles}
    assert len(looks) == len(METHODS)
    assert method_style("ring", 0)["color"] != method_style("ring+qsgd", 10)["color"]
    assert method_style("ring+sign", 3)["color"] == method_style("twostage+sign+ef", 7)["color"]
    assert method_style("ring+sign", 0)["marker"] != method_style("twostage+sign+ef", 10)[
        "marker"]
