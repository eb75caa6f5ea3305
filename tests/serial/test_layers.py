"""The import rule, checked mechanically: layers one way down, a pure sched/, no circles,
no library module importing the ``ringcomp`` package face (see docs/architecture.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import grimp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_import_linter_contracts_are_kept():
    """import-linter's layers contract (tools -> training -> api -> collectives ->
    compression -> comm -> foundation -> kernels) and the pure-sched contract, from
    ``.importlinter``."""
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
    assert "ringcomp.kernels.signs_ref" in g.modules
    assert strongly_connected(g) == []
    assert g.find_modules_that_directly_import("ringcomp") == set()


def test_the_circle_check_finds_a_circle():
    """The check itself can fail: an added edge back up the layers is a circle."""
    g = graph()
    g.add_import(importer="ringcomp.comm", imported="ringcomp.api")
    assert any({"ringcomp.api", "ringcomp.comm"} <= set(c) for c in strongly_connected(g))
