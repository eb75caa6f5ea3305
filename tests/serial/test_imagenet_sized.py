"""ImageNet-sized training without a download: the synthetic ``images`` data set (3 x side x
side, 1000 classes) and ``torch:resnet50`` (25.6M parameters, as torchvision's ResNet-50),
checked against their definitions, and the study that times them (``experiments
resnet50``) run at 2 ranks exactly as the GPU record runs it, at a small side."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_cli import mpirun

from ringcomp.training import data
from ringcomp.training.config import parse

torch = pytest.importorskip("torch")
from ringcomp.torch.models import build_torch_model  # noqa: E402 - needs torch


def test_images_are_class_patterns_plus_noise_and_learnable():
    a = data.images(seed=3, samples=600, features=3 * 32 * 32)
    b = data.images(seed=3, samples=600, features=3 * 32 * 32)
    assert a.classes == data.IMAGE_CLASSES == 1000 and a.features == 3072
    assert len(a.x_train) == 480 and len(a.x_test) == 120 and a.x_train.dtype == np.float32
    np.testing.assert_array_equal(a.x_train, b.x_train)  # drawn from the seed alone
    assert not np.array_equal(a.x_train, data.images(4, 600, 3072).x_train)
    # oracle: an image minus its own class's pattern is unit noise; labels are learnable,
    # since each image is nearer its class's mean than most other images' classes
    x = np.concatenate([a.x_train, a.x_test])
    y = np.concatenate([a.y_train, a.y_test])
    assert abs(x.std() - np.sqrt(2)) < 0.05  # noise 1 + pattern 1, independent
    same = [np.mean((x[i] - x[j]) ** 2) for i in range(600) for j in range(i)
            if y[i] == y[j]][:50]
    other = [np.mean((x[i] - x[j]) ** 2) for i in range(50) for j in range(i)
             if y[i] != y[j]][:50]
    assert same and np.mean(same) < 2.2 < 3.8 < np.mean(other)


@pytest.mark.parametrize("features", [64, 3 * 30 * 30 + 1, 3 * 7 * 7])
def test_images_need_three_channel_square_sides(features):
    with pytest.raises(ValueError, match="3·side²"):
        data.image_side(features)
    with pytest.raises(SystemExit):
        parse(["--dataset", "images", "--features", str(features)])


def test_resnet50_has_torchvisions_parameter_count_at_any_side():
    for side in (32, 224):
        model = build_torch_model("torch:resnet50", 3 * side * side, 1000, seed=0)
        assert sum(p.numel() for p in model.parameters()) == 25_557_032
    assert model(torch.zeros(2, 3 * 224 * 224)).shape == (2, 1000)
    with pytest.raises(ValueError, match="side of at least 32"):
        build_torch_model("torch:resnet50", 3 * 16 * 16, 1000, seed=0)
    with pytest.raises(SystemExit):
        parse(["--model", "torch:resnet50:64x128"])  # it takes no sizes


def test_the_resnet50_study_splits_every_methods_step_at_two_ranks(tmp_path):
    """The study GPU records run (``experiments resnet50``), on the CPU at a 32-pixel side:
    ringcomp's trainer (Marsit: ``train --model torch:resnet50 --dataset images``) and DDP
    each take the timed steps, the trace gives Marsit's codec time and when its all-reduces
    ran, and the record renders the table it printed."""
    out = tmp_path / "r50"
    done = mpirun(2, ["-m", "ringcomp.experiments", "resnet50", "--device", "cpu", "--side",
                      "32", "--samples", "20", "--batch-size", "2", "--steps", "2", "--warmup",
                      "0", "--trace-steps", "1", "--methods", "marsit,ddp", "--bucket-mb",
                      "30", "--segment-bytes", "65536", "--out", str(out)],
                  timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "r50.json").read_text())
    assert record["parameters"] == 25_557_032 and record["ranks"] == 2
    marsit, ddp = record["rows"]
    assert (marsit["method"], ddp["method"], ddp["backend"]) == ("marsit", "ddp", "gloo")
    # a step is its parts at least; the traced run timed the codec (no staging on a CPU)
    assert marsit["step_ms"] >= 0.9 * (marsit["compute_ms"] + marsit["exposed_ms"])
    assert marsit["codec_ms"] > 0 and marsit["staging_ms"] is None
    assert marsit["step_min_ms"] <= marsit["step_ms"] <= marsit["step_max_ms"]
    # one 1-bit all-reduce of 25.6M gradients a step (about 3.2 MB) against DDP's float32
    assert 2.5e6 < marsit["wire_bytes"] < 5e6 and ddp["wire_bytes"] == 4 * 25_557_032
    assert ddp["compute_ms"] is None  # DDP's step is not split
    # the traced step's all-reduces: every gradient once, each within the step, one at a
    # time in submission order (the engine's FIFO), beside forward and backward's time
    line = marsit["timeline"]
    assert sum(b for b, _, _ in line["ops"]) == 4 * 25_557_032
    assert all(0 <= t0 <= t1 for _, t0, t1 in line["ops"])
    assert all(a[2] <= b[1] for a, b in zip(line["ops"][:-1], line["ops"][1:], strict=True))
    assert line["compute_ms"] > 0
    assert "timeline" not in ddp
    # --bucket-mb sets ringcomp's buckets (DDP's bucket_cap_mb alike): a bucket closes once
    # it holds 30 MiB, so ResNet-50's 102 MB take 4 all-reduces a step (the last bucket's
    # rest and the small tensors' own among them), not the 35 of the 1 MB default
    assert record["bucket_mb"] == 30 and len(line["ops"]) == 4
    assert sum(b < 30 * 2**20 for b, _, _ in line["ops"]) == 2, line["ops"]
    from ringcomp.experiments import resnet50
    from ringcomp.results.blocks import render

    table = resnet50.format_table(record)
    assert table in done.stdout and table in render(record)
    assert "gloo backend (CPU tensors)" in table
    assert "buckets 30 MB, segments 0.0625 MiB" in table and record["segment_bytes"] == 65536


def test_the_study_refuses_what_would_fail_midway():
    from test_cli import env

    for bad, says in ((["--methods", "exact,vgg"], "unknown --methods ['vgg']"),
                      (["--side", "16"], "--side must be >= 32"),
                      (["--steps", "0"], "--steps and --trace-steps >= 1"),
                      (["--trace", "x"], "the study traces its own runs"),
                      (["--bucket-mb", "0"], "--bucket-mb must be > 0"),
                      (["--segment-bytes", "2"], "--segment-bytes must be 0"),
                      (["--segment-bytes", "-1"], "--segment-bytes must be 0"),
                      (["--bucket-mb", "nan"], "--bucket-mb must be > 0")):
        done = subprocess.run([sys.executable, "-m", "ringcomp.experiments", "resnet50",
                               "--device", "cpu", *bad], capture_output=True, text=True,
                              timeout=60, env=env())
        assert done.returncode == 2 and says in done.stderr, (bad, done.stderr)


def test_the_studys_buckets_and_segments_reach_every_methods_trainer():
    """``--bucket-mb`` and ``--segment-bytes`` act on every ringcomp method's training
    options (an option the study took and dropped would time the defaults)."""
    import argparse

    from ringcomp.experiments import resnet50, resnet50_run

    args = argparse.Namespace(side=32, samples=20, batch_size=2, device="cpu",
                              bucket_mb=25.0, segment_bytes=4 << 20)
    for method in resnet50.METHODS:
        o = resnet50_run._train_options(args, method, 1, None)
        assert (o.bucket_mb, o.segment_bytes) == ("25", 4 << 20), method
    args.segment_bytes = 0  # the algorithm's own
    assert resnet50_run._train_options(args, "exact", 1, None).segment_bytes == 0
