"""Records and the docs' generated blocks: provenance, staleness, rendering, the check."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ringcomp import records
from ringcomp.experiments import codecs


def test_every_generated_block_in_the_docs_is_what_its_record_renders():
    """The figures in README.md and docs/ are the records' own (report docs --check)."""
    done = subprocess.run([sys.executable, "-m", "ringcomp.report", "docs", "--check"],
                          capture_output=True, text=True, cwd=records.ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _record(tmp_path, code_file, **data):
    prov = records.provenance(["python", "-m", "ringcomp.experiments", "codecs"],
                              [os.path.relpath(code_file, records.ROOT)], "MPICH Version: 9",
                              ranks=4)
    path = str(tmp_path / "r.json")
    records.write(path, "test-kind", prov, data)
    return path


@pytest.fixture
def test_kind():
    records.RENDERERS["test-kind"] = lambda r: f"| value |\n|---|\n| {r['value']} |"
    yield
    del records.RENDERERS["test-kind"]


def test_provenance_names_the_command_commit_host_mpi_versions_and_code():
    prov = records.provenance(["cmd", "--x"], ["ringcomp/records.py"], "MPICH Version: 5",
                              ranks=3)
    assert prov["command"] == "cmd --x" and prov["mpi"] == "MPICH Version: 5"
    assert len(prov["commit"]) == 40 and isinstance(prov["dirty"], bool)
    assert prov["host"]["cores"] == os.cpu_count() and prov["host"]["cpu"]
    assert prov["versions"]["numpy"] and prov["versions"]["python"]
    assert prov["code"]["hash"] == records.code_hash(["ringcomp/records.py"])
    assert prov["ranks"] == 3
    assert prov["host"]["gpus"] == records._gpus()  # none on a machine without nvidia-smi


def test_a_gpu_host_names_its_gpus_driver_and_cuda_runtime(monkeypatch, tmp_path):
    """What ``nvidia-smi`` lists goes into the host, the CUDA runtime CuPy loaded beside it
    and whether an MPS server shared the GPU, and the rendered footer names them: a table
    measured on a GPU says on which."""
    listed = "NVIDIA H100 80GB HBM3, 580.159, 81559 MiB\n"
    monkeypatch.setattr(records.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(records.subprocess, "run", lambda cmd, **kw: subprocess.
                        CompletedProcess(cmd, 0, listed if "nvidia-smi" in cmd[0] else ""))
    runtime = type("Runtime", (), {"runtimeGetVersion": staticmethod(lambda: 12080)})
    monkeypatch.setitem(sys.modules, "cupy", type("Cupy", (), {"cuda": type(
        "Cuda", (), {"runtime": runtime})}))
    gpus = records._gpus()
    assert gpus == [{"model": "NVIDIA H100 80GB HBM3", "driver": "580.159",
                     "memory": "81559 MiB", "cuda_runtime": "12.8"}]
    prov = {"date": "d", "host": {"cores": 16, "cpu": "x86", "gpus": gpus}, "mpi": "MPI",
            "versions": {}, "commit": "c" * 40, "dirty": False, "command": "cmd",
            "code": {"files": [], "hash": records.code_hash([])}}
    assert ("on 16 cores (x86) and 1 x NVIDIA H100 80GB HBM3 (driver 580.159, CUDA 12.8), "
            in records.footer({"kind": "k", "provenance": prov}))
    pipe = tmp_path / "mps"  # an MPS server's control pipe: the footer says the GPU was shared
    pipe.mkdir()
    (pipe / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    prov["host"]["gpus"] = records._gpus()
    assert prov["host"]["gpus"][0]["mps"] is True
    assert "(driver 580.159, CUDA 12.8, MPS), " in records.footer({"kind": "k",
                                                                    "provenance": prov})
    monkeypatch.setattr(records.shutil, "which", lambda name: None)
    assert records._gpus() == []


def test_blocks_are_rendered_checked_and_stale_code_is_marked(tmp_path, test_kind):
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    path = _record(tmp_path, code, value=42)
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n<!-- BEGIN generated from {path} -->\nold\n<!-- END generated -->\n"
                   f"outro\n")
    assert records.update_blocks(str(doc), check=True) == [path]  # differs, left alone
    assert "old" in doc.read_text()
    assert records.update_blocks(str(doc)) == [path]
    text = doc.read_text()
    assert "| 42 |" in text and "Reproduce: `python -m ringcomp.experiments codecs`" in text
    assert text.startswith("intro\n") and text.endswith("outro\n") and "Stale" not in text
    assert records.update_blocks(str(doc), check=True) == []  # now equal
    code.write_text("x = 2\n")  # the measured code changed: the block says so
    assert records.update_blocks(str(doc), check=True) == [path]
    records.update_blocks(str(doc))
    assert "**Stale:**" in doc.read_text() and "(1 of its 1 files: `" in doc.read_text()


def test_an_unknown_record_kind_is_refused_by_name(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"kind": "nonsense", "provenance": {}}))
    with pytest.raises(ValueError, match="no renderer for record kind 'nonsense'"):
        records.render(records.load(str(path)))


def test_codecs_ratios_are_paired_repetition_by_repetition():
    rows = [{"size_bytes": 8, "algorithm": "ring", "compressor": "none", "time_s": 2.0,
             "times_s": [2.0, 4.0, 1.0]},
            {"size_bytes": 8, "algorithm": "ring", "compressor": "marsit", "time_s": 1.0,
             "times_s": [1.0, 1.0, 1.0]}]
    (row,) = codecs.rings(rows, memcpy_gbps=8e-9, p=4, cores=2)
    # per repetition 0.5, 0.25, 1.0: not the ratio of the medians (0.5)
    assert (row["median"], row["min"], row["max"]) == (0.5, 0.25, 1.0)
    assert row["bound_s"] == pytest.approx(2.0)  # 4 ranks on 2 cores: two copies of 8 bytes


def test_codecs_time_split_sums_codec_and_waits_per_call(tmp_path):
    """A call's time = codec (encode, merge, decode hops) + waits + the rest, per call and
    rank, averaged; MPI's own calls (no hops) are left out."""
    def op(rank, number, alg, seconds):
        return {"type": "op", "rank": rank, "op": number, "alg": alg, "bytes": 64, "size": 2,
                "t0": 0.0, "t1": seconds}

    def hop(rank, number, kind, seconds, wait=0.0):
        return {"type": "hop", "rank": rank, "op": number, "kind": kind, "t0": 1.0,
                "t1": 1.0 + seconds, "wait": wait}

    for rank in (0, 1):
        lines = [op(rank, 1, "ring+marsit", 1.0), hop(rank, 1, "encode", 0.25),
                 hop(rank, 1, "merge", 0.25), hop(rank, 1, "recv", 0.5, wait=0.25),
                 op(rank, 2, "mpi", 9.0)]
        (tmp_path / f"rank-{rank}.jsonl").write_text("".join(json.dumps(x) + "\n"
                                                             for x in lines))
    (row,) = codecs.split(str(tmp_path))
    assert row["method"] == "ring+marsit" and row["calls"] == 2 and row["p"] == 2
    assert (row["op_s"], row["codec_s"], row["wait_s"], row["rest_s"]) == (1.0, 0.5, 0.25,
                                                                           0.25)


def test_a_block_naming_a_missing_record_fails_with_the_documents_name(tmp_path,
                                                                        monkeypatch):
    doc = tmp_path / "page.md"
    doc.write_text("<!-- BEGIN generated from docs/records/nowhere.json -->\n"
                   "<!-- END generated -->\n")
    monkeypatch.setattr(records, "documents", lambda: [str(doc)])
    from ringcomp import report

    with pytest.raises(SystemExit, match="page.md.*nowhere.json"):
        report.report_docs(check=True)


@pytest.mark.parametrize("argv,words", [
    (["--ranks", "1"], "--ranks must be at least 2"),
    (["--iters", "2"], "--iters must be at least 3"),
    (["--testbed-rate", "fast"], "--testbed-rate"),
    (["--split-ranks", "4,1"], "--split-ranks need at least 2 ranks"),
])
def test_codecs_study_refuses_nonsense_options_before_running_anything(argv, words):
    done = subprocess.run([sys.executable, "-m", "ringcomp.experiments", "codecs", *argv],
                          capture_output=True, text=True, cwd=records.ROOT, timeout=120)
    assert done.returncode == 2 and words in done.stderr, done.stderr


@pytest.mark.parametrize("status, dirty", [("M docs/records/bench-p4.json\n M docs/a.md", False),
                                           ("M docs/a.md\n M ringcomp/api.py", True),
                                           ("M ringcomp/api.py", True)])
def test_only_changes_outside_docs_make_a_record_dirty(monkeypatch, status, dirty):
    """A study writing several records in a row: the records before it are not code.
    (``_git`` strips its output, so the first line has lost its leading blank.)"""
    monkeypatch.setattr(records, "_git", lambda *a: status if a[0] == "status" else "0" * 40)
    assert records.provenance(["x"], ["ringcomp/records.py"], "")["dirty"] is dirty


def test_report_knows_every_kind_a_tool_writes():
    """``report docs`` renders any record a study or tool writes (a kind missing here would
    fail only when a page first embeds it)."""
    import ringcomp.report  # noqa: F401 - registers the renderers

    assert {"bench", "codecs", "convergence", "hops", "perfmodel", "simulate", "torch-ddp",
            "validate"} <= set(records.RENDERERS)


def test_code_files_match_patterns_once_and_sorted():
    files = records.code_files("ringcomp/collectives/*.py", "ringcomp/collectives/ring.py")
    assert files == sorted(set(files)) and "ringcomp/collectives/ring.py" in files
    assert all(not f.startswith("/") for f in files)


def _convergence_record(path, task, ranks, accs):
    """A convergence record of one task: method -> per-seed test accuracies."""
    def row(label, seeds):
        mean = sum(seeds) / len(seeds)
        return {"label": label, "lr": 0.1, "test_acc": mean, "test_acc_ci95": 0.01,
                "versus": "ring", "seed_test_acc": {str(i): a for i, a in enumerate(seeds)}}
    prov = records.provenance(["mpiexec", "-n", str(ranks), "python", "-m",
                               "ringcomp.experiments", "convergence", "--tasks", task],
                              ["ringcomp/records.py"], "MPICH Version: 9", ranks=ranks)
    records.write(str(path), "convergence", prov, {
        "ranks": ranks, "seeds": [0, 1, 2], "tasks": {task: {"base": "--model mlp", "rows": [
            row(label, seeds) for label, seeds in accs.items()]}}})
    return str(path)


def test_one_block_renders_the_convergence_columns_of_several_records(tmp_path):
    """A block naming several records renders one table across them (a column per task and
    rank count), the paired differences derived from the per-seed accuracies, and every
    record's footer; records of two kinds in one block are refused by name."""
    import ringcomp.report  # noqa: F401 - registers the renderers

    iid = _convergence_record(tmp_path / "iid.json", "mlp", 8, {
        "ring": [0.98, 0.97, 0.99], "ring+marsit": [0.96, 0.95, 0.97]})
    skew = _convergence_record(tmp_path / "skew.json", "mlp-skew", 16, {
        "ring": [0.97, 0.96, 0.98], "ring+marsit": [0.975, 0.975, 0.975],
        "ring+sign": [0.90, 0.91, 0.92]})
    doc = tmp_path / "doc.md"
    doc.write_text(f"<!-- BEGIN generated from {iid} {skew} -->\n<!-- END generated -->\n")
    assert records.update_blocks(str(doc)) == [f"{iid} {skew}"]
    text = doc.read_text()
    assert "| method | mlp, p=8 | mlp-skew, p=16 |" in text
    assert "| ring+marsit | 0.960 ± 0.010 (0.1) | 0.975 ± 0.010 (0.1) |" in text
    assert "| ring+sign | - | 0.910 ± 0.010 (0.1) |" in text  # not in the first column
    # paired: 2 points below on every seed (interval 0: bold); +0.5 +1.5 -0.5: not bold
    assert "| ring+marsit | **-2.00 ± 0.00** | +0.50 ± 2.48 |" in text
    assert text.count("Reproduce: `mpiexec -n") == 2 and "`iid.json`: Measured" in text
    assert records.update_blocks(str(doc), check=True) == []
    doc.write_text(f"<!-- BEGIN generated from {iid} -->\n<!-- END generated -->\n")
    records.update_blocks(str(doc))  # one record of the kind: the same form, one column
    assert "| method | mlp, p=8 |" in doc.read_text()

    other = _record(tmp_path, records.ROOT + "/ringcomp/records.py", value=1)
    records.RENDERERS["test-kind"] = lambda r: "x"
    try:
        doc.write_text(f"<!-- BEGIN generated from {iid} {other} -->\n<!-- END generated -->\n")
        with pytest.raises(ValueError, match="records of one kind"):
            records.update_blocks(str(doc))
        doc.write_text(f"<!-- BEGIN generated from {other} {other} -->\n"
                       "<!-- END generated -->\n")
        with pytest.raises(ValueError, match="no renderer of several records"):
            records.update_blocks(str(doc))
    finally:
        del records.RENDERERS["test-kind"]


def test_a_record_is_checked_against_files_its_study_named_only_later(monkeypatch):
    """A file the study declares now but did not when the record was measured (the
    kernels, named after the first convergence columns) counts when it changed since the
    record's commit; not when it did not exist then (new code cannot have been
    measured), nor when the record declared it and left it out (another compressor's)."""
    then = {"study.py": "x = 1\n", "kernel.py": "k = 1\n", "other.py": "o = 1\n"}
    now = {"study.py": "x = 1\n", "kernel.py": "k = 2\n", "other.py": "o = 2\n",
           "new.py": "n = 1\n"}
    monkeypatch.setattr(records, "code_hash", lambda files: "same")
    monkeypatch.setattr(records, "_at_commit", lambda commit, path: then.get(path))
    monkeypatch.setattr(records, "_current", lambda path: now[path])
    monkeypatch.setattr(records, "_git", lambda *args: "\n".join(
        path for path in ("kernel.py", "other.py", "new.py") if path in args))
    monkeypatch.setitem(records.DECLARED, "later",
                        lambda record: ["study.py", "kernel.py", "other.py", "new.py"])
    old = {"kind": "later", "provenance": {"commit": "c" * 40, "dirty": False, "code": {
        "files": ["study.py"], "hash": "same"}}}
    assert records.changed_files(old) == ["kernel.py", "other.py"]
    narrowed = {"kind": "later", "provenance": {"commit": "c" * 40, "dirty": False, "code": {
        "files": ["study.py", "kernel.py"], "hash": "same",
        "declared": ["study.py", "kernel.py", "other.py"]}}}
    assert records.changed_files(narrowed) == []  # the hash of its own files matches
    monkeypatch.setattr(records, "code_hash", lambda files: "moved")
    assert records.changed_files(narrowed) == ["kernel.py"]



def test_a_file_the_study_no_longer_names_for_a_record_is_not_compared(monkeypatch):
    """A record measured when its study named the planning code for runs that never plan:
    once the study narrows it away for such records, a change to it does not make the
    record stale; a change to a file still named does, and so does a named file gone."""
    then = {"study.py": "x = 1\n", "planning.py": "p = 1\n", "kernel.py": "k = 1\n"}
    now = {"study.py": "x = 1\n", "planning.py": "p = 2\n", "kernel.py": "k = 1\n"}
    monkeypatch.setattr(records, "code_hash", lambda files: "moved")
    monkeypatch.setattr(records, "_at_commit", lambda commit, path: then.get(path))
    monkeypatch.setattr(records, "_current", lambda path: now[path])
    exists = {"study.py", "planning.py", "kernel.py"}
    monkeypatch.setattr(records.os.path, "exists", lambda path: os.path.basename(path) in exists)
    record = {"kind": "narrowed", "provenance": {"commit": "c" * 40, "dirty": False, "code": {
        "files": ["study.py", "planning.py", "kernel.py"], "hash": "then"}}}
    monkeypatch.setitem(records.DECLARED, "narrowed",
                        lambda record: ["study.py", "planning.py", "kernel.py"])
    assert records.changed_files(record) == ["planning.py"]
    monkeypatch.setitem(records.DECLARED, "narrowed", lambda record: ["study.py", "kernel.py"])
    assert records.changed_files(record) == []
    now["kernel.py"] = "k = 2\n"
    assert records.changed_files(record) == ["kernel.py"]
    now["kernel.py"] = "k = 1\n"
    exists.discard("planning.py")  # deleted: its code went somewhere, so it counts
    assert records.changed_files(record) == ["planning.py"]

MEASURED = '''"""A study."""
import math

from ringcomp import records

CODE = records.code_files("study.py")


def _shared(x):
    return x + 1


def _cell(x):
    return f"{x:.3g}"


def main(args):
    """Measure."""
    prov = records.provenance(["study"], CODE, "MPI")
    records.write("out.json", "k", prov, {})
    return _shared(args)  # the figure


@records.renderer("k")
def render(record):
    return _cell(record["x"]) + str(_shared(1))
'''


@pytest.mark.parametrize("edit, is_stale", [
    (lambda t: t.replace('"""Measure."""', '"""Measure it, better worded."""'), False),
    (lambda t: t.replace("# the figure", "# the figure, commented"), False),
    (lambda t: t.replace('f"{x:.3g}"', 'f"{x:.0f}"'), False),      # a renderer-only helper
    (lambda t: t.replace("str(_shared(1))", "'!'"), False),         # the renderer itself
    (lambda t: t.replace("x + 1", "x + 2"), True),                  # a helper main uses too
    (lambda t: t.replace("return _shared(args)", "return args"), True),
    (lambda t: t + "\nSCALE = 2\n", True),
    # naming one more file it depends on is a declaration, not measured code
    (lambda t: t.replace('code_files("study.py")', 'code_files("study.py", "k.py")'), False),
    (lambda t: t.replace('CODE = records', 'CODES = records'), True),
    # how the record is written down is not how its figures are computed
    (lambda t: t.replace('["study"], CODE', '["study", "--x"], measured.only(CODE, [])')
     .replace("from ringcomp import records", "from ringcomp import measured, records"),
     False),
    (lambda t: t.replace('records.write("out.json"', 'records.write("other.json"'), False),
    (lambda t: t.replace("from ringcomp import records", "from ringcomp import np, records"),
     True),
    # what a file imports, not where: moved into the function that uses it, or another
    (lambda t: t.replace("import math\n", "").replace("def _shared(x):\n",
                                                     "def _shared(x):\n    import math\n"),
     False),
    (lambda t: t.replace("import math\n", "import cmath as math\n"), True),
])
def test_a_record_is_stale_when_its_measured_code_changes_not_its_wording(
        monkeypatch, edit, is_stale):
    """Staleness ignores docstrings, comments and the presentation (renderers and the
    private helpers only they use), compared with the file at the record's commit."""
    record = {"provenance": {"commit": "c" * 40, "dirty": False,
                             "code": {"files": ["study.py"], "hash": "differs"}}}
    monkeypatch.setattr(records, "code_hash", lambda files: "now")
    monkeypatch.setattr(records, "_at_commit", lambda commit, path: MEASURED)
    monkeypatch.setattr(records, "_current", lambda path: edit(MEASURED))
    assert records.stale(record) is is_stale
    assert records.changed_files(record) == (["study.py"] if is_stale else [])
    record["provenance"]["dirty"] = True  # the commit does not hold what was measured
    assert records.stale(record) is True
    record["provenance"]["dirty"] = False
    monkeypatch.setattr(records, "_at_commit", lambda commit, path: None)  # not in history
    assert records.stale(record) is True


def test_a_change_checked_result_neutral_does_not_make_a_record_stale(monkeypatch, tmp_path):
    """In a real git history: a record measured at A; B adds code to its file (stale until
    B is declared result-neutral for that file in ``NEUTRAL``, then not, and the footer
    names B); declared ``host_only``, a record measured on a GPU stays stale; a
    comment-only commit after it changes nothing; an uncommitted change, a declaration
    naming another file, or a later undeclared change make it stale again."""
    import json
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, check=True, capture_output=True,
                              text=True).stdout.strip()

    def commit(text, message):
        (tmp_path / "study.py").write_text(text)
        git("add", "study.py")
        git("commit", "-qm", message)
        return git("rev-parse", "HEAD")

    def declare(*entries):
        (tmp_path / "neutral.json").write_text(json.dumps(
            [{"commit": c, "files": files, "digest": "d", "why": "w"} for c, files in entries]))
        records.neutral_changes.cache_clear()

    git("init", "-q")
    a = commit("x = 1\n", "A")
    monkeypatch.setattr(records, "ROOT", str(tmp_path))
    monkeypatch.setattr(records, "NEUTRAL", str(tmp_path / "neutral.json"))
    records.neutral_changes.cache_clear()
    record = {"kind": "t", "provenance": {
        "commit": a, "dirty": False, "date": "d", "host": {"cores": 2, "cpu": "c"},
        "mpi": "m", "versions": {}, "command": "c",
        "code": {"files": ["study.py"], "hash": records.code_hash(["study.py"])}}}
    b = commit("x = 1\n\n\ndef images():\n    return 2\n", "B")
    assert records.changed_files(record) == ["study.py"]
    declare((b, ["other.py"]))
    assert records.changed_files(record) == ["study.py"]
    declare((b, ["study.py"]))
    assert records.changed_files(record) == [] and records.neutral_since(record) == [b]
    assert f"checked to leave results as they were ({b[:10]}" in records.footer(record)
    gpu_record = {**record, "provenance": {**record["provenance"], "device": "gpu"}}
    assert records.changed_files(gpu_record) == []
    (tmp_path / "neutral.json").write_text(json.dumps([{  # a change acting on the GPU
        "commit": b, "files": ["study.py"], "host_only": True, "digest": "d", "why": "w"}]))
    records.neutral_changes.cache_clear()
    assert records.changed_files(record) == [] and records.neutral_since(record) == [b]
    assert records.changed_files(gpu_record) == ["study.py"]
    assert records.neutral_since(gpu_record) == []
    commit("x = 1  # one\n\n\ndef images():\n    return 2\n", "comment only")
    assert records.changed_files(record) == []
    (tmp_path / "study.py").write_text("x = 2\n\n\ndef images():\n    return 2\n")
    assert records.changed_files(record) == ["study.py"]  # uncommitted
    commit("x = 3\n\n\ndef images():\n    return 2\n", "D")
    assert records.changed_files(record) == ["study.py"]
    assert "**Stale:**" in records.footer(record)
    records.neutral_changes.cache_clear()
