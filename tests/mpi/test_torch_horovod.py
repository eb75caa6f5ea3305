"""Horovod's calls on tensors (``import ringcomp.torch as hvd``), against mpi4py's own
collectives; the tests named ``test_horovod_*`` are ported from Horovod's
test/parallel/test_torch.py (same name, same check, ringcomp's oracle)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank
from mpi4py import MPI

torch = pytest.importorskip("torch")
import ringcomp.torch as hvd  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]


@pytest.fixture(autouse=True)
def _initialised(comm):
    hvd.init()
    yield
    hvd.shutdown()


def _tensor(dtype, shape, rank):
    g = torch.Generator().manual_seed(1234 + rank)
    values = torch.randint(-100, 100, shape, generator=g)
    return values.to(dtype)


@pytest.mark.mpi(min_size=1)
def test_horovod_rank_size_and_local_layout(comm):
    """rank/size are MPI's; one node here: local_rank == rank, local_size == size,
    cross_rank 0 of 1."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local = (node.Get_rank(), node.Get_size())
    node.Free()
    got = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
           hvd.cross_size())
    want = (comm.rank, comm.size, *local, comm.rank // local[1], comm.size // local[1])
    assert every_rank(comm, got == want and hvd.is_initialized()), (got, want)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_horovod_allreduce(comm, dtype, dim):
    """Sum and the default Average of every dtype and rank (oracle: MPI's Allreduce);
    the input is left as it was."""
    x = _tensor(dtype, (17,) * dim, comm.rank)
    before = x.clone()
    want = comm.allreduce(x.numpy(), op=MPI.SUM)
    summed = hvd.allreduce(x, op=hvd.Sum)
    ok = np.array_equal(summed.numpy(), want) and torch.equal(x, before)
    if dtype.is_floating_point:
        averaged = hvd.allreduce(x)
        ok &= np.allclose(averaged.numpy(), want / comm.size)
        ok &= np.allclose(hvd.allreduce(x, average=False).numpy(), want)
    else:  # an integer average would be truncated: refused on every rank, before any call
        with pytest.raises(TypeError, match="op=Sum"):
            hvd.allreduce(x)
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("op,mpi_op", [("min", MPI.MIN), ("max", MPI.MAX),
                                       ("prod", MPI.PROD)])
def test_horovod_allreduce_min_max_product(comm, op, mpi_op):
    x = _tensor(torch.float64, (5, 3), comm.rank) / 50
    want = np.empty_like(x.numpy())
    comm.Allreduce(x.numpy(), want, op=mpi_op)
    op = {"min": hvd.Min, "max": hvd.Max, "prod": hvd.Product}[op]
    assert every_rank(comm, np.allclose(hvd.allreduce(x, op=op).numpy(), want))


@pytest.mark.mpi(min_size=1)
def test_horovod_allreduce_prescale_postscale_and_inplace(comm):
    """prescale before the sum, postscale after; allreduce_ writes the tensor itself (a
    strided view too)."""
    x = _tensor(torch.float64, (4, 6), comm.rank)
    want = comm.allreduce(x.numpy(), op=MPI.SUM)
    scaled = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    inplace = x.clone()
    returned = hvd.allreduce_(inplace, op=hvd.Sum)
    strided = x.clone().t()  # not contiguous
    hvd.allreduce_(strided, op=hvd.Sum)
    ok = (np.allclose(scaled.numpy(), 1.5 * want) and returned is inplace
          and np.array_equal(inplace.numpy(), want) and np.array_equal(strided.t().numpy(), want))
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_horovod_allreduce_fp16_compression(comm):
    """compression=Compression.fp16: the sum of the values rounded to float16 (oracle:
    NumPy's rounding of each rank's input, summed in float32 as ringcomp's cast sums)."""
    x = torch.linspace(-2, 2, 64) * (comm.rank + 1) / 3
    got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    exact = comm.allreduce(x.numpy().astype(np.float64), op=MPI.SUM)
    assert every_rank(comm, np.allclose(got.numpy(), exact, rtol=2e-3, atol=2e-3))


@pytest.mark.mpi(min_size=2)
def test_horovod_allreduce_error(comm):
    """Tensors of other shapes on the ranks: an error on every rank, not a hang."""
    x = torch.ones(17 + (comm.rank == comm.size - 1))
    with pytest.raises(ValueError, match="length"):
        hvd.allreduce(x)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
def test_horovod_allgather_variable_size(comm, dtype):
    """Rank r contributes r + 1 rows: the concatenation in rank order (oracle: mpi4py's
    allgather of the arrays)."""
    x = _tensor(dtype, (comm.rank + 1, 3, 2), comm.rank)
    got = hvd.allgather(x)
    want = np.concatenate(comm.allgather(x.numpy()))
    assert every_rank(comm, got.dtype == dtype and np.array_equal(got.numpy(), want))


@pytest.mark.mpi(min_size=2)
def test_horovod_allgather_error(comm):
    x = torch.ones(2, 3 + (comm.rank == 1))
    with pytest.raises(ValueError, match="differ at most in the first"):
        hvd.allgather(x)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
def test_horovod_broadcast_and_inplace(comm, dtype):
    root = comm.size - 1
    x = _tensor(dtype, (3, 5), comm.rank)
    want = comm.bcast(x.numpy(), root=root)
    copy = hvd.broadcast(x, root_rank=root)
    ok = np.array_equal(copy.numpy(), want) and (comm.rank == root or not torch.equal(x, copy))
    ok &= hvd.broadcast_(x, root_rank=root) is x and np.array_equal(x.numpy(), want)
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_horovod_broadcast_object_and_allgather_object(comm):
    mine = {"rank": comm.rank, "list": list(range(comm.rank))}
    root = comm.size // 2
    ok = hvd.broadcast_object(mine, root_rank=root) == {"rank": root,
                                                         "list": list(range(root))}
    ok &= hvd.allgather_object(mine) == comm.allgather(mine)
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_horovod_async_calls_with_poll_and_synchronize(comm):
    """Several asynchronous calls in flight (Horovod's test_horovod_allreduce_async_fused):
    each handle's result equals the synchronous call's; poll is true once synchronized;
    the in-place forms write their tensor."""
    xs = [_tensor(torch.float32, (n,), comm.rank) for n in (5, 300, 7000)]
    handles = [hvd.allreduce_async(x, op=hvd.Sum) for x in xs]
    gathered = hvd.allgather_async(xs[0])
    bcast = hvd.broadcast_async(xs[1], root_rank=0)
    inplace = xs[2].clone()
    inplace_handle = hvd.allreduce_async_(inplace, op=hvd.Sum)
    results = [hvd.synchronize(h) for h in handles]
    ok = all(np.array_equal(r.numpy(), comm.allreduce(x.numpy(), op=MPI.SUM))
             for r, x in zip(results, xs, strict=True))
    ok &= all(hvd.poll(h) for h in handles)
    ok &= np.array_equal(hvd.synchronize(gathered).numpy(),
                         np.concatenate(comm.allgather(xs[0].numpy())))
    ok &= np.array_equal(hvd.synchronize(bcast).numpy(), comm.bcast(xs[1].numpy(), root=0))
    ok &= hvd.synchronize(inplace_handle) is not None and np.array_equal(
        inplace.numpy(), comm.allreduce(xs[2].numpy(), op=MPI.SUM))
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_what_ringcomp_does_not_have_is_refused(comm):
    """join, Adasum and process sets are Horovod's: refused with what to do, not imitated;
    a call before init() says to call it."""
    x = torch.ones(4)
    with pytest.raises(NotImplementedError, match="same number of batches"):
        hvd.join()
    with pytest.raises(ValueError, match="Adasum"):
        hvd.allreduce(x, op=hvd.Adasum)
    with pytest.raises(ValueError, match="process sets"):
        hvd.allreduce(x, process_set=object())
    with pytest.raises(ValueError, match="op= or the deprecated average="):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    hvd.shutdown()
    with pytest.raises(ValueError, match="init"):
        hvd.rank()


@pytest.mark.mpi(min_size=1)
def test_distributed_optimizer_takes_horovods_compression_keyword(comm):
    """DistributedOptimizer(compression=hvd.Compression.fp16) is compressor="fp16"; both
    at once are refused."""
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   model.named_parameters(), compression=hvd.Compression.fp16)
    ok = opt.compressor is not None and opt.compressor.spec().startswith("fp16")
    opt.close()
    with pytest.raises(TypeError, match="not both"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 compression=hvd.Compression.fp16, compressor="sign")
    plain = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     compression=hvd.Compression.none)
    ok &= plain.compressor is None
    plain.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_no_public_name_is_shadowed_by_a_submodule(comm):
    """Every submodule of ringcomp and ringcomp.torch imported, each public name is still
    what it names, not a module of the same name (hvd.broadcast was the module
    broadcast.py once broadcast_parameters had imported it)."""
    import importlib
    import pkgutil
    import types

    import ringcomp

    shadowed = []
    for package in (ringcomp, hvd):
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
        shadowed += [f"{package.__name__}.{name}" for name in package.__all__
                     if isinstance(getattr(package, name), types.ModuleType)]
    assert every_rank(comm, not shadowed), shadowed
