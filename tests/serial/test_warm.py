"""``python -m ringcomp.warm``'s split over processes: every step once, a type's together."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ringcomp import warm


def labels() -> list[str]:
    return [label for label, _ in warm.steps()]


@pytest.mark.parametrize("jobs", [1, 2, 3, 7])
def test_every_step_runs_once_and_an_element_types_steps_share_a_process(jobs):
    names = labels()
    parts = warm.shares(names, jobs)
    assert 1 <= len(parts) <= min(jobs, 3)
    assert sorted(i for part in parts for i in part) == list(range(len(names)))
    kinds = [{names[i].rpartition(", ")[2] for i in part} for part in parts]
    # a compiled walk compiles the codecs of its element type: two processes compiling
    # steps of one type would compile that code twice
    assert all(a.isdisjoint(b) for n, a in enumerate(kinds) for b in kinds[n + 1:])
    # each process keeps the steps' order (float32's walk before the rest, as one job's)
    assert all(part == sorted(part) for part in parts)


def test_the_steps_name_their_element_type_last():
    assert {name.rpartition(", ")[2] for name in labels()} == {
        "float32", "float64", "other dtypes"}


def test_a_script_without_a_main_guard_warms_in_two_processes(tmp_path):
    """``warm.main`` called from a plain script (as ``tests/warm_kernels.py`` does): its
    processes must not run the caller's script again (multiprocessing's spawned children
    did, and each started a warm-up of its own until the first raised)."""
    script = tmp_path / "warm_here.py"
    script.write_text("from ringcomp import warm\nwarm.main(['--jobs', '2', '--quiet'])\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("ringcomp.warm: compiled") == 1, out.stdout
    assert "Traceback" not in out.stderr
