"""A stand-in for torchvision (no CPU build of it for this torch on the package mirror):
the models, datasets and transforms Horovod's PyTorch examples name, on synthetic data."""

from torchvision import datasets, models, transforms  # noqa: F401

__version__ = "0.0+standin"
