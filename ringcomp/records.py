"""Result records: a study's numbers with their provenance, and the docs' blocks rendered from them.

A record is one JSON file: ``{"kind": ..., "provenance": {...}, ...the study's data}``.
``provenance`` says what was measured, where and on which code: the command line, the git
commit (and whether the tree was dirty), the date, the host (cores, CPU, memory), the MPI
library, the versions of Python and the libraries on the path, and a hash of the source
files the figures depend on (``code``), so a reader can tell when the code has changed
since (``stale``).

Docs embed a record's table between two markers::

    <!-- BEGIN generated from docs/records/codecs-p4.json -->
    ...what the record's kind renders...
    <!-- END generated -->

or one table across several records of one kind (a study run column by column), where the
kind registers a renderer of many (``@renderer(kind, many=True)``, which then renders its
blocks of one record too)::

    <!-- BEGIN generated from docs/records/a.json docs/records/b.json -->

``python -m ringcomp.report docs`` rewrites every such block from its record; with
``--check`` it changes nothing and lists the blocks that differ (the test suite runs it).
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import functools
import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

#: the packages whose versions a record names
PACKAGES = ("numpy", "numba", "mpi4py", "mpich", "openmpi", "scipy", "torch", "cupy")

#: record kind -> function(record) -> markdown; studies register their renderers
RENDERERS: dict = {}
#: record kind -> function(list of records) -> markdown: one table across several records
RENDERERS_MANY: dict = {}

BLOCK = re.compile(r"(<!-- BEGIN generated from (?P<path>\S+(?: \S+)*) -->\n)(?P<body>.*?)"
                   r"(<!-- END generated -->)", re.S)


#: record kind -> the files its study names now as its code, or a function of a record
#: giving them (narrowed to the compressors it ran): ``renderer(kind, code=...)``; a record
#: measured before a file was named is still checked against it (``changed_files``)
DECLARED: dict = {}


def renderer(kind: str, many: bool = False, code=None):
    """Decorator: ``fn(record) -> markdown`` renders records of ``kind``; with ``many``,
    ``fn(records) -> markdown`` renders several of them as one table. ``code``: the
    files the study names as its code (its ``CODE``), or ``fn(record) -> files``,
    declared for ``changed_files``."""
    def register(fn):
        (RENDERERS_MANY if many else RENDERERS)[kind] = fn
        if code is not None:
            DECLARED[kind] = code if callable(code) else list(code)
        return fn
    return register


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


#: the module-level name a study declares its ``code_files`` under: a declaration of what
#: the figures depend on, not code they depend on (``measured_code`` leaves it out, so
#: naming a missed file does not make the records measured before stale)
CODE_NAME = "CODE"
#: the calls that write a record down (``module.function``): a statement made of one is
#: what a study says about its figures, not how it computes them (``measured_code`` leaves
#: it out, with the import of those modules)
RECORDING = {("records", "provenance"), ("records", "write"), ("measured", "only"),
             ("measured", "compressors_in"), ("measured", "for_runs")}


def code_files(*patterns: str) -> list[str]:
    """The project files (relative to the root, sorted) that match ``patterns``, e.g.
    ``"ringcomp/collectives/*.py"``: what a record's figures depend on."""
    return sorted({os.path.relpath(path, ROOT) for pattern in patterns
                   for path in glob.glob(os.path.join(ROOT, pattern))})


def code_hash(paths) -> str:
    """SHA-256 (first 16 hex digits) of the named source files, relative to the project
    root, in the order given: what a record's figures depend on."""
    digest = hashlib.sha256()
    for path in paths:
        with open(os.path.join(ROOT, path), "rb") as f:
            digest.update(path.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (OSError, ValueError):
        return None


def _gpus() -> list[dict]:
    """The GPUs ``nvidia-smi`` lists (model, driver, memory); none without it. With the
    CUDA runtime version where the study loaded CuPy (what its kernels ran on), and
    ``mps`` where an MPS server's control pipe is there (the ranks' kernels then share the
    GPU through it instead of taking turns)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listed = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = [dict(zip(("model", "driver", "memory"), (field.strip() for field in
                                                      line.rsplit(",", 2)), strict=True))
             for line in listed.splitlines() if line.count(",") >= 2]
    if found and os.path.exists(os.path.join(
            os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"), "control")):
        for gpu in found:  # CUDA clients find an MPS server by this pipe: ranks share it
            gpu["mps"] = True
    cupy = sys.modules.get("cupy")
    if cupy is not None and found:
        with contextlib.suppress(Exception):  # a CuPy without a usable runtime says nothing
            version = cupy.cuda.runtime.runtimeGetVersion()
            for gpu in found:
                gpu["cuda_runtime"] = f"{version // 1000}.{version % 1000 // 10}"
    return found


def _versions() -> dict:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def provenance(command: list[str], code: list[str], mpi: str, declared=None,
               **extra) -> dict:
    """Where, when and on what a record was measured. ``command``: the command line that
    reproduces it; ``code``: the source files its figures depend on (a study that knows
    the compressors it ran narrows them with ``measured.only``); ``declared``: the
    study's whole ``CODE`` before that narrowing (default: ``code``); ``mpi``: the MPI
    library (``launch.mpi_facts``); ``extra``: anything else the study knows (rank count,
    placement, device)."""
    # the docs and the records themselves do not count: a study writing several records in
    # a row would otherwise call every record after the first "dirty"
    status = [line for line in _git("status", "--porcelain", "--untracked-files=no")
              .splitlines() if not line.split(maxsplit=1)[-1].startswith("docs/")]
    # a copy without its .git (a device machine's) takes the commit it was copied at from
    # RINGCOMP_COMMIT, and says so; the code hash still tells whether the files are those
    commit = _git("rev-parse", "HEAD")
    if not commit and os.environ.get("RINGCOMP_COMMIT"):
        commit = os.environ["RINGCOMP_COMMIT"]
        extra.setdefault("commit_from", "RINGCOMP_COMMIT (no git checkout)")
    return {"command": shlex.join(command), "commit": commit,
            "dirty": bool(status), "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%d %H:%M UTC"),
            "host": {"name": platform.node(), "cores": os.cpu_count(), "cpu": _cpu_model(),
                     "memory_gib": _memory_gib(), "os": platform.platform(),
                     "gpus": _gpus()},
            "mpi": mpi, "versions": _versions(),
            "code": {"files": list(code), "hash": code_hash(code),
                     "declared": list(code if declared is None else declared)}, **extra}


def write(path: str, kind: str, prov: dict, data: dict) -> None:
    """Write a record atomically (a crash leaves the old one)."""
    record = {"kind": kind, "provenance": prov, **data}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def load(path: str) -> dict:
    with open(path if os.path.isabs(path) else os.path.join(ROOT, path)) as f:
        return json.load(f)


#: commits whose changes to the files they name were checked to leave results as they were
#: (``tests/digest_outputs.py`` printed the same digests before and after them, at 3 ranks):
#: a list of {"commit", "files", "digest", "why"}. A record measured before such a commit
#: is not stale for that commit's changes to those files (``changed_files``), and its
#: footer names the commit
NEUTRAL = os.path.join(ROOT, "docs", "records", "neutral-changes.json")


@functools.lru_cache(maxsize=1)
def neutral_changes() -> dict[str, tuple[frozenset, bool]]:
    """Full commit hash -> (the files, relative to the root, whose changes in it were
    checked result-neutral; whether only for records measured off the GPU: an entry's
    ``"host_only": true``, for a change that acts on device buffers alone) from ``NEUTRAL``
    (none without the file)."""
    try:
        with open(NEUTRAL) as f:
            entries = json.load(f)
    except FileNotFoundError:
        return {}
    return {entry["commit"]: (frozenset(entry["files"]), bool(entry.get("host_only")))
            for entry in entries}


def _neutral_for(change: str, path: str, device: str | None) -> bool:
    """Whether ``change`` is declared result-neutral for ``path`` in a record of
    ``device`` (its provenance's; None or "cpu" off the GPU)."""
    files, host_only = neutral_changes().get(change, (frozenset(), False))
    return path in files and not (host_only and device == "gpu")


def _neutral_commits(commit: str, path: str, head: str,
                     device: str | None = None) -> list[str] | None:
    """The commits declared result-neutral for ``path`` (in a record of ``device``) that
    changed its measured code since ``commit`` up to ``head``, when they are the only such
    changes (None otherwise: a change not declared, an uncommitted one, a history git
    cannot walk)."""
    if not neutral_changes() or not head:
        return None
    at_head = _at_commit(head, path)
    try:
        now = _current(path)
    except OSError:
        return None
    if at_head is None or measured_code(path, at_head) != measured_code(path, now):
        return None
    changes = _code_changes(commit, head, path)
    if not changes or not all(_neutral_for(change, path, device) for change in changes):
        return None
    return list(changes)


@functools.lru_cache(maxsize=4096)
def _code_changes(commit: str, head: str, path: str) -> tuple[str, ...]:
    """The commits from ``commit`` (excluded) to ``head`` that changed ``path``'s measured
    code, not only its wording. Cached: both ends are fixed commits, whose files never
    change, and ``report docs`` asks once per record and file."""
    found = []
    for change in _git("rev-list", f"{commit}..{head}", "--", path).split():
        before, after = _at_commit(f"{change}^", path), _at_commit(change, path)
        if before is None or after is None or \
                measured_code(path, before) != measured_code(path, after):
            found.append(change)
    return tuple(found)


def _head() -> str:
    """HEAD's commit where some change is declared result-neutral ('' otherwise, or
    without git): asked once per record, not per file."""
    return _git("rev-parse", "HEAD") if neutral_changes() else ""


def neutral_since(record: dict) -> list[str]:
    """The result-neutral commits (``NEUTRAL``) that changed the record's measured files
    since it was measured, oldest first: what its footer says instead of "stale"."""
    prov = record["provenance"]
    if prov.get("dirty", True):
        return []
    found, head = set(), _head()
    for path in prov["code"]["files"]:
        if _differs(prov["commit"], path):
            found.update(_neutral_commits(prov["commit"], path, head,
                                          prov.get("device")) or ())
    return sorted(found, key=lambda c: _git("log", "-1", "--format=%ct", c))


def stale(record: dict) -> bool:
    """True when the code the record measured has changed since (or is gone)."""
    return bool(changed_files(record))


def changed_files(record: dict) -> list[str]:
    """The files of the code the record measured that have changed since (or are gone).

    1. A record measured on a dirty tree whose files' hash no longer matches: all of them
       (the commit does not hold what was measured).
    2. Otherwise, when the files' hash differs, each is compared with its text at the
       record's commit as ``measured_code`` reads them (Python without its docstrings, comments and
       record renderers; other files byte for byte): a change to how a table is worded or
       rendered does not make its figures stale. A file that cannot be read at that commit
       (a shallow clone, a renamed file) or now counts as changed. A file whose every
       change since was made in commits checked result-neutral for it (``NEUTRAL``) does
       not.
    3. So do the files its study declares now (``DECLARED``) that it did not declare then
       (``provenance``'s ``declared``: a record measured before its study named them)
       and that existed at the record's commit: a file added since cannot have been
       measured, and code moved into it changed the file it left. (``DECLARED`` is filled
       as the studies are imported: ``ringcomp.report`` imports them all.)
    4. A file the record named that its study, narrowing for this record, no longer names
       (``measured.only`` learnt that runs like the record's never call it, e.g. the
       planning code of runs without ``--plan``) is not compared, unless it is gone.
    """
    prov = record["provenance"]
    files = prov["code"]["files"]
    then_declared = set(prov["code"].get("declared", files))
    declared = DECLARED.get(record.get("kind"), ())
    declared = list(declared(record) if callable(declared) else declared)
    unnamed = [path for path in declared if path not in then_declared]
    try:
        current = code_hash(files) == prov["code"]["hash"]
    except OSError:
        current = False
    if declared:
        named = set(declared)
        files = [path for path in files
                 if path in named or not os.path.exists(os.path.join(ROOT, path))]
    if prov.get("dirty", True):
        return [] if current else list(files)
    head = "" if current else _head()
    changed = [] if current else [
        path for path in files if _differs(prov["commit"], path)
        and _neutral_commits(prov["commit"], path, head, prov.get("device")) is None]
    if unnamed:
        moved = set(_git("diff", "--name-only", prov["commit"], "--", *unnamed).split())
        changed += [path for path in unnamed if path in moved
                    and _at_commit(prov["commit"], path) is not None
                    and _differs(prov["commit"], path)]
    return changed


def _differs(commit: str, path: str) -> bool:
    """Whether ``path``'s measured code now differs from its text at ``commit`` (a file
    that cannot be read then or now does)."""
    then = _at_commit(commit, path)
    try:
        now = _current(path)
    except OSError:
        return True
    return then is None or measured_code(path, then) != measured_code(path, now)


def _current(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


@functools.lru_cache(maxsize=4096)
def _at_commit(commit: str, path: str) -> str | None:
    """The file's text at ``commit`` (None: not there, or no git). Cached: a commit's
    files never change, and ``report docs`` asks for the same ones once per record (a
    thousand ``git show`` runs uncached)."""
    try:
        return subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=1024)
def measured_code(path: str, text: str) -> str:
    """What of a source file its figures depend on: for Python, the syntax tree without
    docstrings, without the presentation (``_presentation``), without the ``CODE``
    declaration (``CODE_NAME``) and without the statements that write the record down
    (``RECORDING``, and the import of those modules), its imports as a set rather than in
    place; comments are not in the tree. Other files: the text. Cached by path and text:
    every record names the same few dozen files (``report docs --check``: 13.4 -> 2.7 s
    of CPU time, 20 records)."""
    if not path.endswith(".py"):
        return text
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    shown = _presentation(tree)
    tree.body = [node for node in tree.body if getattr(node, "name", None) not in shown
                 and not _declares_code(node)]
    recording = {module for module, _ in RECORDING}
    for node in ast.walk(tree):  # first the imports, emptied here and dropped below
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ringcomp.") \
                and node.module.rsplit(".", 1)[-1] in recording:
            node.names = []  # from ringcomp.measured import ...
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            node.names = [a for a in node.names if a.name.rsplit(".", 1)[-1] not in recording]
    # what a file imports, not where: an import moved into the function that uses it
    # (to keep it out of start-up) computes the same; importing something else does not
    imported = sorted({ast.dump(node) for node in ast.walk(tree)
                       if isinstance(node, (ast.Import, ast.ImportFrom)) and node.names})
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        node.body = [child for child in body if not _is_renderer(child)
                     and not isinstance(child, (ast.Import, ast.ImportFrom))
                     and not _records(child)]
        if (node.body and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
                and isinstance(node.body[0].value.value, str)):
            node.body = node.body[1:]  # the docstring
    return "\n".join([ast.dump(tree), *imported])


def _presentation(tree: ast.Module) -> set[str]:
    """Module-level functions that only present a record: the renderers
    (``@renderer(...)``) and the private helpers (``_name``) used by nothing else, found
    to a fixed point (a helper of a helper counts)."""
    functions = {node.name: node for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    used = {name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            for name, node in functions.items()}
    elsewhere = {n.id for node in tree.body if node.__class__ not in (ast.FunctionDef,
                                                                    ast.AsyncFunctionDef)
                 for n in ast.walk(node) if isinstance(n, ast.Name)}
    shown = {name for name, node in functions.items() if _is_renderer(node)}
    grew = True
    while grew:
        grew = False
        for name in functions:
            users = {user for user, names in used.items() if name in names and user != name}
            if (name not in shown and name.startswith("_") and name not in elsewhere
                    and users and users <= shown):
                shown.add(name)
                grew = True
    return shown


def _records(node) -> bool:
    """A statement that only writes the record down: ``x = records.provenance(...)``,
    ``records.write(...)`` (``RECORDING``), or an import left with no names."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return not node.names
    value = node.value if isinstance(node, (ast.Assign, ast.Expr)) else None
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and isinstance(value.func.value, ast.Name)
            and (value.func.value.id, value.func.attr) in RECORDING)


def _declares_code(node) -> bool:
    """``CODE = ...`` at module level (``CODE_NAME``)."""
    targets = (node.targets if isinstance(node, ast.Assign)
               else [node.target] if isinstance(node, ast.AnnAssign) else [])
    return any(isinstance(t, ast.Name) and t.id == CODE_NAME for t in targets)


def _is_renderer(node) -> bool:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    for decorator in node.decorator_list:
        call = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = call.attr if isinstance(call, ast.Attribute) else getattr(call, "id", "")
        if name == "renderer":
            return True
    return False


#: changed files a stale footer names (the rest are counted)
SHOWN = 4


def _gpus_named(gpus: list[dict]) -> str:
    """' and 1 x NVIDIA H100 80GB HBM3 (driver 580.159, CUDA 12.8[, MPS])', or '' without
    GPUs."""
    if not gpus:
        return ""
    models = ", ".join(sorted({gpu["model"] for gpu in gpus}))
    facts = ["driver " + ", ".join(sorted({gpu["driver"] for gpu in gpus}))]
    facts += [f"CUDA {v}" for v in sorted({gpu["cuda_runtime"] for gpu in gpus
                                           if "cuda_runtime" in gpu})]
    facts += ["MPS"] * any(gpu.get("mps") for gpu in gpus)
    return f" and {len(gpus)} x {models} ({', '.join(facts)})"


def footer(record: dict) -> str:
    """The line under every rendered table: the machine, the commit, the command, and a
    warning while the measured code has changed since."""
    prov = record["provenance"]
    host = prov["host"]
    versions = ", ".join(f"{k} {v}" for k, v in prov["versions"].items())
    line = (f"*Measured {prov['date']} on {host['cores']} cores ({host['cpu']})"
            f"{_gpus_named(host.get('gpus') or [])}, "
            f"{prov['mpi'] or 'no MPI'}; {versions}; commit {prov['commit'][:10]}"
            f"{' (dirty tree)' if prov['dirty'] else ''}. Reproduce: `{prov['command']}`.*")
    changed = changed_files(record)
    if changed:
        shown = ", ".join(f"`{path.removeprefix('ringcomp/')}`" for path in changed[:SHOWN])
        more = f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
        line += (f"\n\n**Stale:** the code it measured has changed since commit "
                 f"{prov['commit'][:10]} ({len(changed)} of its {len(prov['code']['files'])} "
                 f"files: {shown}{more}): re-measure.")
    elif neutral := neutral_since(record):
        line += (f" Its code changed since only in commits checked to leave results as they "
                 f"were ({', '.join(c[:10] for c in neutral)}: "
                 f"`docs/records/neutral-changes.json`).")
    return line


def render(record: dict) -> str:
    kind = record.get("kind")
    if kind not in RENDERERS:
        raise ValueError(f"no renderer for record kind {kind!r}; known: {sorted(RENDERERS)}")
    return RENDERERS[kind](record).rstrip("\n") + "\n\n" + footer(record) + "\n"


def render_many(found: list[dict], paths: list[str]) -> str:
    """One table across several records of one kind, then every record's footer, each
    naming its file."""
    kinds = {record.get("kind") for record in found}
    if len(kinds) != 1:
        raise ValueError(f"one block renders records of one kind; {' '.join(paths)} hold "
                         f"{sorted(map(str, kinds))}")
    kind = kinds.pop()
    if kind not in RENDERERS_MANY:
        raise ValueError(f"record kind {kind!r} has no renderer of several records; "
                         f"those that do: {sorted(RENDERERS_MANY)}")
    feet = [f"`{os.path.basename(path)}`: {footer(record)[1:]}"
            for path, record in zip(paths, found, strict=True)]
    return (RENDERERS_MANY[kind](found).rstrip("\n") + "\n\n"
            + "\n\n".join("*" + foot for foot in feet) + "\n")


def update_blocks(doc: str, check: bool = False) -> list[str]:
    """Re-render every generated block of the markdown file ``doc`` from its record.
    Returns the records whose block differed; writes the file unless ``check``."""
    with open(doc) as f:
        text = f.read()
    differ = []

    def fill(match):
        paths = match["path"].split()
        found = [load(path) for path in paths]
        # a kind with a renderer of many renders through it even from one record: its
        # page keeps one form as columns are added
        body = (render(found[0]) if len(paths) == 1 and found[0].get("kind")
                not in RENDERERS_MANY else render_many(found, paths))
        if body != match["body"]:
            differ.append(match["path"])
        return match[1] + body + match[4]

    new = BLOCK.sub(fill, text)
    if differ and not check:
        with open(doc + ".tmp", "w") as f:
            f.write(new)
        os.replace(doc + ".tmp", doc)
    return differ


def documents() -> list[str]:
    """README.md and every markdown file under docs/."""
    docs = os.path.join(ROOT, "docs")
    found = [os.path.join(ROOT, "README.md")]
    for folder, _, files in os.walk(docs):
        found += [os.path.join(folder, name) for name in sorted(files) if name.endswith(".md")]
    return found

