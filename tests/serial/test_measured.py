"""What a record names as the code it measured: the files of the compressors it ran."""

from __future__ import annotations

import numpy as np
import pytest
from registered import hop_compressors

from ringcomp import measured, records
from ringcomp.compression import Key, compressors, get_compressor
from ringcomp.experiments.convergence import METHODS
from ringcomp.kernels import backends


@pytest.mark.parametrize("spec", hop_compressors())
def test_the_kernel_families_read_from_the_source_are_those_a_compressor_runs(
        spec, monkeypatch):
    """Every family a compressor's encode and decode resolve at run time is among those
    ``measured`` reads from its source (so its record names their files); NumPy and
    Numba sizes both."""
    resolved = set()
    backend, for_size = backends.backend, backends.for_size

    def spy(family, *args, **kwargs):
        resolved.add(family)
        return backend(family, *args, **kwargs)

    def spy_size(family, *args, **kwargs):
        resolved.add(family)
        return for_size(family, *args, **kwargs)

    monkeypatch.setattr(backends, "backend", spy)
    monkeypatch.setattr(backends, "for_size", spy_size)
    comp, name = get_compressor(spec), spec.split(":", 1)[0]
    for n in (33, backends.NUMBA_FROM_ELEMENTS + 1):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        comp.decode(comp.encode(x, Key(seed=1)), n, np.empty(n, np.float32))
    assert resolved - {"finite"} <= measured.kernel_families(name), (name, resolved)
    for family in measured.kernel_families(name):
        assert f"ringcomp/kernels/{family}_ref.py" in measured.compressor_files(name)


def test_a_record_names_only_the_codec_files_of_the_methods_it_ran():
    """A study of the exact ring, top-k and Marsit names the framework, the collectives,
    top-k's selection and the sign kernels, not QSGD's or Count-Sketch's code; a study that
    runs QSGD names its kernels too."""
    code = records.code_files("ringcomp/experiments/convergence.py", *measured.TRAINING_CODE)
    names = measured.compressors_in(METHODS[m] for m in ["ring", "ring+topk+ef", "ring+marsit",
                                                         "ring+marsit-s0.03"])
    assert names == ["none", "topk", "marsit"]
    kept = measured.only(code, names)
    for path in ("ringcomp/compression/topk.py", "ringcomp/kernels/select_ref.py",
                 "ringcomp/kernels/signs_numba.py", "ringcomp/compression/base.py",
                 "ringcomp/collectives/ring.py", "ringcomp/training/optim.py",
                 "ringcomp/kernels/optim_ref.py", "ringcomp/kernels/rng.py"):
        assert path in kept, path
    for path in ("ringcomp/kernels/quant_ref.py", "ringcomp/compression/quantize.py",
                 "ringcomp/compression/countsketch.py", "ringcomp/kernels/sketch_numba.py",
                 "ringcomp/kernels/cast_ref.py"):
        assert path in code and path not in kept, path
    assert "ringcomp/kernels/quant_ref.py" in measured.only(code, ["qsgd:levels=4"])
    assert measured.only(code, compressors()) == code
    with pytest.raises(ValueError, match="unknown compressor"):
        measured.only(code, ["zip"])


def test_every_named_method_maps_to_a_registered_compressor():
    for method in METHODS:
        assert set(measured.compressors_in([METHODS[method]])) <= set(
            compressors()), method


def executed_files(fn) -> set[str]:
    """The project files (relative to the root) whose functions ``fn()`` called."""
    import os
    import sys

    called = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name != "<module>":
            called.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return {os.path.relpath(path, records.ROOT) for path in called
            if path.startswith(records.ROOT)}


@pytest.mark.parametrize("plan", [[], ["--plan", "layerwise"]])
def test_the_planning_code_runs_only_when_a_run_plans(plan):
    """A training run without ``--plan`` calls none of ``PLANNING_CODE`` (so a record of such
    runs leaves it out: ``only(..., planned=False)``); one with ``--plan`` calls it."""
    from mpi4py import MPI

    from ringcomp.runner import run
    from ringcomp.training.config import parse
    from ringcomp.transports import get_transport

    options = ["--no-progress", "--steps", "3", "--batch-size", "4", "--model", "mlp:16x8",
               "--compressor", "topk", "--error-feedback", *plan]
    assert measured.plans([options]) == bool(plan)
    ran = executed_files(lambda: run(parse(options), get_transport(MPI.COMM_SELF)))
    assert "ringcomp/training/trainer.py" in ran  # (one rank compresses nothing)
    planning = ran & set(measured.PLANNING_CODE)
    assert planning == ({"ringcomp/training/planning.py", "ringcomp/training/measure.py"}
                        if plan else set())
    code = records.code_files(*measured.TRAINING_CODE)
    kept = measured.only(code, ["topk"], planned=measured.plans([options]))
    assert ran & set(code) <= set(kept)  # what ran is named
    assert set(measured.PLANNING_CODE) <= set(code)
