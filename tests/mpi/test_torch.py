"""ringcomp.torch: Horovod's DistributedOptimizer over ringcomp, on CPU tensors.

Oracles: one process taking the whole global batch (exact aggregation), every rank's
parameters compared byte for byte (replicas), an uninterrupted run (resume).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank

torch = pytest.importorskip("torch")
import ringcomp.torch as rt  # noqa: E402

BATCH = 4


def net(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 3))


def data(steps: int, ranks: int):
    g = torch.Generator().manual_seed(1)
    n = steps * ranks * BATCH
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def flat(model) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy()


def identical(comm, model) -> bool:
    return len(set(comm.allgather(flat(model).tobytes()))) == 1


def local_step(model, opt, x, y, rank: int, step: int, ranks: int, passes: int = 1):
    """This rank's share of global step ``step`` (batch ``BATCH`` split into ``passes``)."""
    lo = (step * ranks + rank) * BATCH
    where = next(model.parameters()).device
    opt.zero_grad()
    for part in range(passes):
        a = lo + part * BATCH // passes
        b = lo + (part + 1) * BATCH // passes
        out = model(x[a:b].to(where))
        loss = torch.nn.functional.cross_entropy(out, y[a:b].to(where)) * (b - a) / BATCH
        loss.backward()
    opt.step()


def resumed_equals_whole(comm, make, steps: int, cut: int,
                         through=lambda state: state) -> tuple[bool, bool]:
    """(after ``steps``, a run stopped at ``cut`` and continued from its model's and
    optimizer's state dicts in fresh objects made with another seed equals the
    uninterrupted run bit for bit; the uninterrupted run kept all ranks identical).
    ``through``: what the state dicts pass through on the way (e.g. torch.save/load)."""
    x, y = data(steps, comm.size)
    whole, whole_opt = make(0)
    same = True
    for step in range(steps):
        local_step(whole, whole_opt, x, y, comm.rank, step, comm.size)
        same &= identical(comm, whole)
    first, first_opt = make(0)
    for step in range(cut):
        local_step(first, first_opt, x, y, comm.rank, step, comm.size)
    again, again_opt = make(9)
    again.load_state_dict(through(first.state_dict()))
    again_opt.load_state_dict(through(first_opt.state_dict()))
    for step in range(cut, steps):
        local_step(again, again_opt, x, y, comm.rank, step, comm.size)
    for o in (whole_opt, first_opt, again_opt):
        o.close()
    return np.array_equal(flat(whole), flat(again)), same


def follows_one_process(comm, model, opt, single, single_opt, x, y, steps, passes=1,
                        atol=1e-6):
    """Step the distributed ``model`` and the one-process ``single`` (p times the batch)
    side by side: (parameters close after every step, identical on every rank after
    every step); ``opt`` closed."""
    p = comm.size
    ok = same = True
    for step in range(steps):
        local_step(model, opt, x, y, comm.rank, step, p, passes)
        lo, hi = step * p * BATCH, (step + 1) * p * BATCH
        single_opt.zero_grad()
        torch.nn.functional.cross_entropy(single(x[lo:hi]), y[lo:hi]).backward()
        single_opt.step()
        ok &= np.allclose(flat(model), flat(single), rtol=1e-5, atol=atol)
        same &= identical(comm, model)
    opt.close()
    return ok, same


def distributed(comm, seed=0, lr=0.1, momentum=0.9, device="cpu", **options):
    model = net(seed).to(device)
    opt = rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr,
                                                  momentum=momentum),
                                  model.named_parameters(), comm=comm, **options)
    return model, opt


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("options", [
    {"algorithm": "ring", "bucket_mb": 0.001},
    {"algorithm": "tree", "bucket_mb": 0},
    {"algorithm": "ring", "bucket_mb": "all"},
    {"algorithm": "rabenseifner", "bucket_mb": 0.001, "backward_passes_per_step": 2},
    {"algorithm": "torus", "bucket_mb": 0.001},
])
def test_p_ranks_follow_one_process_with_p_times_the_batch(comm, options):
    p, steps = comm.size, 6
    x, y = data(steps, p)
    model, opt = distributed(comm, **options)
    single = net()
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9)
    ok, same = follows_one_process(comm, model, opt, single, single_opt, x, y, steps,
                                   options.get("backward_passes_per_step", 1))
    assert every_rank(comm, ok) and every_rank(comm, same)


COMPRESSED = [
    {"compressor": "sign", "error_feedback": True},
    {"compressor": "qsgd", "algorithm": "torus"},
    {"compressor": "topk:ratio=0.1", "error_feedback": True},
    {"compressor": "qsgd", "algorithm": "tree"},
    {"compressor": "fp16"},
    {"compressor": "powersgd", "error_feedback": True},
    {"compressor": "countsketch:ratio=0.5", "error_feedback": True, "algorithm": "allgather"},
    {"compressor": "sign", "algorithm": "twostage", "error_feedback": True},
]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("options", COMPRESSED)
def test_every_compressor_keeps_ranks_bit_identical(comm, options):
    x, y = data(8, comm.size)
    model, opt = distributed(comm, small_tensor=64, bucket_mb=0.002, **options)
    ok = True
    for step in range(8):
        local_step(model, opt, x, y, comm.rank, step, comm.size)
        ok &= identical(comm, model) and bool(np.isfinite(flat(model)).all())
    assert any(b.compressed for b in opt.reducer.buckets)
    opt.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_rebucket_moves_residuals_with_their_elements_as_the_trainers_do(comm):
    """The DistributedOptimizer re-buckets through the same reducer as the NumPy trainer:
    each rank's error-feedback residuals follow their elements into the new buckets (one
    per tensor, then back), and training goes on identically on every rank."""
    from ringcomp.training.buckets import plan_buckets

    x, y = data(6, comm.size)
    model, opt = distributed(comm, compressor="topk:ratio=0.1", error_feedback=True,
                             small_tensor=64, bucket_mb=0.002)
    for step in range(3):
        local_step(model, opt, x, y, comm.rank, step, comm.size)
    before, old = opt.reducer.flat_residuals(opt.flat.size), opt.reducer.buckets
    opt.rebucket(plan_buckets(opt.flat.infos, 0, 64))
    ok = len(opt.reducer.buckets) != len(old) and np.array_equal(
        opt.reducer.flat_residuals(opt.flat.size), before) and bool(before.any())
    opt.rebucket(old)
    ok &= np.array_equal(opt.reducer.flat_residuals(opt.flat.size), before)
    for step in range(3, 6):
        local_step(model, opt, x, y, comm.rank, step, comm.size)
    ok &= identical(comm, model)
    opt.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("options", [COMPRESSED[1], COMPRESSED[4], COMPRESSED[6]])
def test_resume_from_state_dicts_is_bit_identical(comm, options):
    """Save model and optimizer state after 3 steps, load them into fresh objects: step 6
    equals an uninterrupted run's, bit for bit (residuals, warm start and the step count
    that keys the random streams all travel in the optimizer's state_dict)."""
    resumed, _ = resumed_equals_whole(comm, lambda seed: distributed(
        comm, seed=seed, small_tensor=64, bucket_mb=0.002, **options), steps=6, cut=3)
    assert every_rank(comm, resumed)


@pytest.mark.mpi(min_size=1)
def test_synchronize_leaves_the_mean_of_every_ranks_gradient_for_clipping(comm):
    """synchronize() then clip then step() inside skip_synchronize(): the gradients the
    clip sees are the mean over ranks (oracle: MPI's Allreduce of each rank's local
    gradients), and they are views of the flat buffer (zero copy)."""
    from mpi4py import MPI

    x, y = data(1, comm.size)
    model, opt = distributed(comm, bucket_mb=0.001)
    lo = comm.rank * BATCH
    local = torch.autograd.grad(torch.nn.functional.cross_entropy(
        model(x[lo:lo + BATCH]), y[lo:lo + BATCH]), list(model.parameters()))
    expected = [comm.allreduce(g.numpy(), op=MPI.SUM) / comm.size for g in local]
    opt.zero_grad(set_to_none=False)
    torch.nn.functional.cross_entropy(model(x[lo:lo + BATCH]), y[lo:lo + BATCH]).backward()
    opt.synchronize()
    got = [p.grad.numpy().copy() for p in model.parameters()]
    start = opt.flat.buffer.data_ptr()
    views = all(start <= p.grad.data_ptr() < start + 4 * opt.flat.size
                for p in model.parameters())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with opt.skip_synchronize():
        opt.step()
    same = identical(comm, model)
    opt.close()
    close = all(np.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(got, expected,
                                                                       strict=True))
    assert every_rank(comm, close and views and same)


@pytest.mark.mpi(min_size=2)
def test_differing_options_fail_on_every_rank_naming_them(comm):
    model = net()
    with pytest.raises(ValueError, match="compressor") as err:
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                model.named_parameters(), comm=comm,
                                compressor="sign" if comm.rank else "topk")
    assert "rank 0='topk'" in str(err.value)


@pytest.mark.mpi(min_size=2)
def test_a_compressor_object_is_used_as_given_and_agreed_by_its_spec(comm):
    """``compressor=`` takes a ``ringcomp.Compressor`` (as Horovod's ``compression=`` takes
    an object): the optimizer compresses with that very object, and ranks whose objects
    differ fail on every rank, named by their specs."""
    from ringcomp import get_compressor

    model = net()
    given = get_compressor("topk:ratio=0.1")
    opt = rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  model.named_parameters(), comm=comm, compressor=given,
                                  error_feedback=True)
    used = opt.compressor is given and opt.reducer.compressor is given
    used &= opt.options.compressor == "topk:ratio=0.1"
    opt.close()
    with pytest.raises(ValueError, match="compressor") as err:
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                model.named_parameters(), comm=comm,
                                compressor=get_compressor("topk:ratio=0.2" if comm.rank
                                                          else "topk:ratio=0.1"))
    assert "rank 0='topk:ratio=0.1'" in str(err.value)
    assert every_rank(comm, used)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("options,needle", [
    ({"compressor": "marsit"}, "Marsit optimizer"),
    ({"error_feedback": True}, "needs a compressor other than marsit"),
    ({"algorithm": "nope"}, "unknown algorithm"),
    ({"bucket_mb": -1}, "bucket_mb=-1"),
    ({"backward_passes_per_step": 0}, "backward_passes_per_step"),
    ({"compressor": "zip"}, "zip"),
    ({"torus": "1x1"}, "torus acts only with algorithm torus"),  # train's words
    ({"warmup_steps": 2}, "warmup_steps acts only with a compressor"),
    ({"compressor": "sign", "shadow": True}, "shadow acts only with tracer and a compressor"),
    ({"algorithm": "tree", "segment_bytes": 4096}, "segment_bytes acts only with an algorithm"),
    ({"algorithm": "torus", "torus": "7x7"}, "rows x columns must be"),
])
def test_meaningless_options_are_refused(comm, options, needle):
    model = net()
    with pytest.raises(ValueError, match=needle):
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                model.named_parameters(), comm=comm, **options)


@pytest.mark.mpi(min_size=1)
def test_unknown_option_and_non_float32_parameters_are_refused(comm):
    model = net()
    with pytest.raises(TypeError, match="bucket_size"):
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=comm,
                                bucket_size=4)
    model = net().double()
    with pytest.raises(ValueError, match="float32"):
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=comm)
    model = net().double() if comm.rank == comm.size - 1 else net()  # one rank differs
    with pytest.raises(ValueError, match=f"rank {comm.size - 1}: .*float32"):
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=comm)


@pytest.mark.mpi(min_size=2)
def test_broadcast_parameters_and_optimizer_state_from_the_root(comm):
    model = net(seed=comm.rank)  # different on every rank
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (comm.rank + 1), momentum=0.9)
    x, y = data(1, 1)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()  # momentum buffers now differ too
    rt.broadcast_parameters(model.state_dict(), root_rank=1, comm=comm)
    rt.broadcast_optimizer_state(opt, root_rank=1, comm=comm)
    momentum = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1)
                          for p in model.parameters()]).numpy()
    assert every_rank(comm, identical(comm, model))
    assert every_rank(comm, len(set(comm.allgather(momentum.tobytes()))) == 1)
    assert every_rank(comm, opt.param_groups[0]["lr"] == pytest.approx(0.2))


@pytest.mark.mpi(min_size=2)
def test_broadcast_of_different_models_fails_everywhere(comm):
    model = net() if comm.rank else torch.nn.Linear(8, 3)
    with pytest.raises(ValueError, match=r"ranks \[.*\] hold other tensors than rank 0"):
        rt.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)


def marsit(comm, seed=0, k=0, device="cpu", momentum=0.0, weight_decay=0.0, **options):
    model = net(seed).to(device)
    opt = rt.DistributedOptimizer(rt.Marsit(model.parameters(), lr=0.1, global_lr=0.01, k=k,
                                            momentum=momentum, weight_decay=weight_decay),
                                  model.named_parameters(), comm=comm, compressor="marsit",
                                  small_tensor=64, bucket_mb=0.002, **options)
    return model, opt


@pytest.mark.mpi(min_size=1)
def test_marsit_full_precision_rounds_are_torch_sgd_with_the_same_momentum_and_decay(comm):
    """Oracle: with k = 1 every round is full precision, x -= mean over ranks of
    lr·m_m; local momenta are linear in the gradients, so p ranks follow one process
    running torch.optim.SGD (same momentum and weight decay) on p times the batch."""
    p, steps = comm.size, 6
    x, y = data(steps, p)
    model, opt = marsit(comm, k=1, momentum=0.8, weight_decay=0.01)
    single = net()
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.8, weight_decay=0.01)
    ok, same = follows_one_process(comm, model, opt, single, single_opt, x, y, steps)
    assert every_rank(comm, ok) and every_rank(comm, same)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_marsit_moves_every_compressed_coordinate_by_the_global_step(comm, algorithm):
    """Step 0 (no compensation yet): every coordinate of a compressed tensor moves by
    exactly ±global_lr (the aggregated sign), small tensors by the mean of lr·g over ranks
    (oracle: MPI's Allreduce of each rank's local gradient)."""
    from mpi4py import MPI

    x, y = data(1, comm.size)
    model, opt = marsit(comm, algorithm=algorithm)
    before = [p.detach().clone() for p in model.parameters()]
    lo = comm.rank * BATCH
    local = torch.autograd.grad(torch.nn.functional.cross_entropy(
        model(x[lo:lo + BATCH]), y[lo:lo + BATCH]), list(model.parameters()))
    local_step(model, opt, x, y, comm.rank, 0, comm.size)
    ok = True
    for p, p0, g in zip(model.parameters(), before, local, strict=True):
        moved = (p0 - p.detach()).numpy()
        if p.numel() >= 64:  # compressed: ±0.01 exactly, up to float32 rounding of x
            ok &= bool(np.allclose(np.abs(moved), 0.01, rtol=1e-3))
        else:
            mean = comm.allreduce((0.1 * g).numpy(), op=MPI.SUM) / comm.size
            ok &= bool(np.allclose(moved, mean, rtol=1e-4, atol=1e-7))
    opt.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("k,momentum", [(0, 0.0), (3, 0.0), (0, 0.9)])
def test_marsit_keeps_ranks_identical_and_resumes_bit_identically(comm, k, momentum):
    resumed, same = resumed_equals_whole(comm, lambda seed: marsit(
        comm, seed=seed, k=k, momentum=momentum, weight_decay=1e-3 if momentum else 0.0),
                                         steps=8, cut=4)
    assert every_rank(comm, same)
    assert every_rank(comm, resumed)


@pytest.mark.mpi(min_size=1)
def test_marsit_is_refused_where_it_means_nothing(comm):
    model = net()
    with pytest.raises(ValueError, match="Marsit optimizer"):  # signs with SGD's update
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=comm,
                                compressor="marsit")
    with pytest.raises(ValueError, match="Marsit optimizer"):  # Marsit's update, exact sums
        rt.DistributedOptimizer(rt.Marsit(model.parameters(), lr=0.1), comm=comm)
    with pytest.raises(RuntimeError, match="DistributedOptimizer"):
        rt.Marsit(model.parameters(), lr=0.1).step()
    with pytest.raises(ValueError, match="one parameter group"):
        rt.Marsit([{"params": [model[0].weight]}, {"params": [model[0].bias]}], lr=0.1)
    for bad in ({"lr": 0}, {"lr": 0.1, "global_lr": float("nan")}, {"lr": 0.1, "k": -1},
                {"lr": 0.1, "momentum": 1.0}, {"lr": 0.1, "weight_decay": -1}):
        with pytest.raises(ValueError, match="Marsit"):
            rt.Marsit(model.parameters(), **bad)


@pytest.fixture
def gloo(comm):
    """torch.distributed's gloo group over the world (started once per process)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        rt.init_process_group(comm)
    assert dist.get_rank() == comm.rank and dist.get_world_size() == comm.size
    return dist


def ddp(model, state=None):
    wrapped = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.002)
    if state is not None:
        wrapped.register_comm_hook(state, rt.ringcomp_hook)
    return wrapped


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_ddp_hook_equals_ddps_own_allreduce_and_the_one_process_run(comm, gloo, algorithm):
    p, steps = comm.size, 5
    x, y = data(steps, p)
    state = rt.HookState(comm, algorithm=algorithm)
    ours, theirs, single = ddp(net(), state), ddp(net()), net()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
            for m in (ours, theirs, single)]
    ok = True
    for step in range(steps):
        for model, opt in zip((ours, theirs), opts, strict=False):
            local_step(model, opt, x, y, comm.rank, step, p)
        lo, hi = step * p * BATCH, (step + 1) * p * BATCH
        opts[2].zero_grad()
        torch.nn.functional.cross_entropy(single(x[lo:hi]), y[lo:hi]).backward()
        opts[2].step()
        ok &= np.allclose(flat(ours), flat(theirs), rtol=1e-5, atol=1e-6)
        ok &= np.allclose(flat(ours), flat(single), rtol=1e-5, atol=1e-6)
    same = identical(comm, ours)
    state.close()
    assert state.steps == steps
    assert every_rank(comm, ok and same)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("options", [{"compressor": "sign", "error_feedback": True},
                                     {"compressor": "qsgd", "algorithm": "allgather"}])
def test_ddp_hook_with_a_compressor_keeps_ranks_identical(comm, gloo, options):
    """... and its tracer records every bucket's hops, with their error in shadow mode."""
    from ringcomp.trace import Tracer

    x, y = data(6, comm.size)
    tracer = Tracer()
    state = rt.HookState(comm, tracer=tracer, shadow=True, **options)
    model = ddp(net(), state)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ok = True
    for step in range(6):
        local_step(model, opt, x, y, comm.rank, step, comm.size)
        ok &= identical(comm, model)
    state.close()
    kinds = {record.get("kind") for record in tracer.records}
    ok &= {"recv", "shadow"} <= kinds
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_hook_state_refuses_what_the_optimizer_refuses(comm):
    with pytest.raises(TypeError, match="bucket_mb"):
        rt.HookState(comm, bucket_mb=1)  # DDP buckets itself (bucket_cap_mb)
    with pytest.raises(ValueError, match="Marsit optimizer"):
        rt.HookState(comm, compressor="marsit")
