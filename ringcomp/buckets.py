"""Fusion plans: which consecutive gradients (in backward order) travel as one buffer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    """Parameters ``first..last`` (indices into the store, backward order) = flat slice
    ``[lo, hi)``; ``compressed`` says whether the compressor applies to it."""

    index: int
    first: int
    last: int
    lo: int
    hi: int
    compressed: bool

    @property
    def size(self) -> int:
        return self.hi - self.lo


def plan_buckets(infos, bucket_bytes: float | None, small_elements: int = 0,
                 itemsize: int = 4) -> list[Bucket]:
    """Cut the parameters into buckets.

    ``bucket_bytes``: None = one bucket for the whole model, 0 = one per parameter tensor
    (layer-wise), else close a bucket once it holds at least that many bytes (Horovod/DDP
    fusion). Tensors smaller than ``small_elements`` (biases, norms) travel uncompressed:
    consecutive small ones, and any small one that follows a large one, form buckets of
    their own so compressed and exact data never share a buffer.

    Invariant: buckets are contiguous, cover every parameter once, in backward order.
    """
    buckets: list[Bucket] = []
    start = None

    def close(end):
        nonlocal start
        first, last = start, end
        buckets.append(Bucket(len(buckets), first, last, infos[first].offset,
                              infos[last].offset + infos[last].size,
                              infos[first].size >= small_elements))
        start = None

    for i, info in enumerate(infos):
        small = info.size < small_elements
        if start is not None and (infos[start].size < small_elements) != small:
            close(i - 1)
        if start is None:
            start = i
        filled = (infos[i].offset + info.size - infos[start].offset) * itemsize
        if bucket_bytes is not None and filled >= bucket_bytes:
            close(i)
    if start is not None:
        close(len(infos) - 1)
    return buckets
