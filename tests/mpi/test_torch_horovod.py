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
def test_horovod_grouped_allreduce_and_what_is_built(comm):
    """grouped_allreduce is allreduce of each tensor (Horovod's
    test_horovod_grouped_allreduce); MPI is built, NCCL and Gloo are not."""
    xs = [_tensor(torch.float64, (n,), comm.rank) for n in (3, 17, 40)]
    got = hvd.grouped_allreduce(xs, op=hvd.Sum)
    ok = all(np.array_equal(g.numpy(), comm.allreduce(x.numpy(), op=MPI.SUM))
             for g, x in zip(got, xs, strict=True))
    ok &= hvd.mpi_built() and not hvd.nccl_built() and not hvd.gloo_built()
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
    """Adasum and process sets are Horovod's: refused with what to do, not imitated; a
    call before init() says to call it."""
    x = torch.ones(4)
    with pytest.raises(ValueError, match="Adasum"):
        hvd.allreduce(x, op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="all-to-all"):
        hvd.alltoall(x)
    with pytest.raises(ValueError, match="process sets"):
        hvd.allreduce(x, process_set=object())
    # every Horovod name is there: what ringcomp lacks raises saying what to do instead
    # (23 of Horovod's names raised AttributeError)
    for call, error, needle in (
            (lambda: hvd.ProcessSet([0]), ValueError, "process sets"),
            (lambda: hvd.add_process_set([0]), ValueError, "process sets"),
            (lambda: hvd.remove_process_set(None), ValueError, "process sets"),
            (lambda: hvd.alltoall_async(x), NotImplementedError, "all-to-all"),
            (lambda: hvd.sparse_allreduce_async(x), NotImplementedError, "dense"),
            (lambda: hvd.elastic.run, NotImplementedError, "elastic training")):
        with pytest.raises(error, match=needle):
            call()
    # the global set is every rank, what ringcomp's calls run on: a call may name it
    assert every_rank(comm, torch.equal(
        hvd.allreduce(x, op=hvd.Sum, process_set=hvd.global_process_set), x * comm.size))
    with pytest.raises(ValueError, match="op= or the deprecated average="):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    hvd.shutdown()
    with pytest.raises(ValueError, match="init"):
        hvd.rank()
    with pytest.raises(ValueError, match="init"):
        hvd.join()


@pytest.mark.mpi(min_size=1)
def test_distributed_optimizer_takes_horovods_compression_keyword(comm):
    """DistributedOptimizer(compression=hvd.Compression.fp16) is compressor="fp16"; both
    at once are refused."""
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   model.named_parameters(), compression=hvd.Compression.fp16)
    # every tensor in fp16, as Horovod's (ringcomp's own default leaves small ones exact)
    ok = opt.compressor is not None and opt.compressor.spec().startswith("fp16")
    ok &= opt.options.small_tensor == 0
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


# -- join: ranks out of data add zeros ------------------------------------------------------
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("first_join_rank", [0, 1])
@pytest.mark.parametrize("caching", [False, True])
def test_horovod_join_allreduce(comm, dtype, first_join_rank, caching):
    """The first joiner adds zeros to the others' all-reduces (synchronous and
    asynchronous, two tensors at once): their average is the sum of the live ranks'
    tensors over size(); join() returns the last joiner on every rank."""
    first = first_join_rank % comm.size
    op = hvd.Average if dtype.is_floating_point else hvd.Sum
    a = _tensor(dtype, (5, 5), 0)  # every rank the same, as Horovod's test
    b = _tensor(dtype, (17,), 1)
    if caching:  # every rank live: the plain result first
        ha, hb = hvd.allreduce_async(a, op=op), hvd.allreduce_async(b, op=op)
        hvd.synchronize(ha), hvd.synchronize(hb)
    ok = True
    if comm.rank == first:
        last = hvd.join()
    else:
        if caching:
            ha, hb = hvd.allreduce_async(a, op=op), hvd.allreduce_async(b, op=op)
            got_a, got_b = hvd.synchronize(ha), hvd.synchronize(hb)
        else:
            got_a, got_b = hvd.allreduce(a, op=op), hvd.allreduce(b, op=op)
        live = comm.size - 1
        for got, x in ((got_a, a), (got_b, b)):
            want = x * live / comm.size if op == hvd.Average else x * live
            ok &= torch.allclose(got, want.to(dtype), rtol=1e-6, atol=0) and got.dtype == dtype
        last = hvd.join()
    # every rank but the first joins in the same round: the highest of them is "last"
    want_last = first if comm.size == 1 else max(r for r in range(comm.size) if r != first)
    assert every_rank(comm, ok and last == want_last), (last, want_last)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("call", ["allgather", "broadcast", "broadcast_object", "min",
                                  "broadcast_parameters"])
def test_horovod_join_allgather_and_broadcast_raise(comm, call):
    """Calls a joined rank cannot add zeros to raise on every live rank (Horovod's
    test_horovod_join_allgather / _broadcast), which then join too; nothing hangs."""
    tensor = torch.ones(17, 17)
    if comm.rank == 0:
        last = hvd.join()
        assert every_rank(comm, last == comm.size - 1)
        return
    calls = {"allgather": lambda: hvd.allgather(tensor),
             "broadcast": lambda: hvd.broadcast(tensor, 1),
             "broadcast_object": lambda: hvd.broadcast_object("x", 1),
             "min": lambda: hvd.allreduce(tensor, op=hvd.Min),
             "broadcast_parameters": lambda: hvd.broadcast_parameters(
                 torch.nn.Linear(2, 2).state_dict(), root_rank=1)}
    with pytest.raises(RuntimeError, match="in join"):
        calls[call]()
    last = hvd.join()
    assert every_rank(comm, last == comm.size - 1)


def _uneven_run(comm, compression=None, batches=lambda r: 2 + r):
    """Rank r trains on ``batches(r)`` batches of its own data, then joins; returns
    (model, optimizer, the rank join() named, the reference parameters: each step's
    gradient the sum of the live ranks' own over size(), computed here alone)."""
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    reference = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   model.named_parameters(), compression=compression)

    def batch(rank, step):
        g = torch.Generator().manual_seed(1000 * rank + step)
        return torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)

    for step in range(batches(comm.rank)):
        opt.zero_grad()
        x, y = batch(comm.rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    last = hvd.join()
    # the reference: one process, every rank's batches, zeros from ranks out of data
    ref = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    with torch.no_grad():
        for p, r in zip(ref.parameters(), reference, strict=True):
            p.copy_(r)
    for step in range(max(batches(r) for r in range(comm.size))):
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for rank in range(comm.size):
            if step < batches(rank):
                ref.zero_grad()
                x, y = batch(rank, step)
                torch.nn.functional.mse_loss(ref(x), y).backward()
                for g, p in zip(grads, ref.parameters(), strict=True):
                    g += p.grad
        with torch.no_grad():
            for g, p in zip(grads, ref.parameters(), strict=True):
                p -= 0.1 * g / comm.size
    return model, opt, last, list(ref.parameters())


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compression", [None, "fp16"])
def test_distributed_optimizer_with_uneven_batches_and_join(comm, compression):
    """Rank r has 2 + r batches: each joins when out of data and adds zero gradients to
    the others' steps; join() names the highest rank (the last out of data), whose
    parameters equal the single-process reference; broadcast from it, every rank has
    them."""
    model, opt, last, reference = _uneven_run(comm, compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    hvd.broadcast_optimizer_state(opt, root_rank=last)  # the recipe docs/torch.md gives
    tol = 1e-6 if compression is None else 2e-3
    ok = last == comm.size - 1 and all(
        torch.allclose(p, r, atol=tol, rtol=0)
        for p, r in zip(model.parameters(), reference, strict=True))
    steps = opt.steps
    opt.close()
    assert every_rank(comm, ok and steps == comm.size + 1), (last, steps)


@pytest.mark.mpi(min_size=2)
def test_join_refuses_what_it_cannot_mirror(comm):
    """A step with a compressor whose zeros do not arrive as zeros (sign) runs to its end
    and raises on the live ranks while a rank is joined (which then join too), leaving
    their parameters as they were; a join() called between backward and step raises on
    every rank."""
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   model.named_parameters(), compressor="sign")
    x = torch.ones(3, 4)
    if comm.rank == 0:
        hvd.join()
    else:
        model(x).sum().backward()
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(RuntimeError, match="in hvd.join"):
            opt.step()
        unchanged = all(torch.equal(p, b)
                        for p, b in zip(model.parameters(), before, strict=True))
        hvd.join()
    opt.close()
    assert every_rank(comm, comm.rank == 0 or unchanged)
    exact = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     model.named_parameters())
    exact.zero_grad()
    model(x).sum().backward()
    if comm.rank == 0:
        with pytest.raises(RuntimeError, match="between backward"):
            hvd.join()
    else:
        with pytest.raises(RuntimeError, match="could not take part"):
            exact.step()
    exact.discard()
    exact.close()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mine,theirs", [
    ({"op": hvd.Average}, {"op": hvd.Sum}),
    ({"prescale_factor": 2.0}, {"prescale_factor": 1.0}),
    ({"postscale_factor": 0.5}, {}),
])
def test_horovod_op_and_scale_factors_are_agreed(comm, mine, theirs):
    """Average is a sum divided on each rank, and the scale factors are applied on each
    rank: called with Average on one rank and Sum on another (or other factors), every
    rank used to get a result - different ones - without a word. Now they are agreed
    beside the call's arguments: ArgumentMismatchError on every rank, naming them."""
    from ringcomp.errors import ArgumentMismatchError

    kwargs = mine if comm.rank == 0 else theirs
    try:
        hvd.allreduce(torch.ones(8), **kwargs)
        text = None
    except ArgumentMismatchError as exc:
        text = str(exc)
    texts = comm.allgather(text)
    assert all(t is not None and "options:" in t for t in texts), texts
    assert every_rank(comm, torch.equal(hvd.allreduce(torch.ones(8), op=hvd.Sum),
                                        torch.full((8,), float(comm.size))))


@pytest.mark.mpi(min_size=2)
def test_horovod_broadcast_object_root_is_agreed(comm):
    """A root_rank that differs between ranks used to give each rank its own object; now
    it is refused on every rank, as is a root out of range; the same root works."""
    from ringcomp.errors import ArgumentMismatchError

    for root, error in ((comm.rank, ArgumentMismatchError), (comm.size, ValueError)):
        with pytest.raises(error, match="root_rank"):
            hvd.broadcast_object({"rank": comm.rank}, root_rank=root)
    got = hvd.broadcast_object({"rank": comm.rank}, root_rank=comm.size - 1)
    assert every_rank(comm, got == {"rank": comm.size - 1})


@pytest.mark.mpi(min_size=2)
def test_horovod_node_layout_is_local_after_init_and_barrier_waits_for_all(comm):
    """After init() the node layout is answered locally: one rank asking alone (Horovod's
    scripts do, e.g. to pick a GPU on rank 0's log line only) gets it at once, where it
    used to wait out the deadline for the others' collective. barrier() returns once every
    rank called it."""
    import time

    if comm.rank == 0:
        layout = (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
        assert layout[1] >= 1 and layout[3] >= 1
    late = comm.rank == comm.size - 1
    if late:
        time.sleep(0.5)
    t0 = time.perf_counter()
    hvd.barrier()
    waited = time.perf_counter() - t0
    assert every_rank(comm, late or waited > 0.3)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kwargs,scale", [({}, "average"), ({"op": hvd.Average}, "average"),
                                          ({"op": hvd.Sum}, "sum"),
                                          ({"gradient_predivide_factor": 4.0}, "average")])
def test_distributed_optimizer_takes_horovods_op_and_predivide_factor(comm, kwargs, scale):
    """Horovod's three PyTorch examples pass op= and gradient_predivide_factor=; they
    used to be refused. op=Average (the default) leaves the mean of the ranks'
    gradients, op=Sum their sum, and a predivide factor f divides by f before the
    all-reduce and multiplies by f / size after: the mean again (against mpi4py's
    Allreduce of the same gradients)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   model.named_parameters(), **kwargs)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(comm.rank))
    model(x).square().sum().backward()
    mine = [p.grad.detach().clone().numpy() for p in model.parameters()]
    opt.synchronize()
    ok = True
    for p, local in zip(model.parameters(), mine, strict=True):
        total = np.empty_like(local)
        comm.Allreduce(local, total)
        want = total / comm.size if scale == "average" else total
        ok &= np.allclose(p.grad.numpy(), want, rtol=1e-6, atol=1e-6)
    with opt.skip_synchronize():
        opt.step()
    opt.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kwargs,needle", [
    ({"op": hvd.Adasum}, "Adasum"), ({"op": hvd.Max}, "Average or Sum"),
    ({"gradient_predivide_factor": 0.0}, "finite number > 0"),
    ({"gradient_predivide_factor": float("nan")}, "finite number > 0"),
    ({"op": hvd.Sum, "gradient_predivide_factor": 2.0}, "only with op=Average")])
def test_distributed_optimizer_refuses_what_horovods_op_cannot_mean(comm, kwargs, needle):
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match=needle):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 model.named_parameters(), **kwargs)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_horovod_allreduce_grad(comm, dim):
    """Horovod's test: the gradient of a summed allreduce is the allreduce (sum) of the
    incoming gradient - ones times size (it used to be dropped: no grad at all)."""
    tensor = torch.randn(*([5] * dim), generator=torch.Generator().manual_seed(comm.rank))
    tensor.requires_grad_()
    summed = hvd.allreduce(tensor, average=False)
    summed.backward(torch.ones([5] * dim))
    want = np.ones([5] * dim) * comm.size
    assert every_rank(comm, tensor.grad is not None
                      and np.array_equal(tensor.grad.numpy(), want))


@pytest.mark.mpi(min_size=1)
def test_horovod_allreduce_average_grad(comm):
    tensor = torch.ones(7, requires_grad=True)
    hvd.allreduce(tensor).backward(torch.full((7,), 3.0))
    assert every_rank(comm, torch.allclose(tensor.grad, torch.full((7,), 3.0)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_horovod_allgather_grad(comm, dim):
    """Horovod's test: ranks gather tensors of 1..size rows; the incoming gradient of
    rank r's rows is r, the same on every rank; each rank's gradient is its own rows'
    gradient summed over the ranks: r * size."""
    rows = comm.rank + 1
    tensor = torch.ones([rows] + [4] * (dim - 1), requires_grad=True)
    gathered = hvd.allgather(tensor)
    grad_ys = torch.cat([torch.full([r + 1] + [4] * (dim - 1), float(r))
                         for r in range(comm.size)])
    gathered.backward(grad_ys)
    want = np.full([rows] + [4] * (dim - 1), float(comm.rank * comm.size))
    assert every_rank(comm, np.array_equal(tensor.grad.numpy(), want))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_horovod_broadcast_grad(comm, dim):
    """Horovod's test: the gradient of a broadcast is the incoming gradient summed over
    ranks on the root (ones times size), zero elsewhere."""
    root = comm.size - 1
    tensor = (torch.ones([5] * dim) * comm.rank).requires_grad_()
    broadcasted = hvd.broadcast(tensor, root)
    broadcasted.backward(torch.ones([5] * dim))
    want = np.ones([5] * dim) * (comm.size if comm.rank == root else 0)
    assert every_rank(comm, np.array_equal(tensor.grad.numpy(), want))
    assert every_rank(comm, np.array_equal(broadcasted.detach().numpy(),
                                           np.full([5] * dim, float(root))))


@pytest.mark.mpi(min_size=1)
def test_horovod_bfloat16(comm):
    """bfloat16 (which NumPy lacks; its .numpy() used to fail): summed in float32 and
    rounded back, gathered and broadcast bit for bit."""
    x = torch.full((9,), 1.5 + comm.rank, dtype=torch.bfloat16)
    summed = hvd.allreduce(x, op=hvd.Sum)
    want = sum(1.5 + r for r in range(comm.size))
    ok = summed.dtype == torch.bfloat16 and torch.equal(
        summed, torch.full((9,), want, dtype=torch.float32).to(torch.bfloat16))
    gathered = hvd.allgather(x[:2].clone())
    ok &= gathered.dtype == torch.bfloat16 and torch.equal(
        gathered, torch.cat([torch.full((2,), 1.5 + r).to(torch.bfloat16)
                             for r in range(comm.size)]))
    ok &= torch.equal(hvd.broadcast(x, 0), torch.full((9,), 1.5).to(torch.bfloat16))
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_horovod_names_are_agreed_and_calls_of_other_names_refused(comm):
    """Two same-shaped asynchronous all-reduces named "a" and "b", made in another order
    on each rank, used to be silently swapped (calls pair up in the order made). Horovod
    pairs them by name; ringcomp refuses such a pair on every rank (at synchronize); made
    in the same order, each gets its own sum."""
    from ringcomp.errors import ArgumentMismatchError

    a, b = torch.full((6,), 1.0), torch.full((6,), 100.0)
    order = [("a", a), ("b", b)] if comm.rank == 0 else [("b", b), ("a", a)]
    handles = [hvd.allreduce_async(t, name=name, op=hvd.Sum) for name, t in order]
    raised = []
    for handle in handles:
        try:
            hvd.synchronize(handle)
        except ArgumentMismatchError as exc:
            raised.append("name (hashed)" in str(exc))
    ok = raised == [True, True]
    got = [hvd.synchronize(hvd.allreduce_async(t, name=n, op=hvd.Sum))
           for n, t in (("a", a), ("b", b))]
    ok &= torch.equal(got[0], a * comm.size) and torch.equal(got[1], b * comm.size)
    assert every_rank(comm, ok), raised


@pytest.mark.mpi(min_size=2)
def test_horovod_join_mirrors_scale_factors_and_names(comm):
    """A joined rank's zeros take part in a live call with scale factors and a name:
    the factors and the name travel with the announcement, so the joined rank's call is
    agreed as the live ranks' (with the factors agreed, it was refused)."""
    first = 0
    x = torch.full((9,), 2.0)
    ok = True
    if comm.rank == first:
        hvd.join()
    else:
        got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5,
                            name="scaled")
        ok = torch.allclose(got, torch.full((9,), 2.0 * 3.0 * 0.5 * (comm.size - 1)))
        hvd.join()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dims", [(6, 3), (4, 3, 5), (2, 3, 4, 4)])
def test_sync_batchnorm_is_batchnorm_of_the_global_batch(comm, dims):
    """hvd.SyncBatchNorm (it raised AttributeError): each rank normalises its shard (of
    its own length) with the statistics of every rank's rows together - the outputs,
    running statistics and gradients of one torch BatchNorm over the concatenated batch
    (a loss summed over ranks)."""
    def shard(r):
        return torch.randn((r + 2, *dims[1:]), generator=torch.Generator().manual_seed(r),
                           dtype=torch.float64)

    layer_type = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}
    whole = torch.cat([shard(r) for r in range(comm.size)]).requires_grad_()
    plain = layer_type[len(dims)](3).double()
    ours = hvd.SyncBatchNorm(3).double()
    with torch.no_grad():
        for layer in (plain, ours):
            layer.weight.copy_(torch.tensor([0.5, 1.5, -2.0]))
            layer.bias.copy_(torch.tensor([0.1, 0.0, -0.3]))
    weights = torch.randn(whole.shape, generator=torch.Generator().manual_seed(99),
                          dtype=torch.float64)
    want = plain(whole)
    (want * weights).sum().backward()
    lo = sum(r + 2 for r in range(comm.rank))
    rows = slice(lo, lo + comm.rank + 2)
    mine = shard(comm.rank).requires_grad_()
    out = ours(mine)
    (out * weights[rows]).sum().backward()
    checks = {"out": torch.allclose(out, want[rows], atol=1e-10),
              "grad": torch.allclose(mine.grad, whole.grad[rows], atol=1e-10),
              "mean": torch.allclose(ours.running_mean, plain.running_mean, atol=1e-12),
              "var": torch.allclose(ours.running_var, plain.running_var, atol=1e-12),
              "weight": torch.allclose(hvd.allreduce(ours.weight.grad, op=hvd.Sum),
                                       plain.weight.grad, atol=1e-10)}
    ours.eval()
    checks["eval"] = torch.equal(ours(mine).detach(), torch.nn.functional.batch_norm(
        mine.detach(), ours.running_mean, ours.running_var, ours.weight, ours.bias,
        False, 0.0, ours.eps).detach())
    assert every_rank(comm, all(checks.values())), checks


@pytest.mark.mpi(min_size=2)
def test_horovod_timeline_records_every_hop_of_the_calls_between(comm, mpi_tmp_path):
    """start_timeline / stop_timeline (they raised AttributeError) record ringcomp's hops
    of every call on tensors between them: rank 0 writes a Chrome trace at the file
    named, with each call's op and hops on every rank's track; calls after the stop are
    not recorded; Horovod's mark_cycles is refused (nothing to mark)."""
    import json

    path = str(mpi_tmp_path / "timeline.json")
    with pytest.raises(ValueError, match="mark_cycles"):
        hvd.start_timeline(path, mark_cycles=True)
    # where the timeline cannot be written it is refused at the start, not at the stop
    blocked = mpi_tmp_path / "a-file"
    if comm.rank == 0:
        blocked.write_text("")
    comm.Barrier()
    with pytest.raises(OSError):
        hvd.start_timeline(str(blocked / "timeline.json"))
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(100))
    hvd.allgather(torch.ones(3, 2))
    hvd.broadcast(torch.ones(7), 0)
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(5))
    ok = True
    if comm.rank == 0:
        with open(path) as f:
            trace = json.load(f)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        names = {e.get("name", "") for e in events}
        tracks = {e.get("tid") for e in events if e.get("ph") == "X"}  # a track per rank
        ok = ("allreduce[ring] 400 B" in names and "broadcast[tree] 28 B" in names
              and any(n.startswith("allgather[") for n in names) and len(tracks) == comm.size)
        ok &= "allreduce[ring] 20 B" not in names  # the call after the stop
    assert every_rank(comm, ok)
    assert every_rank(comm, hvd.mpi_threads_supported() and hvd.mpi_enabled()
                      and not hvd.gloo_enabled() and hvd.is_homogeneous())


@pytest.mark.mpi(min_size=1)
def test_horovod_timeline_records_the_optimizers_buckets(comm, mpi_tmp_path):
    """A timeline records the buckets of every DistributedOptimizer without a tracer of
    its own - one made before start_timeline and one made after - for the steps between
    start and stop only (Horovod's timeline is where its users see their gradients'
    all-reduces); the steps give the parameters an untraced twin gets."""
    import json

    def step(model, opt, seed):
        opt.zero_grad()
        x = torch.randn(4, model.in_features, generator=torch.Generator().manual_seed(seed))
        model(x).sum().backward()
        opt.step()

    def made(inputs, outputs):
        torch.manual_seed(0)
        model = torch.nn.Linear(inputs, outputs)  # 33 and 12 float32 parameters
        return model, hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               named_parameters=model.named_parameters())

    path = str(mpi_tmp_path / "timeline.json")
    first, first_opt = made(10, 3)
    twin, twin_opt = made(10, 3)
    step(first, first_opt, comm.rank)
    hvd.start_timeline(path)
    second, second_opt = made(5, 2)
    for seed in (1, 2):
        step(first, first_opt, comm.rank + seed)
    step(second, second_opt, comm.rank)
    hvd.stop_timeline()
    step(first, first_opt, comm.rank + 3)
    step(second, second_opt, comm.rank)
    for seed in (0, 1, 2, 3):
        step(twin, twin_opt, comm.rank + seed)
    ok = all(torch.equal(a, b) for a, b in zip(first.parameters(), twin.parameters(),
                                                 strict=True))
    for opt in (first_opt, second_opt, twin_opt):
        opt.close()
    if comm.rank == 0:
        with open(path) as f:
            trace = json.load(f)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        calls = [e["name"] for e in events if e.get("ph") == "X" and e.get("tid") == 0
                 and e["name"].startswith("allreduce[")]
        ok &= sorted(calls) == ["allreduce[ring] 132 B"] * 2 + ["allreduce[ring] 48 B"]
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_a_timeline_skips_an_optimizer_whose_engine_a_finished_run_closed(comm, mpi_tmp_path):
    """``ringcomp.train --model torch:...`` closes its optimizer's reducer (engine) when the
    run ends, not the DistributedOptimizer: a timeline started after such a run in the
    same process raised "the communication engine was closed" (found when the torch
    training tests ran before this file)."""
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    opt.reducer.close()  # what ringcomp.runner does when a torch job ends
    hvd.start_timeline(str(mpi_tmp_path / "timeline.json"))
    hvd.allreduce(torch.ones(3))
    hvd.stop_timeline()
    opt.close()
    assert every_rank(comm, True)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("rows", [1, 5, 8])
def test_horovod_reducescatter_and_its_grad(comm, rows):
    """hvd.reducescatter (it raised AttributeError): rank r gets its rows of the
    reduction (Average by default; the first rows % size ranks a row more), against
    mpi4py's Allreduce; its gradient is Horovod's - the incoming gradients gathered
    (divided by size for Average)."""
    x = torch.randn(rows, 3, generator=torch.Generator().manual_seed(comm.rank),
                    dtype=torch.float64).requires_grad_()
    mine = hvd.reducescatter(x)
    total = np.empty((rows, 3))
    comm.Allreduce(x.detach().numpy(), total)
    share, extra = divmod(rows, comm.size)
    lo = comm.rank * share + min(comm.rank, extra)
    hi = lo + share + (comm.rank < extra)
    ok = np.allclose(mine.detach().numpy(), total[lo:hi] / comm.size)
    mine.backward(torch.full(mine.shape, float(comm.rank + 1), dtype=torch.float64))
    grad_rows = np.concatenate([np.full((divmod(rows, comm.size)[0] + (r < extra), 3),
                                        (r + 1) / comm.size) for r in range(comm.size)])
    ok &= np.allclose(x.grad.numpy(), grad_rows)
    summed = hvd.reducescatter(x.detach(), op=hvd.Sum)
    ok &= np.allclose(summed.numpy(), total[lo:hi])
    later = hvd.synchronize(hvd.reducescatter_async(x.detach(), op=hvd.Sum, name="rs"))
    ok &= np.allclose(later.numpy(), total[lo:hi])
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_horovod_grouped_calls(comm):
    """grouped_allreduce_, grouped_allreduce_async(_), grouped_allgather (they raised
    AttributeError): each tensor's own call, in order; one handle for an async group."""
    tensors = [torch.full((4,), 1.0 + comm.rank), torch.full((2, 2), 10.0)]
    want = [torch.full((4,), sum(1.0 + r for r in range(comm.size))),
            torch.full((2, 2), 10.0 * comm.size)]
    got = hvd.synchronize(hvd.grouped_allreduce_async(tensors, op=hvd.Sum, name="g"))
    ok = all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    inplace = [t.clone() for t in tensors]
    hvd.grouped_allreduce_(inplace, op=hvd.Sum)
    ok &= all(torch.equal(g, w) for g, w in zip(inplace, want, strict=True))
    again = [t.clone() for t in tensors]
    ok &= hvd.synchronize(hvd.grouped_allreduce_async_(again, op=hvd.Sum)) is not None
    ok &= all(torch.equal(g, w) for g, w in zip(again, want, strict=True))
    gathered = hvd.grouped_allgather([torch.ones(1, 2) * comm.rank])
    ok &= gathered[0].shape == (comm.size, 2)
    assert every_rank(comm, ok)
