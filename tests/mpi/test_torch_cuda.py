"""ringcomp.torch on CUDA tensors: gradients handed to ringcomp through DLPack (CuPy views,
no copies), PyTorch's streams waited on. Runs where PyTorch and CuPy see a GPU.

Oracles as in test_torch.py (one process with the whole batch, byte-equal replicas, an
uninterrupted run) plus the stream hand-over: gradients produced on a side stream that is
held back by a sleep kernel still reach MPI complete.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("PyTorch sees no GPU", allow_module_level=True)

from test_torch import (  # noqa: E402
    BATCH,
    COMPRESSED,
    data,
    ddp,
    distributed,
    flat,
    identical,
    local_step,
    marsit,
    net,
    resumed_equals_whole,
)

import ringcomp.torch as rt  # noqa: E402

CUDA = "cuda"


@pytest.fixture(autouse=True)
def one_gpu_per_rank(comm):
    torch.cuda.set_device(comm.rank % torch.cuda.device_count())


def one_process_matches(comm, model, opt, steps, passes=1, sleep=0, stream=None) -> bool:
    """Train ``model`` through ``opt`` for ``steps`` and compare with one process taking
    the whole global batch after every step (and replicas with each other)."""
    p = comm.size
    x, y = data(steps, p)
    single = net().to(CUDA)
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9)
    ok = True
    for step in range(steps):
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            if sleep:  # hold the producing stream back: a missed wait reads stale grads
                torch.cuda._sleep(sleep)
            local_step(model, opt, x, y, comm.rank, step, p, passes)
        torch.cuda.synchronize()  # the step's kernels may still run on a side stream
        lo, hi = step * p * BATCH, (step + 1) * p * BATCH
        single_opt.zero_grad()
        torch.nn.functional.cross_entropy(single(x[lo:hi].to(CUDA)),
                                          y[lo:hi].to(CUDA)).backward()
        single_opt.step()
        ok &= np.allclose(flat(model), flat(single), rtol=1e-4, atol=1e-5)
        ok &= identical(comm, model)
    return ok


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("options", [
    {"algorithm": "ring", "bucket_mb": 0.001},
    {"algorithm": "tree", "bucket_mb": 0},
    {"algorithm": "rabenseifner", "bucket_mb": "all", "backward_passes_per_step": 2},
])
def test_cuda_tensors_follow_one_process_with_p_times_the_batch(comm, options):
    model, opt = distributed(comm, device=CUDA, **options)
    ok = one_process_matches(comm, model, opt, 5, options.get("backward_passes_per_step", 1))
    on_device = isinstance(opt.flat.array, cupy.ndarray)
    opt.close()
    assert every_rank(comm, ok and on_device)


@pytest.mark.mpi(min_size=1)
def test_gradients_from_a_held_back_side_stream_are_waited_for(comm):
    """Forward, backward and step on a user's stream that a sleep kernel holds back: the
    engine must wait for that stream before MPI reads the gradients, and the averaged
    gradients must be in place before the step's kernels on that stream run."""
    model, opt = distributed(comm, device=CUDA, bucket_mb=0.001)
    ok = one_process_matches(comm, model, opt, 4, sleep=20_000_000,
                             stream=torch.cuda.Stream())
    opt.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("options", COMPRESSED)
def test_every_compressor_on_cuda_keeps_ranks_bit_identical(comm, options):
    x, y = data(6, comm.size)
    model, opt = distributed(comm, device=CUDA, small_tensor=64, bucket_mb=0.002, **options)
    ok = True
    for step in range(6):
        local_step(model, opt, x, y, comm.rank, step, comm.size)
        ok &= identical(comm, model) and bool(np.isfinite(flat(model)).all())
    residuals = opt.reducer.feedback.residuals.values() if opt.reducer.feedback else []
    on_device = all(isinstance(r, cupy.ndarray) for r in residuals)
    opt.close()
    assert every_rank(comm, ok and on_device)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("options", [COMPRESSED[1], COMPRESSED[4], COMPRESSED[6]])
def test_cuda_resume_is_bit_identical_and_its_state_loads_on_the_cpu(comm, options):
    make = lambda seed, device=CUDA: distributed(  # noqa: E731
        comm, seed=seed, device=device, small_tensor=64, bucket_mb=0.002, **options)
    resumed, same = resumed_equals_whole(comm, make, steps=6, cut=3)
    x, y = data(1, comm.size)
    model, opt = make(0)
    local_step(model, opt, x, y, comm.rank, 0, comm.size)
    saved = opt.state_dict()
    host = all(isinstance(v, np.ndarray) for part in ("feedback", "compressor")
               for v in saved["ringcomp"][part].values())
    cpu_model, cpu_opt = make(0, "cpu")
    cpu_opt.load_state_dict(saved)
    loaded = sorted(map(str, cpu_opt.reducer.feedback.residuals)) == sorted(
        map(str, opt.reducer.feedback.residuals)) and cpu_opt.steps == 1
    for o in (opt, cpu_opt):
        o.close()
    assert every_rank(comm, resumed and same and host and loaded)


@pytest.mark.mpi(min_size=1)
def test_marsit_on_cuda_moves_compressed_coordinates_by_the_global_step(comm):
    x, y = data(1, comm.size)
    model, opt = marsit(comm, device=CUDA)
    before = flat(model)
    local_step(model, opt, x, y, comm.rank, 0, comm.size)
    moved = np.abs(before - flat(model))
    big = np.concatenate([np.full(p.numel(), p.numel() >= 64) for p in model.parameters()])
    ok = bool(np.allclose(moved[big], 0.01, rtol=1e-3)) and identical(comm, model)
    opt.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_marsit_k_on_cuda_resumes_bit_identically(comm):
    resumed, same = resumed_equals_whole(
        comm, lambda seed: marsit(comm, seed=seed, k=3, device=CUDA), steps=6, cut=3)
    assert every_rank(comm, resumed and same)


@pytest.mark.mpi(min_size=1)
def test_ddp_hook_on_cuda_equals_ddps_own_allreduce(comm):
    import torch.distributed as dist

    if not dist.is_initialized():
        rt.init_process_group(comm)
    p, steps = comm.size, 4
    x, y = data(steps, p)
    state = rt.HookState(comm, algorithm="ring")
    ours, theirs = ddp(net().to(CUDA), state), ddp(net().to(CUDA))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ours, theirs)]
    ok = True
    for step in range(steps):
        for model, opt in zip((ours, theirs), opts, strict=True):
            local_step(model, opt, x, y, comm.rank, step, p)
        ok &= np.allclose(flat(ours), flat(theirs), rtol=1e-5, atol=1e-6)
        ok &= identical(comm, ours)
    state.close()
    assert every_rank(comm, ok)
