"""Horovod's three PyTorch examples run by their import line, at 2 ranks, on synthetic data.

``pytorch_synthetic_benchmark.py``, ``pytorch_mnist.py`` and ``pytorch_imagenet_resnet50.py``
from Horovod's ``examples/pytorch``: their text is Horovod's and is not copied here, so
these tests read a Horovod checkout's (``HOROVOD_EXAMPLES=<checkout>/examples/pytorch``,
``make horovod-examples HOROVOD=<checkout>``) and are skipped without one. Each runs with
``import horovod.torch as hvd`` (and ``import horovod``) the only lines changed, under
``mpiexec -n 2``, with small arguments. Where torchvision cannot be imported (PyPI has no
CPU build of it for this torch: its operators need the CUDA build's libraries), the
stand-in in ``tests/standins`` gives the examples their models, datasets and transforms on
synthetic data; the ImageNet example reads a synthetic image folder written here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
EXAMPLES = os.environ.get("HOROVOD_EXAMPLES")
STANDINS = ROOT / "tests" / "standins"
#: the lines a user changes: Horovod's imports, each to ringcomp's
IMPORTS = ((re.compile(r"^import horovod\.torch as hvd$", re.M),
            "import ringcomp.torch as hvd  # was: import horovod.torch as hvd"),
           (re.compile(r"^import horovod$", re.M),
            "import ringcomp as horovod  # was: import horovod"))

pytestmark = pytest.mark.skipif(
    not EXAMPLES, reason="set HOROVOD_EXAMPLES to a Horovod checkout's examples/pytorch "
                         "(make horovod-examples HOROVOD=<checkout>)")


def ported(name: str, where: Path) -> Path:
    """Horovod's example ``name`` with its import lines changed (and nothing else), in
    ``where``."""
    text = (Path(EXAMPLES) / name).read_text()
    changed = text
    for pattern, line in IMPORTS:
        changed = pattern.sub(line, changed)
    assert changed != text, f"{name}: no `import horovod.torch as hvd` line to change"
    path = where / name
    path.write_text(changed)
    return path


def torchvision_path() -> str:
    """The stand-in's directory where the real torchvision does not import, else ''."""
    probe = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True)
    return "" if probe.returncode == 0 else str(STANDINS)


def run(script: Path, *args: str, cwd: Path) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (torchvision_path(), str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run(["mpiexec", "-n", "2", sys.executable, str(script), *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.timeout(700)
@pytest.mark.parametrize("fp16", [False, True])
def test_synthetic_benchmark(tmp_path, fp16):
    """``model(norm_layer=hvd.SyncBatchNorm)``, the optimizer with ``compression=`` and
    ``op=``, both broadcasts, timed steps: rank 0 prints the total rate."""
    script = ported("pytorch_synthetic_benchmark.py", tmp_path)
    out = run(script, "--batch-size", "4", "--num-warmup-batches", "2",
              "--num-batches-per-iter", "2", "--num-iters", "3",
              *(["--fp16-allreduce"] if fp16 else []), cwd=tmp_path)
    rate = re.search(r"Total img/sec on 2 CPU\(s\): ([\d.]+)", out)
    assert rate and float(rate.group(1)) > 0, out[-2000:]


@pytest.mark.timeout(700)
def test_mnist(tmp_path):
    """``DistributedSampler`` shards, ``gradient_predivide_factor=``, fp16 compression, the
    named ``allreduce``s of the test metrics: both epochs train and test on every rank,
    and the averaged test metrics are finite."""
    script = ported("pytorch_mnist.py", tmp_path)
    out = run(script, "--epochs", "2", "--fp16-allreduce", "--gradient-predivide-factor",
              "2.0", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    tested = re.findall(r"Test set: Average loss: ([\d.]+), Accuracy: ([\d.]+)%", out)
    assert len(tested) == 2 and all(np.isfinite(float(a)) for a, _ in tested), out[-2000:]


def image_folder(root: Path, images: int) -> None:
    """Three classes of ``images`` random 64x80 PNGs each under ``root``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in ("a", "b", "c"):
        (root / name).mkdir(parents=True)
        for i in range(images):
            pixels = rng.integers(0, 255, (64, 80, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")


@pytest.mark.timeout(700)
def test_imagenet_resnet50_trains_checkpoints_and_resumes(tmp_path):
    """Sub-batches under ``backward_passes_per_step=``, the per-batch named ``allreduce``
    of the metrics, the broadcast of the resume epoch, rank 0's checkpoints with the
    optimizer's ``state_dict()``: two epochs write two checkpoints; a second run to three
    epochs resumes from the second (loads it on rank 0, broadcasts it) and writes the third."""
    image_folder(tmp_path / "train", 12)
    image_folder(tmp_path / "val", 6)
    script = ported("pytorch_imagenet_resnet50.py", tmp_path)
    common = ["--train-dir", "train", "--val-dir", "val", "--batch-size", "2",
              "--batches-per-allreduce", "2", "--val-batch-size", "4",
              "--gradient-predivide-factor", "2"]
    run(script, *common, "--epochs", "2", cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-1.pth.tar", "checkpoint-2.pth.tar"]
    out = run(script, *common, "--epochs", "3", cwd=tmp_path)
    assert (tmp_path / "checkpoint-3.pth.tar").exists()
    assert "Train Epoch     #3" in out and "Train Epoch     #1" not in out, out[-2000:]
