"""Training: the exact-aggregation oracle, identical ranks, resume, bad configurations."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
from conftest import every_rank
from mpi4py import MPI

from ringcomp.compression import ErrorFeedback
from ringcomp.models.replay import ReplayModel
from ringcomp.runner import run
from ringcomp.sched import Problem, make_plan
from ringcomp.training import checkpoint
from ringcomp.training.buckets import buckets_from_plan
from ringcomp.training.config import agree, parse
from ringcomp.training.trainer import NonFinite, Trainer
from ringcomp.transport.cache import get_transport
from ringcomp.version import __version__


def options(*extra, steps=6, batch=4):
    return parse(["--no-progress", "--steps", str(steps), "--batch-size", str(batch),
                  "--model", "mlp:32x16", *extra])


def digest(array) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def steps(trainer, count):
    for _ in range(count):
        trainer.train_step(trainer.step)
        trainer.step += 1


def follows_one_process(comm, trainer, single, count=8) -> tuple[bool, bool]:
    """Step ``trainer`` (p ranks) and ``single`` (one process, p times the batch) side by
    side: (parameters close after every step, identical on every rank after every step);
    both engines closed."""
    ok, same = True, True
    for _ in range(count):
        steps(trainer, 1)
        steps(single, 1)
        ok &= np.allclose(trainer.store.flat, single.store.flat, rtol=1e-4, atol=1e-5)
        same &= len(set(comm.allgather(digest(trainer.store.flat)))) == 1
    trainer.reducer.close()
    single.reducer.close()
    return ok, same


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("algorithm", ["ring", "tree", "twostage", "torus"])
def test_p_ranks_follow_one_process_with_p_times_the_batch(comm, algorithm):
    """Exact aggregation: p ranks with batch b take the steps one process takes with batch
    p·b (same global samples), up to summation-order rounding; ranks stay bit-identical."""
    p = comm.size
    trainer = Trainer(options("--algorithm", algorithm, "--bucket-mb", "0.002"),
                      get_transport())
    single = Trainer(options(batch=4 * p), get_transport(MPI.COMM_SELF))
    ok, same = follows_one_process(comm, trainer, single)
    assert len(trainer.reducer.buckets) > 2  # several buckets really overlapped
    assert every_rank(comm, ok) and every_rank(comm, same)


@pytest.mark.mpi(min_size=1)
def test_marsits_full_precision_rounds_are_sgd_with_the_same_momentum_and_weight_decay(comm):
    """Oracle: Marsit-K with K = 1 (every round full precision) applies the mean of the
    ranks' lr·m_m; local momenta are linear in the gradients, so p ranks must follow one
    process running SGD with the same momentum and weight decay on p times the batch."""
    p, knobs = comm.size, ("--momentum", "0.8", "--weight-decay", "0.01", "--lr", "0.05")
    trainer = Trainer(options("--compressor", "marsit", "--marsit-k", "1", *knobs),
                      get_transport())
    single = Trainer(options(*knobs, batch=4 * p), get_transport(MPI.COMM_SELF))
    ok, same = follows_one_process(comm, trainer, single)
    assert every_rank(comm, ok) and every_rank(comm, same)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("extra", [
    ("--compressor", "marsit"), ("--compressor", "sign"),
    ("--compressor", "marsit", "--momentum", "0.5", "--weight-decay", "1e-3"),
    ("--compressor", "topk:ratio=0.05", "--error-feedback"), ("--compressor", "qsgd"),
    ("--compressor", "fp16"), ("--compressor", "countsketch:ratio=0.5", "--error-feedback"),
    ("--compressor", "powersgd", "--error-feedback"),
    ("--compressor", "sign", "--algorithm", "allgather", "--error-feedback"),
    ("--compressor", "sign", "--algorithm", "twostage", "--error-feedback"),
    ("--compressor", "marsit", "--algorithm", "tree", "--marsit-k", "3"),
    ("--compressor", "marsit", "--algorithm", "torus"),
    ("--compressor", "sign", "--algorithm", "torus", "--error-feedback"),
])
def test_every_compressor_keeps_ranks_identical_and_learns(comm, extra):
    trainer = Trainer(options(*extra, "--small-tensor", "64"), get_transport())
    before = trainer.evaluate()
    ok = True
    for _ in range(12):
        steps(trainer, 1)
        ok &= len(set(comm.allgather(digest(trainer.store.flat)))) == 1
    loss = trainer.train_step(trainer.step)["loss"]
    trainer.reducer.close()
    assert every_rank(comm, ok)
    assert np.isfinite(loss) and any(b.compressed for b in trainer.reducer.buckets)
    if "countsketch" not in extra[1]:  # a sketch of a 3k-parameter model learns slowly
        assert trainer.evaluate() >= before or trainer.evaluate() > 0.3


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("extra", [
    ("--compressor", "marsit", "--warmup-steps", "2"),
    ("--compressor", "sign", "--error-feedback"),
    ("--compressor", "qsgd", "--error-feedback", "--segment-bytes", "256"),
])
def test_the_small_exact_bucket_rides_in_the_compressed_call_with_the_same_bits(
        comm, extra, monkeypatch, mpi_tmp_path):
    """The step's last bucket, exact and small (the biases), travels in the walk of the
    compressed ring before it: one collective a step instead of two (the trace's calls),
    and the parameters bit for bit those of the run that sends them apart, warm-up steps
    (nothing compressed: nothing rides) included."""
    from ringcomp.training import reducer

    def run_with(rider_bytes):
        monkeypatch.setattr(reducer, "RIDER_BYTES", rider_bytes)
        trace = str(mpi_tmp_path / f"trace{rider_bytes}")
        trainer = Trainer(options(*extra, "--trace", trace, steps=5), get_transport())
        steps(trainer, 5)
        trainer.reducer.close()
        carriers = [r for r in trainer.tracer.records if r["type"] == "op"]
        return digest(trainer.store.flat), carriers, trainer.reducer.buckets

    default = reducer.RIDER_BYTES
    apart, alone, buckets = run_with(-1)
    riding, carried, _ = run_with(default)
    assert [b.compressed for b in buckets] == [True, False]  # the model's two buckets
    warm = 2 if "--warmup-steps" in extra else 0
    assert every_rank(comm, apart == riding and len(alone) == 10
                      and len(carried) == 10 and len({r["t0"] for r in carried}) == 5 + warm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("extra", [
    ("--compressor", "topk:ratio=0.05", "--error-feedback", "--optimizer", "adam",
     "--lr", "0.01"),
    ("--compressor", "marsit", "--marsit-k", "4", "--weight-decay", "1e-3"),
    ("--compressor", "marsit", "--partition", "label-skew:0.3", "--algorithm", "torus"),
    ("--compressor", "powersgd", "--error-feedback"),
    ("--compressor", "sign", "--algorithm", "twostage", "--error-feedback"),
])
def test_resume_is_bit_identical(comm, mpi_tmp_path, extra):
    """Stop after a checkpoint at step 5, resume in a fresh trainer: the parameters after
    step 9 equal an uninterrupted run's, bit for bit."""
    ck = str(mpi_tmp_path / "ck")
    whole = Trainer(options(*extra, steps=9), get_transport())
    steps(whole, 9)
    first = Trainer(options(*extra, "--checkpoint-dir", ck, steps=9), get_transport())
    steps(first, 5)
    first.save()
    first.reducer.close()
    again = Trainer(options(*extra, "--checkpoint-dir", ck, "--resume", steps=9),
                    get_transport())
    assert again.restore() and again.step == 5
    steps(again, 4)
    ok = np.array_equal(whole.store.flat, again.store.flat)
    for t in (whole, again):
        t.reducer.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_resume_skips_a_checkpoint_corrupt_on_one_rank(comm, mpi_tmp_path, capsys):
    """The last rank's file of the newest checkpoint is truncated: every rank falls back to
    the older intact one (the same step everywhere), and rank 0 names the bad file."""
    ck = str(mpi_tmp_path / "ck-corrupt")
    first = Trainer(options("--checkpoint-dir", ck, steps=9), get_transport())
    steps(first, 3)
    first.save()
    kept = first.store.flat.copy()
    steps(first, 2)
    first.save()
    first.reducer.close()
    bad = f"{ck}/step-00000005/rank-{comm.size - 1:05d}.npz"
    if comm.rank == comm.size - 1:
        with open(bad, "r+b") as f:
            f.truncate(64)
    comm.Barrier()
    again = Trainer(options("--checkpoint-dir", ck, "--resume", steps=9), get_transport())
    assert again.restore()
    said = capsys.readouterr().err
    ok = again.step == 3 and np.array_equal(again.store.flat, kept)
    again.reducer.close()
    assert every_rank(comm, ok)
    if comm.rank == 0:
        assert bad in said and "step 3" in said


@pytest.mark.mpi(min_size=2)
def test_resume_refuses_other_options(comm, mpi_tmp_path):
    ck = str(mpi_tmp_path / "ck2")
    first = Trainer(options("--checkpoint-dir", ck), get_transport())
    steps(first, 2)
    first.save()
    first.reducer.close()
    other = Trainer(options("--checkpoint-dir", ck, "--lr", "0.5"), get_transport())
    with pytest.raises(ValueError, match="lr=0.1"):
        other.restore()
    other.reducer.close()


def written_before(comm, ck: str, option: str) -> None:
    """Make the checkpoint in ``ck`` one written before ``option`` existed: its manifest
    without it (rank 0 writes; every rank waits)."""
    if comm.rank == 0:
        [step] = [name for name in os.listdir(ck) if name.startswith("step-")]
        manifest = os.path.join(ck, step, checkpoint.MANIFEST)
        with open(manifest) as f:
            meta = json.load(f)
        del meta[option]
        with open(manifest, "w") as f:
            json.dump(meta, f)
    comm.Barrier()


@pytest.mark.mpi(min_size=1)
def test_a_checkpoint_from_before_an_option_existed_resumes_as_its_run_did(comm,
                                                                          mpi_tmp_path):
    """A checkpoint written before --eval-on existed has no eval_on: it used to be refused
    as "written with other options: eval_on=None". The option takes the value the old run
    had (its default, the test set): the run resumes; asking for another is refused."""
    ck = str(mpi_tmp_path / "ck-old")
    first = Trainer(options("--checkpoint-dir", ck), get_transport())
    steps(first, 2)
    first.save()
    first.reducer.close()
    written_before(comm, ck, "eval_on")
    again = Trainer(options("--checkpoint-dir", ck, "--resume"), get_transport())
    ok = again.restore() and again.step == 2
    again.reducer.close()
    other = Trainer(options("--checkpoint-dir", ck, "--resume", "--eval-on", "validation"),
                    get_transport())
    with pytest.raises(ValueError, match="eval_on='test' \\(now 'validation'\\)"):
        other.restore()
    other.reducer.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_the_test_set_is_the_data_seeds_not_the_runs(comm, mpi_tmp_path):
    """Runs of every --seed (a sweep's too) test on one set that none of them trains on;
    --data-seed moves the split. A checkpoint from before --data-seed (its data split by
    --seed) resumes only where that split is the same."""
    seeded = [Trainer(options("--seed", str(seed), *extra), get_transport())
              for seed, extra in ((0, ()), (7, ()), (7, ("--eval-on", "validation")),
                                  (7, ("--data-seed", "5")))]
    base, other, sweep, moved = (t.data for t in seeded)
    assert np.array_equal(base.x_test, other.x_test)
    held = {row.tobytes() for row in base.x_test}
    assert not held & {row.tobytes() for row in sweep.x_train}
    assert not held & {row.tobytes() for row in sweep.x_test}  # validation: from train only
    assert not np.array_equal(base.x_test, moved.x_test)
    for t in seeded:
        t.reducer.close()
    for seed, resumes in ((0, True), (3, False)):
        ck = str(mpi_tmp_path / f"ck-data-seed-{seed}")
        first = Trainer(options("--checkpoint-dir", ck, "--seed", str(seed)), get_transport())
        steps(first, 1)
        first.save()
        first.reducer.close()
        written_before(comm, ck, "data_seed")
        again = Trainer(options("--checkpoint-dir", ck, "--seed", str(seed)), get_transport())
        if resumes:
            assert again.restore()
        else:
            with pytest.raises(ValueError, match="data_seed"):
                again.restore()
        again.reducer.close()


@pytest.mark.mpi(min_size=2)
def test_differing_options_fail_everywhere_naming_them(comm):
    args = options("--lr", "0.1" if comm.rank else "0.2")
    with pytest.raises(ValueError, match=r"lr: rank 0=0.2, rank 1=0.1"):
        agree(get_transport(), args)


@pytest.mark.mpi(min_size=2)
def test_nonfinite_stops_everywhere_or_is_skipped(comm):
    for skip in (False, True):
        trainer = Trainer(options(*(["--skip-nonfinite"] if skip else [])), get_transport())
        if comm.rank == 1:
            trainer.store.flat[:] = np.nan  # only rank 1's model breaks
        if skip:
            before = trainer.store.flat.copy()
            record = trainer.train_step(0)
            assert every_rank(comm, record["skipped"] and np.array_equal(
                trainer.store.flat, before, equal_nan=True))
        else:
            with pytest.raises(NonFinite, match="step 0: the loss is NaN or Inf"):
                trainer.train_step(0)
        trainer.reducer.close()


@pytest.mark.mpi(min_size=1)
def test_run_writes_metrics_and_checkpoints(comm, mpi_tmp_path):
    import json
    import os

    path, ck = mpi_tmp_path / "m.jsonl", mpi_tmp_path / "ck3"
    args = options("--metrics", str(path), "--checkpoint-dir", str(ck), "--checkpoint-every",
                   "2", "--keep", "2", "--eval-every", "3", steps=7)
    summary = run(args, get_transport())
    assert summary["steps"] == 7
    if comm.rank == 0:
        header, *records = [json.loads(line) for line in path.read_text().splitlines()]
        # the file starts with what ran: options, version, commit, ranks, first step
        run_ = header["run"]
        assert (run_["options"]["eval_every"] == 3 and run_["ranks"] == comm.size
                and run_["from_step"] == 0 and run_["version"] == __version__
                and len(run_["commit"]) in (0, 40))
        assert [r["step"] for r in records[:-1]] == list(range(7)) and records[-1]["summary"]
        need = {"step", "epoch", "loss", "samples_per_s", "compute_s", "comm_s",
                "exposed_comm_s", "wire_bytes"}
        assert all(need <= set(r) for r in records[:-1])
        assert [r["step"] for r in records[:-1] if "test_acc" in r] == [2, 5, 6]
        # keep 2; the job's lock file stays (docs/guarantees.md, checkpoint directories)
        assert sorted(os.listdir(ck)) == [".ringcomp.lock", "step-00000006", "step-00000007"]


@pytest.mark.mpi(min_size=1)
def test_stop_at_ends_every_rank_after_the_first_evaluation_reaching_it(comm, mpi_tmp_path):
    """Oracle: the same run without --stop-at. The stopped run is its prefix, up to the first
    evaluation at or above the target (the highest accuracy seen, so it is reached once
    or more); a target never reached runs every step."""
    import json

    def records(tag, *extra):
        path = mpi_tmp_path / f"{tag}.jsonl"
        summary = run(options("--metrics", str(path), "--eval-every", "4", *extra, steps=40,
                              batch=8), get_transport())
        lines = comm.bcast(path.read_text() if comm.rank == 0 else None)
        return summary, [json.loads(line) for line in lines.splitlines()][1:-1]

    _, full = records("full")
    evaluated = [(r["step"] + 1, r["test_acc"]) for r in full if "test_acc" in r]
    target = max(acc for _, acc in evaluated)
    first = next(step for step, acc in evaluated if acc >= target)
    summary, stopped = records("stopped", "--stop-at", str(target))
    assert summary["steps"] == summary["reached_step"] == first and len(stopped) == first
    assert [r["loss"] for r in stopped] == [r["loss"] for r in full[:first]]
    if target < 1:
        summary, _ = records("never", "--stop-at", str(min(1.0, target + 1e-3)))
        assert summary["steps"] == 40 and summary["reached_step"] is None


def replay_options(*extra):
    return parse(["--no-progress", "--model", "replay:bert-base", "--replay-scale", "0.0005",
                  "--replay-tflops", "0", "--bucket-mb", "0.05", "--steps", "3", *extra])


@pytest.mark.mpi(min_size=1)
def test_replay_step_applies_the_mean_of_every_ranks_synthetic_gradient(comm):
    """Oracle: one process rebuilds every rank's noise and runs SGD with momentum on
    x + mean(noise) in float64; the p-rank run must land on the same parameters. (Warm-up
    steps are exact, and with a compressor set the small tensors travel in one gathered
    bucket: the gather/scatter path is checked too.)"""
    args = replay_options("--compressor", "topk", "--warmup-steps", "3")
    trainer = Trainer(args, get_transport())
    ranks = [ReplayModel("bert-base", 0, r, args.batch_size, 0, 0.0005)
             for r in range(comm.size)]
    x = ranks[0].store.flat.astype(np.float64)
    velocity, ok, same = np.zeros_like(x), True, True
    for model in ranks:
        model.store.flat[...] = 0  # the gradient is then the noise alone
    for step in range(3):
        loss = trainer.train_step(step)["loss"]
        ok &= loss == pytest.approx(0.5 * np.mean(x ** 2), rel=1e-4)
        noise = []
        for model in ranks:
            model.begin(step)
            list(model.backward())
            noise.append(model.store.grad.astype(np.float64))
        velocity = args.momentum * velocity + x + np.mean(noise, axis=0)
        x -= args.lr * velocity
        ok &= np.allclose(trainer.store.flat, x, rtol=1e-4, atol=1e-5)
        same &= len(set(comm.allgather(digest(trainer.store.flat)))) == 1
    trainer.reducer.close()
    buckets = trainer.reducer.buckets
    assert len(buckets) > 2 and any(not b.compressed for b in buckets)
    assert every_rank(comm, ok) and every_rank(comm, same)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compressor", ["marsit", "topk:ratio=0.01"])
def test_replay_with_compression_keeps_ranks_identical(comm, compressor):
    extra = ("--error-feedback",) if compressor != "marsit" else ()
    summary = run(replay_options("--compressor", compressor, *extra), get_transport())
    assert every_rank(comm, summary["steps"] == 3 and np.isfinite(summary["loss"])
                      and summary["test_acc"] is None)


@pytest.mark.mpi(min_size=1)
def test_planned_buckets_are_shared_and_exact_training_still_matches_one_process(
        comm, mpi_tmp_path):
    profile = str(mpi_tmp_path / "profile.json")
    trainer = Trainer(options("--plan", "layerwise", "--profile", profile), get_transport())
    trainer.apply_plan()  # measures (collectively) and writes the profile
    single = Trainer(options(batch=4 * comm.size), get_transport(MPI.COMM_SELF))
    plan = [(b.members, b.compressed) for b in trainer.reducer.buckets]
    ok = all(other == plan for other in comm.allgather(plan))  # every rank plans alike
    ok &= plan == [((i,), False) for i in range(len(trainer.store.infos))]
    for _ in range(6):
        steps(trainer, 1)
        steps(single, 1)
        ok &= np.allclose(trainer.store.flat, single.store.flat, rtol=1e-4, atol=1e-5)
    for t in (trainer, single):
        t.reducer.close()
    other = Trainer(options("--model", "mlp:8", "--plan", "optimal", "--profile", profile),
                    get_transport())
    with pytest.raises(ValueError, match="measured for another model"):
        other.apply_plan()
    other.reducer.close()
    with pytest.raises(ValueError, match="positive size"):  # refused before profiling
        Trainer(options("--plan", "fixed:-1"), get_transport())
    other = Trainer(options("--plan", "optimal", "--profile", profile, "--compressor", "sign"),
                    get_transport())
    with pytest.raises(ValueError, match="other settings: compressor=None"):
        other.apply_plan()
    other.reducer.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("plan", ["optimal", "mgwfbp", "layerfusion"])
def test_planned_run_resumes_bit_identically(comm, mpi_tmp_path, plan):
    """The profile lives in the checkpoint directory, so the resumed run plans the same
    buckets (error-feedback residuals are kept per bucket)."""
    ck = str(mpi_tmp_path / f"ck-{plan}")
    extra = ("--plan", plan, "--compressor", "topk:ratio=0.1", "--error-feedback",
             "--small-tensor", "16")
    first = Trainer(options(*extra, "--checkpoint-dir", ck, steps=8), get_transport())
    first.apply_plan()
    whole = Trainer(options(*extra, "--profile", f"{ck}/profile.json", steps=8),
                    get_transport())
    whole.apply_plan()
    steps(whole, 8)
    steps(first, 4)
    first.save()
    again = Trainer(options(*extra, "--checkpoint-dir", ck, "--resume", steps=8),
                    get_transport())
    again.apply_plan()
    assert again.restore() and again.step == 4
    steps(again, 4)
    ok = np.array_equal(whole.store.flat, again.store.flat)
    ok &= [b.members for b in again.reducer.buckets] == [b.members for b in first.reducer.buckets]
    for t in (first, whole, again):
        t.reducer.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_rebucketing_moves_error_feedback_residuals_with_their_elements(comm):
    trainer = Trainer(options("--compressor", "topk:ratio=0.1", "--error-feedback",
                              "--small-tensor", "16"), get_transport())
    steps(trainer, 3)
    before, old = trainer.reducer.flat_residuals(trainer.store.size), trainer.reducer.buckets
    problem = Problem([4 * i.size for i in trainer.store.infos],
                      [0.0] * len(trainer.store.infos), float, float)
    for plan in ("balanced:2", "layerwise", "modelwise"):
        trainer.rebucket(buckets_from_plan(trainer.store.infos, make_plan(plan, problem)))
        assert np.array_equal(trainer.reducer.flat_residuals(trainer.store.size), before), plan
    trainer.rebucket(old)
    ok = np.array_equal(trainer.reducer.flat_residuals(trainer.store.size), before) and before.any()
    ok &= all(trainer.reducer.feedback.residuals[ErrorFeedback.key(b.index, b.size)].size == b.size
              for b in trainer.reducer.buckets if b.compressed)
    steps(trainer, 2)  # and training goes on, identically everywhere
    ok &= len(set(comm.allgather(digest(trainer.store.flat)))) == 1
    trainer.reducer.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=2)
def test_mergecomp_online_search_agrees_everywhere_and_resumes_after_it(comm, mpi_tmp_path):
    """The search's decisions come from agreed times: every rank ends with the same buckets
    and parameters. Its choice is kept in the checkpoint directory's profile, so a run
    resumed after the search continues bit-identically."""
    ck = str(mpi_tmp_path / "ck-mergecomp")
    extra = ("--plan", "mergecomp", "--mergecomp-steps", "1", "--compressor",
             "topk:ratio=0.1", "--error-feedback", "--checkpoint-dir", ck)
    first = Trainer(options(*extra, steps=16), get_transport())
    first.apply_plan()
    messages = []
    for _ in range(12):
        steps(first, 1)
        messages.append(first.after_step(0.01 * (1 + comm.rank)))  # ranks disagree
    search = first.planned.search
    ok = search.done and sum(m is not None for m in messages) == 1
    plan = [b.members for b in first.reducer.buckets]
    ok &= all(other == plan for other in comm.allgather(plan))
    first.save()
    steps(first, 4)
    again = Trainer(options(*extra, "--resume", steps=16), get_transport())
    again.apply_plan()
    assert again.planned.search.done  # the saved choice, no new search
    ok &= again.restore() and [b.members for b in again.reducer.buckets] == plan
    steps(again, 4)
    ok &= np.array_equal(first.store.flat, again.store.flat)
    ok &= len(set(comm.allgather(digest(first.store.flat)))) == 1
    for t in (first, again):
        t.reducer.close()
    assert every_rank(comm, ok)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["digits", "synthetic"])
def test_the_data_is_read_once_and_every_rank_gets_the_same_bytes(comm, name, monkeypatch):
    """Rank 0 reads (or generates) the set and broadcasts it: every rank holds exactly what
    ``load`` gives, and no other rank reads it; a failure on rank 0 is raised everywhere."""
    from ringcomp.errors import EverywhereError
    from ringcomp.training import data

    t = get_transport(comm)
    want = data.load(name, 3, 512, 16)
    reads = []
    real = data.load
    monkeypatch.setattr(data, "load", lambda *a: reads.append(a) or real(*a))
    got = data.load_shared(t, name, 3, 512, 16)
    same = all(np.array_equal(getattr(got, f), getattr(want, f)) and
               getattr(got, f).dtype == getattr(want, f).dtype
               for f in ("x_train", "y_train", "x_test", "y_test"))
    assert every_rank(comm, same and len(reads) == (1 if comm.rank == 0 else 0))
    with pytest.raises(EverywhereError, match="rank 0: ValueError: unknown dataset"):
        data.load_shared(t, "nonsense", 3)


@pytest.mark.mpi(min_size=2)
def test_autos_calibration_is_neither_a_steps_bytes_nor_its_time(comm, mpi_tmp_path):
    """``--algorithm auto`` measures its constants when the engine starts, before step 0:
    step 0 sends at most what a step of this model can (its ~11 KB of gradients through
    a ring, twice; MPI's own Allreduce counts none), where it used to carry the
    calibration's hundreds of MB; the first step's communication is not the
    calibration's seconds."""
    path = mpi_tmp_path / "auto.jsonl"
    summary = run(options("--algorithm", "auto", "--metrics", str(path), steps=3),
                  get_transport())
    ok = summary["steps"] == 3
    if comm.rank == 0:
        first = json.loads(path.read_text().splitlines()[1])  # after the run's header
        ok &= first["step"] == 0 and first["wire_bytes"] < 1e6 and first["comm_s"] < 1.0
    assert every_rank(comm, ok)
