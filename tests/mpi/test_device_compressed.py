"""Every compressor on every compressed algorithm, with device buffers, equals the host run.

Where the device path can run: under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``,
the ``make test`` stage that runs this file at 3 ranks) with ``DeviceArray`` - a host
array that says it is in GPU memory, so the CUDA kernels, the device allocations and the
staging through host buffers all run - and on a GPU with CuPy arrays. Skipped elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank
from fakedevice import GPUS, NO_DEVICE, SIMULATED, DeviceArray

import ringcomp
from ringcomp.compression import ErrorFeedback
from ringcomp.kernels.arrays import on_device, to_numpy
from ringcomp.trace import Tracer
from ringcomp.transport.mpilib import detect_cuda_aware

pytestmark = pytest.mark.skipif(not SIMULATED and not GPUS, reason=NO_DEVICE)
if GPUS:
    import cupy

COMPRESSORS = [c for c in ringcomp.compressors() if c != "none"]
SCHEMES = ["ring", "tree", "dbtree", "allgather", "twostage"]
#: small and awkward under the simulator (it runs every GPU thread in Python)
SIZES = [0, 1, 101] if SIMULATED else [0, 1, 1000, 65539]
#: several segments per chunk: under the simulator at 3 ranks a 101-element chunk of 34 is
#: two; on a GPU 4096-element segments (a 65539-element chunk at 2 ranks is 9), since a
#: launch costs tens of microseconds there and a segment is a hop's launches
SEGMENT = 32 * 4 if SIMULATED else 4096 * 4


@pytest.fixture(autouse=True)
def one_gpu_per_rank(comm):
    if GPUS:
        cupy.cuda.Device(comm.rank % GPUS).use()


def to_device(x: np.ndarray):
    return DeviceArray.of(x) if SIMULATED else cupy.asarray(x)


def exact_match_expected(compressor: str) -> bool:
    # PowerSGD's matrix products run in cuBLAS on a GPU, OpenBLAS on the host
    return SIMULATED or compressor != "powersgd"


def run_both(comm, compressor, algorithm, n, **kwargs):
    """(host result, device result) of the same call on fresh transports."""
    x = np.random.default_rng(comm.rank * 7 + n).standard_normal(n).astype(np.float32)
    results = []
    for place in (lambda a: a, to_device):
        t = ringcomp.Transport(comm)
        try:
            out = ringcomp.allreduce(place(x), algorithm=algorithm, comm=t,
                                     compressor=compressor, segment_bytes=SEGMENT, seed=3,
                                     step=1, **kwargs)
        except (ValueError, TypeError) as err:  # a pairing the library refuses
            out = err
        finally:
            t.close()
        results.append(out)
    return results


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", SCHEMES)
@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_device_equals_host(comm, compressor, algorithm):
    for n in SIZES:
        host, dev = run_both(comm, compressor, algorithm, n)
        if isinstance(host, Exception):  # refused on the host: refused alike on the device
            assert every_rank(comm, type(dev) is type(host) and str(dev) == str(host)), n
            continue
        assert every_rank(comm, on_device(dev)), f"n={n}: the result left the device"
        got = to_numpy(dev)
        if exact_match_expected(compressor):
            ok = got.tobytes() == host.tobytes()
        else:
            ok = np.allclose(got, host, rtol=1e-3, atol=1e-4 * np.abs(host).max(initial=1))
        assert every_rank(comm, ok), f"n={n}"


#: every compressor with error feedback on the ring; on the two-stage scheme (whose owner
#: keeps a second residual, through the same compressor-independent wrapper) not QSGD and
#: Count-Sketch, whose kernels the ring's cases and ``test_device_equals_host`` already
#: run under the simulator, at 6 s a case there (its thread per GPU thread)
FEEDBACK_CASES = [("ring", c) for c in ("sign", "qsgd", "topk", "countsketch", "powersgd")] + [
    ("twostage", c) for c in ("sign", "topk", "powersgd")]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm,compressor", FEEDBACK_CASES)
def test_error_feedback_on_device(comm, algorithm, compressor):
    """Two steps with error feedback (the second adds what the first left, at the worker and
    at a two-stage owner): outputs and residuals equal the host run's, and the residuals stay
    in device memory."""
    n = 101 if SIMULATED else 50_001
    memories = [ErrorFeedback(), ErrorFeedback()]
    for step in range(2):
        x = np.random.default_rng(comm.rank + 10 * step).standard_normal(n).astype(np.float32)
        outs = []
        for memory, place in zip(memories, (lambda a: a, to_device), strict=True):
            t = ringcomp.Transport(comm)
            outs.append(ringcomp.allreduce(place(x), algorithm=algorithm, comm=t,
                                           compressor=compressor, error_feedback=memory,
                                           segment_bytes=SEGMENT, step=step, seed=5))
            t.close()
        host, dev = outs
        if exact_match_expected(compressor):
            assert every_rank(comm, to_numpy(dev).tobytes() == host.tobytes()), step
    residuals = list(memories[1].residuals.values())
    assert every_rank(comm, bool(residuals) and all(on_device(r) for r in residuals))
    if exact_match_expected(compressor):
        same = all(to_numpy(memories[1].residuals[k]).tobytes() == v.tobytes()
                   for k, v in memories[0].residuals.items())
        assert every_rank(comm, same)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_shadow_mode_on_device(comm, algorithm):
    """Shadow mode's per-hop errors from device buffers equal those from host buffers."""
    n = 101 if SIMULATED else 40_000
    x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
    errors = []
    for place in (lambda a: a, to_device):
        t, tracer = ringcomp.Transport(comm), Tracer()
        ringcomp.allreduce(place(x), algorithm=algorithm, comm=t, compressor="sign",
                           tracer=tracer, shadow=True, segment_bytes=SEGMENT)
        t.close()
        errors.append([(r.get("lo"), r.get("rel_err")) for r in tracer.records
                       if r.get("kind") == "shadow"])
    assert every_rank(comm, errors[0] and errors[0] == errors[1])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm,compressor", [("ring", "marsit"), ("tree", "sign"),
                                                  ("ring", "none")])
def test_trace_records_each_staging_copy(comm, algorithm, compressor):
    """A traced call on device buffers staged through host memory records one
    ``stage-out`` per message sent and one ``stage-in`` per message received, each with the
    message's bytes and inside the call; host buffers and a CUDA-aware transport (nothing
    staged) record none. This is the staging part of a hop's codec / staging / wire split."""
    n = 101 if SIMULATED else 40_000
    x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
    cases = [(to_device, False, True), (lambda a: a, False, False)]
    # device pointers handed to MPI: the stand-in's are host memory; a real GPU's crash a
    # non-CUDA-aware MPI (seen on the H100 under its Open MPI 4.1.6: a segfault in Isend)
    if SIMULATED or detect_cuda_aware():
        cases.append((to_device, True, False))
    for place, cuda_aware, staged in cases:
        t, tracer = ringcomp.Transport(comm, cuda_aware=cuda_aware), Tracer()
        ringcomp.allreduce(place(x), algorithm=algorithm, comm=t, compressor=compressor,
                           tracer=tracer, segment_bytes=SEGMENT)
        t.close()
        hops = [r for r in tracer.records if r["type"] == "hop"]
        call = next(r for r in tracer.records if r["type"] == "op")
        sent = sorted(r["bytes"] for r in hops if r["kind"] == "send")
        received = sorted(r["bytes"] for r in hops if r["kind"] == "recv")
        outs = sorted(r["bytes"] for r in hops if r["kind"] == "stage-out")
        ins = sorted(r["bytes"] for r in hops if r["kind"] == "stage-in")
        inside = all(call["t0"] <= r["t0"] <= r["t1"] <= call["t1"] for r in hops
                     if r["phase"] == "staging")
        expected = (sent, received) if staged else ([], [])
        assert every_rank(comm, bool(sent) and (outs, ins) == expected and inside)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm,compressor", [
    ("mpi", None), ("ring", None), ("ring", "marsit"), ("ring", "sign"), ("ring", "qsgd"),
    ("ring", "topk:ratio=0.1")])
def test_a_small_device_plan_stages_once_with_the_hosts_bits(comm, algorithm, compressor):
    """Where MPI is not CUDA-aware, a plan of a small device all-reduce runs its host
    twin's bound call on one host copy (``bind.Staged``): the host run's bytes, out of
    place and in place, the result on the device, and the messages the device path's
    hop-by-hop call sends."""
    import numba  # noqa: F401 - the exact ring's walk is compiled once a process has Numba

    from ringcomp.plans.bind import Staged

    t = ringcomp.Transport(comm)
    if t.cuda_aware:
        t.close()
        pytest.skip("MPI takes device memory itself here: nothing is staged")
    try:
        x = np.random.default_rng(comm.rank).standard_normal(101 if SIMULATED else 4099)
        x = x.astype(np.float32)
        args = dict(algorithm=algorithm, compressor=compressor, comm=t, seed=3)
        dev = to_device(x)
        plan = ringcomp.allreduce_init(dev, **args)
        ok = isinstance(plan._call, Staged)
        for step in range(2):
            want = ringcomp.allreduce(x, step=step, **args)
            sent = t.bytes_sent, t.messages_sent
            got = plan(step=step)
            by_plan = t.bytes_sent - sent[0], t.messages_sent - sent[1]
            sent = t.bytes_sent, t.messages_sent
            general = ringcomp.allreduce(dev, step=step, **args)
            by_general = t.bytes_sent - sent[0], t.messages_sent - sent[1]
            ok &= on_device(got) and to_numpy(got).tobytes() == want.tobytes()
            ok &= to_numpy(general).tobytes() == want.tobytes() and by_plan == by_general
        mine = to_device(x.copy())  # (the stand-in's arrays share the host array's memory)
        ringcomp.allreduce_init(mine, out=mine, **args)(step=0)
        ok &= to_numpy(mine).tobytes() == ringcomp.allreduce(x, step=0, **args).tobytes()
    finally:
        t.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["ring", "tree", "allgather"])
@pytest.mark.parametrize("way", ["call", "plan"])
def test_unchecked_device_lengths_of_equal_payload_bytes_are_refused(comm, algorithm, way):
    """Without the argument agreement (``check=False``), 101 device elements on rank 0
    and 102 on the others: sign's bits are packed 32 to a word, so the payloads have equal
    bytes and no receive can tell them apart. Unchecked compressed device calls - plans
    too, whose host twin's walk is staged (``bind.Staged``) - agree on the length and
    item size first: ArgumentMismatchError on every rank, before anything is written. At
    equal lengths a plan and a plain call send the same messages and give the host's bits."""
    from test_errors import same_error_everywhere

    from ringcomp.errors import ArgumentMismatchError

    t = ringcomp.Transport(comm)
    try:
        n = 101 if comm.rank == 0 else 102
        x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
        args = dict(algorithm=algorithm, compressor="sign", comm=t, check=False, seed=3)
        dev, out = to_device(x), to_device(np.full(n, 7.0, np.float32))
        call = (ringcomp.allreduce_init(dev, out=out, **args) if way == "plan"
                else lambda: ringcomp.allreduce(dev, out=out, **args))
        same_error_everywhere(comm, call, ArgumentMismatchError, "length (min 101, max 102)")
        ok = bool(np.all(to_numpy(out) == 7.0))
        y = x[:101]
        want = ringcomp.allreduce(y, **args)
        dev = to_device(y)
        sent = t.bytes_sent, t.messages_sent
        got = (ringcomp.allreduce_init(dev, **args)() if way == "plan"
               else ringcomp.allreduce(dev, **args))
        used = t.bytes_sent - sent[0], t.messages_sent - sent[1]
        sent = t.bytes_sent, t.messages_sent
        ringcomp.allreduce(dev, **args)
        ok &= to_numpy(got).tobytes() == want.tobytes()
        ok &= used == (t.bytes_sent - sent[0], t.messages_sent - sent[1])
    finally:
        t.close()
    assert every_rank(comm, ok)
