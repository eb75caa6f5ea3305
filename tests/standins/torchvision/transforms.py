"""The transforms the examples compose, on PIL images and tensors."""

import numpy as np
import torch


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, image):
        a = np.asarray(image, dtype=np.float32) / 255.0
        return torch.from_numpy(a[None] if a.ndim == 2 else a.transpose(2, 0, 1).copy())


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]

    def __call__(self, x):
        return (x - self.mean) / self.std


class Resize:
    def __init__(self, size):
        self.size = size

    def __call__(self, image):
        w, h = image.size
        s = self.size / min(w, h)
        return image.resize((max(1, round(w * s)), max(1, round(h * s))))


class CenterCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, image):
        w, h = image.size
        left, top = (w - self.size) // 2, (h - self.size) // 2
        return image.crop((left, top, left + self.size, top + self.size))


class RandomResizedCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, image):
        w, h = image.size
        side = int(min(w, h) * np.sqrt(np.random.uniform(0.08, 1.0))) or 1
        left, top = np.random.randint(0, w - side + 1), np.random.randint(0, h - side + 1)
        return image.crop((left, top, left + side, top + side)).resize((self.size, self.size))


class RandomHorizontalFlip:
    def __call__(self, image):
        from PIL import Image

        return image.transpose(Image.FLIP_LEFT_RIGHT) if np.random.rand() < 0.5 else image
