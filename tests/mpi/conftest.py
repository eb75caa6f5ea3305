"""MPI test plumbing: every rank agrees on every test's verdict, and a stand-in GPU array."""

from __future__ import annotations

import functools
import os
import sys

import pytest

os.environ.setdefault("MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD", "1000000000")
os.environ.setdefault("RINGCOMP_TIMEOUT", "60")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

_VERDICT_COMM = MPI.COMM_WORLD.Dup()

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Make every rank report the same outcome for each test phase.

    A failure seen by one rank only would otherwise be reported by that rank alone, and a
    rank that stops early leaves the others blocked in the next collective. Each phase's
    outcome is all-gathered on a private communicator; if any rank failed, every rank
    reports the failure with the failing ranks' messages.
    """
    outcome = yield
    report = outcome.get_result()
    failed = report.failed
    text = ""
    if failed:
        text = str(report.longrepr)[-3000:]
    verdicts = _VERDICT_COMM.allgather((failed, text))
    bad = [(r, t) for r, (f, t) in enumerate(verdicts) if f]
    if bad and not failed:
        report.outcome = "failed"
        report.longrepr = "\n".join(f"--- rank {r} failed ---\n{t}" for r, t in bad)
    elif bad:
        others = [r for r, _ in bad if r != MPI.COMM_WORLD.Get_rank()]
        if others:
            report.longrepr = f"{report.longrepr}\n(also failed on ranks {others})"


@pytest.fixture(autouse=True, scope="session")
def _auto_calibrates_up_to_1_mb():
    """``auto`` calibrates up to 1 MB with 3 repetitions instead of 16 MB with 7: the tests
    check what it chooses and that every rank chooses alike, not the 16 MB fit (the
    studies and benchmarks use the full calibration). Its three calibrations were ~12%
    of every rank count's time."""
    from ringcomp.collectives import auto

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(auto, "calibrate", functools.partial(
            auto.calibrate, sizes=auto.CALIBRATION_SIZES[:-1], reps=3))
        yield


@pytest.fixture
def comm():
    return MPI.COMM_WORLD


@pytest.fixture(autouse=True)
def plans_of_this_test_only():
    """Plain calls run through plans kept on the world's transport (``plans/call.py``),
    which fix what they resolved when made - a module switch a test sets (the compiled
    walks' ``ENABLED``, ``CHECK_AS_READ_FROM_BYTES``) included: each test starts without
    the plans of the tests before it."""
    from ringcomp.transport.cache import get_transport

    get_transport().kept.plans.clear()


def every_rank(comm, ok: bool) -> bool:
    """True when ``ok`` holds on every rank (use in asserts so all ranks agree)."""
    return all(comm.allgather(bool(ok)))


def exact_walk_spy(monkeypatch) -> list:
    """A list that gets one entry each time the exact ring's compiled walk runs (the walk
    compiled for float32 first, so the spy stands in for the dispatcher only)."""
    from ringcomp.collectives import ring_native

    ring_native.compile_walks([np.float32])
    ran = []
    real = ring_native._walk
    monkeypatch.setattr(ring_native, "_walk", lambda *args: ran.append(1) or real(*args))
    return ran


def walked_algorithms(compressed: bool = False) -> list[str]:
    """The registered algorithms with a compiled walk (``Algorithm.walk``; with
    ``compressed``, those that also have a compressed form): the differential tests are
    generated from the registry, so an algorithm that gains a walk is tested by them."""
    from ringcomp.collectives import REGISTRY

    return sorted(name for name, entry in REGISTRY.items()
                  if entry.walk is not None and (entry.compressed or not compressed))


def both_walks(t, x, monkeypatch, algorithm, walked: list, **options):
    """[(result, bytes sent, messages sent) of ``t``'s ``algorithm`` all-reduce of ``x``
    by its Python walk (the one choice of a compiled walk, ``executor.compiled``, made to
    say no), then by what that choice binds]; appends to ``walked`` whether it bound a
    compiled walk (a test asserts that some of its sizes did, or it compared the Python
    walk with itself)."""
    import ringcomp
    from ringcomp.collectives import executor

    out, bound = [], []
    real = executor.compiled

    def spied(*args, **kwargs):
        walk = real(*args, **kwargs)
        bound.append(walk is not None)
        return walk

    for choose in ((lambda *a, **k: None), spied):
        monkeypatch.setattr(executor, "compiled", choose)
        t.kept.plans.clear()  # a plan keeps what it bound: bind again under this choice
        sent, messages = t.bytes_sent, t.messages_sent
        y = ringcomp.allreduce(x, algorithm=algorithm, comm=t, **options)
        out.append((y, t.bytes_sent - sent, t.messages_sent - messages))
    monkeypatch.setattr(executor, "compiled", real)
    walked.append(any(bound))
    return out
