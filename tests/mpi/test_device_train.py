"""Training with ``--device gpu``: everything on the device, the same run as on the CPU.

Where it can run: under Numba's CUDA simulator (the ``make test`` stage that runs the
device files at 3 ranks), where "the GPU" is ``DeviceArray`` - host memory that says it is
on the device and refuses to be mixed with host arrays, as CuPy does - and the CUDA kernels
run simulated; there a GPU run must equal the CPU run bit for bit. On a real GPU (CuPy),
exact runs must match the CPU run within matrix-product rounding (cuBLAS and OpenBLAS sum
in different orders), and every rank must hold the same bytes. Skipped elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank
from fakedevice import DEVICE_NAMESPACE, GPUS, NO_DEVICE, SIMULATED

from ringcomp.devices import placement
from ringcomp.kernels.arrays import on_device, to_numpy
from ringcomp.training.config import parse
from ringcomp.training.trainer import Trainer
from ringcomp.transport.cache import get_transport

pytestmark = pytest.mark.skipif(not SIMULATED and not GPUS, reason=NO_DEVICE)

#: a GPU's exact run vs the CPU's after a few steps: matrix products summed in another order
GPU_RTOL, GPU_ATOL = 1e-4, 1e-5


@pytest.fixture(autouse=True)
def the_gpu(monkeypatch):
    """Under the simulator, ``--device gpu`` places arrays in ``DeviceArray`` memory."""
    if SIMULATED:
        monkeypatch.setattr(placement, "gpu_unavailable", lambda: "")
        monkeypatch.setattr(placement, "gpu_placement",
                            lambda: placement.Placement("gpu", DEVICE_NAMESPACE))


def options(device, *extra, steps=4):
    return parse(["--no-progress", "--steps", str(steps), "--batch-size", "4",
                  "--model", "mlp:16x8", "--small-tensor", "64", "--bucket-mb", "0.001",
                  "--device", device, *extra])


def train(trainer, count):
    for _ in range(count):
        trainer.train_step(trainer.step)
        trainer.step += 1


def same_run(cpu, gpu, exact: bool) -> bool:
    """The bit-for-bit verdict under the simulator; on a GPU, exact runs within rounding
    and compressed ones (where one flipped sign changes the trajectory) not compared."""
    a, b = to_numpy(cpu.store.flat), to_numpy(gpu.store.flat)
    if SIMULATED:
        return np.array_equal(a, b)
    return not exact or np.allclose(a, b, rtol=GPU_RTOL, atol=GPU_ATOL)


def identical_ranks(comm, array) -> bool:
    return len(set(comm.allgather(to_numpy(array).tobytes()))) == 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("extra", [
    (), ("--model", "cnn:2x4", "--optimizer", "adam", "--lr", "0.01"),
    ("--algorithm", "tree", "--momentum", "0"),
    ("--compressor", "marsit", "--marsit-k", "3"),
    ("--compressor", "sign", "--error-feedback"),
    ("--compressor", "topk:ratio=0.1", "--error-feedback"),
    ("--compressor", "qsgd", "--algorithm", "allgather"),
    ("--compressor", "powersgd", "--error-feedback"),
    ("--compressor", "sign", "--algorithm", "twostage", "--error-feedback"),
    ("--model", "replay:bert-base", "--replay-scale", "0.00005", "--replay-tflops", "0",
     "--compressor", "marsit"),
])
def test_gpu_run_equals_cpu_run_and_stays_on_the_device(comm, extra):
    # two steps: the second uses what the first left (momentum, residuals, warm starts);
    # Marsit-K at K = 3 needs four, its full-precision round (step 3) and the one after
    steps = 4 if "--marsit-k" in extra else 2
    cpu = Trainer(options("cpu", *extra, steps=steps), get_transport())
    gpu = Trainer(options("gpu", *extra, steps=steps), get_transport())
    train(cpu, steps)
    train(gpu, steps)
    for t in (cpu, gpu):
        t.reducer.close()
    exact = "--compressor" not in extra
    state = [gpu.store.flat, gpu.store.grad, *gpu.optimizer.state.values()]
    if gpu.reducer.feedback is not None:
        state += list(gpu.reducer.feedback.residuals.values())
    assert every_rank(comm, all(on_device(a) for a in state)), "state left the device"
    assert every_rank(comm, identical_ranks(comm, gpu.store.flat))
    assert every_rank(comm, same_run(cpu, gpu, exact))
    if not gpu.replay:
        assert abs(gpu.evaluate() - cpu.evaluate()) <= (0 if SIMULATED else 0.05)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("first,then", [("gpu", "cpu"), ("cpu", "gpu")])
@pytest.mark.parametrize("extra", [("--compressor", "topk:ratio=0.1", "--error-feedback"),
                                   ("--compressor", "marsit")])
def test_checkpoint_written_on_one_device_resumes_on_the_other(comm, mpi_tmp_path, first,
                                                               then, extra):
    """Stop after step 1 on one device, resume on the other: the parameters after step 2
    equal an uninterrupted run on the second device (bit for bit under the simulator)."""
    ck = str(mpi_tmp_path / f"ck-{first}-{extra[1][:4]}")
    whole = Trainer(options(then, *extra, steps=2), get_transport())
    train(whole, 2)
    before = Trainer(options(first, *extra, "--checkpoint-dir", ck, steps=2), get_transport())
    train(before, 1)
    before.save()
    after = Trainer(options(then, *extra, "--checkpoint-dir", ck, "--resume", steps=2),
                    get_transport())
    assert after.restore() and after.step == 1
    feedback = after.reducer.feedback
    placed = ([after.store.flat, *after.optimizer.state.values(),
               *feedback.residuals.values()] if feedback else [after.store.flat])
    train(after, 1)
    for t in (whole, before, after):
        t.reducer.close()
    assert every_rank(comm, all(on_device(a) == (then == "gpu") for a in placed))
    if SIMULATED:
        assert every_rank(comm, np.array_equal(to_numpy(whole.store.flat),
                                               to_numpy(after.store.flat)))
    assert every_rank(comm, identical_ranks(comm, after.store.flat))


@pytest.mark.mpi(min_size=1)
def test_planned_buckets_profile_on_the_device(comm):
    """--plan profiles forward/backward, the update and the collectives on the device."""
    gpu = Trainer(options("gpu", "--plan", "mgwfbp", "--profile-steps", "1"), get_transport())
    gpu.apply_plan()
    train(gpu, 2)
    gpu.reducer.close()
    profile = gpu.planned.profile
    assert every_rank(comm, all(t >= 0 for t in profile.backward_s) and profile.update_s > 0)
    assert every_rank(comm, identical_ranks(comm, gpu.store.flat))
