"""Logging and output: results on stdout, messages on stderr through the ``ringcomp`` logger,
rank 0 alone for the job, every rank for its own; --quiet, --verbose, RINGCOMP_LOG; the
progress display's modes; --help that states each default once and lists the choices."""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys

import pytest
from test_cli import ROOT, env, mpirun, script

from ringcomp import cli, log
from ringcomp.training import config

TOOLS = ["ringcomp.train", "ringcomp.bench", "ringcomp.info", "ringcomp.report",
         "ringcomp.experiments", "ringcomp.perfmodel", "ringcomp.simulate", "ringcomp.profile",
         "ringcomp.testbed"]


def test_levels_from_the_flags_and_the_environment(monkeypatch):
    monkeypatch.delenv(log.ENV, raising=False)
    assert log.configure() == logging.INFO
    assert log.configure(quiet=True) == logging.WARNING
    assert log.configure(verbose=True) == logging.DEBUG
    monkeypatch.setenv(log.ENV, "Warning")
    assert log.configure() == logging.WARNING
    assert log.configure(verbose=True) == logging.DEBUG  # a flag over the variable
    monkeypatch.setenv(log.ENV, "loud")
    with pytest.raises(ValueError, match="RINGCOMP_LOG='loud': use one of debug, info"):
        log.configure()


def test_a_nonsense_level_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv(log.ENV, "chatty")
    with pytest.raises(SystemExit):
        cli.Parser(prog="tool").parse_args([])
    assert "RINGCOMP_LOG='chatty'" in capsys.readouterr().err


def test_messages_are_formatted_and_filtered_by_level(monkeypatch, capsys):
    monkeypatch.delenv(log.ENV, raising=False)
    log.configure(quiet=True)
    here = logging.getLogger("ringcomp.somewhere")
    here.info("hidden")
    here.warning("kept")
    here.error("also kept")
    log.configure()
    here.info("wrote x.json")
    here.debug("not at info")
    here.info("mine alone", extra=log.EVERY_RANK)  # one rank: no prefix needed
    assert capsys.readouterr().err.splitlines() == [
        "# warning: kept", "# error: also kept", "# wrote x.json", "# mine alone"]
    assert capsys.readouterr().out == ""


def test_a_long_studys_heartbeat_speaks_once_its_interval_has_passed(monkeypatch, caplog):
    """A Heartbeat logs where the study is (done/total, the label, seconds so far) once
    its interval has passed since its last line, and nothing before: a short study stays
    silent, a long one speaks at least that often."""
    clock = iter([0.0, 3.0, 10.5, 12.0, 21.0])
    monkeypatch.setattr(log.time, "monotonic", lambda: next(clock))
    beat = log.Heartbeat(logging.getLogger("ringcomp.test"), "hops: steps", 4)
    with caplog.at_level(logging.INFO, logger="ringcomp"):
        for label in ("a", "b", "c", "d"):
            beat(label)
    assert [r.getMessage() for r in caplog.records] == [
        "hops: steps: 2/4 b (10 s)", "hops: steps: 4/4 d (21 s)"]


def test_quiet_and_verbose_together_are_refused(capsys):
    with pytest.raises(SystemExit):
        cli.Parser(prog="tool").parse_args(["-q", "-v"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_subcommand_keeps_the_commands_flag_and_a_training_parse_does_not_undo_it(
        monkeypatch):
    """``-q`` before or after the study acts; the study's own parses of training options
    (flagless) leave the level alone."""
    monkeypatch.delenv(log.ENV, raising=False)
    for argv in (["-q", "hops"], ["hops", "-q"]):
        log.reset()
        parser = cli.Parser(prog="experiments")
        parser.add_subparsers(dest="study").add_parser("hops")
        assert parser.parse_args(argv).quiet is True
        assert logging.getLogger("ringcomp").level == logging.WARNING
        config.parse(["--steps", "1"])
        assert logging.getLogger("ringcomp").level == logging.WARNING, argv


@pytest.mark.parametrize("module", TOOLS)
def test_every_tool_takes_quiet_and_verbose(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                         text=True, timeout=60, env=env(), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "-q, --quiet" in out.stdout and "-v, --verbose" in out.stdout


def test_rank_zero_speaks_for_the_job_and_every_rank_for_itself(tmp_path):
    job = script(tmp_path, """
        import logging, warnings
        from ringcomp import cli, log
        from mpi4py import MPI
        cli.Parser(prog="job").parse_args([])
        here = logging.getLogger("ringcomp.job")
        here.info("the job's message")
        here.warning("rank %d's own", MPI.COMM_WORLD.rank, extra=log.EVERY_RANK)
        if MPI.COMM_WORLD.rank == 2:
            warnings.warn("only rank 2 saw this")
    """)
    out = mpirun(3, [job], RINGCOMP_LOG="")
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert lines.count("# the job's message") == 1
    for r in range(3):
        assert f"# warning: [rank {r}] rank {r}'s own" in lines
    assert [ln for ln in lines if "only rank 2 saw this" in ln][0].startswith(
        "# warning: [rank 2] ")
    assert out.stdout == ""


def test_results_on_stdout_messages_on_stderr_and_quiet_keeps_the_results(tmp_path):
    record = str(tmp_path / "b.json")
    common = ["-m", "ringcomp.bench", "--sizes", "4K", "--iters", "3", "--algorithms",
              "ring", "--record", record]
    out = mpirun(2, common, RINGCOMP_LOG="")
    assert out.returncode == 0, out.stderr
    assert "ring" in out.stdout and "wrote" not in out.stdout
    assert f"# wrote {record}" in out.stderr.splitlines()
    quiet = mpirun(2, [*common, "-q"], RINGCOMP_LOG="")
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert quiet.stdout.splitlines()[1:] and "ring" in quiet.stdout
    verbose = mpirun(2, [*common, "--algorithms", "auto"], RINGCOMP_LOG="debug")
    assert verbose.returncode == 0, verbose.stderr
    assert "# auto constants: {" in verbose.stderr  # the fit, at debug level only
    assert "auto constants" not in out.stderr


def progress_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("# step ")]


def test_progress_modes_under_mpiexec(tmp_path):
    """Under mpiexec stderr is a pipe: auto prints lines (none with -q), bar draws tqdm's bar
    anyway, lines prints lines even with -q (it was asked for), none prints nothing."""
    common = ["-m", "ringcomp.train", "--steps", "20", "--batch-size", "8"]
    seen = {}
    for mode in (["--progress", "auto"], ["-q"], ["--progress", "bar"],
                 ["--progress", "lines", "-q"], ["--no-progress"], ["--progress"]):
        out = mpirun(2, [*common, *mode], RINGCOMP_LOG="")
        assert out.returncode == 0, out.stderr
        assert "steps on 2 ranks" in out.stdout  # the summary: a result, on stdout
        seen[" ".join(mode)] = out.stderr
    assert len(progress_lines(seen["--progress auto"])) == 10
    assert seen["-q"] == ""
    assert "step/s" in seen["--progress bar"] and "|" in seen["--progress bar"]
    assert not progress_lines(seen["--progress bar"])
    assert len(progress_lines(seen["--progress lines -q"])) == 10
    assert seen["--no-progress"] == ""
    assert len(progress_lines(seen["--progress"])) == 10  # alone: auto


def test_progress_option_values_on_every_path(tmp_path):
    assert config.parse(["--progress", "bar"]).progress == "bar"
    assert config.parse(["--no-progress"]).progress == "none"
    assert config.job(progress="lines").progress == "lines"
    with pytest.raises(SystemExit):
        config.parse(["--progress", "spinner"])
    with pytest.raises(ValueError, match="progress"):
        config.job(progress="spinner")
    with pytest.raises(TypeError, match="progress=False: need a str"):
        config.job(progress=False)
    toml = tmp_path / "c.toml"
    toml.write_text('progress = "lines"\n')
    assert config.parse(["--config", str(toml)]).progress == "lines"


def help_text() -> str:
    return config.parser().format_help()


def test_help_states_each_default_once_and_lists_the_choices():
    text = " ".join(help_text().split())
    assert "(default: None)" not in text
    assert "default 0.9) (default" not in text  # the text said it: not twice
    assert text.count("(default: ring)") == 1
    for choices in ("{digits,synthetic,images}", "{test,validation}", "{cpu,gpu}",
                    "{auto,sgd,adam,marsit}", "{auto,bar,lines,none}"):
        assert choices in text
    assert "{allgather,auto," in text and ",torus,tree,twostage}" in text


def test_every_logger_is_under_ringcomp():
    """A module's logger is ``__name__``, or for a tool run as ``__main__`` its own dotted
    name - never the root or a name outside ``ringcomp`` that the tools' handler misses."""
    bad = []
    package = os.path.join(ROOT, "ringcomp")
    for folder, _, files in os.walk(package):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(
                ".__init__")
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "getLogger":
                    arg = node.args[0] if node.args else None
                    ok = (isinstance(arg, ast.Name) and arg.id == "__name__") or (
                        isinstance(arg, ast.Constant) and arg.value in (module, "ringcomp",
                                                                        "py.warnings"))
                    if not ok:
                        bad.append(f"{module}: getLogger({ast.unparse(arg) if arg else ''})")
    assert not bad, bad

