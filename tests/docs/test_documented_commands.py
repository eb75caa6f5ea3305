"""Every command and code block in README.md and docs/ runs, as written or in its smoke form.

Sybil finds the fenced ``sh`` and ``python`` blocks; a small inline parser finds commands in
backticks (``mpiexec ...``, ``python -m ringcomp...``, ``make ...``, ``srun``, ``sbatch``).
Each runs in a scratch directory that links the project's Makefile, set-up files, ``.venv``
and ``jobs/`` (so what a command writes never lands in the repository) with the
environment's ``bin/`` first on PATH, under a time limit. A Python block runs the way its
first line says (``# tour.py  --  run with: mpiexec -n 4 python tour.py``); a block without
such a line runs in the namespace of the blocks before it on its page (``python`` alone).
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sybil import Document, Region
from sybil.parsers.markdown import CodeBlockParser

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from smoke import ASSIGNMENT, decide, normalize  # noqa: E402

#: what the scratch directory links from the project
LINKED = ("Makefile", "setup.cfg", "pyproject.toml", ".venv", "ringcomp", "jobs", "tests")
#: seconds one documented command may take (its smoke form; the slowest is ~40 s)
LIMIT = 240
#: a command in backticks: what a reader would paste into a shell
INLINE = re.compile(r"(?<!`)`((?:sudo )?(?:\S+=\S+ )*(?:\.venv/bin/)?(?:mpiexec|mpirun|python3? "
                    r"-m ringcomp|make|srun|sbatch)\b[^`\n]*)`(?!`)")
#: where a command writes, or whether it writes a record: not what it runs
OUTPUT = ("--out", "--record")
#: environment that sets which BLAS kernels run and how a waiting MPICH rank waits, not
#: which code runs: a record's footer repeats its page's command under the variables it
#: was measured with, and the two run once (the suite's digests stage runs under these
#: kernels: tests/run_suite.py)
TUNING = re.compile(r"^(?:OPENBLAS_CORETYPE|OPENBLAS_L2_SIZE|MPIR_CVAR_ENABLE_HEAVY_YIELD)=")
RUN_WITH = re.compile(r"^# (\S+\.py)\s+--\s+run with: (.+)$")


@functools.cache
def _scratch() -> Path:
    """A fresh directory per run (a checkpoint left by an earlier run would be resumed),
    removed at exit."""
    stamps = [p for p in (ROOT / ".venv").glob(".installed-*") if not p.name.endswith("-run")]
    newest = max((ROOT / name).stat().st_mtime for name in ("setup.cfg", "pyproject.toml"))
    if not stamps or stamps[0].stat().st_mtime < newest:
        # else the first `make` here would reinstall the project from the scratch directory
        pytest.fail("the environment is older than setup.cfg: run `make setup` first")
    path = Path(tempfile.mkdtemp(prefix="ringcomp-docs-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    for name in LINKED:
        (path / name).symlink_to(ROOT / name)
    return path


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD", "1000000000")
    return env


def _run(script: str, where: str) -> None:
    """Run ``script`` in the scratch directory; fail with its output if it fails."""
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=_scratch(),
                         env=_env(), capture_output=True, text=True, timeout=LIMIT)
    assert out.returncode == 0, (f"{where}: exit {out.returncode}\n$ {script}\n"
                                 f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def _commands(text: str) -> list[str]:
    """The commands of a shell block, one per logical line, comment lines dropped."""
    lines = text.replace("\\\n", " ").splitlines()
    return [normalize(ln) for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _script(commands: list[str]) -> tuple[str, list[str]]:
    """The commands that run here, joined; the reasons for those that do not."""
    run, skipped = [], []
    for command in commands:
        form, rule = decide(command)
        if form is None:
            skipped.append(f"{command!r}: {rule.why}")
        else:
            run.append(form)
    return "\n".join(run), skipped


def _evaluate_shell(example) -> None:
    script, skipped = _script(_commands(example.parsed))
    if not script:
        pytest.skip("; ".join(skipped))
    _run(script, f"{example.path}:{example.line}")


def _evaluate_inline(example) -> None:
    _evaluate_shell(example)


def _evaluate_python(example) -> None:
    first, _, _ = example.parsed.partition("\n")
    found = RUN_WITH.match(first.strip())
    if found is None:  # a fragment of a page's example: it must at least compile
        compile(example.parsed, f"{example.path}:{example.line}", "exec")
        return
    name, command = found.groups()
    (_scratch() / name).write_text(example.parsed)
    script, skipped = _script([normalize(command)])
    if not script:
        pytest.skip("; ".join(skipped))
    _run(script, f"{example.path}:{example.line}")


def _inline_commands(document: Document):
    for found in INLINE.finditer(document.text):
        yield Region(found.start(), found.end(), parsed=found.group(1),
                     evaluator=_evaluate_inline)


PARSERS = (CodeBlockParser(language="sh", evaluator=_evaluate_shell),
           CodeBlockParser(language="python", evaluator=_evaluate_python),
           _inline_commands)


def documents() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def _runs(example) -> str | None:
    """What an example runs, as a key: its script (smoke form, with where it writes left
    out) and the file it runs; None for a fragment that only compiles, or a command no rule
    can decide (it fails when it runs)."""
    text = example.parsed
    found = RUN_WITH.match(text.partition("\n")[0].strip())
    try:
        if found is not None:
            return _script([normalize(found.group(2))])[0] + "\0" + text
        if example.region.evaluator is _evaluate_python:
            return None
        return _script(_commands(text))[0]
    except ValueError:
        return None


#: a study's command naming its tasks: ``--tasks a,b`` runs inside ``--tasks a,b,c``
TASKS = re.compile(r" --tasks (\S+)")


def _subsumed(script: str, runs: dict) -> str | None:
    """Where a command that runs ``script``'s tasks and more, and is otherwise the same,
    runs (the convergence study's single-task commands of training.md run inside claims.md's
    five-task one: each task is its own loop over the same code); None if none does."""
    found = TASKS.search(script)
    if found is None:
        return None
    tasks = set(found.group(1).split(","))
    for other, where in runs.items():
        wider = TASKS.search(other)
        if (wider and tasks < set(wider.group(1).split(","))
                and TASKS.sub("", other) == TASKS.sub("", script)):
            return where
    return None


def _effective(script: str) -> str:
    """What ``script`` runs, as a key: each line's options as argparse reads them - of an
    option given twice with a value the later only (a smoke form appends its own
    ``--repeats 1`` after the page's ``--repeats 9``) - without where it writes
    (``OUTPUT``) and the variables set before it that only tune it (``TUNING``). A value is
    the next word unless it starts with ``-`` and holds no space (``--train-args '--steps
    20'`` is one)."""
    script, nul, code = script.partition("\0")  # a Python example: its command, then its code
    lines = []
    for line in script.split("\n"):
        try:
            words = shlex.split(line)
        except ValueError:  # not one shell line (an unclosed quote): taken as it is
            lines.append(line)
            continue
        start = 0  # the environment set before the command: its tuning left out
        while start < len(words) and re.fullmatch(ASSIGNMENT, words[start]):
            start += 1
        words = [w for w in words[:start] if not TUNING.match(w)] + words[start:]
        pairs, i = [], 0
        while i < len(words):
            valued = (words[i].startswith("--") and i + 1 < len(words)
                      and (not words[i + 1].startswith("-") or " " in words[i + 1]))
            pairs.append((words[i], words[i + 1] if valued else None))
            i += 2 if valued else 1
        last = {name: k for k, (name, value) in enumerate(pairs) if value is not None}
        lines.append(shlex.join(
            word for k, (name, value) in enumerate(pairs)
            if value is None or (last[name] == k and name not in OUTPUT)
            for word in ((name,) if value is None else (name, value))))
    return "\n".join(lines) + nul + code


def _examples():
    """Each example once. A command the docs repeat (claims.md cites
    the pages' commands) runs once: a later copy is skipped, naming where it runs; so does
    one that differs only in where it writes (``--out``, ``--record``: a study's 8- and
    16-rank records, both run at 4), whether it writes a record at all (the performance
    model's table with and without ``--record``) or in options its smoke form sets again
    (``_effective``: two training-time commands run the same 20 steps), and one whose tasks
    a wider command runs
    (``_subsumed``). Decided here, not as the tests run: which copy runs does not depend on
    what ran before or passed, nor on which pytest-xdist worker runs it (the suite runs
    two, stealing work: one command at a time left most of a core idle)."""
    seen, runs, found = set(), {}, []
    for path in documents():
        page = str(path.relative_to(ROOT))
        for example in Document.parse(str(path), *PARSERS):
            key = normalize(example.parsed)
            if key in seen:  # the same text on another line or page runs once
                continue
            seen.add(key)
            where = f"{page}:{example.line}"
            script = _runs(example)
            script = _effective(script) if script else script
            found.append((example, where, script))
            if script and script not in runs:
                runs[script] = where
    for example, where, script in found:
        marks = []
        if script and (wider := _subsumed(script, runs)):
            marks.append(pytest.mark.skip(reason=f"its tasks run at {wider}"))
        elif script and runs[script] != where:
            marks.append(pytest.mark.skip(reason=f"the same command runs at {runs[script]}"))
        yield pytest.param(example, id=where, marks=marks)


EXAMPLES = list(_examples())


@pytest.mark.parametrize("example", EXAMPLES)
def test_documented(example):
    example.evaluate()


def test_the_pages_have_commands_to_run():
    """The parsers still find the README's two set-up commands and its tour: a change of
    fence or format cannot silently empty this suite."""
    texts = [p.values[0].parsed for p in EXAMPLES]
    commands = {command for text in texts for command in _commands(text)}
    assert {"make run", "make test"} <= commands
    assert any("ringcomp.allreduce(" in text for text in texts)
    assert len(commands) > 40


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_that_exists(page):
    """A page moved or renamed leaves no dead link behind (anchors are not checked)."""
    dead = []
    for target in LINK.findall(page.read_text()):
        path = target.split("#")[0]
        if not path or "://" in target or target.startswith("mailto:"):
            continue
        if not (page.parent / path).exists():
            dead.append(target)
    assert not dead, f"{page.relative_to(ROOT)}: dead links {dead}"


def test_a_command_is_left_out_only_for_one_that_runs():
    """Every command skipped as a repeat or as part of a wider one names a command that
    runs here and covers it: same text, or the same options with a superset of tasks."""
    by_id: dict[str, list] = {}  # two commands on one line share a place
    for param in EXAMPLES:
        by_id.setdefault(param.id, []).append(param)
    for param in EXAMPLES:
        for mark in param.marks:
            found = re.search(r"(?:the same command|its tasks) runs? at (\S+)$",
                              mark.kwargs.get("reason", ""))
            if not found:
                continue
            mine = _effective(_runs(param.values[0]))
            covering = [other for other in by_id[found.group(1)] if not other.marks and (
                _effective(_runs(other.values[0])) == mine
                or _subsumed(mine, {_effective(_runs(other.values[0])): other.id}))]
            assert covering, f"{param.id}: no command that runs at {found.group(1)} covers it"
