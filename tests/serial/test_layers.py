"""The import rule, checked mechanically: layers one way down, a pure sched/, no circles,
no library module importing the ``ringcomp`` package face (see docs/architecture.md)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import grimp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: where the kernels' files are: the checkout's top-level ``kernels/`` (``ringcomp/kernels``
#: links to it), or ``ringcomp/kernels`` itself in an unpacked sdist (no link there)
KERNELS = os.path.realpath(os.path.join(ROOT, "ringcomp", "kernels"))


def test_import_linter_contracts_are_kept():
    """import-linter's layers contract (tools -> studies -> jobs -> torch -> training ->
    models -> sched -> plans -> api -> collectives -> compression -> cli -> transport ->
    foundation -> kernels), the transport's own layers, the pure-sched contract and mpi4py
    at the edge, from ``.importlinter``."""
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    out = subprocess.run([lint, "--no-cache"], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def graph():
    return grimp.build_graph("ringcomp", cache_dir=None)


def strongly_connected(g) -> list[list[str]]:
    """Tarjan's algorithm over the package's direct imports: the import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack, on_stack, circles = [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.find_modules_directly_imported_by(v) & g.modules:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for module in sorted(g.modules):
        if module not in index:
            visit(module)
    return circles


def test_no_import_circles_and_no_package_face_imports():
    g = graph()
    assert len(g.modules) > 80  # the whole package was seen (kernels included)
    kernels = {f"ringcomp.kernels.{os.path.basename(path)[:-3]}"
               for path in glob.glob(os.path.join(KERNELS, "*.py"))
               if not path.endswith("__init__.py")}
    assert len(kernels) > 25 and kernels <= g.modules  # every top-level kernels/ file
    assert strongly_connected(g) == []
    assert g.find_modules_that_directly_import("ringcomp") == set()


def test_the_circle_check_finds_a_circle():
    """The check itself can fail: an added edge back up the layers is a circle."""
    g = graph()
    g.add_import(importer="ringcomp.transport.comm", imported="ringcomp.api")
    assert any({"ringcomp.api", "ringcomp.transport.comm"} <= set(c) for c in strongly_connected(g))


def test_every_module_is_in_a_layer_and_the_tools_are_independent():
    """No module escapes the rule by being in no layer: every top-level module and package
    of ``ringcomp`` (but the package face) is named in the layers contract, and the entry
    points sit in one layer as independent siblings (``|``), so none imports another."""
    import configparser

    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, ".importlinter"))
    rows = [row.strip() for row in config["importlinter:contract:layers"]["layers"].splitlines()
            if row.strip()]
    named = {name.strip() for row in rows for name in row.replace("|", ":").split(":")}
    package = os.path.join(ROOT, "ringcomp")
    modules = {f"ringcomp.{entry[:-3] if entry.endswith('.py') else entry}"
               for entry in os.listdir(package)
               if entry != "__init__.py" and not entry.startswith(("_", "."))
               and (entry.endswith(".py") or os.path.isfile(os.path.join(package, entry,
                                                                          "__init__.py")))}
    assert modules - named == set(), f"in no layer: {sorted(modules - named)}"
    tools = {"ringcomp.train", "ringcomp.bench", "ringcomp.info", "ringcomp.report",
             "ringcomp.perfmodel", "ringcomp.simulate", "ringcomp.profile", "ringcomp.testbed",
             "ringcomp.warm", "ringcomp.testing"}
    assert ":" not in rows[0] and {n.strip() for n in rows[0].split("|")} == tools


def test_an_upward_import_from_a_kernel_breaks_the_layers(tmp_path):
    """The kernels live at the top level (``kernels/``, the package's ``ringcomp/kernels``
    a link to it): the layers contract sees them there, and a kernel importing upward
    breaks it. Checked on a copy, with a kernel that imports the collectives' API."""
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(os.path.join(ROOT, "ringcomp"), tmp_path / "ringcomp", symlinks=True,
                    ignore=skip)
    if os.path.islink(os.path.join(ROOT, "ringcomp", "kernels")):  # the checkout's layout
        shutil.copytree(KERNELS, tmp_path / "kernels", ignore=skip)
    shutil.copy(os.path.join(ROOT, ".importlinter"), tmp_path)
    with open(tmp_path / "ringcomp" / "kernels" / "signs_ref.py", "a") as f:
        f.write("\nfrom ringcomp import api  # noqa: E402,F401 - upward, on purpose\n")
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    out = subprocess.run([lint, "--no-cache"], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path)), timeout=300)
    assert out.returncode != 0 and "1 broken" in out.stdout, out.stdout[-3000:]
    assert "ringcomp.kernels.signs_ref -> ringcomp.api" in out.stdout


def test_the_kernels_have_one_module_name():
    """From the checkout's root Python would find ``kernels/`` as a package of its own: it
    refuses, so no kernel is importable under two names (an unpacked sdist has no
    top-level ``kernels/`` to find)."""
    out = subprocess.run([sys.executable, "-c", "import kernels.signs_ref"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode != 0
    if os.path.isdir(os.path.join(ROOT, "kernels")):
        assert "imported as ringcomp.kernels" in out.stderr
    done = subprocess.run([sys.executable, "-c", "import os, ringcomp.kernels.signs_ref as m; "
                           "print(os.path.realpath(m.__file__))"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.strip() == os.path.join(KERNELS, "signs_ref.py"), done.stderr


#: the library modules allowed past MAX_LINES, each one job that reads better whole
#: (docs/architecture.md says why)
LONG_MODULES = {"ringcomp/bench.py", "ringcomp/training/config.py", "ringcomp/api.py",
                "ringcomp/torch/optimizer.py", "ringcomp/experiments/convergence.py"}
MAX_LINES = 300


def test_library_modules_stay_small():
    """No library module past MAX_LINES lines but the five named in LONG_MODULES: a
    module that grows past it is split by job (the Transport's mixins, the studies'
    tables), not left to grow."""
    long = set()
    for path in glob.glob(os.path.join(ROOT, "ringcomp", "**", "*.py"), recursive=True):
        if "kernels" in os.path.relpath(path, ROOT).split(os.sep)[1:2]:
            continue  # the link to kernels/, counted below once
        with open(path) as f:
            if sum(1 for _ in f) > MAX_LINES:
                long.add(os.path.relpath(path, ROOT))
    for path in glob.glob(os.path.join(KERNELS, "*.py")):
        with open(path) as f:
            if sum(1 for _ in f) > MAX_LINES:
                long.add(os.path.join("kernels", os.path.basename(path)))
    assert long <= LONG_MODULES, f"past {MAX_LINES} lines: {sorted(long - LONG_MODULES)}"
