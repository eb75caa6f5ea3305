"""PyTorch models for ``train --model torch:<name>``: an MLP, a LeNet-style CNN, a small
ResNet and ResNet-50, defined here (no downloads), initialised from the run's seed on every
rank."""

from __future__ import annotations

import torch
from torch import nn

from ringcomp.models import TORCH_MODELS, parse_model_spec


def mlp(features: int, classes: int, widths=(128, 64)) -> nn.Module:
    layers, fan_in = [], features
    for width in widths:
        layers += [nn.Linear(fan_in, width), nn.ReLU()]
        fan_in = width
    return nn.Sequential(*layers, nn.Linear(fan_in, classes))


def _side(features: int, divisor: int, name: str) -> int:
    side = int(round(features ** 0.5))
    if side * side != features or side % divisor:
        raise ValueError(f"torch:{name} needs square images with a side divisible by "
                         f"{divisor}; got {features} features")
    return side


def cnn(features: int, classes: int, channels=(8, 16)) -> nn.Module:
    """The NumPy ``cnn``'s architecture: (conv 3x3, ReLU, max-pool 2x2) x 2, dense."""
    side = _side(features, 4, "cnn")
    c1, c2 = channels
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(c2 * (side // 4) ** 2, classes))


class BasicBlock(nn.Module):
    """He et al.'s basic residual block (two 3x3 convolutions), GroupNorm in place of
    BatchNorm: its statistics are per sample, so there are no running buffers that
    data-parallel ranks would have to keep in step (DDP broadcasts BatchNorm's)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(_groups(cout), cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(_groups(cout), cout)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(_groups(cout), cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(self.norm2(self.conv2(y)) + self.shortcut(x))


def _groups(channels: int) -> int:
    return next(g for g in (8, 4, 2, 1) if channels % g == 0)


def resnet(features: int, classes: int, widths=(16, 32)) -> nn.Module:
    """A small ResNet for square single-channel images: a 3x3 stem, one basic block per
    width (every stage after the first halves the side), global average pool, dense."""
    side = _side(features, 2 ** (len(widths) - 1), "resnet")
    stages, cin = [], widths[0]
    for i, width in enumerate(widths):
        stages.append(BasicBlock(cin, width, 1 if i == 0 else 2))
        cin = width
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, widths[0], 3, padding=1, bias=False),
        nn.GroupNorm(_groups(widths[0]), widths[0]), nn.ReLU(),
        *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


class Bottleneck(nn.Module):
    """He et al.'s bottleneck block (1x1 down to ``width``, 3x3 with the stride, 1x1 up to
    4 x ``width``), GroupNorm with 32 groups as in Wu & He's ResNet-50 (see BasicBlock)."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.GroupNorm(32, width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.GroupNorm(32, width),
            nn.ReLU(), nn.Conv2d(width, cout, 1, bias=False), nn.GroupNorm(32, cout))
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(32, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


#: ResNet-50's stages: (bottleneck width, blocks)
RESNET50_STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))


def resnet50(features: int, classes: int) -> nn.Module:
    """ResNet-50 (He et al. 2016) for square 3-channel images (``--dataset images``), with
    GroupNorm: a 7x7 stride-2 stem and 3x3 stride-2 max-pool, 3-4-6-3 bottleneck blocks
    (every stage after the first halves the side), global average pool, dense. 25.6M
    parameters with 1000 classes, as torchvision's; any side the five halvings leave >= 1
    (>= 32)."""
    side = int(round((features / 3) ** 0.5))
    if 3 * side * side != features or side < 32:
        raise ValueError(f"torch:resnet50 needs square 3-channel images with a side of at "
                         f"least 32 (--dataset images --features 3·side²); got {features} "
                         f"features")
    layers, cin = [], 64
    for i, (width, blocks) in enumerate(RESNET50_STAGES):
        for j in range(blocks):
            layers.append(Bottleneck(cin, width, 2 if i > 0 and j == 0 else 1))
            cin = width * Bottleneck.expansion
    return nn.Sequential(
        nn.Unflatten(1, (3, side, side)),
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.GroupNorm(32, 64), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(cin, classes))


BUILDERS = {"mlp": mlp, "cnn": cnn, "resnet": resnet, "resnet50": resnet50}
assert set(BUILDERS) == set(TORCH_MODELS), "the spec grammar names the builders"


def build_torch_model(spec: str, features: int, classes: int, seed: int,
                      device: str = "cpu") -> nn.Module:
    """``torch:cnn``, ``torch:resnet:16x32``, ``torch:mlp:256x128``, ``torch:resnet50``: the model,
    initialised on the CPU from ``seed`` alone (the same values on every rank and device),
    then moved to ``device``."""
    name, kwargs = parse_model_spec(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BUILDERS[name.partition(":")[2]](features, classes, **kwargs)
    return model.to(device)
