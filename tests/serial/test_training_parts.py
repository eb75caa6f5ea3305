"""Training building blocks without MPI: gradients, buckets, shards, optimizers, checkpoints."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import SelfTransport

from ringcomp.models import build_model, replay
from ringcomp.training import checkpoint, data
from ringcomp.training.buckets import plan_buckets
from ringcomp.training.config import parse
from ringcomp.training.optim import MarsitRule


@pytest.mark.parametrize("spec", ["mlp:12x8", "logreg", "cnn:2x3"])
def test_backward_matches_finite_differences(spec):
    model = build_model(spec, 16, 5, seed=3)
    store = model.store
    store.flat, store.grad = store.flat.astype(np.float64), store.grad.astype(np.float64)
    for i, layer in enumerate(model.layers):  # rebind the views to the float64 store
        layer.bind(store, str(i))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 16)), rng.integers(0, 5, 5)
    _, dlogits, _ = model.loss(x, y)
    order = [i for indices in model.backward(dlogits) for i in indices]
    assert order == sorted(order)  # gradients arrive in store (backward) order
    grad = store.grad.copy()
    for i in rng.choice(store.size, 12, replace=False):
        old = store.flat[i]
        store.flat[i] = old + 1e-6
        up = model.loss(x, y)[0]
        store.flat[i] = old - 1e-6
        down = model.loss(x, y)[0]
        store.flat[i] = old
        assert (up - down) / 2e-6 == pytest.approx(grad[i], abs=1e-6, rel=1e-4), (spec, i)


def test_buckets_cover_once_and_put_small_tensors_in_one_exact_bucket():
    store = build_model("mlp:32x16", 64, 10, 0).store
    sizes = [info.size for info in store.infos]  # 160, 10, 512, 16, 2048, 32
    for bucket_bytes in (None, 0, 2000, 1 << 20):
        buckets = plan_buckets(store.infos, bucket_bytes, small_elements=64)
        members = sorted(i for b in buckets for i in b.members)
        assert members == list(range(len(sizes)))  # every tensor exactly once
        assert [b.last for b in buckets] == sorted(b.last for b in buckets)  # ready order
        exact = [b for b in buckets if not b.compressed]
        assert len(exact) == 1 and exact[0].members == (1, 3, 5)  # all small ones
        for b in buckets:  # never mixes compressed and exact tensors
            assert {sizes[i] >= 64 for i in b.members} == {b.compressed}
            flat = np.arange(store.size, dtype=np.float32)
            gathered = b.gather(flat)
            assert np.array_equal(gathered, np.concatenate(
                [flat[store.infos[i].offset:store.infos[i].offset + sizes[i]]
                 for i in b.members]))
            assert [(lo, hi) for lo, hi, _ in b.split(gathered)] == list(b.pieces)
    assert len(plan_buckets(store.infos, 0, 64)) == 4  # 3 large tensors + the small bucket
    assert len(plan_buckets(store.infos, 2000, 64)) == 3  # 160+512 fill 2000 B; 2048
    whole = plan_buckets(store.infos, None)  # nothing small: one contiguous slice
    assert len(whole) == 1 and whole[0].pieces == ((0, store.size),)
    assert len(plan_buckets(store.infos, 0)) == 6


def test_shards_give_the_same_global_batches_for_any_p():
    one = data.Shards(100, 12, 1, 0, seed=5)
    for p in (2, 3, 4):
        ranks = [data.Shards(100, 12 // p, p, r, seed=5) for r in range(p)]
        for step in (0, 7, 8, 20):  # 8 steps per epoch: crosses epochs
            joined = np.concatenate([s.indices(step) for s in ranks])
            assert np.array_equal(joined, one.indices(step))
    with pytest.raises(ValueError, match="fewer than one global batch"):
        data.Shards(10, 8, 2, 0, 0)


def test_marsit_update_and_global_compensation():
    opt = MarsitRule(4, lr=0.5, global_lr=0.1)
    params, grad = np.ones(4, np.float32), np.array([1, -2, 3, -4], np.float32)
    sent = opt.prepare(grad, params, 0, 4, True).copy()
    assert np.array_equal(sent, 0.5 * grad)  # p = eta_l g + c, c = 0 at first
    v = np.array([1, -1, -1, 1], np.float32)  # the aggregated signs
    opt.apply(params, v, 0, 4, 8, 0, True)
    assert np.allclose(params, 1 - 0.1 * v)
    assert np.allclose(opt.state["compensation"], sent - 0.1 * v)  # c = p - eta_s v
    sent = opt.prepare(grad, params, 0, 4, False).copy()
    assert np.allclose(sent, 0.5 * grad + opt.state["compensation"])
    opt.apply(params, sent * 8, 0, 4, 8, 1, False)  # full-precision round: mean, c = 0
    assert np.allclose(params, 1 - 0.1 * v - sent) and not opt.state["compensation"].any()
    assert "momentum" not in opt.state  # the paper's rule keeps no momentum


def test_marsit_with_local_momentum_and_weight_decay_follows_the_documented_rule():
    """Oracle: the rule written out in float64 - d = g + wd x, m' = mu m + d,
    p = lr m' + c; compressed: x -= gl v, c = p - gl v; full precision: x -= mean p, c = 0;
    m = m' either way; a skipped step changes neither m nor c."""
    lr, gl, mu, wd, ranks = 0.5, 0.1, 0.9, 0.01, 4
    opt = MarsitRule(4, lr=lr, global_lr=gl, momentum=mu, weight_decay=wd)
    params = np.array([1, -1, 2, 0.5], np.float32)
    x, m, c = params.astype(np.float64), np.zeros(4), np.zeros(4)
    rng = np.random.default_rng(0)
    for step, compressed in enumerate([True, True, False, True, True]):
        grad = rng.standard_normal(4).astype(np.float32)
        m_new = mu * m + grad + wd * x
        p = lr * m_new + c
        sent = opt.prepare(grad, params, 0, 4, compressed).copy()
        assert np.allclose(sent, p, rtol=1e-5)
        if step == 3:  # given up (a non-finite value elsewhere): nothing moves
            opt.skip(0)
            continue
        if compressed:
            v = np.where(rng.random(4) < 0.5, 1.0, -1.0).astype(np.float32)
            opt.apply(params, v, 0, 4, ranks, step, True)
            x, c = x - gl * v, p - gl * v
        else:  # every rank sent the same p here: the sum is ranks * p
            opt.apply(params, (sent * ranks).astype(np.float32), 0, 4, ranks, step, False)
            x, c = x - p, np.zeros(4)
        m = m_new
        assert np.allclose(params, x, rtol=1e-5, atol=1e-6)
        assert np.allclose(opt.state["compensation"], c, rtol=1e-5, atol=1e-6)
        assert np.allclose(opt.state["momentum"], m, rtol=1e-5, atol=1e-6)


def test_checkpoints_are_atomic_and_pruned(tmp_path):
    t = SelfTransport()
    state = {"params": np.arange(5.0), "feedback": {(0, 5, "<f4", "worker"): np.ones(5)}}
    for step in (1, 2, 3, 4):
        checkpoint.save(t, str(tmp_path), step, state, {"lr": 0.1}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]
    (tmp_path / "step-00000009").mkdir()  # an interrupted write: no manifest
    (tmp_path / "step-00000009" / "rank-00000.npz").write_bytes(b"partial")
    assert checkpoint.latest(str(tmp_path)) == 4
    loaded, meta = checkpoint.load(t, str(tmp_path), 4)
    assert meta["lr"] == 0.1 and meta["step"] == 4
    assert np.array_equal(loaded["params"], np.arange(5.0))
    assert np.array_equal(loaded["feedback"][(0, 5, "<f4", "worker")], np.ones(5))


def test_config_file_and_command_line(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('compressor = "marsit"\nbatch-size = 16\nlr = 0.2\n')
    args = parse(["--config", str(path), "--lr", "0.3"])
    assert (args.compressor, args.batch_size, args.lr) == ("marsit", 16, 0.3)
    assert args.optimizer == "marsit" and args.global_lr == pytest.approx(0.03)
    path.write_text("learning_rate = 1\n")
    with pytest.raises(SystemExit):
        parse(["--config", str(path)])


@pytest.mark.parametrize("argv", [[], ["--compressor", "marsit", "--lr", "0.05"],
                                  ["--optimizer", "adam", "--bucket-mb", "all", "--torus",
                                   "2x2", "--algorithm", "torus", "--metrics", "m \"1\".jsonl"]])
def test_print_config_says_what_made_it_and_reads_back_as_the_same_job(tmp_path, capsys,
                                                                       argv):
    """--print-config: first the ringcomp version, commit and command, then TOML that
    --config reads back to the same job (every option; what was resolved beside it)."""
    from dataclasses import replace

    from ringcomp.version import __version__

    with pytest.raises(SystemExit) as done:
        parse(["--print-config", *argv])
    text = capsys.readouterr().out
    assert done.value.code == 0
    first, second = text.splitlines()[:2]
    assert first.startswith(f"# ringcomp {__version__}, commit ") and "--print-config" in second
    path = tmp_path / "job.toml"
    path.write_text(text)
    assert replace(parse(["--config", str(path)]), config=None) == parse(argv)


def test_replay_networks_have_their_published_sizes():
    """Parameter counts of torchvision's resnet50/vgg16 and Hugging Face's bert-base-uncased
    (with pooler); FLOPs are the usual 4.1 / 15.5 GMACs at 224x224 (BERT: length 128)."""
    facts = {"resnet50": (161, 25_557_032, 8.2), "vgg16": (32, 138_357_544, 30.9),
             "bert-base": (199, 109_482_240, 22.4)}
    for net, (tensors, parameters, gflops) in facts.items():
        got = replay.describe(net)
        assert (got["tensors"], got["parameters"]) == (tensors, parameters), net
        assert got["gflops"] == pytest.approx(gflops, rel=0.01), net


def test_replay_gradients_are_x_plus_seeded_noise_in_backward_order():
    model = replay.ReplayModel("resnet50", seed=1, rank=0, batch=4, tflops=0, scale=0.01)
    assert len(model.store.infos) == 161 and 0.009 < model.store.size / 25_557_032 < 0.011
    assert model.begin(0) == pytest.approx(0.5 * np.mean(model.store.flat.astype(float) ** 2))
    order = [i for indices in model.backward() for i in indices]
    assert order == list(range(161))
    noise = model.store.grad - model.store.flat
    assert abs(noise.mean()) < 0.02 and noise.std() == pytest.approx(1, abs=0.02)
    other_rank = replay.ReplayModel("resnet50", seed=1, rank=1, batch=4, tflops=0, scale=0.01)
    assert np.array_equal(other_rank.store.flat, model.store.flat)  # same start everywhere
    other_rank.begin(0)
    list(other_rank.backward())
    assert not np.array_equal(other_rank.store.grad, model.store.grad)  # own noise per rank
    again = model.store.grad.copy()
    model.begin(0)
    list(model.backward())
    assert np.array_equal(model.store.grad, again)  # (seed, step, rank) fixes it
    model.begin(1)
    list(model.backward())
    assert not np.array_equal(model.store.grad, again)
    with pytest.raises(ValueError, match="unknown replay network"):
        replay.ReplayModel("alexnet", 0, 0, 1)


def test_replay_compute_follows_flops_and_really_takes_that_long():
    model = replay.ReplayModel("vgg16", seed=0, rank=0, batch=8, tflops=40, scale=0.001)
    flops = [layer.flops for layer in model.layers]
    assert np.allclose(model.seconds, np.array(flops) * 8 * 0.001 / 40e12)
    assert model.compute_seconds() == pytest.approx(3 * 30.94e9 * 8 * 0.001 / 40e12, rel=0.01)
    start = time.perf_counter()
    model.begin(0)
    list(model.backward())
    assert time.perf_counter() - start >= model.compute_seconds()  # sleeps never end early


def test_replay_buckets_put_every_small_tensor_in_one_exact_bucket():
    infos = replay.ReplayModel("resnet50", 0, 0, 1, tflops=0, scale=0.01).store.infos
    buckets = plan_buckets(infos, 25 << 10, small_elements=1024)
    exact = [b for b in buckets if not b.compressed]
    assert len(exact) == 1 and len(exact[0].members) == sum(i.size < 1024 for i in infos)
    assert sorted(i for b in buckets for i in b.members) == list(range(len(infos)))


@pytest.mark.parametrize("name", ["sgd", "adam", "marsit"])
def test_an_optimizers_scratch_twin_leaves_the_original_untouched(name):
    """The profile times the update on a twin: the run's state must not move."""
    from ringcomp.training.optim import OPTIMIZERS

    original = OPTIMIZERS[name](8, 0.1)
    params = np.ones(8, np.float32)
    sent = original.prepare(np.full(8, 0.5, np.float32), params, 0, 8, True)
    original.apply(params, sent, 0, 8, 2, 0, True)
    state = {k: v.copy() for k, v in original.state.items()}
    before = params.copy()
    pending = original.prepare(np.full(8, 0.25, np.float32), params, 0, 8,
                               True)  # a bucket in flight
    twin = original.scratch(4)
    assert twin.state == {} and twin.size == 4 and type(twin) is type(original)
    scratch_params = np.zeros(4, np.float32)
    for _ in range(2):
        twin.apply(scratch_params, twin.prepare(np.ones(4, np.float32), scratch_params, 0, 4,
                                                True), 0, 4, 2, 0, True)
    assert all(np.array_equal(original.state[k], v) for k, v in state.items())
    assert set(original.state) == set(state) and np.array_equal(params, before)
    # the bucket in flight is still the original's (Marsit keeps what it sent per bucket)
    original.apply(params, pending, 0, 8, 2, 1, True)
    assert not np.array_equal(params, before)


def test_non_iid_partitions_own_every_sample_once_and_skew_as_asked():
    from ringcomp.training import skew

    labels = np.random.default_rng(0).integers(0, 10, 4000)
    for spec in ("label-skew:0.1", "label-skew:1000", "shard:2"):
        parts = skew.split(labels, 8, spec, seed=3)
        assert len(parts) == 8 and all(len(part) for part in parts)
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(4000))  # once each
        again = skew.split(labels, 8, spec, seed=3)  # every rank computes the same split
        assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    dominant = {spec: skew.class_shares(labels, skew.split(labels, 8, spec, 3), 10).max(1)
                for spec in ("label-skew:0.1", "label-skew:1000")}  # each rank's top class
    assert dominant["label-skew:0.1"].mean() > 0.4 > 0.15 > dominant["label-skew:1000"].max()
    shares = skew.class_shares(labels, skew.split(labels, 8, "shard:2", 3), 10)
    assert ((shares > 0).sum(1) <= 4).all()  # 2 label-sorted shards: 2-4 classes
    assert skew.split(labels, 8, "iid", 3) is None
    for bad in ("label-skew:0", "label-skew:-1", "label-skew:nan", "shard:0", "shard:x",
                "dirichlet:1", "iid:2", ""):
        with pytest.raises(ValueError, match="--partition"):
            skew.parse_partition(bad)
    with pytest.raises(ValueError, match="samples for"):
        skew.split(labels[:3], 8, "shard:1", 0)


def test_a_rank_reads_its_own_samples_each_once_per_pass_with_the_batch_unchanged():
    owned = np.array([5, 9, 12, 40, 41, 77, 100])
    shards = data.Shards(1000, 3, 4, 1, seed=2, owned=owned)
    stream = np.concatenate([shards.indices(step) for step in range(14)])  # 42 = 6 passes
    assert all(len(shards.indices(s)) == 3 for s in range(5))
    for k in range(6):
        assert sorted(stream[7 * k:7 * (k + 1)]) == owned.tolist()
    assert not np.array_equal(stream[:7], stream[7:14])  # each pass reshuffled
    assert shards.steps_per_epoch == 1000 // 12  # the epoch still counts global samples


@pytest.mark.parametrize("ranks, env", [(2, {}), (64, {}), (1, {"OMP_NUM_THREADS": "1"})])
def test_host_thread_pools_get_the_ranks_share_of_the_cores_unless_the_user_sized_them(
        ranks, env):
    """In a fresh process (the limits are process-wide): every BLAS pool NumPy loaded is
    limited to cores // ranks (at least 1); a user's OMP_NUM_THREADS is left to act."""
    import json
    import os
    import subprocess
    import sys

    code = ("import json, numpy, threadpoolctl; from ringcomp.devices import placement; "
            f"share = placement.share_host_cores({ranks}); "
            "pools = [p['num_threads'] for p in threadpoolctl.threadpool_info() "
            "if p['user_api'] == 'blas']; print(json.dumps([share, pools]))")
    clean = {k: v for k, v in os.environ.items() if k not in
             ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                         capture_output=True, text=True, check=True).stdout
    share, pools = json.loads(out)
    assert pools, "NumPy loaded no BLAS pool that threadpoolctl sees"
    if env:
        assert share is None and set(pools) == {int(env["OMP_NUM_THREADS"])}
    else:
        assert share == max(1, (os.cpu_count() or 1) // ranks) and set(pools) == {share}


def test_digits_are_scikit_learns_without_importing_it():
    """The digits come from the file inside scikit-learn's wheel, read without importing
    scikit-learn (0.9 s of CPU per rank) - the same numbers load_digits gives; and a
    default training job (a small model) leaves scikit-learn, scipy.optimize and Numba
    (0.6 s per process; its SGD update stays in NumPy) out: 16 ranks start in seconds."""
    from sklearn.datasets import load_digits

    bunch, ours = load_digits(), data.digits(seed=3)
    x = np.concatenate([ours.x_train, ours.x_test])
    y = np.concatenate([ours.y_train, ours.y_test])
    order = np.random.default_rng([3, 0xDA7A]).permutation(len(bunch.data))
    n_test = len(ours.x_test)
    expected = np.concatenate([order[n_test:], order[:n_test]])
    assert np.array_equal(x, (bunch.data[expected] / 16.0).astype(np.float32))
    assert np.array_equal(y, bunch.target[expected])
    code = ("import runpy, sys\nsys.argv = ['train', '--steps', '1', '--no-progress']\n"
            "try:\n    runpy.run_module('ringcomp.train', run_name='__main__')\n"
            "except SystemExit as end:\n    assert not end.code\n"
            "print([m for m in ('sklearn', 'scipy.optimize', 'numba') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "[]", out.stdout + out.stderr


def test_profile_times_every_call_on_the_same_gradient_like_input(monkeypatch):
    """The profile's all-reduce micro-benchmark feeds every call (the warm-up included) the
    same normal values, seeded by rank: a constant buffer (the old input: ones) ties every
    value and timed top-k's selection several times too slow, which the planners believed."""
    from ringcomp.training import measure

    seen = []

    def fake_allreduce(x, **kwargs):
        seen.append(x.copy())
        x *= 4  # an in-place result, as the real call writes: the next call must not see it

    monkeypatch.setattr(measure, "allreduce", fake_allreduce)
    measure.time_allreduce(SelfTransport(), 4096, repeats=3, algorithm="ring")
    assert len(seen) == 4 and all(np.array_equal(x, seen[0]) for x in seen)
    assert np.unique(seen[0]).size == seen[0].size == 1024  # no ties
    assert abs(seen[0].mean()) < 0.1 and 0.9 < seen[0].std() < 1.1
    other = type("Rank1", (SelfTransport,), {"rank": 1})()
    monkeypatch.setattr(measure, "allreduce", lambda x, **kwargs: seen.append(x.copy()))
    measure.time_allreduce(other, 4096, repeats=1, algorithm="ring")
    assert not np.array_equal(seen[-1], seen[0])  # each rank its own gradient


def test_a_ring_jobs_warm_up_loads_the_compiled_walks():
    """A compressed host job on the ring loads the rings' compiled walks before its first
    step (``load_kernels``), so its first collective is not charged with loading them; a
    job on another algorithm does not load them at all."""
    code = ("import sys, numpy as np\n"
            "from ringcomp.compression import get_compressor\n"
            "from ringcomp.training.engine import load_kernels\n"
            "load_kernels(get_compressor('marsit'), np, sys.argv[1])\n"
            "native = sys.modules.get('ringcomp.collectives.compressed_ring_native')\n"
            "print(-1 if native is None else len(native._walk.signatures))\n")
    loaded = {}
    for algorithm in ("ring", "tree"):
        out = subprocess.run([sys.executable, "-c", code, algorithm], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        loaded[algorithm] = int(out.stdout.split()[-1])
    assert loaded == {"ring": 1, "tree": -1}  # float32 (warm_up's dtype); not imported


def test_error_feedback_warns_about_a_compressor_that_is_not_contractive():
    """Count-Sketch with top-k recovery at its defaults keeps more error than it removes
    (so its residual grows every step: the convergence study's ring+countsketch+ef
    diverged at every rate); top-k, scaled sign and QSGD remove some of it. The probe's
    oracle: ||x - C(x)|| of top-k is the norm of the dropped values, computed here."""
    import warnings

    import numpy as np

    from ringcomp.compression import get_compressor
    from ringcomp.training.combination import PROBE_ELEMENTS, check_combination, contraction

    x = np.random.default_rng(0).standard_normal(PROBE_ELEMENTS).astype(np.float32)
    k = round(0.01 * x.size)  # topk's default ratio
    dropped = np.sort(np.abs(x))[:-k]
    assert contraction(get_compressor("topk")) == pytest.approx(
        np.linalg.norm(dropped) / np.linalg.norm(x), rel=1e-5)
    assert contraction(get_compressor("countsketch")) > 1.2
    with pytest.warns(RuntimeWarning, match="error feedback with countsketch.*amplifies"):
        check_combination(get_compressor("countsketch"), "ring", False, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these warns
        for spec in ("topk", "sign", "qsgd", "powersgd"):
            check_combination(get_compressor(spec), "ring", False, True)
        check_combination(get_compressor("countsketch"), "ring", False, False)  # no EF
