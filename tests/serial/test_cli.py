"""Every entry point run for real under mpiexec, and the failure modes a user meets."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

MPIEXEC = os.environ.get("MPIEXEC", "").split() or [shutil.which("mpiexec") or "mpiexec"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def env(**extra):
    e = dict(os.environ, MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD="1000000000",
             PYTHONUNBUFFERED="1")
    for key in ("PMI_SIZE", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE"):
        e.pop(key, None)
    e.update(extra)
    return e


def mpirun(n, args, timeout=240, **extra):
    return subprocess.run(MPIEXEC + ["-n", str(n), sys.executable] + args, capture_output=True,
                          text=True, timeout=timeout, env=env(**extra), cwd=ROOT)


def script(tmp_path, body: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.parametrize("module", ["ringcomp.bench", "ringcomp.info", "ringcomp.train",
                                    "ringcomp.profile"])
def test_help(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                         text=True, timeout=60, env=env())
    assert out.returncode == 0
    assert "--trace" in out.stdout and "--timeout" in out.stdout
    # each tool names itself (profile takes train's options, and used to say train's name)
    assert out.stdout.startswith(f"usage: python -m {module} ")
    version = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                             text=True, timeout=60, env=env())
    assert version.stdout.startswith(f"python -m {module} (ringcomp) ")


def test_bench_table_json_and_trace(tmp_path):
    path = tmp_path / "bench.jsonl"
    out = mpirun(3, ["-m", "ringcomp.bench", "--sizes", "8,4K,100K", "--iters", "3",
                     "--algorithms", "ring,tree,dbtree,rd,rabenseifner,auto,mpi",
                     "--dtypes", "float32,int32", "--json", str(path),
                     "--trace", str(tmp_path / "tr"), "--raw-mpi"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # nccl-tests' layout: the groups over the columns, then the average bus bandwidth
    assert "out-of-place" in lines[1] and "in-place" in lines[1]
    assert lines[2].split()[:6] == ["size(B)", "count", "type", "redop", "algorithm",
                                    "compressor"]
    assert lines[2].split().count("busbw") == 2 and "avg_us" in lines[2]
    assert any(ln.startswith("# Avg bus bandwidth") for ln in lines)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    # 7 algorithms, mpi4py's own Allreduce and the bare mpi4py ring (--raw-mpi)
    assert len(rows) == 3 * 9 * 2
    for name in ("mpi4py", "mpi4py-ring"):  # right at 2 elements on 3 ranks too
        raw = [r for r in rows if r["algorithm"] == name]
        assert len(raw) == 6 and all(r["wire_bytes"] is None and r["wrong"] == 0
                                     for r in raw)
    keys = {"size_bytes", "algorithm", "compressor", "p", "time_s", "algbw_GBps", "busbw_GBps",
            "wire_bytes", "vs_mpi", "wrong"}
    assert all(keys <= set(r) for r in rows)
    assert all(r["wrong"] == 0 and r["p"] == 3 and r["time_s"] > 0 for r in rows)
    # in place (out=x) too, as nccl-tests: right everywhere, timed on its own
    assert all(r["inplace_wrong"] == 0 and r["inplace_time_s"] > 0 for r in rows)
    assert all(len(r["inplace_times_s"]) == len(r["times_s"]) == 3 for r in rows)
    assert all(r["time_min_s"] <= r["time_s"] <= r["time_max_s"] and
               r["time_min_s"] <= r["time_avg_s"] <= r["time_max_s"] for r in rows)
    exact_row = next(ln for ln in lines if " ring " in ln and " none " in ln)
    assert exact_row.split()[-1] == "-"  # rel_err: for compressors only
    ring = [r for r in rows if r["algorithm"] == "ring" and r["size_bytes"] == 102400]
    # the ring sends 2(p-1)/p of the buffer per rank
    assert ring[0]["wire_bytes"] == pytest.approx(2 * 2 / 3 * 102400, rel=0.01)
    assert all(r["vs_mpi"] == 1.0 for r in rows if r["algorithm"] == "mpi")
    events = json.loads((tmp_path / "tr" / "trace.json").read_text())["traceEvents"]
    assert {e["tid"] for e in events} == {0, 1, 2}


def test_bench_persistent_times_plans_that_give_the_same_results(tmp_path):
    """``--persistent`` times every ringcomp row through a plan (``allreduce_init``): the
    exact rows are right, and each compressed row's error equals the same row's measured
    through ``allreduce`` (the same bits: the same key, the same hops)."""
    rows = {}
    for form in ("call", "plan"):
        path = tmp_path / f"{form}.jsonl"
        out = mpirun(3, ["-m", "ringcomp.bench", "--sizes", "4K,100K", "--iters", "3",
                         "--algorithms", "ring,tree,mpi", "--compressors", "sign,qsgd",
                         "--json", str(path), "--trace", str(tmp_path / form)]
                     + (["--persistent"] if form == "plan" else []))
        assert out.returncode == 0, out.stderr
        rows[form] = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows["plan"]) == len(rows["call"]) == 2 * 7
    for call, plan in zip(rows["call"], rows["plan"], strict=True):
        assert (plan["algorithm"], plan["compressor"]) == (call["algorithm"], call["compressor"])
        assert plan["rel_err"] == call["rel_err"] and plan["wrong"] == call["wrong"]
    assert all(r["wrong"] == 0 for r in rows["plan"] if r["compressor"] == "none")
    assert all(r["rel_err"] > 0 for r in rows["plan"] if r["compressor"] != "none")


def test_plans_made_before_numba_is_loaded_still_replay_their_compiled_walk(tmp_path):
    """A fresh process's first plans: a compressed one binds its compiled walk at once (it
    loads Numba, as its first call would: it took the general path for life before), an
    exact one made earlier binds at its first call after Numba is loaded; both give
    MPI's sum (exact) and the general path's bits (compressed)."""
    job = script(tmp_path, """
        import sys
        import numpy as np
        from mpi4py import MPI
        import ringcomp
        x = np.arange(1000, dtype=np.float32) * (MPI.COMM_WORLD.rank + 1)
        exact = ringcomp.allreduce_init(x, algorithm="ring")
        first = ("numba" in sys.modules, exact._call is not None)
        signs = ringcomp.allreduce_init(x, algorithm="ring", compressor="sign")
        want = np.empty_like(x)
        MPI.COMM_WORLD.Allreduce(x, want)
        got = exact(), signs(step=3)
        same = np.array_equal(got[1], ringcomp.allreduce(x, algorithm="ring",
                                                         compressor="sign", step=3))
        seen = MPI.COMM_WORLD.gather((first, exact._call is not None,
                                      signs._call is not None,
                                      bool(np.array_equal(got[0], want)), bool(same)))
        if MPI.COMM_WORLD.rank == 0:
            print(seen)
    """)
    out = mpirun(2, [job])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([((False, False), True, True, True, True)] * 2), out.stdout


def test_bench_raw_mpi_rows_set_the_floor_with_the_rings_bits(tmp_path):
    """``--raw-mpi`` adds MPI's Allreduce through mpi4py and the bare mpi4py ring, exact
    and with each compressor the ring runs: right, and the bare compressed ring's error is
    the ring's (the same bits; tests/mpi/test_bare_ring.py compares the bytes)."""
    path = tmp_path / "raw.jsonl"
    out = mpirun(3, ["-m", "ringcomp.bench", "--sizes", "4K", "--iters", "3",
                     "--algorithms", "ring,tree,mpi", "--compressors", "marsit,powersgd",
                     "--raw-mpi", "--json", str(path)])
    assert out.returncode == 0, out.stderr
    rows = {(r["algorithm"], r["compressor"]): r
            for r in map(json.loads, path.read_text().splitlines())}
    assert ("mpi4py", "none") in rows and ("mpi4py-ring", "none") in rows
    assert ("mpi4py-ring", "marsit") in rows  # not powersgd: its factors are summed exactly
    assert not any(a == "mpi4py-ring" and c == "powersgd" for a, c in rows)
    assert rows["mpi4py-ring", "none"]["wrong"] == 0
    assert rows["mpi4py-ring", "marsit"]["rel_err"] == rows["ring", "marsit"]["rel_err"]


def test_bench_split_says_where_each_call_goes(tmp_path):
    """``--split`` (with a plan per row, without --trace): one row per call and size from
    every rank's timed calls; exact calls have no codec time, compressed ones do, the
    ring waits on messages, and a record keeps and renders the table."""
    from ringcomp.results.benchtable import render
    from ringcomp.results.record import load

    path = tmp_path / "bench.json"
    out = mpirun(3, ["-m", "ringcomp.bench", "--sizes", "4K,100K", "--iters", "4",
                     "--algorithms", "ring,mpi", "--compressors", "sign", "--split",
                     "--persistent", "--record", str(path)])
    assert out.returncode == 0, out.stderr
    split = {(r["alg"], r["bytes"]): r for r in load(str(path))["split"]}
    assert set(split) == {(a, n) for a in ("mpi", "ring", "ring+sign") for n in (4096, 102400)}
    assert all(r["calls"] == 3 * 4 for r in split.values())
    assert all(split[a, n]["codec_s"] == 0 for a in ("mpi", "ring") for n in (4096, 102400))
    assert all(split["ring+sign", n]["codec_s"] > 0 and split["ring", n]["wait_s"] > 0
               and split["ring", n]["checks_s"] > 0 for n in (4096, 102400))
    assert all(r["total_s"] >= r["checks_s"] for r in split.values())
    # the messages a call received: a ring's 2(p - 1) (one segment a chunk at these
    # sizes), none through MPI's own; the time per hop is the call's after its checks
    assert all(split["ring", n]["hops"] == 2 * (3 - 1) for n in (4096, 102400))
    assert split["mpi", 4096]["hops"] == 0 and split["mpi", 4096]["per_hop_s"] is None
    ring = split["ring", 4096]
    assert 0 < ring["per_hop_s"] <= ring["total_s"]
    assert "where a call's time goes" in out.stdout and "us/hop" in out.stdout
    assert "ring+sign" in render(load(str(path))).split("Where a call's time goes")[1]


def test_bench_standin_device_times_the_device_paths_host_cost(tmp_path):
    """``--device standin`` (under the simulator's import of the CUDA kernels): every
    launch skipped, results not computed (neither checked nor printed as errors), the
    split per hop of the device path; refused without NUMBA_ENABLE_CUDASIM=1."""
    path = tmp_path / "s.json"
    out = mpirun(3, ["-m", "ringcomp.bench", "--sizes", "4K", "--iters", "3",
                     "--algorithms", "ring,mpi", "--compressors", "marsit", "--device",
                     "standin", "--split", "--record", str(path)], NUMBA_ENABLE_CUDASIM="1")
    assert out.returncode == 0, out.stderr
    assert "device standin (kernels skipped: the host path alone)" in out.stdout
    from ringcomp.results.record import load

    record = load(str(path))
    rows = {(r["algorithm"], r["compressor"]): r for r in record["rows"]}
    assert set(rows) == {("mpi", "none"), ("ring", "none"), ("ring", "marsit")}
    assert all(r["wrong"] is None and r["rel_err"] is None for r in rows.values())
    assert rows["ring", "marsit"]["wire_bytes"] < rows["ring", "none"]["wire_bytes"] / 8
    split = {r["alg"]: r for r in record["split"]}
    assert split["ring+marsit"]["hops"] == 4 and split["ring+marsit"]["codec_s"] > 0
    assert record["provenance"]["device"] == "standin"
    refused = mpirun(1, ["-m", "ringcomp.bench", "--device", "standin"],
                     NUMBA_ENABLE_CUDASIM="0")
    assert refused.returncode == 2 and "set NUMBA_ENABLE_CUDASIM=1" in refused.stderr


def test_bench_record_renders_the_printed_table_with_paired_ranges(tmp_path):
    from ringcomp.results.benchtable import render
    from ringcomp.results.record import load

    path = tmp_path / "new" / "bench.json"
    out = mpirun(3, ["-m", "ringcomp.bench", "--sizes", "4K,100K", "--iters", "4",
                     "--algorithms", "ring,mpi", "--trace", str(tmp_path / "tr"),
                     "--record", str(path)])
    assert out.returncode == 0, out.stderr
    record = load(str(path))
    prov = record["provenance"]
    assert prov["command"].startswith("mpiexec -n 3 python -m ringcomp.bench --sizes 4K,100K")
    assert prov["ranks"] == 3 and "digests" not in prov  # a timing record: no verdict
    # the load it was timed under, before and after
    assert {"load1", "busy_processes"} <= set(prov["load"]["before"]) and \
        prov["load"]["after"]["load1"] >= 0
    text = render(record)
    printed = [ln for ln in out.stdout.splitlines() if " float32 " in ln]
    for line in printed:  # every printed row, with the range of its paired ratios after it
        assert any(r.startswith(line) for r in text.splitlines()), line
    ring = [r for r in record["rows"] if r["algorithm"] == "ring"]
    mpi = [r for r in record["rows"] if r["algorithm"] == "mpi"]
    ratios = [a / b for a, b in zip(ring[1]["times_s"], mpi[1]["times_s"], strict=True)]
    assert f"{min(ratios):.2f}-{max(ratios):.2f}" in text
    assert "reduce-scatter" in text  # the hop summary of the traced run
    # how much the ranks slowed each other's host work, a ratio per round, printed and kept
    from ringcomp.hostshare import ROUNDS

    slowdown = record["rank_slowdown"]
    assert len(slowdown) == ROUNDS and all(r > 0 for r in slowdown)
    note = next(ln for ln in out.stdout.splitlines() if ln.startswith("# host work"))
    assert note in text and f"[{min(slowdown):g}-{max(slowdown):g}]" in note
    bad = mpirun(3, ["-m", "ringcomp.bench", "--sizes", "4K", "--iters", "2", "--record",
                     str(path)], timeout=60)
    assert bad.returncode != 0 and "--record needs --iters >= 3" in bad.stderr


def test_info_table():
    out = mpirun(3, ["-m", "ringcomp.info"])
    assert out.returncode == 0, out.stderr
    assert "3 rank(s)" in out.stdout and "check ok" in out.stdout
    assert "MPICH" in out.stdout or "Open MPI" in out.stdout
    assert "multiple" in out.stdout  # the thread level ringcomp needs


@pytest.mark.parametrize("var", ["PMI_SIZE", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE"])
def test_singletons_are_refused(var):
    """N processes started without a working launcher each see a world of 1."""
    out = subprocess.run([sys.executable, "-m", "ringcomp.info"], capture_output=True,
                         text=True, timeout=60, env=env(**{var: "4"}))
    assert out.returncode == 2
    assert "singletons" in out.stderr and f"{var}=4" in out.stderr


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_launcher_outside_mpi_is_refused_with_the_command_that_works(tmp_path, nproc):
    """torchrun starts processes that are no MPI job (each a world of one) and tells them
    WORLD_SIZE: ``import ringcomp`` stops every one within seconds naming the mpiexec
    command that works (it used to hang in init_process_group; with one process too,
    where the worlds agree, in the store torchrun's agent holds); the tools say it in one
    line (exit status 2) naming the module they were run as; a WORLD_SIZE that agrees
    with MPI's world is fine under mpiexec."""
    job = script(tmp_path, """
        import ringcomp.torch as rt
        rt.init_process_group()
    """)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("no torchrun (torch is not installed)")
    start = time.monotonic()
    out = subprocess.run([torchrun, "--nproc-per-node", str(nproc), job],
                         capture_output=True, text=True, timeout=120, env=env(), cwd=tmp_path)
    assert out.returncode != 0 and time.monotonic() - start < 60
    # torchrun stops the other process once one has failed: it may go before it says it
    assert out.stderr.count(f"Launch with `mpiexec -n {nproc} python {job}`") in (1, 2), \
        out.stderr[-2000:]
    tool = subprocess.run([sys.executable, "-m", "ringcomp.info", "--json"],
                          capture_output=True, text=True, timeout=60, env=env(WORLD_SIZE="3"))
    assert tool.returncode == 2 and "WORLD_SIZE=3" in tool.stderr
    assert "mpiexec -n 3 python -m ringcomp.info --json" in tool.stderr, tool.stderr
    assert "Traceback" not in tool.stderr
    agrees = mpirun(2, ["-m", "ringcomp.info"], WORLD_SIZE="2")
    assert agrees.returncode == 0, agrees.stderr


def test_without_an_mpi_library_the_tools_that_need_none_run_and_the_rest_say_how(tmp_path):
    """An install without MPI (mpi4py finds no library: here MPI4PY_LIBMPI points at none):
    ``import ringcomp`` works, so do perfmodel and simulate; the first use of MPI raises
    one message naming the MPICH extra and the site-MPI route, as does ringcomp.info."""
    missing = env(MPI4PY_LIBMPI=str(tmp_path / "libmpi.so"))
    # end to end, not only --help: they used to write their output, then exit 1 when the
    # log's rank filter asked the missing MPI for the rank ("wrote ..." was the last line)
    for argv in (["ringcomp.perfmodel"], ["ringcomp.simulate", "--out", str(tmp_path / "sim"),
                                          "--json", str(tmp_path / "sim.json")]):
        out = subprocess.run([sys.executable, "-m", *argv], capture_output=True,
                             text=True, timeout=120, env=missing)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert out.stdout.strip()
    assert (tmp_path / "sim.json").exists() and "# wrote" in out.stderr
    for argv in (["-c", "import numpy, ringcomp; ringcomp.allreduce(numpy.ones(3))"],
                 ["-m", "ringcomp.info"]):
        out = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                             timeout=60, env=missing)
        assert out.returncode != 0
        assert "no MPI library could be loaded" in out.stderr
        assert "pip install 'ringcomp[mpich]'" in out.stderr and "site MPI" in out.stderr
        assert "Error in sys.excepthook" not in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr  # info: one line, no traceback


def test_the_readme_examples_are_ruff_clean_as_a_users_scripts():
    """``make lint`` checks the README's Python examples too (they failed ruff where a user
    pasted them into a file of their own)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from lint_examples import problems

    assert problems() == []


def test_make_lint_is_clean_with_the_examples_saved_where_they_say():
    """A reader saves each example under the name its ``run with:`` line gives, in the
    checkout (``tour.py``, ``train_torch.py``, ...): ``make lint``'s ``ruff check .`` then
    linted them as the project's own code (ringcomp first-party) and failed; they are
    git-ignored, so ruff leaves them to ``lint_examples`` (as a user's scripts)."""
    import re

    named = {}
    for doc in ("README.md", *sorted(os.listdir(os.path.join(ROOT, "docs")))):
        path = os.path.join(ROOT, doc if doc == "README.md" else os.path.join("docs", doc))
        if not path.endswith(".md"):
            continue
        with open(path) as f:
            text = f.read()
        for block in re.findall(r"```python\n(.*?)```", text, re.S):
            found = re.match(r"# (\S+\.py)\s+--\s+run with", block)
            if found:
                named[found.group(1)] = block
    assert "tour.py" in named and "train_torch.py" in named
    taken = [name for name in named if os.path.exists(os.path.join(ROOT, name))]
    if taken:
        pytest.skip(f"the checkout already holds {taken}: not overwritten")
    try:
        for name, block in named.items():
            with open(os.path.join(ROOT, name), "w") as f:
                f.write(block)
        out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    finally:
        for name in named:
            os.remove(os.path.join(ROOT, name))
    assert out.returncode == 0, out.stdout[-2000:]


def test_library_refuses_singletons_too():
    code = "import numpy, ringcomp; ringcomp.allreduce(numpy.ones(3))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env(PMI_SIZE="2"))
    assert out.returncode != 0 and "LauncherError" in out.stderr


def test_a_start_up_that_never_ends_is_stopped_with_the_reason():
    """A launcher that never answers MPI_Init (here: a PMI server that accepts and stays
    silent, as Slurm's pmi2 plugin after it lost a request): every entry point stops after
    RINGCOMP_INIT_TIMEOUT with why, instead of waiting for ever."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "ringcomp.info"], capture_output=True,
                             text=True, timeout=60,
                             env=env(PMI_PORT=f"127.0.0.1:{port}", PMI_RANK="1", PMI_ID="1",
                                     PMI_SIZE="2", RINGCOMP_INIT_TIMEOUT="2"))
    assert out.returncode == -signal.SIGTERM and time.monotonic() - start < 30
    assert "MPI_Init did not return in 2 s (RINGCOMP_INIT_TIMEOUT)" in out.stderr
    assert "launcher rank 1" in out.stderr and "srun --mpi=pmi2" in out.stderr


@pytest.mark.parametrize("variables,seconds", [
    ({}, 300), ({"RINGCOMP_TIMEOUT": "2"}, 300), ({"RINGCOMP_TIMEOUT": "900"}, 900),
    ({"RINGCOMP_TIMEOUT": "0"}, 0), ({"RINGCOMP_INIT_TIMEOUT": "5", "RINGCOMP_TIMEOUT": "0"}, 5),
    ({"RINGCOMP_INIT_TIMEOUT": "0"}, 0)])
def test_the_start_up_deadline(monkeypatch, variables, seconds):
    """A short deadline for waits does not cut MPI_Init off (it waits for the slowest rank
    to start Python); 0 switches it off."""
    from ringcomp.transport.startup import deadline

    for name in ("RINGCOMP_TIMEOUT", "RINGCOMP_INIT_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert deadline() == seconds


@pytest.mark.parametrize("name,value", [
    ("RINGCOMP_INIT_TIMEOUT", "-5"), ("RINGCOMP_INIT_TIMEOUT", "abc"),
    ("RINGCOMP_INIT_TIMEOUT", "inf"), ("RINGCOMP_INIT_TIMEOUT", "nan"),
    ("RINGCOMP_TIMEOUT", "-5"), ("RINGCOMP_TIMEOUT", "nan")])
def test_bad_deadline_variables_are_refused_at_import_not_ignored(name, value):
    """Both variables parse alike: a bad value stops ``import ringcomp`` with the variable's
    name (a bad RINGCOMP_INIT_TIMEOUT used to switch the start-up watch off in silence)."""
    out = subprocess.run([sys.executable, "-c", "import ringcomp"], capture_output=True,
                         text=True, timeout=60, env=env(**{name: value}))
    assert out.returncode == 1, out.stderr
    assert f"ValueError: {name} must be a" in out.stderr and repr(value) in out.stderr


def test_the_start_up_watch_leaves_nothing_behind():
    """Under a working launcher the watching child is gone once MPI_Init has returned."""
    code = ("import os, ringcomp\n"
            "try:\n    os.waitpid(-1, os.WNOHANG); print('a child is left')\n"
            "except ChildProcessError:\n    print('no child')\n")
    out = mpirun(3, ["-c", code], timeout=60)
    # counted in the whole output: mpiexec may interleave the ranks' lines
    assert out.returncode == 0 and out.stdout.count("no child") == 3, out.stdout
    assert "a child is left" not in out.stdout, out.stdout


@pytest.mark.parametrize("algorithm,waiting,split", [
    ("tree", "recv of 4000 bytes from rank 1", True),
    # one blocking MPI_Allreduce (faster than Iallreduce + Wait): the watchdog's thread
    # still aborts the job past the deadline, naming the call
    ("mpi", "MPI Allreduce of 4000 bytes", True),
    # a small exact ring sum runs as one compiled walk (Numba is loaded below): blocked in
    # MPI from compiled code, it is still under the deadline
    ("ring", "the ring's compiled walk", True),
    # and a small Marsit ring (its halves, the input checked as read: check=False)
    ("ring+marsit", "the compressed ring's compiled walk", True),
    # a compressed call's first use of the transport splits the ranks by node (to share
    # the cores among kernels): collective, so under the deadline too
    ("ring+marsit", "the split of the ranks by node", False)])
def test_deadline_names_operation_peer_and_bytes(tmp_path, algorithm, waiting, split):
    """Rank 1 never joins: rank 0 must abort after the deadline with a precise message."""
    job = script(tmp_path, f"""
        import time, numpy as np, ringcomp
        from mpi4py import MPI
        from ringcomp.collectives import ring_native  # loads Numba: the ring's walk compiled
        ringcomp.install_abort_on_exception()
        transport = ringcomp.get_transport()
        if {split}:
            transport.local_size  # the ranks split by node, on both
        if MPI.COMM_WORLD.rank == 0:
            ringcomp.allreduce(np.ones(1000, np.float32), algorithm="{algorithm.split('+')[0]}",
                               compressor={algorithm.partition('+')[2] or None!r}, check=False)
        else:
            time.sleep(60)
    """)
    out = mpirun(2, [job], timeout=120, RINGCOMP_TIMEOUT="2")
    assert out.returncode != 0
    assert "deadline passed" in out.stderr
    assert f"allreduce[{algorithm}] of 4000 bytes" in out.stderr
    assert waiting in out.stderr


def test_deadline_on_a_rank_that_never_joins(tmp_path):
    job = script(tmp_path, """
        import time, numpy as np, ringcomp
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 0:
            ringcomp.allreduce(np.ones(10))
        else:
            time.sleep(60)
    """)
    out = mpirun(2, [job], timeout=120, RINGCOMP_TIMEOUT="2")
    assert out.returncode != 0 and "deadline passed" in out.stderr


def test_exception_on_one_rank_aborts_the_job(tmp_path):
    job = script(tmp_path, """
        import numpy as np, ringcomp
        from mpi4py import MPI
        ringcomp.get_transport()  # installs the abort-on-exception hook (size > 1)
        if MPI.COMM_WORLD.rank == 2:
            raise RuntimeError("boom on rank 2")
        ringcomp.allreduce(np.ones(10))
    """)
    out = mpirun(3, [job], timeout=120, RINGCOMP_TIMEOUT="100")
    assert out.returncode != 0
    assert "boom on rank 2" in out.stderr and "uncaught exception" in out.stderr


def test_dead_rank_brings_the_job_down(tmp_path):
    job = script(tmp_path, """
        import os, numpy as np, ringcomp
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 1:
            os._exit(7)
        ringcomp.allreduce(np.ones(10))
    """)
    out = mpirun(3, [job], timeout=120, RINGCOMP_TIMEOUT="100")
    assert out.returncode != 0


def test_kernels_subpackage_only():
    """ringcomp.kernels is importable; no top-level ``kernels`` package is installed."""
    code = ("import importlib.util, ringcomp.kernels; "
            "print(importlib.util.find_spec('kernels') is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env(), cwd="/")
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def test_bench_kernels_table(tmp_path):
    path = tmp_path / "kernels.jsonl"
    out = subprocess.run([sys.executable, "-m", "ringcomp.bench", "--kernels",
                          "--kernel-elements", "64K", "--json", str(path)], capture_output=True,
                         text=True, timeout=300, env=env())
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    kernels = {(r["kernel"], r["backend"]) for r in rows}
    assert ("memcpy", "numpy") in kernels and ("marsit merge 1/3", "numba") in kernels
    assert all(r["GBps"] > 0 for r in rows)


def test_train_job_end_to_end(tmp_path):
    """The README's main job: trains, writes metrics and checkpoints, resumes."""
    metrics, ck = tmp_path / "m.jsonl", tmp_path / "ck"
    common = ["-m", "ringcomp.train", "--no-progress", "--epochs", "2", "--metrics",
              str(metrics), "--checkpoint-dir", str(ck), "--compressor", "marsit"]
    out = mpirun(3, common)
    assert out.returncode == 0, out.stderr
    assert "test accuracy" in out.stdout
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    summary = records[-1]
    assert summary["summary"] and summary["steps"] == 2 * (1437 // 24)
    assert summary["test_acc"] > 0.5  # Marsit learns digits in 2 epochs
    out = mpirun(3, common + ["--resume", "--epochs", "3"])
    assert out.returncode == 0, out.stderr
    resumed = [json.loads(line) for line in metrics.read_text().splitlines()]
    # appended: what the resumed run is, then its steps, continued
    assert resumed[len(records)]["run"]["from_step"] == summary["steps"]
    assert resumed[len(records) + 1]["step"] == summary["steps"]
    out = subprocess.run([sys.executable, "-m", "ringcomp.report", "train", str(metrics),
                          "--labels", "marsit", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120, env=env())
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("marsit"))
    assert row.split()[1:3] == ["1", str(3 * (1437 // 24))]  # one run, resumed to 3 epochs
    assert (tmp_path / "r.png").stat().st_size > 1000
    out = mpirun(2, ["-m", "ringcomp.train", "--no-progress", "--compressor", "marsit",
                     "--optimizer", "sgd"])
    assert out.returncode != 0 and "goes with the Marsit optimizer" in out.stderr
    out = mpirun(2, ["-m", "ringcomp.train", "--no-progress", "--error-feedback"])
    assert out.returncode != 0 and "error feedback (--error-feedback" in out.stderr


@pytest.mark.parametrize("fault", ["raise", "exit"])
def test_a_failing_rank_brings_training_down(tmp_path, fault):
    """Rank 1 raises (or dies) at step 5 while the others are in the step's collectives:
    the job ends with an error (and the traceback), it does not hang."""
    job = script(tmp_path, f"""
        import os, sys
        from mpi4py import MPI
        from ringcomp import train
        from ringcomp.training import trainer
        step = trainer.Trainer.train_step
        def faulty(self, i):
            if MPI.COMM_WORLD.rank == 1 and i == 5:
                if {fault!r} == "exit":
                    os._exit(3)
                raise RuntimeError("injected fault on rank 1")
            return step(self, i)
        trainer.Trainer.train_step = faulty
        sys.exit(train.main(["--no-progress", "--epochs", "3", "--compressor", "marsit"]))
    """)
    out = mpirun(3, [job], timeout=120, RINGCOMP_TIMEOUT="60")
    assert out.returncode != 0
    if fault == "raise":
        assert "injected fault on rank 1" in out.stderr and "Traceback" in out.stderr


def test_experiments_hops(tmp_path):
    # into a folder that does not exist yet: made before the study runs
    out = mpirun(3, ["-m", "ringcomp.experiments", "hops", "--steps", "8", "--elements",
                     "3000", "--methods", "ring+marsit,ring+sign,tree+fp16",
                     "--out", str(tmp_path / "new" / "h")])
    tmp_path = tmp_path / "new"
    assert out.returncode == 0, out.stderr
    assert "bias" in out.stdout and "ring+marsit" in out.stdout
    result = json.loads((tmp_path / "h.json").read_text())
    assert result["p"] == 3 and {r["alg"] for r in result["hops"]} == {
        "ring+marsit", "ring+sign", "tree+fp16"}
    marsit, sign = result["bias"]["ring+marsit"], result["bias"]["ring+sign"]
    assert [t for t, _ in marsit] == [1, 2, 4, 8]
    # Marsit is unbiased: its average closes in on the mean of signs like 1/sqrt(T)
    # (ratio ~ 0.35 over 8 steps); scaled sign is deterministic: its bias stays
    assert marsit[-1][1] < 0.5 * marsit[0][1]
    assert sign[-1][1] == pytest.approx(sign[0][1])
    assert result["bias"]["tree+fp16"][-1][1] < 1e-3
    for name in ("h-per-hop.png", "h-per-hop.svg", "h-bias.png", "h-bias.svg"):
        assert (tmp_path / name).stat().st_size > 1000
    from ringcomp.experiments.hop_error import render  # the record renders the printed table

    assert result["kind"] == "hops" and result["provenance"]["ranks"] == 3
    bias = out.stdout.split("# bias:")[1].splitlines()[1:5]
    assert len(bias) == 4 and all(line in render(result) for line in bias)


def test_an_output_that_cannot_be_written_is_refused_before_the_study_runs(tmp_path):
    tmp_path.joinpath("file").write_text("")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ringcomp.experiments", "hops", "--out",
                          str(tmp_path / "file" / "h")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "argument --out: cannot create" in out.stderr
    assert time.monotonic() - started < 30  # refused at parse time, not after the study


def test_experiments_convergence(tmp_path):
    base = ("--model mlp:16 --epochs 1 --batch-size 8 --lr 0.1 --eval-every 10 "
            "--small-tensor 100")
    out = mpirun(3, ["-m", "ringcomp.experiments", "convergence", "--methods",
                     "ring,ring+marsit,ring+topk+ef", "--seeds", "0,1", "--tasks", "custom",
                     "--base", base, "--lrs", "0.1,1e4", "--target", "0.5", "--out",
                     str(tmp_path / "c"), "--sweep-seeds", "100,101", "--global-batch", "21"])
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["kind"] == "convergence"  # a record: the command that reproduces it
    assert result["provenance"]["command"].startswith(
        "mpiexec -n 3 python -m ringcomp.experiments convergence --methods")
    rows = {r["label"]: r for r in result["tasks"]["custom"]["rows"]}
    assert list(rows) == ["ring", "ring+marsit", "ring+topk+ef"] and result["ranks"] == 3
    for row in rows.values():
        # lr 1e4 diverges (or trains to nothing) on validation: 0.1 is chosen for everyone
        assert row["lr"] == 0.1 and row["validation"]["0.1"] > 0.3
        # the rate is picked by the mean over the sweep seeds; a divergence counts as one
        per_seed = row["validation_seeds"]["0.1"]
        assert len(per_seed) == 2 and per_seed[0] != per_seed[1]
        assert row["validation"]["0.1"] == pytest.approx(sum(per_seed) / 2)
        assert row["validation"]["10000.0"] is None or None not in \
            row["validation_seeds"]["10000.0"]
        # 0.1 was the grid's smallest rate and the best: the grid grew a step below it
        assert row["validation"]["1e-06"] < row["validation"]["0.1"]
        assert set(row["seed_test_acc"]) == {"0", "1"}  # every seed's, for paired tests
        assert sum(row["seed_test_acc"].values()) / 2 == pytest.approx(row["test_acc"])
        # --global-batch 21: 7 a rank (the base's 8 overridden), 1437 // 21 steps an epoch
        assert row["runs"] == 2 and row["steps"] == 1437 // 21 and not row["diverged"]
        assert row["test_acc"] > 0.5 and row["reached"] == 2 and row["steps_to_target"] > 0
        assert 0 <= row["test_acc_ci95"] < 1
    # differences to the first method, paired seed by seed; the record's renderer derives
    # them again from the per-seed accuracies it keeps, and gets the same
    assert rows["ring"]["diff"] == 0 and rows["ring"]["diff_ci95"] == 0
    from ringcomp.experiments.convergence_tables import paired_from_seeds, render

    for row in rows.values():
        assert paired_from_seeds(row, rows["ring"]) == pytest.approx(
            (row["diff"], row["diff_ci95"]))
    assert "| ring+topk+ef | 1e-06, 0.1, 10000 | 0.1 |" in render(result)
    assert all(r["versus"] == "ring" and -1 < r["diff"] < 1 for r in rows.values())
    assert "test - ring (paired)" in out.stdout
    # the exact ring sends 32 bits per element, Marsit 1 (the 26 biases go exactly)
    assert rows["ring+marsit"]["wire_bytes"] < rows["ring"]["wire_bytes"] / 8
    assert len(list((tmp_path / "c-runs").glob("*.jsonl"))) == 6
    assert (tmp_path / "c-custom.png").stat().st_size > 1000
    assert "val@0.1" in out.stdout and "test acc ±95%" in out.stdout
    out = mpirun(2, ["-m", "ringcomp.experiments", "convergence", "--methods", "ring",
                     "--seeds", "0", "--tasks", "custom", "--base", "--epochs 1",
                     "--lrs", "1e4", "--out", str(tmp_path / "d")])
    assert out.returncode == 0, out.stderr  # a diverging run is a result, not a crash
    single = json.loads((tmp_path / "d.json").read_text())
    row = single["tasks"]["custom"]["rows"][0]
    # the table (a result) on stdout, the per-run line (progress) on stderr
    assert row["diverged"] == 1 and "NaN @" in out.stdout and "diverged" in out.stderr
    assert row["validation"] == {"10000.0": None}
    assert single["sweep_seeds"] == [100, 101, 102]  # the default: three
    assert result["sweep_seeds"] == [100, 101]
    # a global batch that does not split over the ranks: refused on every rank, no run
    out = mpirun(2, ["-m", "ringcomp.experiments", "convergence", "--methods", "ring",
                     "--global-batch", "9", "--out", str(tmp_path / "e")])
    assert out.returncode != 0 and not (tmp_path / "e-runs").exists()
    assert out.stderr.count("--global-batch 9 does not split over 2 ranks") == 2


def test_convergence_marsit_second_rate_methods():
    """ring+marsit-s<r> trains Marsit with eta_s = r * eta_l at every rate of the sweep."""
    from ringcomp.experiments.convergence import DEFAULT_METHODS, MARSIT_RATIOS, method_options
    from ringcomp.training.config import parse

    for lr in (0.01, 0.3):
        tied = parse(method_options("ring+marsit", lr))
        assert tied.optimizer == "marsit" and tied.global_lr == pytest.approx(lr / 10)
        for name, ratio in MARSIT_RATIOS.items():
            args = parse(method_options(name, lr))
            assert args.compressor == "marsit" and args.optimizer == "marsit"
            assert args.lr == lr and args.global_lr == pytest.approx(ratio * lr)
    # more tries than the others: opt-in, never part of the default comparison
    assert not set(MARSIT_RATIOS) & set(DEFAULT_METHODS)


def test_convergence_sweep_runs_as_many_steps_as_the_final_runs():
    from ringcomp.experiments.convergence import sweep_length

    # digits: 1437 training images, 1150 after the validation split; 3 ranks x 8 = 24 a step
    assert sweep_length(["--epochs", "2", "--batch-size", "8"], 3) == [
        "--steps", str(2 * (1437 // 24)), "--epochs", "3"]  # 118 steps, 47 an epoch
    assert sweep_length(["--steps", "50", "--batch-size", "8"], 3) == [
        "--steps", "50", "--epochs", "2"]
    assert sweep_length(["--batch-size", "100"], 16) == []  # the trainer refuses it


def test_experiments_convergence_quick_and_refusals(tmp_path, capsys):
    out = mpirun(2, ["-m", "ringcomp.experiments", "convergence", "--quick", "--methods",
                     "ring,torus+marsit", "--tasks", "mlp-skew", "--out", str(tmp_path / "q")])
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "q.json").read_text())
    assert result["lrs"] == [0.03, 0.1] and result["seeds"] == [0, 1]
    assert "label-skew:0.1" in result["tasks"]["mlp-skew"]["base"]
    assert [r["runs"] for r in result["tasks"]["mlp-skew"]["rows"]] == [2, 2]
    # --quick fills in only what the user left: a --seeds given acts
    out = mpirun(2, ["-m", "ringcomp.experiments", "convergence", "--quick", "--methods",
                     "ring", "--seeds", "3", "--out", str(tmp_path / "s")])
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["lrs"] == [0.03, 0.1] and result["seeds"] == [3]
    # refused at parse time, alike on every rank: checked in this process
    import argparse

    from ringcomp.experiments import convergence

    for bad, needle in ((["--tasks", "imagenet"], "unknown --tasks"),
                        (["--base", "--epochs 1"], "--base acts only with --tasks custom"),
                        (["--tasks", "custom"], "needs --base"),
                        (["--lrs", "0"], "--lrs needs rates > 0"),
                        (["--sweep-seeds", ""], "--sweep-seeds needs at least one seed"),
                        (["--tasks", "custom", "--base", "--global-lr 0.001", "--methods",
                          "ring+marsit-s0.03"], "which ring+marsit-s0.03 set at every rate")):
        parser = argparse.ArgumentParser()
        convergence.add_parser(parser.add_subparsers(dest="study"))
        with pytest.raises(SystemExit):
            convergence.check_args(parser.parse_args(["convergence", *bad]), parser)
        assert needle in capsys.readouterr().err, bad


def test_profile_command(tmp_path):
    path = tmp_path / "p.json"
    common = ["-m", "ringcomp.profile", "--model", "replay:resnet50", "--replay-scale", "0.01",
              "--compressor", "marsit", "--profile-steps", "2", "--profile", str(path)]
    out = mpirun(2, common)
    assert out.returncode == 0, out.stderr
    profile = json.loads(path.read_text())
    assert profile["ranks"] == 2 and profile["compressor"] == "marsit"
    assert len(profile["backward_s"]) == 161 and profile["forward_s"] > 0
    assert profile["update_s"] > 0  # the optimizer and the statistics all-reduce: charged
    assert all(a >= 0 and b >= 0 for a, b in (profile["exact"], profile["compressed"]))
    assert "compressed all-reduce" in out.stdout
    out = mpirun(3, common)  # the file exists but was measured at 2 ranks
    assert out.returncode != 0 and "ranks=2 (now 3)" in out.stderr


def test_experiments_validate(tmp_path):
    out = mpirun(2, ["-m", "ringcomp.experiments", "validate", "--methods", "none,marsit",
                     "--plans", "layerwise,optimal", "--base",
                     "--model replay:resnet50 --replay-scale 0.02 --steps 6 --profile-steps 2",
                     "--out", str(tmp_path / "v")])
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "v.json").read_text())["rows"]
    assert [(r["method"], r["plan"]) for r in rows] == [
        ("none", "layerwise"), ("none", "optimal"), ("marsit", "layerwise"),
        ("marsit", "optimal")]
    assert rows[0]["buckets"] == 161  # layer-wise: one bucket per ResNet-50 tensor
    # how many of them each plan compressed: none for the exact method, some for Marsit's
    assert rows[0]["compressed_buckets"] == rows[1]["compressed_buckets"] == 0
    assert 0 < rows[2]["compressed_buckets"] <= rows[2]["buckets"]
    assert all(r["predicted_s"] > 0 and r["wall_s"] > 0 for r in rows)
    # the spread of the 3 timed steps (6 minus 3 warm-up) beside their median
    assert all(r["timed_steps"] == 3 and r["wall_min_s"] <= r["wall_s"] <= r["wall_max_s"]
               for r in rows)
    assert "mean |error|" in out.stdout and "median over 3 timed steps" in out.stdout
    from ringcomp.experiments import validate  # noqa: F401 - its renderer
    from ringcomp.results import blocks  # what the docs render, and its command
    from ringcomp.results import record as records

    record = records.load(str(tmp_path / "v.json"))
    assert record["kind"] == "validate" and record["provenance"]["command"].startswith(
        "mpiexec -n 2 python -m ringcomp.experiments validate --methods none,marsit")
    printed = [line for line in out.stdout.splitlines() if line.startswith(("none ", "marsit "))]
    assert len(printed) == 4 and all(line in blocks.render(record) for line in printed)


def test_experiments_train_time_pairs_each_method_with_the_exact_run(tmp_path):
    """Two repetitions of exact and Marsit jobs at 2 ranks: each method's summary per job,
    the ratio to the exact job of the same repetition, the bytes Marsit saves; the record
    renders the printed table; a method it does not know is refused up front."""
    out = subprocess.run([sys.executable, "-m", "ringcomp.experiments", "train-time",
                          "--ranks", "2", "--methods", "marsit", "--repeats", "2",
                          "--train-args", "--steps 8", "--out", str(tmp_path / "t")],
                         capture_output=True, text=True, timeout=300, env=env(), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    from ringcomp.experiments import train_time
    from ringcomp.results import blocks
    from ringcomp.results import record as records

    record = records.load(str(tmp_path / "t.json"))
    exact, marsit = record["rows"]
    assert (exact["method"], marsit["method"]) == ("exact", "marsit")  # exact first, always
    assert all(len(row["runs"]) == 2 and all(r["wall_s"] > 0 for r in row["runs"])
               for row in record["rows"])
    ratios = [m["wall_s"] / e["wall_s"] for m, e in zip(marsit["runs"], exact["runs"],
                                                          strict=True)]
    assert marsit["vs_exact"]["min"] == pytest.approx(min(ratios))
    assert marsit["vs_exact"]["max"] == pytest.approx(max(ratios))
    assert exact["vs_exact"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    # 1 bit a coordinate and a scale against 32 bits: far fewer bytes for the same steps
    assert marsit["runs"][0]["wire_bytes"] < exact["runs"][0]["wire_bytes"] / 8
    assert record["provenance"]["command"].startswith(
        "python -m ringcomp.experiments train-time --ranks 2")
    assert train_time.render(record) in out.stdout and "| marsit |" in blocks.render(record)
    refused = subprocess.run([sys.executable, "-m", "ringcomp.experiments", "train-time",
                              "--methods", "marsit,zip"], capture_output=True, text=True,
                             timeout=60, env=env(), cwd=ROOT)
    assert refused.returncode == 2 and "unknown ['zip']" in refused.stderr


def test_bench_compressors_rows(tmp_path):
    path = tmp_path / "c.jsonl"
    out = mpirun(3, ["-m", "ringcomp.bench", "--sizes", "64K", "--iters", "2",
                     "--algorithms", "ring,tree", "--compressors", "fp16,sign,marsit",
                     "--json", str(path), "--trace", str(tmp_path / "tr"), "--shadow"])
    assert out.returncode == 0, out.stderr
    assert "skipped" not in out.stdout
    # each rank's BLAS pool gets its share of the cores (PowerSGD's products were 18x
    # slower with a pool per core in every rank), said in the header
    share = max(1, (os.cpu_count() or 1) // 3)
    assert f"BLAS threads per rank {share}" in out.stdout.splitlines()[0]
    after = out.stdout.split("# shadow:")[1].splitlines()
    shadow = [line.split() for line in after if "+" in line.split(" ")[0]]
    assert {row[0] for row in shadow} == {f"{a}+{c}" for a in ("ring", "tree")
                                          for c in ("fp16", "sign", "marsit")}
    # one row per number of contributors: the ring's hops cover 2, 3; the tree's sends 1
    # (leaves 1 and 2), the root's total 3
    assert {int(row[2]) for row in shadow if row[0].startswith("ring")} == {2, 3}
    assert {int(row[2]) for row in shadow if row[0].startswith("tree")} == {1, 3}
    rows = {(r["algorithm"], r["compressor"]): r
            for r in map(json.loads, path.read_text().splitlines())}
    assert set(rows) == {(a, c) for a in ("ring", "tree")
                         for c in ("none", "fp16", "sign", "marsit")}
    assert rows["ring", "fp16"]["rel_err"] < 1e-3 and rows["ring", "none"]["rel_err"] < 1e-6
    # 1 bit per element (+ a 4-byte scale per segment for sign) instead of 32
    assert rows["ring", "marsit"]["wire_bytes"] == pytest.approx(
        rows["ring", "none"]["wire_bytes"] / 32, rel=0.01)
    assert rows["ring", "marsit"]["cosine"] > 0.3


def test_setup_cfg_lists_every_package():
    """A non-editable install ships only the listed packages (ringcomp.sched was missing)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    listed = set(cfg["options"]["packages"].split())
    found = {os.path.relpath(d, ROOT).replace(os.sep, ".")
             for d, _, files in os.walk(os.path.join(ROOT, "ringcomp")) if "__init__.py" in files}
    assert found <= listed, f"missing from setup.cfg: {sorted(found - listed)}"
    assert os.path.exists(os.path.join(ROOT, "LICENSE")) and cfg["metadata"]["license"] == "MIT"


def test_experiments_torch(tmp_path):
    """The PyTorch study end to end at 2 ranks, tiny: both tables, every method's row, the
    DDP baseline's ratio 1, accuracies and wire bytes that mean something."""
    pytest.importorskip("torch")
    out = mpirun(2, ["-m", "ringcomp.experiments", "torch", "--speed-model", "torch:mlp:32",
                     "--speed-steps", "8", "--warmup", "2", "--steps", "8",
                     "--speed-methods", "ringcomp,ddp-gloo,ringcomp-mpi", "--methods",
                     "ringcomp,ddp-gloo,ddp+fp16,ddp+powersgd,ringcomp-topk+ef",
                     "--out", str(tmp_path / "t")], CUDA_VISIBLE_DEVICES="")
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "t.json").read_text())
    speed = {r["method"]: r for r in result["speed"]}
    assert set(speed) == {"ringcomp", "ddp-gloo", "ringcomp-mpi"}
    # exact methods move every gradient: the same bytes, 2(p-1)/p x 4 x parameters (MPI's
    # own Allreduce counted as a ring would send, as gloo's)
    assert speed["ringcomp"]["wire_bytes"] == speed["ddp-gloo"]["wire_bytes"] == speed[
        "ringcomp-mpi"]["wire_bytes"] == 4 * result["parameters"]
    table = {r["method"]: r for r in result["table"]}
    assert table["ringcomp"]["test_acc"] == pytest.approx(table["ddp-gloo"]["test_acc"],
                                                          abs=0.02)
    assert table["ddp+fp16"]["wire_bytes"] < table["ddp-gloo"]["wire_bytes"]
    assert table["ringcomp-topk+ef"]["wire_bytes"] < table["ringcomp"]["wire_bytes"]
    assert "vs ddp-gloo" in out.stdout and "median over 6 timed steps" in out.stdout
    assert all(r["timed_steps"] == 6 and r["step_min_ms"] <= r["step_ms"] <= r["step_max_ms"]
               for r in speed.values())  # the spread of the steps after the warm-up
    from ringcomp.experiments.torch_tables import render
    from ringcomp.results import record as records

    record = records.load(str(tmp_path / "t.json"))
    assert record["kind"] == "torch-ddp" and record["provenance"]["ranks"] == 2
    printed = [ln for ln in out.stdout.splitlines() if ln.startswith(("ringcomp", "ddp"))]
    assert len(printed) == 8 and all(line in render(record) for line in printed)


def test_experiments_torch_refuses_bad_options_before_any_work():
    pytest.importorskip("torch")
    for bad, needle in ((["--speed-methods", "ringcomp,nccl"], "unknown --speed-methods"),
                        (["--steps", "5", "--warmup", "5"], "must exceed --warmup")):
        out = mpirun(2, ["-m", "ringcomp.experiments", "torch", *bad], timeout=60)
        assert out.returncode != 0 and needle in out.stderr, out.stderr


def test_studies_load_torch_and_scipy_stats_only_when_they_need_them():
    """Every rank of every study paid ~3.6 s of CPU importing torch and scipy.stats, which
    only the torch study and rank 0's result tables use; `--help` paid it too. Now the
    parser loads neither, the torch study still parses, and scipy.stats still works."""
    pytest.importorskip("torch")
    body = ("import sys\n"
            "from ringcomp.experiments.__main__ import main\n"
            "for argv in (['convergence', '--help'], ['torch', '--help']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print('loaded', sorted({'torch', 'scipy.stats._stats_py', 'matplotlib'}\n"
            "                       & set(sys.modules)))\n"
            "from ringcomp.runs import ci95\n"
            "print('ci95', round(ci95([1.0, 2.0, 3.0]), 4))\n")
    out = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "loaded []" in out.stdout and "--speed-model" in out.stdout, out.stdout
    assert "ci95 2.4841" in out.stdout  # t(0.975, 2) x 1 / sqrt(3)


def test_ringcomp_torch_keeps_numbas_threads_from_spinning(tmp_path):
    """With PyTorch in the process, a DistributedOptimizer's engine makes Numba's parallel
    kernels use its workqueue threads (OpenMP's spun beside PyTorch's: 7 s instead of
    0.4 s); a layer the user chose is left alone."""
    pytest.importorskip("torch")
    body = """
        import numba, torch
        import ringcomp.torch as rt
        model = torch.nn.Linear(64, 64)
        opt = rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      compressor="sign", error_feedback=True, small_tensor=0)
        model(torch.randn(4, 64)).sum().backward()
        opt.step()
        opt.close()
        print("layer", numba.threading_layer())
    """
    out = mpirun(1, [script(tmp_path, body)], timeout=120)
    assert out.returncode == 0 and "layer workqueue" in out.stdout, out.stderr
    # OpenMP's threads told to sleep when idle: the layer the user chose is what is
    # checked, not the spinning it would do beside PyTorch's (7 s of this test's 12)
    out = mpirun(1, [script(tmp_path, body)], timeout=120, NUMBA_THREADING_LAYER="omp",
                 OMP_WAIT_POLICY="passive")
    assert out.returncode == 0 and "layer omp" in out.stdout, out.stderr


def test_train_help_is_grouped_and_every_option_is_in_one_group():
    """`train --help` shows its options in sections (model and data, optimization, the run,
    communication, compression, checkpoints, output), each option in exactly one."""
    from ringcomp.training.config import GROUPS, OPTIONS

    listed = [name for names in GROUPS.values() for name in names]
    assert sorted(listed) == sorted(OPTIONS) and len(listed) == len(set(listed))
    out = subprocess.run([sys.executable, "-m", "ringcomp.train", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    titles = [line[:-1] for line in out.stdout.splitlines() if line.endswith(":")
              and not line.startswith(" ")]
    assert [t for t in titles if t in GROUPS] == list(GROUPS)
    section = out.stdout.split("\ncompression:\n")[1].split("\n\n")[0]
    assert "--compressor" in section and "--error-feedback" in section and "--lr" not in section


def test_the_torch_adapter_without_torch_says_how_to_install_it():
    """``rt.DistributedOptimizer`` where torch is missing: the install line, not a bare
    traceback from deep inside the adapter; the names that need no torch still load."""
    code = ("import sys; sys.modules['torch'] = None\n"  # import torch now fails
            "import ringcomp.torch as rt\n"
            "import ringcomp.torch.job\n"
            "try:\n    rt.DistributedOptimizer\nexcept ModuleNotFoundError as err:\n"
            "    print('ERR', err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env(), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "ERR ringcomp.torch.DistributedOptimizer needs PyTorch" in out.stdout
    assert "pip install 'ringcomp[torch]'" in out.stdout


def test_one_rank_without_a_launcher_says_so_and_how_to_scale_the_rate(tmp_path):
    """``python -m ringcomp.train`` alone: one line naming the launcher and the rate for
    this global batch - which then trains, where the 4-rank default diverges; under a
    launcher (``mpiexec -n 1``) nothing is said."""
    from ringcomp.transport.launch import LAUNCHER_VARS

    alone = env()
    for key in LAUNCHER_VARS:
        alone.pop(key, None)
    out = subprocess.run([sys.executable, "-m", "ringcomp.train", "--epochs", "3",
                          "--no-progress"], capture_output=True, text=True, timeout=240,
                         env=alone, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "one rank, started without an MPI launcher" in out.stderr
    assert "`mpiexec -n N python -m ringcomp.train`" in out.stderr
    assert "--lr 0.025 for this global batch of 8" in out.stderr
    scaled = subprocess.run([sys.executable, "-m", "ringcomp.train", "--epochs", "3",
                             "--no-progress", "--lr", "0.025"], capture_output=True,
                            text=True, timeout=240, env=alone, cwd=ROOT)
    assert scaled.returncode == 0 and "--lr 0.025 for" not in scaled.stderr  # rate set
    accuracy = float(scaled.stdout.split("test accuracy ")[1].split(",")[0])
    assert accuracy > 0.9, scaled.stdout
    launched = mpirun(1, ["-m", "ringcomp.train", "--epochs", "1", "--no-progress"])
    assert launched.returncode == 0 and "without an MPI launcher" not in launched.stderr


def test_experiments_kernels_records_the_kernel_table(tmp_path):
    """The kernel table as a record (what docs/gpu.md renders from a GPU run): the host
    backends here, with the load they were timed under; a GPU record shows each kernel's
    target and whether it is met."""
    from ringcomp.experiments import kernels
    from ringcomp.results import blocks
    from ringcomp.results import record as records

    out = tmp_path / "k"
    done = subprocess.run([sys.executable, "-m", "ringcomp.experiments", "kernels",
                           "--elements", "64K", "--out", str(out)], capture_output=True,
                          text=True, timeout=300, env=env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    record = records.load(f"{out}.json")
    assert record["kind"] == "kernels" and record["elements"] == 65536
    assert record["provenance"]["command"] == (f"python -m ringcomp.experiments kernels "
                                               f"--elements 64K --out {out}")
    assert record["provenance"]["device"] == "cpu" and "load" in record["provenance"]
    text = blocks.render(record)
    assert "| memcpy | numpy | 1 |" in text and "| topk 1% encode | numpy | 1 |" in text
    assert "target" not in text and "**Stale" not in text
    gpu_rows = [{"kernel": "device copy", "backend": "cupy", "threads": 0, "GBps": 1479.0,
                 "vs_copy": 1.0},
                {"kernel": "sign pack", "backend": "cuda", "threads": 0, "GBps": 986.0,
                 "vs_copy": 0.667},
                {"kernel": "qsgd decode", "backend": "cuda", "threads": 0, "GBps": 389.0,
                 "vs_copy": 0.263}]
    text = kernels.render({**record, "device": "gpu", "rows": gpu_rows})
    assert "| device copy | cupy | - | 1479 | 1.00 | - | - |" in text
    assert "| sign pack | cuda | - | 986 | 0.67 | 0.70 | **no** |" in text
    assert "| qsgd decode | cuda | - | 389 | 0.26 | 0.25 | yes |" in text
    assert "hop's segment" not in text  # a record without hop rows shows no second table
    hops = [{"kernel": "device copy", "backend": "cupy", "us": 4.25},
            {"kernel": "marsit join 1/3", "backend": "cuda", "us": 140.0},
            {"kernel": "marsit merge 1/3", "backend": "cuda", "us": 60.0}]
    text = kernels.render({**record, "device": "gpu", "rows": gpu_rows, "hop_rows": hops,
                           "hop_elements": 1 << 18, "hop_calls": 200})
    assert "262,144 float32 elements (1 MiB): microseconds per call, 200 calls" in text
    assert "| device copy | cupy | 4.2 | - | - |" in text
    assert "| marsit join 1/3 | cuda | 140.0 | 100 | **no** |" in text
    assert "| marsit merge 1/3 | cuda | 60.0 | 100 | yes |" in text
    assert "dispatcher" not in text  # a record from before the dispatcher column
    hops[1]["us_dispatcher"], hops[2]["us_dispatcher"] = 190.5, 98.0
    text = kernels.render({**record, "device": "gpu", "rows": gpu_rows, "hop_rows": hops,
                           "hop_elements": 1 << 18, "hop_calls": 200})
    assert "| kernel | backend | us per call | through the dispatcher | target | met |" in text
    assert "| device copy | cupy | 4.2 | - | - | - |" in text
    assert "| marsit join 1/3 | cuda | 140.0 | 190.5 | 100 | **no** |" in text
    for bad, says in ((["--elements", "0"], "--elements must be at least 1"),
                      (["--device", "gpu"], "--device gpu: ")):
        done = subprocess.run([sys.executable, "-m", "ringcomp.experiments", "kernels", *bad],
                              capture_output=True, text=True, timeout=60, env=env(), cwd=ROOT)
        if bad[0] == "--device" and "no usable GPU" not in done.stderr and done.returncode == 0:
            continue  # a machine with a GPU runs it
        assert done.returncode == 2 and says in done.stderr, done.stderr


def test_the_gpu_records_script_runs_the_documented_steps(tmp_path):
    """``jobs/gpu-records.sh`` parses, runs the documented steps, and each of its bench
    commands passes the bench's own checks (with the buffers on the host: no GPU here)."""
    import shlex

    from ringcomp.bench import parse_args

    path = os.path.join(ROOT, "jobs", "gpu-records.sh")
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    with open(path) as f:
        text = f.read()
    for step in ('-m pytest -q -p no:cacheprovider "${WORKERS[@]}" tests/cuda',
                 '-n 2 "$PY" tests/mpi_pytest.py', 'import pytest_mpi',
                 "tests/mpi/test_device_compressed.py tests/mpi/test_device_train.py",
                 "-m ringcomp.experiments kernels --device gpu --elements 64M",
                 "NAME=gpu-bench$SUFFIX\n", "SUFFIX=-mps\n", "SUFFIX=$SUFFIX-cudaaware\n",
                 'MPI[0]="$GPU_MPI/bin/mpiexec"', "RINGCOMP_CUDA_AWARE=1",
                 '-n 4 "$PY" -m ringcomp.experiments resnet50 --device gpu',
                 '--out "$OUT/gpu-resnet50$SUFFIX-p4"',
                 '--record "$OUT/$NAME-p4.json"',
                 '--record "$OUT/$NAME-trace-p4.json"', "nvidia-cuda-mps-control -d",
                 '--segment-bytes 4M --record "$OUT/$NAME-seg4m-p4.json"'):
        assert step in text, step
    commands = [line.split("-m ringcomp.bench", 1)[1] for line in
                text.replace("\\\n", " ").splitlines() if "-m ringcomp.bench" in line]
    assert len(commands) == 3
    for command in commands:
        argv = shlex.split(command.replace('"$OUT/$NAME', f'"{tmp_path}/gpu-bench').replace(
            '"$TRACE"', str(tmp_path / "trace")).replace("--device gpu", "--device cpu"))
        args = parse_args(argv)  # exits 2 on a refused option
        assert args.device == "cpu" and args.record.startswith(str(tmp_path))
    for setting, says in (({"GPU_STEPS": "2 7"}, "GPU_STEPS: unknown step '7'"),
                          ({"GPU_MPS": "yes"}, "GPU_MPS must be 0 or 1"),
                          ({"GPU_MPI": str(tmp_path), "GPU_STEPS": "1 2"},
                           "GPU_MPI acts on steps 3 to 6 only"),
                          ({"GPU_MPI": str(tmp_path / "none")},
                           "no bin/mpiexec or wheels/mpi4py-*.whl there")):
        done = subprocess.run(["bash", path, str(tmp_path / "out")], capture_output=True,
                              text=True, timeout=60, env={**os.environ, **setting})
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert not (tmp_path / "out").exists()  # refused before anything ran


def test_the_lent_machine_driver_refuses_bad_settings_and_keeps_to_its_budget(tmp_path):
    """``jobs/gpu-lent.sh`` (run by hand on a lent GPU machine: docs/gpu.md) parses,
    refuses a missing or short commit, an unknown phase, a non-numeric budget and an
    unwritable output folder before anything runs, and with no time left skips every
    phase, saying so, and still leaves its one archive behind."""
    path = os.path.join(ROOT, "jobs", "gpu-lent.sh")
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    with open(path) as f:
        text = f.read()
    for phase in ('records staged GPU_STEPS="2 3 4 5"', 'GPU_MPI=.cuda-mpi GPU_STEPS="3 5"',
                  'records tests GPU_STEPS="1"', 'records seg4m GPU_STEPS="6"'):
        assert phase in text, phase
    sha = "0" * 40
    out = tmp_path / "out"
    (tmp_path / "a-file").write_text("")  # a folder inside it cannot be made
    for argv, setting, says in (
            ([], {"RINGCOMP_COMMIT": sha}, "usage"),
            ([str(out)], {"RINGCOMP_COMMIT": "0bbf140"}, "RINGCOMP_COMMIT must be the full"),
            ([str(out), "staged", "fast"], {"RINGCOMP_COMMIT": sha}, "unknown phase 'fast'"),
            ([str(out)], {"RINGCOMP_COMMIT": sha, "LIMIT": "9m"}, "LIMIT must be whole"),
            ([str(tmp_path / "a-file" / "out")], {"RINGCOMP_COMMIT": sha},
             "cannot write records.tgz there")):
        done = subprocess.run(["bash", path, *argv], capture_output=True, text=True,
                              timeout=60, env={**os.environ, **setting})
        assert done.returncode == 2 and says in done.stderr, (argv, done.stderr)
        assert not out.exists()  # refused before anything ran
    # a copy of the script alone (no carried wheels beside it), with no time left
    (tmp_path / "copy" / "jobs").mkdir(parents=True)
    shutil.copy(path, tmp_path / "copy" / "jobs")
    done = subprocess.run(["bash", str(tmp_path / "copy" / "jobs" / "gpu-lent.sh"), str(out),
                           "staged", "aware"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RINGCOMP_COMMIT": sha, "LIMIT": "0"})
    assert done.returncode == 0, done.stderr
    assert "skipped staged: 0 s left" in done.stdout and "skipped aware" in done.stdout
    assert (out / "records.tgz").is_file()


def test_the_cuda_mpi_build_script_parses_and_refuses_a_missing_tarball(tmp_path):
    """``jobs/build-cuda-mpi.sh`` (a 6-minute build, run by hand: docs/gpu.md) parses, checks
    that its build has CUDA support, and refuses an ``OMPI_TARBALL`` that is not there
    before it builds or writes anything."""
    path = os.path.join(ROOT, "jobs", "build-cuda-mpi.sh")
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    with open(path) as f:
        assert "mpi_built_with_cuda_support:value:true" in f.read()
    done = subprocess.run(["bash", path, str(tmp_path / "mpi")], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "OMPI_TARBALL": str(tmp_path / "no.tar.bz2")})
    assert done.returncode == 2 and "OMPI_TARBALL: no file" in done.stderr, done.stderr
    assert not (tmp_path / "mpi").exists()


def test_a_study_that_is_not_an_mpi_job_refuses_to_run_as_several_tasks():
    """``mpiexec -n 4 python -m ringcomp.experiments codecs`` used to start four copies that
    each launched its own jobs, whose MPI_Init failed with a PMI error; every study that is
    not an MPI job now says to run it alone (a launcher's task count, here Slurm's, over 1),
    and one task (a Slurm batch step) still runs."""
    for study in ("codecs", "kernels", "network", "time-to-accuracy"):
        done = subprocess.run([sys.executable, "-m", "ringcomp.experiments", study],
                              capture_output=True, text=True, timeout=60, cwd=ROOT,
                              env=env(SLURM_STEP_NUM_TASKS="3"))
        assert done.returncode == 2, (study, done.stderr)
        assert (f"{study} is not an MPI job: run it alone, without mpiexec or srun"
                in done.stderr and "one of 3 tasks" in done.stderr), done.stderr
    done = subprocess.run([sys.executable, "-m", "ringcomp.experiments", "kernels",
                           "--elements", "1K"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env(SLURM_STEP_NUM_TASKS="1"))
    assert done.returncode == 0, done.stderr


def test_the_tools_know_compressors_an_installed_package_names(tmp_path):
    """A compressor of another package, named under the ``ringcomp.compressors`` entry
    points, is known to the command-line tools (which run no code of the user's, so
    ``compression.register`` in a script could not reach them): here an installed
    package (its dist-info on the path) names ``half``, fp16 under another name, and
    ``ringcomp.train --compressor half`` trains two ranks with it; a broken entry point
    is skipped with a warning naming it."""
    site = tmp_path / "site"
    dist = site / "ringcomp_half-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ringcomp-half\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[ringcomp.compressors]\nhalf = ringcomp_half:Half\nbroken = ringcomp_half:Nothing\n")
    (site / "ringcomp_half.py").write_text(
        "from ringcomp.compression.fp16 import Fp16\n\n\n"
        "class Half(Fp16):\n    name = 'half'\n")
    paths = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = mpirun(2, ["-m", "ringcomp.train", "--no-progress", "--steps", "3",
                     "--compressor", "half"], PYTHONPATH=paths)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'broken'" in out.stderr and "did not load" in out.stderr
    code = "import ringcomp; print(ringcomp.compressors())"
    listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env=env(PYTHONPATH=paths))
    assert "'half'" in listed.stdout, listed.stderr
