"""Training building blocks without MPI: gradients, buckets, shards, optimizers, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from ringcomp import checkpoint, data
from ringcomp.buckets import plan_buckets
from ringcomp.models import build_model
from ringcomp.optim import Marsit
from ringcomp.trainconfig import parse


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


def test_buckets_cover_contiguously_and_split_small_tensors():
    store = build_model("mlp:32x16", 64, 10, 0).store
    sizes = [info.size for info in store.infos]  # 160, 10, 512, 16, 2048, 32
    for bucket_bytes in (None, 0, 2000, 1 << 20):
        buckets = plan_buckets(store.infos, bucket_bytes, small_elements=64)
        assert buckets[0].lo == 0 and buckets[-1].hi == store.size
        assert all(a.hi == b.lo and a.last + 1 == b.first for a, b in
                   zip(buckets, buckets[1:], strict=False))
        for b in buckets:  # never mixes compressed and exact tensors
            assert {sizes[i] >= 64 for i in range(b.first, b.last + 1)} == {b.compressed}
    assert len(plan_buckets(store.infos, 0)) == 6
    assert len(plan_buckets(store.infos, None)) == 1


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
    opt = Marsit(4, lr=0.5, global_lr=0.1)
    params, grad = np.ones(4, np.float32), np.array([1, -2, 3, -4], np.float32)
    sent = opt.prepare(grad, 0, 4, True).copy()
    assert np.array_equal(sent, 0.5 * grad)  # p = eta_l g + c, c = 0 at first
    v = np.array([1, -1, -1, 1], np.float32)  # the aggregated signs
    opt.apply(params, v, 0, 4, 8, 0, True)
    assert np.allclose(params, 1 - 0.1 * v)
    assert np.allclose(opt.state["compensation"], sent - 0.1 * v)  # c = p - eta_s v
    sent = opt.prepare(grad, 0, 4, False).copy()
    assert np.allclose(sent, 0.5 * grad + opt.state["compensation"])
    opt.apply(params, sent * 8, 0, 4, 8, 1, False)  # full-precision round: mean, c = 0
    assert np.allclose(params, 1 - 0.1 * v - sent) and not opt.state["compensation"].any()


class SelfTransport:
    rank, size = 0, 1

    def barrier(self):
        pass

    def allgather_obj(self, obj):
        return [obj]


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
