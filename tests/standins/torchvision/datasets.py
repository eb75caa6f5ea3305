"""``MNIST`` (synthetic digits, no download) and ``ImageFolder`` (a folder per class)."""

import os

import numpy as np
from PIL import Image


class MNIST:
    def __init__(self, root, train=True, download=False, transform=None):
        rng = np.random.default_rng(0 if train else 1)
        n = 512 if train else 256
        self.targets = rng.integers(0, 10, n)
        # each digit a bright square in its own place: learnable in a few steps
        self.data = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, t in enumerate(self.targets):
            self.data[i, 2 * t + 2:2 * t + 8, 4:24] = 255
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        image = Image.fromarray(self.data[i], mode="L")
        return (self.transform(image) if self.transform else image), int(self.targets[i])


class ImageFolder:
    def __init__(self, root, transform=None):
        self.classes = sorted(os.listdir(root))
        self.samples = [(os.path.join(root, c, f), k) for k, c in enumerate(self.classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        image = Image.open(path).convert("RGB")
        return (self.transform(image) if self.transform else image), target
