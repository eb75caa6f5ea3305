"""Datasets (``digits``, ``synthetic``, ``images``) and the sharding every rank agrees on."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, replace

import numpy as np

from ringcomp.transport.agree import everywhere


@dataclass
class Dataset:
    """Train and test arrays: features float32 (n, features), labels int64."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int

    @property
    def features(self) -> int:
        return self.x_train.shape[1]

    def placed(self, placement) -> Dataset:
        """The same data in ``placement``'s memory (a ``ringcomp.devices.placement.Placement``): on
        a GPU the whole (small) set is copied once, so batches never cross the bus."""
        return replace(self, **{name: placement.put(getattr(self, name))
                                for name in ("x_train", "y_train", "x_test", "y_test")})


def _split(name, x, y, classes, seed, test_fraction) -> Dataset:
    order = np.random.default_rng([seed, 0xDA7A]).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset(name, x[train], y[train], x[test], y[test], classes)


def digits_file() -> str:
    """Where scikit-learn's wheel keeps the digits (``load_digits`` reads the same file),
    found without importing scikit-learn: its import costs 0.9 s of CPU per process, which
    every rank of a 16-rank job on two cores paid."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the digits data set ships inside scikit-learn: pip "
                                  "install scikit-learn (ringcomp's setup installs it)")
    return os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data",
                        "digits.csv.gz")


def digits(seed: int, test_fraction: float = 0.2) -> Dataset:
    """The 1797 8x8 digit images that ship inside scikit-learn, scaled to [0, 1]."""
    table = np.loadtxt(digits_file(), delimiter=",")  # 64 pixels, then the label
    x = (table[:, :-1] / 16.0).astype(np.float32)
    return _split("digits", x, table[:, -1].astype(np.int64), 10, seed, test_fraction)


def synthetic(seed: int, samples: int = 8192, features: int = 64, classes: int = 10,
              test_fraction: float = 0.2) -> Dataset:
    """Labels of a random two-layer teacher network on Gaussian inputs: learnable, with a
    known size, for any number of samples and features."""
    rng = np.random.default_rng([seed, 0x7EAC])
    x = rng.standard_normal((samples, features)).astype(np.float32)
    hidden = np.tanh(x @ rng.standard_normal((features, 4 * classes)) / np.sqrt(features))
    y = (hidden @ rng.standard_normal((4 * classes, classes))).argmax(axis=1)
    return _split("synthetic", x, y.astype(np.int64), classes, seed, test_fraction)


#: the ``images`` data set's classes, as ImageNet's
IMAGE_CLASSES = 1000
#: its class patterns' side before they are scaled up to the images'
_PATTERN_SIDE = 8


def image_side(features: int) -> int:
    """The side of the square 3-channel images of ``features`` values (3·side²); ValueError
    when ``features`` is not that."""
    side = int(round((features / 3) ** 0.5))
    if features % 3 or side * side * 3 != features or side < _PATTERN_SIDE:
        raise ValueError(f"images are 3 x side x side: --features must be 3·side² with side "
                         f">= {_PATTERN_SIDE} (150528 for ImageNet's 3x224x224), got "
                         f"{features}")
    return side


def images(seed: int, samples: int = 8192, features: int = 3 * 224 * 224,
           test_fraction: float = 0.2) -> Dataset:
    """Synthetic ImageNet-shaped images, flattened: 3 x side x side (``features`` = 3·side²),
    ``IMAGE_CLASSES`` classes, for timing models of ImageNet's size without a download.
    Class c's images are its own random 3 x 8 x 8 pattern scaled up (nearest neighbour) plus
    unit Gaussian noise, so the labels are learnable; drawn from ``seed`` (``--data-seed``)
    in float32 (a 224-pixel set of 512 samples is 308 MB)."""
    side = image_side(features)
    rng = np.random.default_rng([seed, 0x1A6E])
    patterns = rng.standard_normal((IMAGE_CLASSES, 3, _PATTERN_SIDE, _PATTERN_SIDE),
                                   np.float32)
    grid = np.arange(side) * _PATTERN_SIDE // side  # each pixel's pattern cell
    y = rng.integers(0, IMAGE_CLASSES, samples)
    x = rng.standard_normal((samples, features), np.float32)
    for i, label in enumerate(y):
        x[i] += patterns[label][:, grid][:, :, grid].reshape(-1)
    return _split("images", x, y.astype(np.int64), IMAGE_CLASSES, seed, test_fraction)


DATASETS = ("digits", "synthetic", "images")


def load(name: str, seed: int, samples: int = 8192, features: int = 64,
         evaluate: str = "test") -> Dataset:
    """Data set ``name`` as ``seed`` (``--data-seed``, not the run's ``--seed``) splits
    (and, for ``synthetic`` and ``images``, draws) it; ``evaluate="validation"``: see
    ``validation_split``."""
    if name == "digits":
        dataset = digits(seed)
    elif name == "synthetic":
        dataset = synthetic(seed, samples, features)
    elif name == "images":
        dataset = images(seed, samples, features)
    else:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    return validation_split(dataset, seed) if evaluate == "validation" else dataset


def load_shared(transport, name: str, seed: int, samples: int = 8192, features: int = 64,
                evaluate: str = "test") -> Dataset:
    """``load`` run once, on rank 0, and its arrays broadcast to the other ranks: sixteen
    ranks on a node no longer each read (or generate) the same set. A failure there
    (scikit-learn missing, an unknown name) is raised on every rank."""
    dataset = everywhere(transport, lambda: load(name, seed, samples, features, evaluate)
                         if transport.rank == 0 else None)
    return transport.bcast_obj(dataset) if transport.size > 1 else dataset


def validation_split(dataset: Dataset, seed: int, fraction: float = 0.2) -> Dataset:
    """The training set cut into training and validation data, the validation part in
    the place of the test set (which is left out): for choosing hyper-parameters, such
    as a learning rate, without looking at the test set."""
    order = np.random.default_rng([seed, 0x7A11D]).permutation(len(dataset.x_train))
    held, kept = np.split(order, [int(round(len(order) * fraction))])
    return replace(dataset, x_train=dataset.x_train[kept], y_train=dataset.y_train[kept],
                   x_test=dataset.x_train[held], y_test=dataset.y_train[held])


class Shards:
    """Global batches of ``size·batch`` samples in an order fixed by (seed, epoch); rank r
    reads rows [r·batch, (r+1)·batch) of each. The sample order is the same for any number
    of ranks, so p ranks with batch b see what one process with batch p·b sees; the last
    incomplete global batch of an epoch is dropped.

    Non-IID (``owned``: this rank's samples, ``training.skew.split``): the rank reads
    ``batch`` samples a step from its own, in a stream of seeded permutations of them
    (every owned sample once per pass, a pass as long as the rank's share), so the global
    batch keeps ``size·batch`` samples and an epoch ``n // (size·batch)`` steps."""

    def __init__(self, n: int, batch: int, size: int, rank: int, seed: int, owned=None):
        if batch < 1:
            raise ValueError(f"batch size must be >= 1, got {batch}")
        self.n, self.batch, self.size, self.rank, self.seed = n, batch, size, rank, seed
        self.owned = owned
        self.steps_per_epoch = n // (batch * size)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{n} training samples are fewer than one global batch "
                             f"({size} ranks x {batch}); lower --batch-size")

    def indices(self, step: int) -> np.ndarray:
        """Sample indices of this rank for global step ``step`` (0-based, across epochs)."""
        if self.owned is not None:
            return self._own_batch(step)
        epoch, i = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng([self.seed, 0x0D3E, epoch]).permutation(self.n)
        start = (i * self.size + self.rank) * self.batch
        return order[start:start + self.batch]

    def _own_batch(self, step: int) -> np.ndarray:
        """Positions step·batch .. of this rank's stream of passes over its own samples."""
        m = len(self.owned)
        passes, offsets = np.divmod(np.arange(step * self.batch, (step + 1) * self.batch), m)
        out = np.empty(self.batch, np.int64)
        for k in np.unique(passes):
            order = np.random.default_rng([self.seed, 0x0D3E, self.rank, k]).permutation(m)
            out[passes == k] = self.owned[order[offsets[passes == k]]]
        return out
