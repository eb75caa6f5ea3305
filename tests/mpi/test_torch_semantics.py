"""ringcomp.torch against the semantics Horovod's DistributedOptimizer taught PyTorch users:
misused loops refused (never a stale gradient), synchronize/skip_synchronize, close, state
dicts through torch.save, and Horovod's own optimizer tests ported (origin named on each:
horovod/horovod test/parallel/test_torch.py).

Oracles: a run without the misuse, one process taking the whole global batch, every rank's
parameters compared byte for byte, an uninterrupted run (resume).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from conftest import every_rank

torch = pytest.importorskip("torch")
from test_torch import (  # noqa: E402
    BATCH,
    data,
    distributed,
    flat,
    follows_one_process,
    identical,
    local_step,
    net,
    resumed_equals_whole,
)

import ringcomp.torch as rt  # noqa: E402

F = torch.nn.functional


def loss_of(model, x, y, rank: int, step: int, ranks: int):
    lo = (step * ranks + rank) * BATCH
    return F.cross_entropy(model(x[lo:lo + BATCH]), y[lo:lo + BATCH])


# -- misused loops: refused on the rank that misused, never a stale gradient ------------
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("passes", [1, 2])
def test_more_backward_passes_than_declared_are_refused(comm, passes):
    """Horovod's AssertionError "Gradients were computed more than backward_passes_per_step
    times": one pass too many used to leave the first passes' average in p.grad without a
    word. Only rank 0 misuses: it alone raises; stepping on, every rank applies the same
    averaged gradient (the extra pass is not in it) and nobody waits for a deadline."""
    x, y = data(2, comm.size)
    model, opt = distributed(comm, bucket_mb=0.001, backward_passes_per_step=passes)
    clean, clean_opt = distributed(comm, bucket_mb=0.001, backward_passes_per_step=passes)
    raised = ""
    for m, o, extra in ((model, opt, comm.rank == 0), (clean, clean_opt, False)):
        o.zero_grad()
        for _ in range(passes):
            (loss_of(m, x, y, comm.rank, 0, comm.size) / passes).backward()
        if extra:
            try:
                loss_of(m, x, y, comm.rank, 0, comm.size).backward()
            except RuntimeError as exc:
                raised = str(exc)
        o.step()
    for o in (opt, clean_opt):
        o.close()
    told = (f"more than backward_passes_per_step={passes}" in raised
            and "raise backward_passes_per_step" in raised) if comm.rank == 0 else not raised
    assert every_rank(comm, told), raised
    assert every_rank(comm, np.array_equal(flat(model), flat(clean)) and identical(comm, model))


@pytest.mark.mpi(min_size=1)
def test_zero_grad_between_backward_and_step_is_refused(comm):
    """Horovod: "zero_grad() ... prohibited as it can cause a race condition". It used to
    zero the buffer while the buckets were on their way, and the step applied the stale
    average. Refused (the gradients untouched), the step that follows is the clean one."""
    x, y = data(1, comm.size)
    model, opt = distributed(comm, bucket_mb=0.001)
    clean, clean_opt = distributed(comm, bucket_mb=0.001)
    for m, o in ((model, opt), (clean, clean_opt)):
        o.zero_grad()
        loss_of(m, x, y, comm.rank, 0, comm.size).backward()
    with pytest.raises(RuntimeError, match=r"zero_grad\(\) after backward\(\)"):
        opt.zero_grad()
    for o in (opt, clean_opt):
        o.step()
        o.zero_grad()  # after step: fine
        o.close()
    assert every_rank(comm, np.array_equal(flat(model), flat(clean)))


@pytest.mark.mpi(min_size=1)
def test_a_backward_after_synchronize_is_refused(comm):
    """After synchronize() p.grad holds the average; a backward before step() would be
    added to it locally and never all-reduced. Refused before autograd adds anything
    (rank 0 misuses, alone): the step the message recommends, inside
    skip_synchronize(), is the clean run's step on every rank (it used to apply rank 0's
    gradient added to the average, and the ranks diverged). torch.autograd.grad, which
    writes no p.grad, is not refused."""
    x, y = data(1, comm.size)
    model, opt = distributed(comm, bucket_mb=0.001)
    clean, clean_opt = distributed(comm, bucket_mb=0.001)
    raised = ""
    for m, o, misuse in ((model, opt, comm.rank == 0), (clean, clean_opt, False)):
        o.zero_grad()
        loss_of(m, x, y, comm.rank, 0, comm.size).backward()
        o.synchronize()
        torch.autograd.grad(loss_of(m, x, y, comm.rank, 0, comm.size), list(m.parameters()))
        if misuse:
            try:
                loss_of(m, x, y, comm.rank, 0, comm.size).backward()
            except RuntimeError as exc:
                raised = str(exc)
        with o.skip_synchronize():
            o.step()
    for o in (opt, clean_opt):
        o.close()
    told = "after synchronize() and before step()" in raised if comm.rank == 0 else not raised
    assert every_rank(comm, told), raised
    assert every_rank(comm, np.array_equal(flat(model), flat(clean)) and identical(comm, model))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("options", [
    {"compressor": "sign", "error_feedback": True},
    {"compressor": "topk:ratio=0.1", "error_feedback": True, "algorithm": "tree"},
])
def test_step_after_synchronize_warns_and_reduces_once(comm, options):
    """Horovod's test_synchronize_step_warning: step() after synchronize() outside
    skip_synchronize() warns and steps on the synchronized gradient. It used to all-reduce
    again: compressed twice, the residual updated twice, the step count (which keys the
    random streams) advanced twice."""
    x, y = data(3, comm.size)
    runs = []
    for wrapped in (False, True):
        model, opt = distributed(comm, small_tensor=64, bucket_mb=0.002, **options)
        caught = []
        for step in range(3):
            opt.zero_grad()
            loss_of(model, x, y, comm.rank, step, comm.size).backward()
            opt.synchronize()
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                if wrapped:
                    with opt.skip_synchronize():
                        opt.step()
                else:
                    opt.step()
            caught += [str(w.message) for w in seen]
        runs.append((flat(model), opt.steps, opt.state_dict()["ringcomp"]["feedback"], caught))
        opt.close()
    (bare, bare_steps, bare_ef, bare_warn), (ok, ok_steps, ok_ef, ok_warn) = runs
    same_ef = bare_ef.keys() == ok_ef.keys() and all(torch.equal(bare_ef[k], ok_ef[k])
                                                     for k in ok_ef)
    assert every_rank(comm, np.array_equal(bare, ok) and bare_steps == ok_steps == 3
                      and same_ef and not ok_warn and len(bare_warn) == 3
                      and "skip_synchronize" in bare_warn[0])


@pytest.mark.mpi(min_size=1)
def test_step_inside_skip_synchronize_without_synchronize_is_refused(comm):
    """The gradients are not averaged yet (buckets may still be on their way)."""
    x, y = data(1, comm.size)
    model, opt = distributed(comm)
    opt.zero_grad()
    loss_of(model, x, y, comm.rank, 0, comm.size).backward()
    with pytest.raises(RuntimeError, match="without synchronize"), opt.skip_synchronize():
        opt.step()
    opt.step()  # the right way still works after the refusal
    opt.close()
    assert every_rank(comm, identical(comm, model))


@pytest.mark.mpi(min_size=1)
def test_a_closed_optimizer_refuses_at_once(comm):
    """step() after close() used to wait for an engine that had stopped, on every rank,
    for ever (no deadline fires in a Future's wait)."""
    x, y = data(1, comm.size)
    model, opt = distributed(comm)
    opt.close()
    opt.close()  # twice is fine
    opt.zero_grad()
    loss_of(model, x, y, comm.rank, 0, comm.size).backward()
    for call in (opt.step, opt.synchronize, opt.discard):
        with pytest.raises(RuntimeError, match="closed DistributedOptimizer"):
            call()
    with pytest.raises(RuntimeError, match="engine was closed"):
        opt.reducer.engine.submit(np.ones(3, np.float32), step=0, bucket=0, compressed=False)


@pytest.mark.mpi(min_size=1)
def test_writes_after_a_bucket_left_never_reach_its_all_reduce(comm):
    """One tensor per bucket (a one-piece bucket used to travel as a view of the live
    buffer): whatever writes into p.grad once its bucket has left cannot change the
    all-reduce, whatever the timing. Written here right after backward, every time."""
    torch.manual_seed(0)
    results = []
    for scribble in (False, True):
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 3))
        opt = rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), comm=comm, bucket_mb=0)
        model.load_state_dict(net_state(model))
        g = torch.Generator().manual_seed(comm.rank)
        opt.zero_grad()
        model(torch.randn(8, 256, generator=g)).sum().backward()
        if scribble:
            with torch.no_grad():
                for p in model.parameters():
                    p.grad.fill_(1e6)
        opt.step()
        opt.close()
        results.append(flat(model))
    assert every_rank(comm, np.array_equal(results[0], results[1]))


def net_state(model) -> dict:
    """The same initial weights for every instance of a model's shape."""
    torch.manual_seed(5)
    return {k: torch.randn_like(v) * 0.05 for k, v in model.state_dict().items()}


@pytest.mark.mpi(min_size=1)
def test_duplicate_names_are_refused(comm):
    """Horovod's test_duplicate_names: names in named_parameters must be unique (a
    ValueError on every rank)."""
    a, b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    named = list(a.named_parameters()) + list(b.named_parameters())
    with pytest.raises(ValueError, match="duplicates: weight, bias"):
        rt.DistributedOptimizer(torch.optim.SGD(list(a.parameters()) + list(b.parameters()),
                                                lr=0.1), named, comm=comm)


@pytest.mark.mpi(min_size=1)
def test_named_parameters_left_out_or_missing(comm):
    """Horovod's test_no_named_parameters (names by position, trains) and
    test_missing_named_parameters (naming half the parameters is a ValueError)."""
    model = net()
    with pytest.raises(ValueError, match="named_parameters lacks"):
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                list(model.named_parameters())[:1], comm=comm)
    opt = rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=comm)
    x, y = data(1, comm.size)
    local_step(model, opt, x, y, comm.rank, 0, comm.size)
    opt.close()
    assert every_rank(comm, identical(comm, model))


# -- state dicts: torch.save / torch.load, and refused mismatches --------------------------
def through_torch_save(state: dict) -> dict:
    """``state`` written by torch.save and read back by torch.load's defaults
    (weights_only=True: tensors and plain values only)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("options", [
    {"compressor": "sign", "error_feedback": True},
    {"compressor": "powersgd", "error_feedback": True},
    {"compressor": "sign", "algorithm": "twostage", "error_feedback": True},
])
def test_state_dicts_through_torch_save_resume_bit_identically(comm, options):
    """Horovod's test_broadcast_state saves and loads with torch.save/torch.load. Error
    feedback's residuals and PowerSGD's warm start were NumPy arrays, which torch.load's
    default (weights_only=True) refuses; they are CPU tensors now."""
    resumed, same = resumed_equals_whole(comm, lambda seed: distributed(
        comm, seed=seed, small_tensor=64, bucket_mb=0.002, **options), steps=6, cut=3,
        through=through_torch_save)
    assert every_rank(comm, resumed and same)


@pytest.mark.mpi(min_size=1)
def test_marsit_state_through_torch_save_resumes_bit_identically(comm):
    def make(seed):
        model = net(seed)
        return model, rt.DistributedOptimizer(
            rt.Marsit(model.parameters(), lr=0.1, momentum=0.9), model.named_parameters(),
            comm=comm, compressor="marsit", small_tensor=64, bucket_mb=0.002)

    resumed, same = resumed_equals_whole(comm, make, steps=6, cut=3,
                                         through=through_torch_save)
    assert every_rank(comm, resumed and same)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("changed,needle", [
    ({"compressor": "topk:ratio=0.1"}, "compressor='sign' (now 'topk:ratio=0.1')"),
    ({"bucket_mb": 0.001}, "bucket_mb=0.002 (now 0.001)"),
    ({"error_feedback": False}, "error_feedback=True (now False)"),
    ({"warmup_steps": 2}, "warmup_steps=0 (now 2)"),
])
def test_a_state_saved_with_other_options_is_refused_naming_them(comm, changed, needle):
    """``train --resume`` refuses a checkpoint of other options; load_state_dict used to
    take any ringcomp state without a word."""
    x, y = data(1, comm.size)
    base = {"compressor": "sign", "error_feedback": True, "bucket_mb": 0.002}
    model, opt = distributed(comm, **base)
    local_step(model, opt, x, y, comm.rank, 0, comm.size)
    state = through_torch_save(opt.state_dict())
    other, other_opt = distributed(comm, **{**base, **changed})
    with pytest.raises(ValueError, match="saved with other options") as err:
        other_opt.load_state_dict(state)
    for o in (opt, other_opt):
        o.close()
    assert every_rank(comm, needle in str(err.value)), str(err.value)


@pytest.mark.mpi(min_size=2)
def test_another_ranks_residuals_are_refused_naming_the_recipe_that_works(comm):
    """Horovod's recipes - rank 0 saves and every rank loads its file, or
    ``broadcast_optimizer_state`` of a run under way - gave every rank rank 0's
    error-feedback residuals and resumed another trajectory without a word. Now: a rank
    loading another rank's residuals refuses, naming one file per rank (which resumes bit
    for bit: the tests above); the broadcast of a state holding them refuses on every
    rank; a broadcast at the start (nothing per rank yet), as Horovod's recipe does it,
    still works."""
    options = {"compressor": "topk:ratio=0.1", "error_feedback": True, "bucket_mb": 0.002,
               "small_tensor": 64}
    x, y = data(1, comm.size)
    model, opt = distributed(comm, **options)
    local_step(model, opt, x, y, comm.rank, 0, comm.size)
    rank0_file = comm.bcast(through_torch_save(opt.state_dict()) if comm.rank == 0 else None)
    _, other_opt = distributed(comm, **options)
    try:
        other_opt.load_state_dict(rank0_file)
        error = ""
    except ValueError as exc:
        error = str(exc)
    ok = (error == "" if comm.rank == 0 else
          "saved on rank 0" in error and "one file per rank" in error)
    with pytest.raises(ValueError, match="holds its own error-feedback residuals"):
        rt.broadcast_optimizer_state(opt, root_rank=0, comm=comm)
    _, fresh = distributed(comm, **options)
    rt.broadcast_optimizer_state(fresh, root_rank=0, comm=comm)
    for o in (opt, other_opt, fresh):
        o.close()
    assert every_rank(comm, ok), error


@pytest.mark.mpi(min_size=1)
def test_a_state_saved_by_another_number_of_ranks_is_refused(comm):
    """Residuals and compensation are per rank: a state of p ranks does not fit p+1."""
    model, opt = distributed(comm, compressor="sign", error_feedback=True)
    state = opt.state_dict()
    state["ringcomp"]["options"]["ranks"] = comm.size + 1
    with pytest.raises(ValueError, match=f"ranks={comm.size + 1} \\(now {comm.size}\\)"):
        opt.load_state_dict(state)
    opt.close()


# -- Horovod's optimizer tests, ported ----------------------------------------------------
#: every torch.optim class Horovod's tests loop over (all but LBFGS and SparseAdam, which
#: it does not support either); Muon updates 2-D matrices only, and the test model has
#: biases
OPTIMIZERS = sorted((c for c in torch.optim.Optimizer.__subclasses__()
                     if c.__module__.startswith("torch.optim")
                     and c.__name__ not in ("LBFGS", "SparseAdam", "Muon")),
                    key=lambda c: c.__name__)


def make_optimizer(cls, params, **hyper):
    """``cls`` over ``params`` with the hyper-parameters its constructor takes."""
    import inspect

    takes = inspect.signature(cls.__init__).parameters
    return cls(params, **{k: v for k, v in hyper.items() if k in takes})


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("cls", OPTIMIZERS, ids=lambda c: c.__name__)
def test_every_torch_optimizer_averages_and_steps_as_one_process(comm, cls):
    """Horovod's test_force_allreduce / test_broadcast_state loop over every torch.optim
    class: here each, wrapped, on p ranks follows the same class in one process fed the
    whole global batch, step after step, and keeps the ranks bit-identical."""
    assert len(OPTIMIZERS) >= 11
    p, steps = comm.size, 3
    x, y = data(steps, p)
    model, single = net(), net()
    hyper = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}
    opt = rt.DistributedOptimizer(make_optimizer(cls, model.parameters(), **hyper),
                                  model.named_parameters(), comm=comm, bucket_mb=0.001)
    # atol lr/1000: RMSprop divides by the root of tiny squared gradients, which turns the
    # rounding of a sum in another order into up to 6.5e-6 at 5 ranks (the others: <2e-7);
    # a sum instead of a mean, or a missed bucket, moves parameters by ~lr
    ok, same = follows_one_process(comm, model, opt, single,
                                   make_optimizer(cls, single.parameters(), **hyper), x, y,
                                   steps, atol=hyper["lr"] / 1000)
    assert every_rank(comm, ok) and every_rank(comm, same)


@pytest.mark.mpi(min_size=1)
def test_force_allreduce_with_parameters_unused_on_some_ranks(comm):
    """Horovod's test_force_allreduce: rank 0's loss uses one head, the others' another;
    the step completes on every rank (a parameter without a gradient is all-reduced as
    zeros) and the replicas stay identical."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = (torch.nn.Linear(8, 10), torch.nn.Linear(10, 3),
                                            torch.nn.Linear(3, 3))

        def forward(self, x):
            x1 = self.fc2(F.relu(self.fc1(x)))
            return x1, self.fc3(F.relu(x1))

    torch.manual_seed(0)
    model = Net()
    rt.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)
    opt = rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  model.named_parameters(), comm=comm, bucket_mb=0)
    x, y = data(2, comm.size)
    for step in range(2):
        out1, out2 = model(x[step * BATCH:(step + 1) * BATCH])
        opt.zero_grad()
        F.cross_entropy(out1 if comm.rank == 0 else out2,
                        y[step * BATCH:(step + 1) * BATCH]).backward()
        opt.step()
    opt.close()
    assert every_rank(comm, identical(comm, model))


@pytest.mark.mpi(min_size=1)
def test_dynamic_requires_grad_gan_style(comm):
    """Horovod's test_dynamic_requires_grad: two optimizers, a generator's and a
    discriminator's; each round freezes one side, so only the other's gradients are made
    and only its optimizer steps: the trained side's gradients are non-zero, the frozen
    side's zero. Replicas stay identical; the frozen side's optimizer has nothing in flight
    (zero_grad is allowed on it)."""
    torch.manual_seed(0)
    gen, disc = torch.nn.Linear(4, 6), torch.nn.Linear(6, 1)
    gen_opt = rt.DistributedOptimizer(torch.optim.SGD(gen.parameters(), lr=0.1),
                                      gen.named_parameters(), comm=comm)
    disc_opt = rt.DistributedOptimizer(torch.optim.SGD(disc.parameters(), lr=0.1),
                                       disc.named_parameters(), comm=comm)
    g, ok = torch.Generator().manual_seed(comm.rank), True
    for round_ in range(4):
        train_gen = round_ % 2 == 1
        for param in gen.parameters():
            param.requires_grad_(train_gen)
        for param in disc.parameters():
            param.requires_grad_(not train_gen)
        gen_opt.zero_grad()
        disc_opt.zero_grad()
        disc(gen(torch.randn(5, 4, generator=g))).sum().backward()
        for side, trained in ((gen, train_gen), (disc, not train_gen)):
            ok &= all(bool(param.grad.abs().max() > 0) == trained
                      for param in side.parameters())
        (gen_opt if train_gen else disc_opt).step()
    for o in (gen_opt, disc_opt):
        o.close()
    assert every_rank(comm, ok and identical(comm, gen) and identical(comm, disc))


@pytest.mark.mpi(min_size=1)
def test_gradient_clipping_between_synchronize_and_step(comm):
    """Horovod's test_gradient_clipping: synchronize(), clip, then step() inside
    skip_synchronize(): the step uses the clipped average (oracle: the same clip of the
    one-process gradient of the global batch)."""
    x, y = data(1, comm.size)
    model, opt = distributed(comm, momentum=0.0, bucket_mb=0.001)
    single = net()
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1)
    opt.zero_grad()
    loss_of(model, x, y, comm.rank, 0, comm.size).backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    with opt.skip_synchronize():
        opt.step()
    opt.close()
    F.cross_entropy(single(x[:comm.size * BATCH]), y[:comm.size * BATCH]).backward()
    torch.nn.utils.clip_grad_norm_(single.parameters(), 0.1)
    single_opt.step()
    assert every_rank(comm, np.allclose(flat(model), flat(single), rtol=1e-5, atol=1e-6))


@pytest.mark.mpi(min_size=1)
def test_broadcast_optimizer_state_with_options_differing_by_rank(comm):
    """Horovod's test_broadcast_state_options: every rank makes its optimizer with other
    hyper-parameters; after broadcast_optimizer_state every rank has rank 0's (their
    types too), for every torch.optim class, and - with rank 0's parameters - every rank's
    next step is the same."""
    ours = ({"lr": 0.1, "momentum": 0.8, "weight_decay": 0.2, "betas": (0.9, 0.999),
             "etas": (0.8, 2.4), "step_sizes": (1e-5, 100.0)} if comm.rank == 0 else
            {"lr": 0.2, "momentum": 0.9, "weight_decay": 0.1, "betas": (0.8, 0.9),
             "etas": (0.25, 1.75), "step_sizes": (1e-7, 5.0)})
    root = {"lr": 0.1, "momentum": 0.8, "weight_decay": 0.2, "betas": (0.9, 0.999),
            "etas": (0.8, 2.4), "step_sizes": (1e-5, 100.0)}
    x, y = data(2, comm.size)
    ok = True
    for cls in OPTIMIZERS:
        model = net()
        opt = rt.DistributedOptimizer(make_optimizer(cls, model.parameters(), **ours),
                                      model.named_parameters(), comm=comm)
        local_step(model, opt, x, y, comm.rank, 0, comm.size)  # ranks diverge: other lr
        rt.broadcast_optimizer_state(opt, root_rank=0, comm=comm)
        rt.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)
        group = opt.param_groups[0]
        for k, v in root.items():
            if k in group:
                got = group[k]
                ok &= type(got) is type(v) and np.allclose(got, v)
        local_step(model, opt, x, y, comm.rank, 1, comm.size)
        ok &= identical(comm, model)  # root's state (momenta included) everywhere
        opt.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
def test_broadcast_state_with_a_frozen_parameter(comm):
    """Horovod's test_broadcast_state_no_grad: a parameter that requires no gradient is
    left out of the all-reduce (its grad stays None) and broadcasts still work."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.index = torch.nn.Parameter(torch.tensor([1.0, 3.0]), requires_grad=False)
            self.b = torch.nn.Parameter(torch.rand(4))

        def forward(self, x):
            return torch.index_select(self.b, 0, self.index.long()) * x

    torch.manual_seed(comm.rank)
    model = Model()
    opt = rt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9,
                        nesterov=True), model.named_parameters(), comm=comm)
    rt.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)
    rt.broadcast_optimizer_state(opt, root_rank=0, comm=comm)
    opt.zero_grad()
    model(torch.ones(2)).sum().backward()
    opt.step()
    opt.close()
    assert every_rank(comm, model.index.grad is None and identical(comm, model))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("change", ["add_param_group", "unfreeze", "freeze"])
def test_parameters_changed_after_wrapping_are_refused_then_rebuilt(comm, change):
    """A head added with add_param_group, a layer unfrozen or frozen after wrapping: the
    step used to step the new parameters on each rank's own gradient (the ranks drifted
    apart without a word). Refused on every rank before anything of the step is
    accumulated into the flat buffer or sent; after opt.rebuild(...) the step all-reduces
    them and every rank's parameters equal one process on the global batch."""
    torch.manual_seed(3)
    body, head = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)
    model = torch.nn.Sequential(body, torch.nn.Tanh(), head)
    if change == "unfreeze":
        body.weight.requires_grad_(False)
    params = list(body.parameters()) + ([] if change == "add_param_group"
                                        else list(head.parameters()))  # frozen ones too
    opt = rt.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), comm=comm)
    rt.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)
    if change == "add_param_group":
        opt.add_param_group({"params": list(head.parameters())})
    elif change == "unfreeze":
        body.weight.requires_grad_(True)
    else:
        head.bias.requires_grad_(False)
    before = [p.detach().clone() for p in model.parameters()]
    g = torch.Generator().manual_seed(comm.rank)
    x, y = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)
    opt.zero_grad()
    with pytest.raises(RuntimeError, match="parameters changed after DistributedOptimizer"):
        F.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="opt.rebuild"):
        opt.step()  # a retry without rebuild() is refused again
    untouched = all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    opt.rebuild()
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    # the oracle: one process, every rank's batch, the same parameters trained
    reference = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    reference.load_state_dict(dict(zip(reference.state_dict(), before, strict=True)))
    trained = [q for q, p in zip(reference.parameters(), model.parameters(), strict=True)
               if p.requires_grad]
    xs, ys = zip(*(comm.allgather((x, y))), strict=True)
    for q in trained:
        q.grad = None
    sum(F.cross_entropy(reference(a), b) for a, b in zip(xs, ys, strict=True)).backward()
    with torch.no_grad():
        for q in trained:
            q -= 0.1 * q.grad / comm.size
    same = all(torch.allclose(p, q, atol=1e-6) for p, q in
               zip(model.parameters(), reference.parameters(), strict=True))
    opt.close()
    assert every_rank(comm, untouched and same and identical(comm, model))
