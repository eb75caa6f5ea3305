"""Compressors, one file each, and the registry that names them."""

from ringcomp.compression import (  # noqa: F401
    countsketch,
    fp16,
    marsit,
    none,
    powersgd,
    quantize,
    randomk,
    sign,
    topk,
)
from ringcomp.compression.base import REGISTRY, Compressor, Key, get_compressor, register
from ringcomp.compression.feedback import ErrorFeedback


def compressors() -> list[str]:
    """Names of the registered compressors."""
    return sorted(REGISTRY)


__all__ = ["REGISTRY", "Compressor", "ErrorFeedback", "Key", "compressors", "get_compressor",
           "register"]
