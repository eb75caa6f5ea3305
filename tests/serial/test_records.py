"""Records and the docs' generated blocks: provenance, load, rendering, the check."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from ringcomp import version
from ringcomp.experiments import codecs
from ringcomp.results import blocks, record


def test_every_generated_block_in_the_docs_is_what_its_record_renders():
    """The figures in README.md and docs/ are the records' own (report docs --check)."""
    done = subprocess.run([sys.executable, "-m", "ringcomp.report", "docs", "--check"],
                          capture_output=True, text=True, cwd=record.ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(autouse=True)
def _no_timing_environment(monkeypatch):
    """The records made here name no variable of the environment the suite runs under
    (it sets MPICH's heavy yield, which a record would rightly name)."""
    for name in record.timing_environment():
        monkeypatch.delenv(name)


def test_a_record_names_the_variables_that_change_its_timing(monkeypatch):
    """MPI's, the threads' and the kernels' variables are kept, sorted, and the footer's
    command starts with them, as a shell takes them; others are not; without any, the
    record has no such field."""
    assert "environment" not in record.provenance(["cmd"], "", None)
    monkeypatch.setenv("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    monkeypatch.setenv("HOME_NOT_TIMING", "x")
    prov = record.provenance(["mpiexec", "-n", "2", "python", "-m", "ringcomp.bench"], "",
                             None)
    assert prov["environment"] == {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1",
                                   "NUMBA_ENABLE_CUDASIM": "1"}
    assert ("Reproduce: `MPIR_CVAR_ENABLE_HEAVY_YIELD=1 NUMBA_ENABLE_CUDASIM=1 mpiexec -n 2 "
            "python -m ringcomp.bench`.") in blocks.footer({"kind": "k", "provenance": prov})
    # a root study's command: the variables after sudo, which drops those before it
    prov = record.provenance(["sudo", ".venv/bin/python", "-m", "ringcomp.experiments",
                              "network"], "", None)
    assert ("Reproduce: `sudo MPIR_CVAR_ENABLE_HEAVY_YIELD=1 NUMBA_ENABLE_CUDASIM=1 "
            ".venv/bin/python -m ringcomp.experiments network`.") in blocks.footer(
        {"kind": "k", "provenance": prov})


def _record(tmp_path, name="r.json", **data):
    prov = record.provenance(["python", "-m", "ringcomp.experiments", "codecs"],
                             "MPICH Version: 9", {"load1": 0.5, "busy_processes": 0},
                             ranks=4)
    path = str(tmp_path / name)
    record.write(path, "test-kind", prov, data)
    return path


@pytest.fixture
def test_kind():
    blocks.RENDERERS["test-kind"] = lambda r: f"| value |\n|---|\n| {r['value']} |"
    yield
    del blocks.RENDERERS["test-kind"]


def test_provenance_names_the_command_commit_host_mpi_versions_and_load():
    before = record.machine_load()
    prov = record.provenance(["cmd", "--x"], "MPICH Version: 5", before, ranks=3)
    assert prov["command"] == "cmd --x" and prov["mpi"] == "MPICH Version: 5"
    assert len(prov["commit"]) == 40 and isinstance(prov["dirty"], bool)
    assert prov["host"]["cores"] == os.cpu_count() and prov["host"]["cpu"]
    assert prov["versions"]["numpy"] and prov["versions"]["python"]
    assert prov["ranks"] == 3 and "digests" not in prov
    assert prov["load"]["before"] == before and prov["load"]["after"]["load1"] >= 0
    assert isinstance(prov["load"]["after"]["busy_processes"], int)
    assert prov["host"]["gpus"] == record._gpus()  # none on a machine without nvidia-smi
    with open("/proc/cpuinfo") as f:  # the vector extension the kernels compiled for
        flags = f.read()
    assert prov["host"]["simd"] == ("AVX-512" if " avx512f" in flags else
                                    "AVX2" if " avx2" in flags else prov["host"]["simd"])
    assert f"({prov['host']['cpu']}, {prov['host']['simd']})" in blocks.footer(
        {"provenance": prov}, "HEAD") or prov["host"]["simd"] is None
    older = {**prov, "host": {k: v for k, v in prov["host"].items() if k != "simd"}}
    assert f"({prov['host']['cpu']}, SIMD level not recorded)" in blocks.footer(
        {"provenance": older}, "HEAD")  # a record from before the field: not left to guess
    digests = {"train:exact@3": "ab"}
    assert record.provenance(["cmd"], "", None, digests)["digests"] == digests
    assert "load" not in record.provenance(["cmd"], "", None)  # not taken: not invented


def test_a_study_the_testbed_started_names_the_testbeds_command_and_hosts(monkeypatch):
    """Every study under mpiexec (validate, convergence, bench, ...) that
    ``python -m ringcomp.testbed`` started records the testbed's command line, which is
    what reproduces it, and the emulated hosts as its placement - not one node."""
    from ringcomp import cluster

    testbed = ["sudo", ".venv/bin/python", "-m", "ringcomp.testbed", "--hosts", "4"]
    monkeypatch.setenv(*next(iter(cluster.testbed_env(testbed, 4, 1, 1e9).items())))
    job = ["mpiexec", "-n", "4", "python", "-m", "ringcomp.experiments", "validate"]
    prov = record.provenance(job, "", None, ranks=4, placement="one node")
    assert prov["command"] == ("sudo .venv/bin/python -m ringcomp.testbed --hosts 4 -- "
                               "python -m ringcomp.experiments validate")
    assert prov["placement"].startswith("4 emulated hosts x 1 rank(s) at 1 Gbit/s")
    monkeypatch.delenv(cluster.TESTBED_ENV)
    assert record.provenance(job, "", None, placement="one node")["placement"] == "one node"


def test_busy_processes_counts_another_busy_process_not_this_one_nor_its_ranks(monkeypatch):
    """A process spinning beside the study counts; the study itself does not, nor a
    process running its very command line under another parent (a rank the testbed
    started on another emulated host): seen from a process whose command line is the
    spinners', neither spinner counts."""
    import time

    spin = "while True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    # the same command line, started under another parent (a shell here)
    launcher = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0" & wait', spin])
    try:
        time.sleep(0.3)  # the shell has started its child
        rank = [pid for pid, (ppid, _) in record._cpu_times().items() if ppid == launcher.pid]
        busy = record.busy_pids(0.5)
        real = record._command_line
        monkeypatch.setattr(record, "_command_line",
                            lambda pid: real(spinner.pid if pid == os.getpid() else pid))
        as_the_job = record.busy_pids(0.5)
    finally:
        for pid in rank:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        for process in (spinner, launcher):
            process.kill()
            process.wait()
    assert spinner.pid in busy and os.getpid() not in busy and os.getppid() not in busy
    assert len(rank) == 1 and rank[0] in busy
    assert not ({spinner.pid, *rank} & as_the_job)


def test_a_gpu_host_names_its_gpus_driver_and_cuda_runtime(monkeypatch, tmp_path):
    """What ``nvidia-smi`` lists goes into the host, the CUDA runtime CuPy loaded beside it
    and whether an MPS server shared the GPU, and the rendered footer names them: a table
    measured on a GPU says on which."""
    listed = "NVIDIA H100 80GB HBM3, 580.159, 81559 MiB\n"
    monkeypatch.setattr(record.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(record.subprocess, "run", lambda cmd, **kw: subprocess.
                        CompletedProcess(cmd, 0, listed if "nvidia-smi" in cmd[0] else ""))
    runtime = type("Runtime", (), {"runtimeGetVersion": staticmethod(lambda: 12080)})
    monkeypatch.setitem(sys.modules, "cupy", type("Cupy", (), {"cuda": type(
        "Cuda", (), {"runtime": runtime})}))
    gpus = record._gpus()
    assert gpus == [{"model": "NVIDIA H100 80GB HBM3", "driver": "580.159",
                     "memory": "81559 MiB", "cuda_runtime": "12.8"}]
    prov = {"date": "d", "host": {"cores": 16, "cpu": "x86", "simd": None,
                                 "gpus": gpus}, "mpi": "MPI",
            "versions": {}, "commit": "c" * 40, "dirty": False, "command": "cmd"}
    assert ("on 16 cores (x86) and 1 x NVIDIA H100 80GB HBM3 (driver 580.159, CUDA 12.8), "
            in blocks.footer({"kind": "k", "provenance": prov}))
    pipe = tmp_path / "mps"  # an MPS server's control pipe: the footer says the GPU was shared
    pipe.mkdir()
    (pipe / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    prov["host"]["gpus"] = record._gpus()
    assert prov["host"]["gpus"][0]["mps"] is True
    assert "(driver 580.159, CUDA 12.8, MPS), " in blocks.footer({"kind": "k",
                                                                   "provenance": prov})
    monkeypatch.setattr(record.shutil, "which", lambda name: None)
    assert record._gpus() == []


def test_blocks_are_rendered_and_checked_with_the_load_and_no_verdict(tmp_path, test_kind):
    path = _record(tmp_path, value=42)
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n<!-- BEGIN generated from {path} -->\nold\n<!-- END generated -->\n"
                   f"outro\n")
    assert blocks.update_blocks(str(doc), check=True) == [path]  # differs, left alone
    assert "old" in doc.read_text()
    assert blocks.update_blocks(str(doc)) == [path]
    text = doc.read_text()
    assert "| 42 |" in text and "Reproduce: `python -m ringcomp.experiments codecs`" in text
    assert "Load (1-minute average; other busy processes): 0.5, 0 before; " in text
    assert text.startswith("intro\n") and text.endswith("outro\n") and "Stale" not in text
    assert blocks.update_blocks(str(doc), check=True) == []  # now equal
    data = json.loads(pathlib.Path(path).read_text())
    data["value"] = 43  # the record changed: its block differs until re-rendered
    pathlib.Path(path).write_text(json.dumps(data))
    assert blocks.update_blocks(str(doc), check=True) == [path]


def test_a_value_records_footer_names_its_digests_not_the_load(tmp_path, test_kind):
    prov = record.provenance(["mpiexec", "-n", "8", "x"], "MPI", None,
                             {"train:exact@3": "a", "train:exact@5": "b"})
    text = blocks.render({"kind": "test-kind", "provenance": prov, "value": 1})
    assert "checked against the code by 2 digests of miniature runs" in text
    assert "Load" not in text and "commits" not in text


def test_a_timing_footer_counts_the_commits_to_the_package_as_of_a_named_commit(
        monkeypatch, tmp_path, test_kind):
    """In a real git history: measured at A; B changes ringcomp/, C only docs/. Rendered at
    C the footer says one commit as of C; ``--check`` re-counts as of the commit the block
    names, so a later commit to the package leaves the block right until re-rendered, and
    a block whose count is wrong for the commit it names is caught."""
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, check=True, capture_output=True,
                              text=True).stdout.strip()

    def commit(path, text):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(text)
        git("add", path)
        git("commit", "-qm", path)
        return git("rev-parse", "HEAD")

    git("init", "-q")
    a = commit("ringcomp/x.py", "x = 1\n")
    commit("ringcomp/x.py", "x = 2\n")
    c = commit("docs/page.md", "words\n")
    monkeypatch.setattr(record, "ROOT", str(tmp_path))
    monkeypatch.setattr(version, "ROOT", str(tmp_path))  # where git runs
    path = _record(tmp_path, value=1)
    data = json.loads(pathlib.Path(path).read_text())
    data["provenance"]["commit"] = a
    pathlib.Path(path).write_text(json.dumps(data))
    doc = tmp_path / "doc.md"
    doc.write_text(f"<!-- BEGIN generated from {path} -->\n<!-- END generated -->\n")
    blocks.update_blocks(str(doc))
    assert f"As of commit {c[:10]}, 1 commit has changed `ringcomp/` or `kernels/` since." \
        in doc.read_text()
    commit("kernels/k.py", "k = 1\n")  # a later commit to the package: still right as of c
    assert blocks.update_blocks(str(doc), check=True) == []
    blocks.update_blocks(str(doc))  # re-rendered: counted as of the new HEAD
    assert ", 2 commits have changed" in doc.read_text()
    doc.write_text(doc.read_text().replace(", 2 commits have", ", 5 commits have"))
    assert blocks.update_blocks(str(doc), check=True) == [path]


def test_an_unknown_record_kind_is_refused_by_name(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"kind": "nonsense", "provenance": {}}))
    with pytest.raises(ValueError, match="no renderer for record kind 'nonsense'"):
        blocks.render(record.load(str(path)))


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
    monkeypatch.setattr(blocks, "documents", lambda: [str(doc)])
    from ringcomp import report

    with pytest.raises(SystemExit, match="page.md.*nowhere.json"):
        report.report_docs(check=True)


def test_a_truncated_record_is_named_by_its_file_not_only_its_page(tmp_path, monkeypatch):
    """A record cut short (a full disk, an interrupted copy) used to be reported by the page
    that names it, with JSON's "Expecting ',' delimiter" and no file."""
    cut = tmp_path / "cut.json"
    cut.write_text('{"kind": "bench", "rows": [1, 2')
    doc = tmp_path / "page.md"
    doc.write_text(f"<!-- BEGIN generated from {cut} -->\n<!-- END generated -->\n")
    monkeypatch.setattr(blocks, "documents", lambda: [str(doc)])
    from ringcomp import report

    with pytest.raises(SystemExit, match=r"page.md: record .*cut.json is not whole JSON"):
        report.report_docs(check=True)


@pytest.mark.parametrize("argv,words", [
    (["--ranks", "1"], "--ranks must be at least 2"),
    (["--iters", "2"], "--iters must be at least 3"),
    (["--testbed-rate", "fast"], "--testbed-rate"),
    (["--split-ranks", "4,1"], "--split-ranks need at least 2 ranks"),
])
def test_codecs_study_refuses_nonsense_options_before_running_anything(argv, words):
    done = subprocess.run([sys.executable, "-m", "ringcomp.experiments", "codecs", *argv],
                          capture_output=True, text=True, cwd=record.ROOT, timeout=120)
    assert done.returncode == 2 and words in done.stderr, done.stderr


@pytest.mark.parametrize("status, dirty", [("M docs/records/bench-p4.json\n M docs/a.md", False),
                                           ("M docs/a.md\n M ringcomp/api.py", True),
                                           ("M ringcomp/api.py", True),
                                           ("M README.md\n M docs/a.md", False),
                                           ("M README.md\n M tests/t.py", True)])
def test_only_changes_outside_docs_make_a_record_dirty(monkeypatch, status, dirty):
    """A study writing several records in a row: the records before it are not code.
    (``_git`` strips its output, so the first line has lost its leading blank.)"""
    monkeypatch.setattr(record, "git", lambda *a: status if a[0] == "status" else "0" * 40)
    assert record.provenance(["x"], "", None)["dirty"] is dirty


def test_report_knows_every_kind_a_tool_writes():
    """``report docs`` renders any record a study or tool writes (a kind missing here would
    fail only when a page first embeds it)."""
    import ringcomp.report  # noqa: F401 - registers the renderers

    assert {"bench", "codecs", "convergence", "hops", "perfmodel", "simulate", "torch-ddp",
            "validate"} <= set(blocks.RENDERERS)


def _convergence_record(path, task, ranks, accs):
    """A convergence record of one task: method -> per-seed test accuracies."""
    def row(label, seeds):
        mean = sum(seeds) / len(seeds)
        return {"label": label, "lr": 0.1, "test_acc": mean, "test_acc_ci95": 0.01,
                "versus": "ring", "seed_test_acc": {str(i): a for i, a in enumerate(seeds)}}
    prov = record.provenance(["mpiexec", "-n", str(ranks), "python", "-m",
                              "ringcomp.experiments", "convergence", "--tasks", task],
                             "MPICH Version: 9", None, {"train:exact@3": "a"}, ranks=ranks)
    base = "--model mlp --batch-size 16 --batch-size 8"  # the last one given acts
    record.write(str(path), "convergence", prov, {
        "ranks": ranks, "seeds": [0, 1, 2], "tasks": {task: {"base": base, "rows": [
            row(label, seeds) for label, seeds in accs.items()]}}})
    return str(path)


def _bh_survivors(p_values: dict, rate: float = 0.05) -> set:
    """Benjamini-Hochberg by hand (the oracle): the names whose adjusted p is below rate."""
    ranked = sorted(p_values, key=p_values.get)
    m, kept, lowest = len(ranked), set(), 1.0
    for i in range(m, 0, -1):
        lowest = min(lowest, p_values[ranked[i - 1]] * m / i)
        if lowest < rate:
            kept.add(ranked[i - 1])
    return kept


@pytest.fixture
def own_family(monkeypatch):
    """The false-discovery-rate family of the records a test writes alone (not docs')."""
    from ringcomp.experiments import convergence_family

    monkeypatch.setattr(convergence_family, "family_records", lambda: [])


def test_every_interval_carries_the_one_familys_false_discovery_rate_mark(tmp_path,
                                                                         own_family):
    """Besides the nominal bold, each interval - the primary comparisons (Marsit on the
    ring against exact and against the cascading sign) too - carries a dagger exactly
    when it survives a 5% Benjamini-Hochberg adjustment over the family (here the
    record's own comparisons: both tables, every column)."""
    from scipy import stats

    import ringcomp.report  # noqa: F401 - registers the renderers

    base = [0.90, 0.91, 0.92, 0.93, 0.94]
    steps = {"strong": [-0.050, -0.051, -0.049, -0.052, -0.050],
             "weak": [-0.010, -0.002, -0.012, -0.001, -0.008],
             "null": [0.010, -0.010, 0.005, -0.005, 0.0],
             "ring+marsit": [-0.010, -0.002, -0.012, -0.001, -0.008],
             "ring+sign": [0.004, -0.003, 0.006, -0.006, 0.001]}
    accs = {"ring": base, **{m: [b + d for b, d in zip(base, step, strict=True)]
                             for m, step in steps.items()}}
    path = _convergence_record(tmp_path / "r.json", "mlp", 8, accs)
    doc = tmp_path / "doc.md"
    doc.write_text(f"<!-- BEGIN generated from {path} -->\n<!-- END generated -->\n")
    blocks.update_blocks(str(doc))
    text = doc.read_text()
    diff = {m: np.subtract(accs[m], accs["ring"]) for m in steps}
    diff["pair"] = np.subtract(accs["ring+marsit"], accs["ring+sign"])
    p = {m: stats.ttest_1samp(d, 0.0).pvalue for m, d in diff.items()}
    kept = _bh_survivors(p)
    assert p["weak"] < 0.05 and "weak" not in kept and "strong" in kept  # the data do split
    assert "one family of 6 intervals" in text
    for m in steps:
        # the accuracy table's line, then the difference table's
        line = [line for line in text.splitlines()
                if line.startswith((f"| {m} |", f"| {m} (primary) |"))][-1]
        assert line.endswith("† |") == (m in kept), line
        assert ("**" in line) == (p[m] < 0.05), line
    pair = next(line for line in text.splitlines() if line.startswith("| ring+marsit - "))
    assert pair.endswith("† |") == ("pair" in kept) and "(primary)" in pair


def test_a_cells_mark_is_the_same_in_every_table_that_shows_it(tmp_path, monkeypatch):
    """The family is fixed, not the block's: a comparison shown in a block of one record
    and in a block of two carries the same mark, adjusted over the whole family either
    way; two records naming one comparison with other accuracies are refused; every
    convergence record under docs/records is in the family, and every one it names is
    there."""
    import glob

    import ringcomp.report  # noqa: F401 - registers the renderers
    from ringcomp.experiments import convergence_family
    from ringcomp.results.record import ROOT, load

    iid, skew = _two_columns(tmp_path)
    family = [load(iid), load(skew)]
    monkeypatch.setattr(convergence_family, "family_records", lambda: family)
    doc = tmp_path / "doc.md"
    texts = []
    for shown in ([iid], [iid, skew]):
        doc.write_text(f"<!-- BEGIN generated from {' '.join(shown)} -->\n"
                       "<!-- END generated -->\n")
        blocks.update_blocks(str(doc))
        texts.append(doc.read_text())
    alone = next(line for line in texts[0].splitlines() if line.startswith("| ring+marsit ("))
    beside = next(line for line in texts[1].splitlines() if line.startswith("| ring+marsit ("))
    assert alone.split("|")[2].strip() == beside.split("|")[2].strip() == "**-2.00 ± 0.00** †"
    assert all("one family of 4 intervals" in text for text in texts)
    # the same comparison with other numbers: which is the family's is ambiguous
    other = _convergence_record(tmp_path / "other.json", "mlp", 8, {
        "ring": [0.98, 0.97, 0.99], "ring+marsit": [0.90, 0.95, 0.97]})
    with pytest.raises(ValueError, match="ambiguous"):
        convergence_family.survivors([load(other)])
    kinds = {os.path.basename(path) for path in glob.glob(os.path.join(
        ROOT, "docs", "records", "*.json")) if load(path).get("kind") == "convergence"}
    assert kinds == set(convergence_family.FAMILY)


def _two_columns(tmp_path) -> tuple[str, str]:
    """Two convergence records of three seeds: the IID MLP at 8 ranks (exact, Marsit) and
    the skewed MLP at 16 (exact, Marsit, the cascading sign)."""
    iid = _convergence_record(tmp_path / "iid.json", "mlp", 8, {
        "ring": [0.98, 0.97, 0.99], "ring+marsit": [0.96, 0.95, 0.97]})
    skew = _convergence_record(tmp_path / "skew.json", "mlp-skew", 16, {
        "ring": [0.97, 0.96, 0.98], "ring+marsit": [0.975, 0.975, 0.975],
        "ring+sign": [0.90, 0.91, 0.92]})
    return iid, skew


def test_one_block_renders_the_convergence_columns_of_several_records(tmp_path,
                                                                      own_family):
    """A block naming several records renders one table across them (a column per task and
    rank count), the paired differences derived from the per-seed accuracies, and every
    record's footer; records of two kinds in one block are refused by name."""
    import ringcomp.report  # noqa: F401 - registers the renderers

    iid, skew = _two_columns(tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text(f"<!-- BEGIN generated from {iid} {skew} -->\n<!-- END generated -->\n")
    assert blocks.update_blocks(str(doc)) == [f"{iid} {skew}"]
    text = doc.read_text()
    assert "| method | mlp, p=8, B=64 | mlp-skew, p=16, B=128 |" in text
    assert "| ring+marsit | 0.960 ± 0.010 (0.1) | 0.975 ± 0.010 (0.1) |" in text
    assert "| ring+sign | - | 0.910 ± 0.010 (0.1) |" in text  # not in the first column
    # paired: 2 points below on every seed (interval 0: bold); +0.5 +1.5 -0.5: not bold
    # (the family of four intervals: -2 with no spread, +6.5 and -6 survive it)
    assert "| ring+marsit (primary) | **-2.00 ± 0.00** † | +0.50 ± 2.48 |" in text
    # the pairs the claims turn on: Marsit minus the cascading sign, where a column has both
    # (+7.5, +6.5, +5.5 points); the torus pair, with neither method present, is left out
    assert "| ring+marsit - ring+sign (primary) | - | **+6.50 ± 2.48** † |" in text
    assert "torus+marsit - torus+sign" not in text
    assert text.count("Reproduce: `mpiexec -n") == 2 and "`iid.json`: Measured" in text
    assert blocks.update_blocks(str(doc), check=True) == []
    doc.write_text(f"<!-- BEGIN generated from {iid} -->\n<!-- END generated -->\n")
    blocks.update_blocks(str(doc))  # one record of the kind: the same form, one column
    assert "| method | mlp, p=8, B=64 |" in doc.read_text()

    other = _record(tmp_path, value=1)
    blocks.RENDERERS["test-kind"] = lambda r: "x"
    try:
        doc.write_text(f"<!-- BEGIN generated from {iid} {other} -->\n<!-- END generated -->\n")
        with pytest.raises(ValueError, match="records of one kind"):
            blocks.update_blocks(str(doc))
        doc.write_text(f"<!-- BEGIN generated from {other} {other} -->\n"
                       "<!-- END generated -->\n")
        with pytest.raises(ValueError, match="no renderer of several records"):
            blocks.update_blocks(str(doc))
    finally:
        del blocks.RENDERERS["test-kind"]


def test_a_named_view_renders_marsits_claims_from_the_convergence_records(tmp_path,
                                                                        own_family):
    """``<!-- BEGIN generated marsit-claims from ... -->``: claims.md's view of the same
    records - a row per task and rank count, the exact ring's accuracy, Marsit on the ring
    against exact and against the cascading sign and the cascading sign against exact,
    each a paired interval (bold where it excludes 0), a dash where a method is missing;
    an unknown view is refused by name."""
    import ringcomp.report  # noqa: F401 - registers the renderers

    iid, skew = _two_columns(tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text(f"<!-- BEGIN generated marsit-claims from {iid} {skew} -->\n"
                   "<!-- END generated -->\n")
    assert blocks.update_blocks(str(doc)) == [f"{iid} {skew}"]
    text = doc.read_text()
    assert text.startswith(f"<!-- BEGIN generated marsit-claims from {iid} {skew} -->\n")
    assert "| mlp, p=8, B=64 | 0.980 ± 0.010 | **-2.00 ± 0.00** † | - | - |" in text
    # +0.5 +1.5 -0.5 (t-interval 2.48); +7.5 +6.5 +5.5; -7 -5 -6 points
    assert ("| mlp-skew, p=16, B=128 | 0.970 ± 0.010 | +0.50 ± 2.48 | **+6.50 ± 2.48** † | "
            "**-6.00 ± 2.48** † |") in text
    assert "Method" not in text and "`skew.json`: Measured" in text
    assert blocks.update_blocks(str(doc), check=True) == []
    doc.write_text(f"<!-- BEGIN generated nonsense from {iid} -->\n<!-- END generated -->\n")
    with pytest.raises(ValueError, match="no view 'nonsense'; views: \\['marsit-claims'\\]"):
        blocks.update_blocks(str(doc))


def test_the_suite_and_make_check_digests_under_the_kernels_the_studies_name():
    """``tests/run_suite.py`` (which does not import ringcomp), the Makefile's value-study
    targets and the check the value footers quote name the same OpenBLAS kernels as
    ``digests.DIGEST_BLAS``: a record stamped by ``make convergence`` is checked by
    ``make test`` under the kernels it was computed on."""
    import re

    from ringcomp.experiments import digests

    suite = (pathlib.Path(record.ROOT) / "tests" / "run_suite.py").read_text()
    make = (pathlib.Path(record.ROOT) / "Makefile").read_text()
    assert f'DIGEST_BLAS = "{digests.DIGEST_BLAS}"' in suite
    assert re.search(rf"^DIGEST_BLAS \?= {digests.DIGEST_BLAS}$", make, re.M)
    assert make.count("OPENBLAS_CORETYPE=$(DIGEST_BLAS) mpiexec") == 2
    assert blocks.CHECK.startswith(f"OPENBLAS_CORETYPE={digests.DIGEST_BLAS} mpiexec -n 4 ")


def _validate_record(path, ranks, rows, base="--model replay:resnet50"):
    """A validate record: rows of (method, plan, median, fastest, slowest, predicted) s."""
    prov = record.provenance(["mpiexec", "-n", str(ranks), "python", "-m",
                              "ringcomp.experiments", "validate"], "MPICH Version: 9",
                             {"load1": 0.5, "busy_processes": 0}, ranks=ranks)
    record.write(str(path), "validate", prov, {"ranks": ranks, "base": base, "rows": [
        {"method": m, "plan": p, "buckets": 1, "compressed_buckets": 0, "predicted_s": pred,
         "wall_s": wall, "wall_min_s": lo, "wall_max_s": hi, "error": pred / wall - 1,
         "compute_s": 0.0, "exposed_comm_s": 0.0, "update_s": 0.0, "timed_steps": 3}
        for m, p, wall, lo, hi, pred in rows]})
    return str(path)


def test_validate_records_at_several_rank_counts_render_scaling_factors(tmp_path):
    """One worker's exact model-wise step over each p-worker step, measured (with the range
    over the timed steps) and modelled; a method missing at one p is a dash; one base and a
    1-rank record are required, else the block is refused by what is missing."""
    import ringcomp.report  # noqa: F401 - registers the renderers

    one = _validate_record(tmp_path / "h1.json", 1, [
        ("none", "modelwise", 0.040, 0.039, 0.041, 0.050),
        ("none", "layerwise", 0.045, 0.044, 0.046, 0.050)])
    two = _validate_record(tmp_path / "h2.json", 2, [
        ("none", "mergecomp", 0.050, 0.040, 0.080, 0.0625),
        ("marsit", "mergecomp", 0.080, 0.050, 0.100, 0.100)])
    four = _validate_record(tmp_path / "h4.json", 4, [
        ("none", "mergecomp", 0.160, 0.100, 0.200, 0.200)])
    doc = tmp_path / "doc.md"
    doc.write_text(f"<!-- BEGIN generated from {one} {two} {four} -->\n"
                   "<!-- END generated -->\n")
    blocks.update_blocks(str(doc))
    lines = doc.read_text().splitlines()
    # 40 ms / 50 ms = 80%, over [80 ms, 40 ms] = [50-100]; model 50 / 62.5 = 80%; p=4:
    # 40 / 160 = 25%, [20-40], model 25%
    assert ["none", "mergecomp", "50.0", "80%", "[50-100]", "80%", "0/1", "160.0", "25%",
            "[20-40]", "25%", "0/1"] in [line.split() for line in lines]
    marsit = next(line for line in lines if line.startswith("marsit"))
    assert marsit.split()[2:] == ["80.0", "50%", "[40-80]", "50%", "0/1", *"-----"]
    assert not any(line.startswith("none      layerwise") for line in lines)  # 1 rank only
    assert "one worker: 1 rank, exact, model-wise: 40.0 ms measured" in doc.read_text()
    assert "layerfusion's factor" not in doc.read_text()  # no plan pair to compare
    pair = _validate_record(tmp_path / "pair.json", 2, [
        ("qsgd", "layerwise", 0.090, 0.09, 0.09, 0.1),
        ("qsgd", "layerfusion", 0.030, 0.03, 0.03, 0.1)])
    doc.write_text(f"<!-- BEGIN generated from {one} {pair} -->\n<!-- END generated -->\n")
    blocks.update_blocks(str(doc))
    assert "# p=2: layerfusion's factor over layerwise's (their steps' ratio): qsgd 3.0x" in (
        doc.read_text())

    other = _validate_record(tmp_path / "o.json", 2, [], base="--model mlp")
    for paths, words in (([one, other], "one base"), ([two, four], "one of them on 1 rank"),
                         ([two, two, one], "one record per rank count")):
        doc.write_text(f"<!-- BEGIN generated from {' '.join(paths)} -->\n"
                       "<!-- END generated -->\n")
        with pytest.raises(ValueError, match=words):
            blocks.update_blocks(str(doc))
    lonely = _validate_record(tmp_path / "l.json", 1, [("none", "layerwise", 1, 1, 1, 1)])
    doc.write_text(f"<!-- BEGIN generated from {lonely} {two} -->\n<!-- END generated -->\n")
    with pytest.raises(ValueError, match="no none modelwise row"):
        blocks.update_blocks(str(doc))


def test_every_records_command_is_the_one_that_wrote_it():
    """Each committed record's command names the record itself as what it writes (``--out
    PREFIX`` or ``--record PATH``, the file's name; a GPU record was written on the lent
    machine and copied, so only the name is compared): a footer's Reproduce command
    reproduces that very record, not a neighbour's."""
    import shlex

    folder = pathlib.Path(__file__).resolve().parents[2] / "docs" / "records"
    wrong = []
    for path in sorted(folder.glob("*.json")):
        command = json.loads(path.read_text())["provenance"]["command"]
        words = shlex.split(command) if isinstance(command, str) else list(command)
        written = {os.path.basename(w if w.endswith(".json") else w + ".json")
                   for flag, w in zip(words, words[1:], strict=False)
                   if flag in ("--out", "--record")}
        if path.name not in written:
            wrong.append(f"{path.name}: {' '.join(words)[-120:]}")
    assert len(list(folder.glob("*.json"))) > 40 and not wrong, wrong


def test_a_value_record_says_when_its_values_ran_under_other_kernels_than_its_digests():
    """A matrix product's bits move with the BLAS kernels: a value record whose values were
    computed without the kernels its digests name (pinned elsewhere, or not at all) says so
    in its footer; one computed under them says nothing more."""
    prov = {"date": "2026-12-01 10:00 UTC", "host": {"cores": 2, "cpu": "c"}, "mpi": "m",
            "versions": {}, "commit": "c" * 40, "dirty": False,
            "command": "mpiexec -n 4 python -m x", "digests": {"train:exact@4": "a"},
            "digests_blas": "Haswell"}
    unpinned = blocks.footer({"kind": "k", "provenance": prov})
    assert ("its values came from this host's default BLAS kernels (not pinned), its "
            "digests from Haswell's") in unpinned
    # before records kept their environment, its absence says nothing: not "unpinned"
    older = blocks.footer({"kind": "k", "provenance": {**prov, "date": "2026-11-27 03:34 UTC"}})
    assert ("its values came from BLAS kernels it does not name (measured before records "
            "kept their environment), its digests from Haswell's") in older
    pinned = {**prov, "environment": {"OPENBLAS_CORETYPE": "Haswell"}}
    text = blocks.footer({"kind": "k", "provenance": pinned})
    assert "values came from" not in text
    assert "Reproduce: `OPENBLAS_CORETYPE=Haswell mpiexec -n 4 python -m x`" in text
    other = {**prov, "environment": {"OPENBLAS_CORETYPE": "SkylakeX"}}
    assert "its values came from the SkylakeX kernels" in blocks.footer(
        {"kind": "k", "provenance": other})
