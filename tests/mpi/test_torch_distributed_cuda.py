"""The "ringcomp" torch.distributed backend on CUDA tensors (CuPy views through DLPack, the
caller's streams waited for). Runs where PyTorch and CuPy see a GPU: issue 74's device run."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank
from mpi4py import MPI

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("PyTorch sees no GPU", allow_module_level=True)
dist = pytest.importorskip("torch.distributed")

import ringcomp.torch.distributed  # noqa: E402, F401 - registers the backend

CUDA = "cuda"


@pytest.fixture(scope="module", autouse=True)
def ringcomp_group():
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("ringcomp")
    yield
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def one_gpu_per_rank(comm):
    torch.cuda.set_device(comm.rank % torch.cuda.device_count())


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32], ids=str)
def test_collectives_on_cuda_tensors_equal_mpis_on_the_host(comm, dtype):
    n, p, r = 1000 + comm.size, comm.size, comm.rank
    host = torch.from_numpy((np.arange(n * p) * 7 + 3 * r) % 5 + 1).to(dtype)
    expected = np.empty(n * p, np.float64)
    comm.Allreduce(host.double().numpy(), expected, op=MPI.SUM)
    x = host.to(CUDA)
    dist.all_reduce(x)
    ok = np.array_equal(x.double().cpu().numpy(), expected)
    gathered = torch.empty(p * n * p, dtype=dtype, device=CUDA)
    dist.all_gather_into_tensor(gathered, host.to(CUDA))
    ok &= np.array_equal(gathered.cpu().numpy(), np.concatenate(comm.allgather(host.numpy())))
    block = torch.empty(n, dtype=dtype, device=CUDA)
    dist.reduce_scatter_tensor(block, host.to(CUDA))
    ok &= np.array_equal(block.double().cpu().numpy(), expected[r * n:(r + 1) * n])
    swapped = torch.empty(n * p, dtype=dtype, device=CUDA)
    dist.all_to_all_single(swapped, host.to(CUDA))
    theirs = np.empty(n * p, host.numpy().dtype)
    comm.Alltoall(host.numpy(), theirs)
    ok &= np.array_equal(swapped.cpu().numpy(), theirs)
    root = host.to(CUDA)
    dist.broadcast(root, src=p - 1)
    ok &= np.array_equal(root.cpu().numpy(), comm.bcast(host.numpy(), root=p - 1))
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_a_tensor_still_being_written_on_a_side_stream_is_reduced_complete(comm):
    """The tensor's last kernel is queued on a side stream held back by a sleep: the
    collective runs on the group's thread, which must wait for the caller's stream."""
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device=CUDA)
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        x.fill_(comm.rank + 1.0)
        dist.all_reduce(x)
    torch.cuda.synchronize()
    assert every_rank(comm, bool((x == comm.size * (comm.size + 1) / 2).all()))


@pytest.mark.mpi(min_size=1)
def test_ddp_on_cuda_over_ringcomp_follows_one_process(comm):
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                                   torch.nn.Linear(8, 2)).to(CUDA)

    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(4 * comm.size, 6, generator=g).to(CUDA) for _ in range(3)]
    ddp = torch.nn.parallel.DistributedDataParallel(model())
    single = model()
    for net in (ddp, single):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for batch in batches:
            opt.zero_grad()
            mine = batch[4 * comm.rank:4 * comm.rank + 4] if net is ddp else batch
            net(mine).pow(2).mean().backward()
            opt.step()
    close = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
                for a, b in zip(ddp.module.parameters(), single.parameters(), strict=True))
    assert every_rank(comm, close)
