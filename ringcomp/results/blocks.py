"""The docs' generated blocks: each rendered from its record, with a footer of its provenance.

A page embeds a record's table between two markers::

    <!-- BEGIN generated from docs/records/codecs-p4.json -->
    ...what the record's kind renders...
    <!-- END generated -->

or one table across several records of one kind (a study run column by column), where the
kind registers a renderer of many (``@renderer(kind, many=True)``, which then renders its
blocks of one record too)::

    <!-- BEGIN generated from docs/records/a.json docs/records/b.json -->

or another view of the same records, one its kind registers under a name
(``@renderer(kind, view="name")``, a function of the list of records), for a page that
reads them from another side (claims.md's comparisons named in advance)::

    <!-- BEGIN generated name from docs/records/a.json docs/records/b.json -->

``python -m ringcomp.report docs`` rewrites every such block from its record; with
``--check`` it changes nothing and lists the blocks that differ (``make test`` runs it).
Whether a record's values still follow from the code is judged by behaviour, elsewhere
(``experiments.digests``); a timing record's footer only says when, where, under which load
and how long ago in commits it was measured.
"""

from __future__ import annotations

import os
import re

from ringcomp.results.record import ROOT, git, load

#: record kind -> function(record) -> markdown; studies register their renderers
RENDERERS: dict = {}
#: record kind -> function(list of records) -> markdown: one table across several records
RENDERERS_MANY: dict = {}
#: (record kind, view name) -> function(list of records) -> markdown: another view of them
VIEWS: dict = {}
#: how ``make test`` checks a value record's digests (``experiments.digests``; one of its
#: rank counts and the BLAS kernels it checks under, ``DIGEST_BLAS``)
CHECK = "OPENBLAS_CORETYPE=Haswell mpiexec -n 4 python -m ringcomp.experiments digests --check"
#: the folders whose commits a timing record's footer counts (the measured package)
PACKAGE = ("ringcomp", "kernels")

BLOCK = re.compile(r"(<!-- BEGIN generated (?:(?P<view>[a-z][\w-]*) )?from "
                   r"(?P<path>\S+(?: \S+)*) -->\n)(?P<body>.*?)"
                   r"(?P<end><!-- END generated -->)", re.S)
#: the clause a timing footer ends with; ``--check`` re-counts as of the commit it names
SINCE = re.compile(r" As of commit (?P<commit>[0-9a-f]{7,40}), \d+ commits? (?:have|has) "
                   r"changed `ringcomp/` or `kernels/` since\.")


def renderer(kind: str, many: bool = False, view: str | None = None):
    """Decorator: ``fn(record) -> markdown`` renders records of ``kind``; with ``many``,
    ``fn(records) -> markdown`` renders several of them as one table; with ``view``, as
    the block of that name."""
    def register(fn):
        if view is not None:
            VIEWS[kind, view] = fn
        else:
            (RENDERERS_MANY if many else RENDERERS)[kind] = fn
        return fn
    return register


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


def _load_named(prov: dict) -> str:
    """' Load (1-minute average; other busy processes): 0.4, 0 before; 1.9, 1 after.' or
    what is known of it."""
    load = prov.get("load")
    if not load:
        return " Load not recorded."
    def one(side):
        busy = side.get("busy_processes")
        return f"{side['load1']:g}, {'?' if busy is None else busy}"
    return (f" Load (1-minute average; other busy processes): {one(load['before'])} before; "
            f"{one(load['after'])} after.")


def commits_since(commit: str, as_of: str) -> int | None:
    """How many commits after ``commit`` up to ``as_of`` changed the package (None: git
    cannot tell, e.g. in a copy without its history)."""
    counted = git("rev-list", "--count", f"{commit}..{as_of}", "--", *PACKAGE)
    return int(counted) if counted.isdigit() else None


def _since_named(prov: dict, as_of: str | None) -> str:
    """The timing footer's closing clause: commits to the package since it was measured."""
    count = commits_since(prov["commit"], as_of) if as_of and prov.get("commit") else None
    if count is None:
        return ""
    verb = "has" if count == 1 else "have"
    return (f" As of commit {as_of[:10]}, {count} commit{'s' * (count != 1)} {verb} changed "
            f"`ringcomp/` or `kernels/` since.")


#: when records began to keep the variables they ran under (commit 6300f35): an older
#: record without an ``environment`` may have run under any kernels
ENVIRONMENT_RECORDED_SINCE = "2026-11-28 10:25 UTC"


def _kernels_named(prov: dict) -> str:
    """Where a value record's numbers were not computed under the BLAS kernels its digests
    name: say so (a matrix product's bits, and so the values, move with the kernels)."""
    kernels = prov.get("environment", {}).get("OPENBLAS_CORETYPE")
    if kernels == prov.get("digests_blas"):
        return ""
    if kernels:
        ran = f"the {kernels} kernels"
    elif prov["date"] < ENVIRONMENT_RECORDED_SINCE:  # no field then: unknown, not unpinned
        ran = "BLAS kernels it does not name (measured before records kept their environment)"
    else:
        ran = "this host's default BLAS kernels (not pinned)"
    return (f"; its values came from {ran}, its digests from "
            f"{prov.get('digests_blas') or 'the default'}'s: under other kernels the same "
            "command may give other values")


def _reproduce(prov: dict) -> str:
    """The record's command with the environment it ran under - after ``sudo``, which
    would drop variables set before it."""
    command = prov["command"]
    variables = "".join(f"{k}={v} " for k, v in prov.get("environment", {}).items())
    if command.startswith("sudo "):
        return "sudo " + variables + command[len("sudo "):]
    return variables + command


def footer(record: dict, as_of: str | None = None) -> str:
    """The line under every rendered table: the machine, the commit, the command; for a
    record of computed values the digests CI checks them by, for a timing record the load
    it was measured under and the commits to the package since, as of commit ``as_of``."""
    prov = record["provenance"]
    host = prov["host"]
    versions = ", ".join(f"{k} {v}" for k, v in prov["versions"].items())
    # a record older than the SIMD field says so: AVX-512 and AVX2 hosts time kernels apart
    simd = host.get("simd") if "simd" in host else "SIMD level not recorded"
    cpu = ", ".join(filter(None, (host["cpu"], simd)))
    line = (f"*Measured {prov['date']} on {host['cores']} cores ({cpu})"
            f"{_gpus_named(host.get('gpus') or [])}, "
            f"{prov['mpi'] or 'no MPI'}; {versions}; commit {prov['commit'][:10]}"
            f"{' (dirty tree)' if prov['dirty'] else ''}. Reproduce: `{_reproduce(prov)}`.")
    if prov.get("digests"):
        count = len(prov["digests"])
        return (line + f" Its values are checked against the code by {count} digest"
                f"{'s' * (count != 1)} of miniature runs (`make test`: `{CHECK}`)"
                + _kernels_named(prov) + ".*")
    return line + _load_named(prov) + _since_named(prov, as_of) + "*"


def render(record: dict, as_of: str | None = None) -> str:
    kind = record.get("kind")
    if kind not in RENDERERS:
        raise ValueError(f"no renderer for record kind {kind!r}; known: {sorted(RENDERERS)}")
    return RENDERERS[kind](record).rstrip("\n") + "\n\n" + footer(record, as_of) + "\n"


def render_many(found: list[dict], paths: list[str], as_of: str | None = None,
                view: str | None = None) -> str:
    """One table across several records of one kind (or the view of them named), then
    every record's footer, each naming its file."""
    kinds = {record.get("kind") for record in found}
    if len(kinds) != 1:
        raise ValueError(f"one block renders records of one kind; {' '.join(paths)} hold "
                         f"{sorted(map(str, kinds))}")
    kind = kinds.pop()
    if view is not None and (kind, view) not in VIEWS:
        raise ValueError(f"record kind {kind!r} has no view {view!r}; views: "
                         f"{sorted(name for k, name in VIEWS if k == kind)}")
    if view is None and kind not in RENDERERS_MANY:
        raise ValueError(f"record kind {kind!r} has no renderer of several records; "
                         f"those that do: {sorted(RENDERERS_MANY)}")
    draw = RENDERERS_MANY[kind] if view is None else VIEWS[kind, view]
    feet = [f"`{os.path.basename(path)}`: {footer(record, as_of)[1:]}"
            for path, record in zip(paths, found, strict=True)]
    return (draw(found).rstrip("\n") + "\n\n"
            + "\n\n".join("*" + foot for foot in feet) + "\n")


def update_blocks(doc: str, check: bool = False) -> list[str]:
    """Re-render every generated block of the markdown file ``doc`` from its record.
    Returns the records whose block differed; writes the file unless ``check``. Timing
    footers count commits as of HEAD; ``check`` counts them as of the commit the block
    names, so a block stays right until the next re-render."""
    with open(doc) as f:
        text = f.read()
    differ, head = [], git("rev-parse", "HEAD")

    def fill(match):
        paths = match["path"].split()
        found = [load(path) for path in paths]
        named = SINCE.search(match["body"])
        as_of = named["commit"] if check and named else head
        # a kind with a renderer of many renders through it even from one record: its
        # page keeps one form as columns are added
        body = (render(found[0], as_of) if len(paths) == 1 and not match["view"]
                and found[0].get("kind") not in RENDERERS_MANY
                else render_many(found, paths, as_of, match["view"]))
        if body != match["body"]:
            differ.append(match["path"])
        return match[1] + body + match["end"]

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
