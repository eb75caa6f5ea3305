"""The source files a study's numbers depend on: what its record names as the code it measured.

A study declares ``CODE = records.code_files(...)`` from the groups here plus its own files;
at record time ``only(CODE, compressors)`` leaves out the files that belong to compressors
the study did not run (their modules and the kernel families only they use), so a change to
QSGD's kernels does not make a table without a QSGD row stale. What belongs to a compressor
is read from the source, never declared by hand (``compressor_files``): its module, the
compression modules it imports, and the kernel families it resolves (``backends.backend``
or ``for_size`` with the family's name, or ``ringcomp.kernels.<family>`` imported).
"""

from __future__ import annotations

import ast
import functools
import os

from ringcomp.records import ROOT, code_files

#: the compression framework every compressed run uses: registry, base classes, hop rules,
#: error feedback, the shared-seed base
FRAMEWORK = ("ringcomp/compression/__init__.py", "ringcomp/compression/base.py",
             "ringcomp/compression/rules.py", "ringcomp/compression/feedback.py")
#: what compressed all-reduce computes on the CPU: the collectives, the codecs and the
#: kernels they run (the CPU forms: the references and their Numba twins, bit-equal to them
#: by test; not the CUDA forms)
CODEC_CODE = ("ringcomp/compression/*.py", "ringcomp/collectives/*.py",
              "ringcomp/kernels/*_ref.py", "ringcomp/kernels/*_numba.py",
              "ringcomp/kernels/arrays.py", "ringcomp/kernels/backends.py",
              "ringcomp/kernels/reduce.py", "ringcomp/kernels/rng.py",
              "ringcomp/kernels/signs.py")
#: what compressed all-reduce computes on a GPU besides: the CUDA forms of the kernels,
#: their launch helpers, device buffers (staging, CUDA-aware hand-off) and their placement
DEVICE_CODE = ("ringcomp/kernels/*_cuda.py", "ringcomp/kernels/cuda_launch.py",
               "ringcomp/kernels/cuda_direct.py",
               "ringcomp/device.py", "ringcomp/placement.py")
#: what a training run's numbers depend on on the CPU: the trainer and the models besides;
#: a study adds its own files
TRAINING_CODE = ("ringcomp/runner.py", "ringcomp/runs.py", "ringcomp/training/*.py",
                 "ringcomp/models/*.py", *CODEC_CODE)
#: the training wing's files that only ``--plan`` runs (profiling and its micro-benchmarks)
#: or only the what-if tools use: a run that does not plan never calls them
PLANNING_CODE = ("ringcomp/training/planning.py", "ringcomp/training/measure.py",
                 "ringcomp/training/whatif.py")


def _module_file(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _families() -> tuple[str, ...]:
    from ringcomp.kernels.backends import FAMILIES

    return FAMILIES


@functools.cache
def _reads(path: str) -> tuple[frozenset, frozenset]:
    """(compression modules imported, kernel families used) by one compression module."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    modules, families = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("ringcomp.compression."):
                modules.add(_module_file(node.module))
            if node.module == "ringcomp.kernels":
                families.update(a.name for a in node.names if a.name in _families())
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("backend", "for_size") and node.args
              and isinstance(node.args[0], ast.Constant)
              and node.args[0].value in _families()):
            families.add(node.args[0].value)
    return frozenset(modules), frozenset(families)


def kernel_families(name: str) -> set[str]:
    """The kernel families compressor ``name``'s code resolves (its imports' included)."""
    return set(_closure(name)[1])


def compressor_files(name: str) -> set[str]:
    """The files that belong to compressor ``name`` beyond the framework: its module, the
    compression modules it imports, and its kernel families' files (every backend)."""
    modules, families = _closure(name)
    kernels = set(code_files(*(f"ringcomp/kernels/{family}{suffix}" for family in families
                               for suffix in ("_*.py", ".py"))))
    return (set(modules) - set(FRAMEWORK)) | kernels


@functools.cache
def _closure(name: str) -> tuple[frozenset, frozenset]:
    from ringcomp.compression import REGISTRY

    if name not in REGISTRY:
        raise ValueError(f"unknown compressor {name!r}; known: {', '.join(sorted(REGISTRY))}")
    todo, modules, families = [_module_file(REGISTRY[name].__module__)], set(), set()
    while todo:
        path = todo.pop()
        if path in modules:
            continue
        modules.add(path)
        imported, used = _reads(path)
        todo.extend(imported)
        families |= used
    return frozenset(modules), frozenset(families)


def compressors_in(option_lists) -> list[str]:
    """The compressors that lists of training options run (``--compressor X``; "none"
    where there is none), in order, once each."""
    found = []
    for options in option_lists:
        options = list(options)
        found.append(options[options.index("--compressor") + 1] if "--compressor" in options
                     else "none")
    return list(dict.fromkeys(found))


def on_device(files, device: str) -> list[str]:
    """``files``, with ``DEVICE_CODE`` where they ran on the GPU (``device == "gpu"``)."""
    if device != "gpu":
        return list(files)
    return sorted({*files, *code_files(*DEVICE_CODE)})


def plans(option_lists) -> bool:
    """Whether any of these lists of training options plans its buckets (``--plan``)."""
    return any(word == "--plan" or word.startswith("--plan=")
               for options in option_lists for word in options)


def for_runs(files, option_lists) -> list[str]:
    """``files`` narrowed to what training runs with these option lists ran: ``only`` their
    compressors, and the planning code only if one of them plans."""
    option_lists = [list(options) for options in option_lists]
    return only(files, compressors_in(option_lists), planned=plans(option_lists))


def only(files, ran, planned: bool = True) -> list[str]:
    """``files`` without those that belong only to compressors not in ``ran`` (names or
    specs like ``topk:ratio=0.1``; "none", the exact runs' own, always counts), and
    without ``PLANNING_CODE`` unless the runs ``planned`` (``plans``)."""
    from ringcomp.compression import compressors

    names = {"none", *(str(spec).split(":", 1)[0] for spec in ran if spec)}
    used = set().union(*(compressor_files(name) for name in names))
    others = set().union(*(compressor_files(name) for name in compressors())) - used
    if not planned:
        others |= set(PLANNING_CODE)
    return [path for path in files if path not in others]
