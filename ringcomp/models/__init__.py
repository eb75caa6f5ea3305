"""Models with layer-wise backward: ``mlp``, ``cnn``, ``logreg`` (``replay:<net>``: replay.py;
``torch:<net>``: PyTorch models, built in ringcomp/torch/models.py, spelled here)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ringcomp.models.layers import (
    Conv2d,
    Dense,
    Flatten,
    Layer,
    MaxPool2,
    ReLU,
    softmax_cross_entropy,
)
from ringcomp.models.params import ParamStore


class Sequential:
    """Layers applied in order; parameters live in one flat ParamStore in backward order.

    ``backward`` is a generator: after each layer's backward it yields the indices (into
    ``store.infos``) of the parameters whose gradients are now final, so a caller can start
    communicating them while earlier layers are still being differentiated.
    """

    def __init__(self, layers: list[Layer], seed: int, input_shape: tuple[int, ...],
                 placement=None):
        """Initialised on the host from ``seed`` (the same values on any device), then
        moved to ``placement`` (a ``ringcomp.devices.placement.Placement``; default: the host)."""
        self.layers, self.input_shape = layers, tuple(input_shape)
        shapes = [(f"{i}.{name}", i, shape)
                  for i in reversed(range(len(layers))) for name, shape in layers[i].params]
        self.store = ParamStore(shapes)
        for i, layer in enumerate(layers):
            layer.bind(self.store, str(i))
        rng = np.random.default_rng([seed, 0x5EED])
        for layer in layers:
            layer.init(rng)
        if placement is not None:
            self.store.place(placement)

    def forward(self, x: np.ndarray) -> np.ndarray:
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def loss(self, x: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray, int]:
        """Forward pass: (mean loss, d loss / d logits, correct predictions)."""
        logits = self.forward(x.reshape((x.shape[0], *self.input_shape)))
        loss, dlogits = softmax_cross_entropy(logits, labels)
        return loss, dlogits, int((logits.argmax(axis=1) == labels).sum())

    def backward(self, dlogits: np.ndarray) -> Iterator[list[int]]:
        dy = dlogits
        for i in reversed(range(len(self.layers))):
            dy = self.layers[i].backward(dy)
            names = [f"{i}.{name}" for name, _ in self.layers[i].params]
            if names:
                yield [self.store.index[name] for name in names]

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.forward(x.reshape((x.shape[0], *self.input_shape))).argmax(axis=1)


def mlp(features: int, classes: int, seed: int, widths=(128, 64),
        placement=None) -> Sequential:
    layers, fan_in = [], features
    for width in widths:
        layers += [Dense(fan_in, width), ReLU()]
        fan_in = width
    return Sequential(layers + [Dense(fan_in, classes)], seed, (features,), placement)


def logreg(features: int, classes: int, seed: int, placement=None) -> Sequential:
    return Sequential([Dense(features, classes)], seed, (features,), placement)


def cnn(features: int, classes: int, seed: int, channels=(8, 16),
        placement=None) -> Sequential:
    """LeNet-style on square single-channel images: (conv 3x3, ReLU, pool 2x2) x 2, dense."""
    side = int(round(features ** 0.5))
    if side * side != features or side % 4:
        raise ValueError(f"cnn needs square images with a side divisible by 4; got "
                         f"{features} features")
    c1, c2 = channels
    layers = [Conv2d(1, c1, 3, side, side), ReLU(), MaxPool2(),
              Conv2d(c1, c2, 3, side // 2, side // 2), ReLU(), MaxPool2(), Flatten(),
              Dense(c2 * (side // 4) ** 2, classes)]
    return Sequential(layers, seed, (1, side, side), placement)


MODELS = {"mlp": mlp, "logreg": logreg, "cnn": cnn}
#: PyTorch models (``torch:<name>``) -> the keyword their sizes set
TORCH_MODELS = {"mlp": "widths", "cnn": "channels", "resnet": "widths", "resnet50": None}


def build_model(spec: str, features: int, classes: int, seed: int,
                placement=None) -> Sequential:
    """``mlp``, ``mlp:256x128`` (hidden widths), ``logreg``, ``cnn``, ``cnn:8x16``; the
    parameters in ``placement``'s memory (default: the host)."""
    name, kwargs = parse_model_spec(spec)
    return MODELS[name](features, classes, seed, placement=placement, **kwargs)


def parse_model_spec(spec: str) -> tuple[str, dict]:
    """``"mlp:256x128"`` -> ``("mlp", {"widths": (256, 128)})``, ``"torch:cnn:8x16"`` ->
    ``("torch:cnn", {"channels": (8, 16)})``; ValueError for an unknown name, sizes on a
    model without any, or sizes that are not positive whole numbers."""
    torch_model = spec.startswith("torch:")
    name, _, arg = spec.removeprefix("torch:").partition(":")
    known = TORCH_MODELS if torch_model else MODELS
    if name not in known:
        raise ValueError(f"unknown model {spec!r}; known: {', '.join(MODELS)}, replay:<net>, "
                         f"torch:{{{','.join(TORCH_MODELS)}}}")
    if torch_model:
        name = f"torch:{name}"
    if not arg:
        return name, {}
    keyword = (TORCH_MODELS if torch_model else {"mlp": "widths", "cnn": "channels"}).get(
        name.removeprefix("torch:"))
    if keyword is None:
        raise ValueError(f"model {name!r} takes no sizes (got {spec!r})")
    parts = arg.split("x")
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(f"model {spec!r}: {keyword} must be positive whole numbers joined by "
                         f"'x', e.g. {name}:64x32")
    return name, {keyword: tuple(int(part) for part in parts)}
