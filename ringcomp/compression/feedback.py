"""Error feedback: one wrapper for any compressor, residuals kept per bucket."""

from __future__ import annotations

import warnings

import numpy as np

from ringcomp.compression.base import Compressor, Key
from ringcomp.kernels.arrays import array_module


class ErrorFeedback:
    """Worker-side error memory (EF-SGD / GRACE ``Memory``), keyed by bucket.

    Before a compressed all-reduce, ``compensate`` adds the residual of the bucket's last
    call to the input; afterwards ``update`` stores what this rank's own compression of that
    corrected input lost, segment by segment with the keys the collective uses:
    ``corrected == decode(encode(corrected)) + residual``. Summed over steps, the decoded
    contributions then equal the inputs minus the last residual, so the compression error
    stays bounded instead of accumulating.

    The two-stage scheme also keeps a *server* residual per bucket at each chunk's owner
    (DeepSpeed 1-bit Adam's second error buffer): ``side="server"``.

    Invariant: at most one residual per (bucket, side). A call on a bucket with another
    length or dtype than its residual's replaces it (with a warning: give each tensor its
    own ``bucket``), so calls of ever-changing lengths cannot grow the memory without limit.
    """

    def __init__(self, warn_on_replace: bool = True):
        """``warn_on_replace=False``: buckets are expected to change size (DDP rebuilds its
        buckets after the first iteration), so a replaced residual is not worth a word."""
        self.residuals: dict[tuple, np.ndarray] = {}
        self._slots: dict[tuple, tuple] = {}  # (bucket, side) -> its key in residuals
        self.warn_on_replace = warn_on_replace
        self._warned: set[tuple] = set()  # (bucket, side) whose replacement was said

    def state_dict(self) -> dict:
        """Every residual (worker and server), copied, keyed as ``key`` makes them."""
        return {slot: residual.copy() for slot, residual in self.residuals.items()}

    def load_state_dict(self, state: dict) -> None:
        """Copies of ``state``'s residuals, each kept in the memory it came in (host or
        device: the memory of the buffers it will be added to)."""
        self.residuals = {tuple(slot): array_module(residual).array(residual)
                          for slot, residual in state.items()}
        self._index()

    def _index(self) -> None:
        self._slots = {(k[0], k[3]): k for k in self.residuals}

    def around(self, x: np.ndarray, bucket: int, collective, compressor: Compressor, key: Key,
               segments) -> None:
        """Error feedback around one compressed collective - the only place it runs.

        1. Compensate: ``corrected = x + residual`` of the bucket (a new array).
        2. ``collective(corrected)``.
        3. Update: the residual becomes what this rank's own compression of ``corrected``
           lost over ``segments`` (the collective's, with its keys); ``segments=None``
           means the collective stored it itself (PowerSGD: what its projection lost).
        """
        corrected = self.compensate(x, bucket)
        collective(corrected)
        if segments is not None:
            self.update(corrected, bucket, compressor, key, segments)

    @staticmethod
    def key(bucket: int, size: int, dtype=np.float32, side: str = "worker") -> tuple:
        """Where the residual of a bucket of ``size`` elements is kept."""
        return (bucket, size, np.dtype(dtype).str, side)

    def _slot(self, bucket: int, x, side: str = "worker") -> tuple:
        return self.key(bucket, x.size, x.dtype, side)

    def compensate(self, x: np.ndarray, bucket: int, side: str = "worker") -> np.ndarray:
        """``x`` plus the bucket's residual (a new array; ``x`` is not modified)."""
        residual = self.residuals.get(self._slot(bucket, x, side))
        return x + residual if residual is not None else x.copy()

    def remember(self, residual: np.ndarray, bucket: int, side: str = "worker") -> None:
        """Store ``residual`` as the bucket's residual on ``side``, replacing one of another
        length or dtype (said in a warning: its error is lost)."""
        slot = self._slot(bucket, residual, side)
        old = self._slots.get((bucket, side), slot)
        if old != slot:
            self.residuals.pop(old, None)
            self._say_replaced(bucket, side, old, residual)
        self._slots[(bucket, side)] = slot
        self.residuals[slot] = residual

    def _say_replaced(self, bucket: int, side: str, old: tuple, residual) -> None:
        # once per bucket: the warnings registry keeps every distinct message
        if not self.warn_on_replace or (bucket, side) in self._warned:
            return
        self._warned.add((bucket, side))
        warnings.warn(f"error feedback: bucket {bucket} held a {side} residual of {old[1]} "
                      f"{np.dtype(old[2]).name} elements and now has {residual.size} "
                      f"{residual.dtype.name}: the old residual is dropped (one per bucket; "
                      f"give tensors of different sizes their own bucket=)",
                      RuntimeWarning, stacklevel=4)

    def server_residual(self, bucket: int, size: int, dtype, like=None) -> np.ndarray:
        """A copy of the bucket's server residual of ``size`` elements (zeros at first), for
        a two-stage owner's ``finish`` to add and overwrite (in the memory of ``like``);
        store it back with ``remember(..., side="server")``."""
        residual = self.residuals.get(self.key(bucket, size, dtype, "server"))
        xp = np if like is None else array_module(like)
        return xp.zeros(size, dtype) if residual is None else residual.copy()

    def update(self, corrected: np.ndarray, bucket: int, compressor: Compressor, key: Key,
               segments) -> np.ndarray:
        """Store and return ``corrected - decode(encode(corrected))`` for the bucket,
        encoding the same ``(a, b)`` segments with the same keys as the collective."""
        residual = array_module(corrected).empty_like(corrected)
        for a, b in segments:
            payload = compressor.encode(corrected[a:b], key.at(0, a))
            compressor.decode(payload, b - a, residual[a:b])
        np.subtract(corrected, residual, out=residual)
        self.remember(residual, bucket)
        return residual
