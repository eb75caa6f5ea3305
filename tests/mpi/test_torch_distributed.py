"""``dist.init_process_group("ringcomp")``: torch's collectives against MPI's, DDP against one
process on the global batch, what is not served refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank
from mpi4py import MPI

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import ringcomp.torch.distributed  # noqa: E402, F401 - registers the backend

DTYPES = [torch.float32, torch.float64, torch.float16, torch.int32, torch.int64]
#: torch's op, MPI's, and the op's result on integers 1..size (float16's exact range)
OPS = [(dist.ReduceOp.SUM, MPI.SUM), (dist.ReduceOp.MAX, MPI.MAX), (dist.ReduceOp.MIN, MPI.MIN),
       (dist.ReduceOp.PRODUCT, MPI.PROD)]


@pytest.fixture(scope="module", autouse=True)
def ringcomp_group():
    """The default group, on the backend's own rendezvous (no MASTER_ADDR); a gloo group
    an earlier file left (``test_torch.py``'s) is destroyed first, and made again by the
    later files' fixtures that need it."""
    import os

    assert "MASTER_ADDR" not in os.environ
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("ringcomp")
    yield
    dist.destroy_process_group()


def data(rank: int, n: int, dtype) -> torch.Tensor:
    # small integers: every sum, product, max and min exact in every dtype, so the
    # results can be compared bit for bit with MPI's
    values = (np.arange(n) * 7 + 3 * rank) % 5 + 1
    return torch.from_numpy(values).to(dtype)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op,mpi_op", OPS, ids=["sum", "max", "min", "product"])
def test_all_reduce_in_place_equals_mpis_allreduce(comm, dtype, op, mpi_op):
    n = 1000 + comm.size
    x = data(comm.rank, n, dtype)
    expected = np.empty(n, np.float64)
    comm.Allreduce(x.double().numpy(), expected, op=mpi_op)
    returned = dist.all_reduce(x, op=op)
    assert returned is None and dist.get_backend() == "ringcomp"
    assert every_rank(comm, np.array_equal(x.double().numpy(), expected))


def simple_reduce_tests(rank: int, world_size: int) -> list:
    """PyTorch's own table of reduce cases for a backend (test/distributed/test_c10d_gloo.py,
    ``simple_reduce_tests``): (op, this rank's input, the expected result)."""
    import math
    import operator
    from functools import reduce

    tests = [(dist.ReduceOp.SUM, torch.tensor([rank + 1.0]),
              torch.tensor([float(world_size * (world_size + 1) / 2)])),
             (dist.ReduceOp.PRODUCT, torch.tensor([rank + 1.0]),
              torch.tensor([float(math.factorial(world_size))])),
             (dist.ReduceOp.MIN, torch.tensor([rank + 1.0]), torch.tensor([1.0])),
             (dist.ReduceOp.MAX, torch.tensor([rank + 1.0]), torch.tensor([float(world_size)]))]
    for i in range(4):
        tests.append((dist.ReduceOp.BAND, torch.tensor([rank | (1 << i)], dtype=torch.int32),
                      torch.tensor([1 << i], dtype=torch.int32)))
    for op, fold in ((dist.ReduceOp.BOR, operator.or_), (dist.ReduceOp.BXOR, operator.xor)):
        for i in range(1, 5):
            tests.append((op, torch.tensor([reduce(fold, [rank * i + j for j in range(i)])],
                                           dtype=torch.int32),
                          torch.tensor([reduce(fold, range(world_size * i))],
                                       dtype=torch.int32)))
    return tests


@pytest.mark.mpi(min_size=1)
def test_pytorchs_own_reduce_table_on_all_reduce_and_reduce(comm):
    """Every case of PyTorch's backend table (the bitwise ops too: MPI's own Allreduce
    serves them), through all_reduce and through reduce to every root; a bitwise
    reduce_scatter_tensor against MPI's Reduce_scatter_block; bitwise ops on floats are
    refused by name."""
    ok = True
    for op, mine, expected in simple_reduce_tests(comm.rank, comm.size):
        x = mine.clone()
        dist.all_reduce(x, op=op)
        ok &= torch.equal(x, expected)
        for root in range(comm.size):
            y = mine.clone()
            dist.reduce(y, dst=root, op=op)
            ok &= torch.equal(y, expected if comm.rank == root else mine)
    mixed = torch.tensor([comm.rank * 7 + j for j in range(3 * comm.size)], dtype=torch.int32)
    block, expected_block = torch.empty(3, dtype=torch.int32), np.empty(3, np.int32)
    dist.reduce_scatter_tensor(block, mixed, op=dist.ReduceOp.BOR)
    comm.Reduce_scatter_block(mixed.numpy(), expected_block, op=MPI.BOR)
    ok &= np.array_equal(block.numpy(), expected_block)
    with pytest.raises(dist.DistBackendError, match="BXOR of torch.float32"):
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BXOR)
    if comm.size > 1:  # MPI's own call would take mismatched lengths: refused everywhere
        with pytest.raises(dist.DistBackendError,
                           match="all_reduce: ranks passed different tensors for a bitwise"):
            dist.all_reduce(torch.ones(2 + (comm.rank == 0), dtype=torch.int32),
                            op=dist.ReduceOp.BOR)
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_all_reduce_avg_and_its_async_work(comm):
    x = data(comm.rank, 37, torch.float64)
    expected = np.empty(37)
    comm.Allreduce(x.numpy(), expected)
    work = dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True)
    assert work.wait() and work.is_completed()
    assert work.get_future().wait()[0] is x
    assert every_rank(comm, np.allclose(x.numpy(), expected / comm.size, rtol=0, atol=1e-12))


@pytest.mark.mpi(min_size=1)
def test_async_calls_run_in_call_order_and_a_failure_reaches_its_wait(comm):
    """Ten async all_reduces and a broadcast in flight at once, waited for in reverse: each
    result is its own (the group's thread runs them in call order, as every rank made
    them); a call that fails on one rank raises at its ``wait`` on every rank, and the
    calls queued after it still run."""
    works, xs = [], []
    for i in range(10):
        xs.append(torch.full((1000 + i,), float(comm.rank + i)))
        works.append(dist.all_reduce(xs[-1], async_op=True))
    root = torch.arange(5.0) * (comm.rank + 1)
    works.append(dist.broadcast(root, src=comm.size - 1, async_op=True))
    ok = all(w.wait() for w in reversed(works)) and all(w.is_completed() for w in works)
    total = comm.size * (comm.size - 1) / 2
    ok &= all(torch.equal(x, torch.full((1000 + i,), total + comm.size * i))
              for i, x in enumerate(xs))
    ok &= torch.equal(root, torch.arange(5.0) * comm.size)
    ok &= works[0].get_future().wait()[0] is xs[0]
    bad = torch.ones(3, dtype=torch.bfloat16 if comm.rank == 0 else torch.float32)
    failing = dist.all_reduce(bad, async_op=True)
    after = torch.ones(4)
    later = dist.all_reduce(after, async_op=True)
    with pytest.raises(dist.DistBackendError, match="rank 0: .*bfloat16"):
        failing.wait()
    ok &= not failing.is_success() and later.wait() and later.is_success()
    assert every_rank(comm, ok and torch.equal(after, torch.full((4,), float(comm.size))))


@pytest.mark.mpi(min_size=2)
def test_isend_and_irecv_posted_before_either_is_waited_for(comm):
    """Every rank posts its receive from the left, then its send to the right, then waits:
    with blocking point-to-point every rank would wait in its receive forever."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    got = torch.empty(6, dtype=torch.float64)
    receiving = dist.irecv(got, left, tag=7)
    sending = dist.isend(torch.arange(6.0, dtype=torch.float64) + comm.rank, right, tag=7)
    ok = sending.wait() and receiving.wait() and receiving.is_completed()
    assert every_rank(comm, ok and torch.equal(got, torch.arange(6.0, dtype=torch.float64)
                                               + left))


@pytest.mark.mpi(min_size=1)
def test_broadcast_from_every_root(comm):
    for root in range(comm.size):
        x = torch.arange(11, dtype=torch.float32) * (comm.rank + 1)
        dist.broadcast(x, src=root)
        assert every_rank(comm, torch.equal(x, torch.arange(11, dtype=torch.float32)
                                            * (root + 1)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.filterwarnings("ignore:`torch.distributed.reduce_scatter_tensor` is deprecated")
@pytest.mark.parametrize("op,mpi_op", OPS, ids=["sum", "max", "min", "product"])
def test_reduce_scatter_both_forms_equal_mpis_reduce_scatter(comm, op, mpi_op):
    k = 5
    x = data(comm.rank, k * comm.size, torch.float64)
    expected = np.empty(k)
    comm.Reduce_scatter_block(x.numpy(), expected, op=mpi_op)
    out = torch.empty(k, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, x, op=op)
    listed = torch.empty(k, dtype=torch.float64)
    dist.reduce_scatter(listed, list(x.split(k)), op=op)
    assert every_rank(comm, np.array_equal(out.numpy(), expected)
                      and np.array_equal(listed.numpy(), expected))


@pytest.mark.mpi(min_size=2)
def test_send_and_recv_around_the_ring(comm):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    got = torch.empty(4, dtype=torch.int64)
    mine = torch.arange(4) + 10 * comm.rank
    if comm.rank % 2 == 0:
        dist.send(mine, right, tag=3)
        dist.recv(got, left, tag=3)
    else:
        dist.recv(got, left, tag=3)
        dist.send(mine, right, tag=3)
    assert every_rank(comm, torch.equal(got, torch.arange(4) + 10 * left))


@pytest.mark.mpi(min_size=1)
@pytest.mark.filterwarnings("ignore:`torch.distributed.all_gather_into_tensor` is deprecated")
def test_all_gather_and_into_one_tensor(comm):
    x = torch.full((2, 3), float(comm.rank))
    outs = [torch.empty(2, 3) for _ in range(comm.size)]
    dist.all_gather(outs, x)
    assert every_rank(comm, all(torch.equal(o, torch.full((2, 3), float(r)))
                                for r, o in enumerate(outs)))
    flat = torch.empty(comm.size * 2, 3)
    dist.all_gather_into_tensor(flat, x)
    assert every_rank(comm, torch.equal(flat, torch.cat(outs)))
    dist.barrier()


@pytest.mark.mpi(min_size=1)
def test_a_new_group_of_the_even_ranks_reduces_among_them_only(comm):
    """new_group(ranks) on a sub-communicator of those ranks (every rank calls new_group,
    as torch requires; the others get no group)."""
    evens = list(range(0, comm.size, 2))
    group = dist.new_group(evens)
    x = torch.full((3,), float(comm.rank + 1))
    if comm.rank in evens:
        dist.all_reduce(x, group=group)
        ok = torch.equal(x, torch.full((3,), float(sum(r + 1 for r in evens))))
        ok &= dist.get_rank(group) == evens.index(comm.rank)
    else:
        ok = group == dist.GroupMember.NON_GROUP_MEMBER
    assert every_rank(comm, ok)
    dist.destroy_process_group(group) if comm.rank in evens else None


@pytest.mark.mpi(min_size=2)
@pytest.mark.filterwarnings("ignore:`torch.distributed.reduce_scatter_tensor` is deprecated")
def test_a_bad_call_on_one_rank_is_refused_on_every_rank(comm):
    """A refusal on one rank only (its output list or input the wrong size) is raised on
    every rank before any enters the collective: the ranks stay in step (a rank that went
    on alone met the next call's messages and the job aborted)."""
    wrong = comm.rank == 0
    outs = [torch.empty(2) for _ in range(comm.size + wrong)]
    with pytest.raises(dist.DistBackendError, match="rank 0: .*output tensors for a group"):
        dist.all_gather(outs, torch.ones(2))
    with pytest.raises(dist.DistBackendError, match="rank 0: .*input elements for an output"):
        dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * comm.size + wrong))
    with pytest.raises(dist.DistBackendError, match="rank 0: .*dtype torch.bfloat16"):
        dist.all_reduce(torch.ones(3, dtype=torch.bfloat16 if wrong else torch.float32))
    x = torch.ones(4)
    dist.all_reduce(x)
    assert every_rank(comm, torch.equal(x, torch.full((4,), float(comm.size))))


@pytest.mark.mpi(min_size=1)
@pytest.mark.filterwarnings("ignore:`torch.distributed.(all_gather_into|reduce_scatter)_tensor")
def test_a_gloo_group_on_the_same_store_gives_what_ringcomp_gives(comm):
    """The rendezvous without MASTER_ADDR hands torch a store every rank shares (a
    TCPStore at rank 0, its address sent over MPI), so a gloo group starts on it too (a
    store of each rank's own made gloo wait forever: the test's timeout would end it);
    every call both serve gives gloo's result on the same inputs: all_reduce (every op
    gloo has), broadcast, all_gather(_into_tensor), reduce_scatter_tensor, the even and
    uneven all_to_all_single, gather and scatter."""
    p, r = comm.size, comm.rank
    gloo = dist.new_group(list(range(p)), backend="gloo")
    results = {}
    for name, group in (("ringcomp", None), ("gloo", gloo)):
        got = []
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
                   dist.ReduceOp.MAX, dist.ReduceOp.BAND, dist.ReduceOp.BXOR):
            x = data(r, 301, torch.int32)
            dist.all_reduce(x, op=op, group=group)
            got.append(x)
        x = data(r, 7 * p, torch.float32)
        dist.broadcast(x, src=p - 1, group=group)
        rows = [torch.empty(7 * p) for _ in range(p)]
        dist.all_gather(rows, data(r, 7 * p, torch.float32), group=group)
        flat = torch.empty(7 * p * p)
        dist.all_gather_into_tensor(flat, data(r, 7 * p, torch.float32), group=group)
        block = torch.empty(7)
        dist.reduce_scatter_tensor(block, data(r, 7 * p, torch.float32), group=group)
        even = torch.empty(7 * p)
        dist.all_to_all_single(even, data(r, 7 * p, torch.float32), group=group)
        sends, receives = [(r + j) % 3 for j in range(p)], [(i + r) % 3 for i in range(p)]
        uneven = torch.empty(sum(receives))
        dist.all_to_all_single(uneven, data(r, sum(sends), torch.float32), receives, sends,
                               group=group)
        gathered = [torch.empty(5) for _ in range(p)] if r == 0 else None
        dist.gather(data(r, 5, torch.float32), gathered, dst=0, group=group)
        scattered = torch.empty(4)
        dist.scatter(scattered, [data(i, 4, torch.float32) for i in range(p)] if r == 0
                     else None, src=0, group=group)
        results[name] = got + [x, *rows, flat, block, even, uneven, scattered] + (
            gathered or [])
    same = all(torch.equal(a, b) for a, b in zip(results["ringcomp"], results["gloo"],
                                                 strict=True))
    assert every_rank(comm, same)
    dist.destroy_process_group(gloo)


@pytest.mark.mpi(min_size=1)
def test_the_environment_picks_the_algorithm_and_compression_is_refused(comm, monkeypatch):
    """RINGCOMP_ALGORITHM acts on the groups made after it is set; RINGCOMP_COMPRESSOR is
    refused (torch's collectives promise exact results), as is an unknown algorithm -
    nothing is silently ignored - on every rank when only rank 0's environment says so
    (the others would otherwise wait in the group's first call)."""
    monkeypatch.setenv("RINGCOMP_ALGORITHM", "ring")
    group = dist.new_group(list(range(comm.size)))
    x = torch.ones(10)
    dist.all_reduce(x, group=group)
    ok = group.algorithm == "ring" and torch.equal(x, torch.full((10,), float(comm.size)))
    for name, value, says in (("RINGCOMP_ALGORITHM", "bogus", "unknown"),
                              ("RINGCOMP_COMPRESSOR", "marsit", "exact results")):
        if comm.rank == 0:
            monkeypatch.setenv(name, value)
        with pytest.raises(dist.DistBackendError, match=f"rank 0: .*{says}"):
            dist.new_group(list(range(comm.size)))
        monkeypatch.setenv(name, "ring" if name == "RINGCOMP_ALGORITHM" else "none")
    assert every_rank(comm, ok)


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def train(net, rank: int, size: int, steps: int = 3, global_batch: bool = False):
    """``steps`` of SGD on this rank's 4 rows of each global batch (all of it with
    ``global_batch``: the one-process reference)."""
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(steps):
        batch = torch.randn(4 * size, 6, generator=g)
        opt.zero_grad()
        net(batch if global_batch else batch[4 * rank:4 * rank + 4]).pow(2).mean().backward()
        opt.step()
    return net


def close_to(params, reference) -> bool:
    return all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
               for a, b in zip(params, reference.parameters(), strict=True))


@pytest.mark.mpi(min_size=1)
def test_ddp_on_ringcomp_follows_one_process_on_the_global_batch(comm):
    """DDP over the backend (its default group, no process_group=) trains a model to the
    parameters one process reaches on the global batch. At 1-3 ranks, as the training
    files (``tests/run_suite.py``'s TRAINING_FILES): what DDP's result depends on past one
    even and one odd count is the collectives, which the tests above take to 5, and its
    optimizer's first import of torch._dynamo costs each rank ~2 s of CPU."""
    if comm.size > 3:
        pytest.skip("training at 1-3 ranks (the collectives above run at 1-5)")
    ddp = train(torch.nn.parallel.DistributedDataParallel(tiny_model()), comm.rank, comm.size)
    single = train(tiny_model(), comm.rank, comm.size, global_batch=True)
    assert every_rank(comm, close_to(ddp.module.parameters(), single))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("version", ["fully_shard", "FullyShardedDataParallel"])
def test_fsdp_on_ringcomp_follows_one_process_on_the_global_batch(comm, version):
    """FSDP, both torch's fully_shard (FSDP2: all_gather_into_tensor and
    reduce_scatter_tensor of the shards, coalesced) and FullyShardedDataParallel (FSDP1,
    on CPU with device_id=cpu), over the default ringcomp group: the gathered parameters
    after 3 steps are one process's on the global batch. At 1-3 ranks, as DDP's test."""
    if comm.size > 3:
        pytest.skip("training at 1-3 ranks (the collectives above run at 1-5)")
    from torch.distributed import fsdp

    if version == "fully_shard":
        net = tiny_model()
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fsdp.fully_shard(layer)
        train(fsdp.fully_shard(net), comm.rank, comm.size)
        params = [p.full_tensor() for p in net.parameters()]
    else:
        net = train(fsdp.FullyShardedDataParallel(tiny_model(), use_orig_params=True,
                                                  device_id=torch.device("cpu")),
                    comm.rank, comm.size)
        with fsdp.FullyShardedDataParallel.summon_full_params(net):
            params = [p.detach().clone() for p in net.parameters()]
    single = train(tiny_model(), comm.rank, comm.size, global_batch=True)
    assert every_rank(comm, close_to(params, single))


@pytest.mark.mpi(min_size=2)
def test_ddp_with_ringcomps_compressing_hook_needs_no_gloo(comm):
    """DDP on the ringcomp group with ringcomp_hook (sign + error feedback) - no gloo group
    in the job - trains every rank to the same parameters, the very ones DDP reaches with
    the same hook over a gloo group: the backend carries the compressed training."""
    if comm.size > 3:
        pytest.skip("training at 1-3 ranks (the collectives above run at 1-5)")
    from ringcomp.torch import HookState, ringcomp_hook

    def hooked(group):
        state = HookState(compressor="sign", error_feedback=True)
        net = torch.nn.parallel.DistributedDataParallel(tiny_model(), process_group=group)
        net.register_comm_hook(state, ringcomp_hook)
        train(net, comm.rank, comm.size, steps=4)
        state.close()
        return torch.cat([p.detach().reshape(-1) for p in net.parameters()])

    ours = hooked(None)
    gloo = dist.new_group(list(range(comm.size)), backend="gloo")
    theirs = hooked(gloo)
    dist.destroy_process_group(gloo)
    everyone = comm.allgather(ours.numpy())
    assert every_rank(comm, torch.equal(ours, theirs)
                      and all(np.array_equal(everyone[0], mine) for mine in everyone))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_all_to_all_single_even_and_uneven_equals_mpis_alltoallv(comm, dtype):
    """Rank i sends (i + j) % 3 rows of 2 to rank j (some blocks empty) and, evenly, 3
    rows to every rank; the result is MPI's Alltoallv's on the same data."""
    p, r = comm.size, comm.rank
    sends = [(r + j) % 3 for j in range(p)]
    receives = [(i + r) % 3 for i in range(p)]
    x = data(r, 2 * sum(sends), dtype).reshape(-1, 2)
    expected = np.empty((sum(receives), 2), x.numpy().dtype)
    comm.Alltoallv([x.numpy(), [2 * s for s in sends]], [expected, [2 * n for n in receives]])
    out = torch.empty(sum(receives), 2, dtype=dtype)
    dist.all_to_all_single(out, x, output_split_sizes=receives, input_split_sizes=sends)
    even_in = data(r, 3 * p * 2, dtype).reshape(3 * p, 2)
    even_expected = np.empty_like(even_in.numpy())
    comm.Alltoall(even_in.numpy(), even_expected)
    even_out = torch.empty_like(even_in)
    dist.all_to_all_single(even_out, even_in)
    lists_out = [torch.empty(j + 1, dtype=dtype) for j in range(p)]
    dist.all_to_all(lists_out, [torch.full((r + 1,), float(j), dtype=dtype) for j in range(p)])
    assert every_rank(comm, np.array_equal(out.numpy(), expected)
                      and np.array_equal(even_out.numpy(), even_expected)
                      and all(torch.equal(t, torch.full((j + 1,), float(r), dtype=dtype))
                              for j, t in enumerate(lists_out)))


@pytest.mark.mpi(min_size=2)
def test_all_to_all_sizes_that_do_not_pair_are_refused_on_every_rank(comm):
    """Rank 0 expects one row more from rank 1 than rank 1 sends: every rank raises,
    naming both, before any message (the ranks stay in step: a call after works)."""
    p = comm.size
    receives = [1] * p
    receives[1] += comm.rank == 0
    with pytest.raises(dist.DistBackendError, match="rank 1 sends 1 elements to rank 0, "
                                                    "which expects 2"):
        dist.all_to_all_single(torch.empty(sum(receives)), torch.ones(p),
                               output_split_sizes=receives, input_split_sizes=[1] * p)
    with pytest.raises(dist.DistBackendError, match="split sizes"):
        dist.all_to_all_single(torch.empty(p), torch.ones(p), input_split_sizes=[p])
    out = torch.empty(p)
    dist.all_to_all_single(out, torch.full((p,), float(comm.rank)))
    assert every_rank(comm, torch.equal(out, torch.arange(p, dtype=torch.float32)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("op,mpi_op", OPS[:2], ids=["sum", "max"])
def test_reduce_gather_and_scatter_to_and_from_every_root(comm, op, mpi_op):
    """For each root: reduce gives the root MPI's Reduce and leaves the others' tensors
    as they were; gather collects every rank's tensor in rank order on the root; scatter
    hands rank i the root's i-th tensor."""
    p, r = comm.size, comm.rank
    ok = True
    for root in range(p):
        x = data(r, 23, torch.float64)
        before = x.clone()
        expected = np.empty(23)
        comm.Allreduce(x.numpy(), expected, op=mpi_op)
        dist.reduce(x, dst=root, op=op)
        ok &= np.array_equal(x.numpy(), expected) if r == root else torch.equal(x, before)
        listed = [torch.empty(2, 3) for _ in range(p)] if r == root else None
        dist.gather(torch.full((2, 3), float(r)), listed, dst=root)
        if r == root:
            ok &= all(torch.equal(t, torch.full((2, 3), float(i))) for i, t in enumerate(listed))
        got = torch.empty(4, dtype=torch.int32)
        parts = [torch.arange(4, dtype=torch.int32) + 10 * i for i in range(p)]
        dist.scatter(got, parts if r == root else None, src=root)
        ok &= torch.equal(got, torch.arange(4, dtype=torch.int32) + 10 * r)
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_torchs_object_collectives_and_coalesced_calls(comm):
    """torch's own helpers over the backend's calls: all_gather_object (uneven pickles,
    padded by torch), broadcast_object_list, gather_object; and the coalescing manager's
    fast path (all_reduce, all_gather_into_tensor, reduce_scatter_tensor coalesced)."""
    p, r = comm.size, comm.rank
    objects = [None] * p
    dist.all_gather_object(objects, {"rank": r, "pad": "x" * r})
    shipped = [{"from": "root", "n": 7}] if r == 0 else [None]
    dist.broadcast_object_list(shipped, src=0)
    gathered = [None] * p if r == p - 1 else None
    dist.gather_object(r * r, gathered, dst=p - 1)
    ok = objects == [{"rank": i, "pad": "x" * i} for i in range(p)]
    ok &= shipped == [{"from": "root", "n": 7}]
    ok &= gathered == [i * i for i in range(p)] if r == p - 1 else gathered is None
    a, b = torch.full((3,), float(r)), torch.full((5,), float(r + 1))
    into = [torch.empty(3 * p), torch.empty(5 * p)]
    scattered = [torch.empty(2), torch.empty(1)]
    with dist._coalescing_manager():
        dist.all_reduce(a)
        dist.all_reduce(b)
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(into[0], torch.full((3,), float(r)))
        dist.all_gather_into_tensor(into[1], torch.full((5,), float(r)))
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(scattered[0], torch.ones(2 * p))
        dist.reduce_scatter_tensor(scattered[1], torch.ones(p))
    total = p * (p - 1) / 2
    ok &= torch.equal(a, torch.full((3,), total)) and torch.equal(b, torch.full((5,), total + p))
    ok &= all(torch.equal(t, torch.arange(p, dtype=torch.float32).repeat_interleave(n))
              for t, n in zip(into, (3, 5), strict=True))
    ok &= all(torch.equal(t, torch.full((n,), float(p))) for t, n in zip(scattered, (2, 1),
                                                                         strict=True))
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
@pytest.mark.filterwarnings("ignore:`torch.distributed.reduce_scatter_tensor` is deprecated")
def test_what_is_not_served_is_refused_by_name(comm):
    out = torch.empty(3)
    if comm.size > 1:  # a receive from any source (needs a peer to be meaningful)
        with pytest.raises(dist.DistBackendError, match="recv from any source: not served"):
            dist.recv(torch.empty(1))
    if comm.size > 1:  # (at one rank an input as long as the output is right)
        with pytest.raises(dist.DistBackendError, match="3 input elements for an output"):
            dist.reduce_scatter_tensor(out, torch.ones(3))
    with pytest.raises(dist.DistBackendError, match="dtype torch.bfloat16"):
        dist.all_reduce(torch.ones(3, dtype=torch.bfloat16))
    with pytest.raises(dist.DistBackendError, match="non-contiguous"):
        dist.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(dist.DistBackendError, match="AVG of torch.int64"):
        dist.all_reduce(torch.ones(3, dtype=torch.int64), op=dist.ReduceOp.AVG)
    # nothing was left half-done: a call after the refusals still works
    x = torch.ones(5)
    dist.all_reduce(x)
    assert every_rank(comm, torch.equal(x, torch.full((5,), float(comm.size))))
