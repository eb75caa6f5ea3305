"""``powersgd``: rank-R factors (Vogels et al.), summed exactly in two all-reduce rounds."""

from __future__ import annotations

import math

import numpy as np

from ringcomp.compression.base import Compressor, Key, register
from ringcomp.kernels.arrays import array_module


def orthonormalize(p: np.ndarray) -> np.ndarray:
    """Modified Gram-Schmidt on the columns of ``p`` in place (a zero column stays zero).

    Plain NumPy reductions (pairwise sums, no threaded BLAS), so every rank computes the
    same bits from the same all-reduced input."""
    for j in range(p.shape[1]):
        col = p[:, j]
        for i in range(j):
            col -= (col * p[:, i]).sum() * p[:, i]
        norm = math.sqrt((col * col).sum())
        col *= 1.0 / norm if norm > 0 else 0.0
    return p


def outer_sum(p: np.ndarray, q: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = p @ q.T`` as R rank-1 updates (deterministic, no BLAS)."""
    xp = array_module(out)
    out[...] = 0
    for j in range(p.shape[1]):
        out += xp.outer(p[:, j], q[:, j])
    return out


@register
class PowerSGD(Compressor):
    """PowerSGD: a segment of n elements is viewed as an m x k matrix (m = ceil(sqrt n),
    zero-padded) and approximated as P Q^T with R columns.

    In a collective (``wraps_exact``: ``ringcomp/collectives/lowrank.py``; no hop rule) the
    factors are linear in the data and are summed exactly by any all-reduce algorithm:
    P = sum_m M_m Q, orthonormalise P, Q = sum_m M_m^T P, result P Q^T - the projection of
    the summed matrix on span(P), at (m + k)·R values on the wire instead of n. ``warm=1``
    (the default, as DDP's hook) starts each call from the bucket's last Q, so repeated
    calls run a power iteration across steps; ``warm=0`` draws Q from the shared seed
    every call. ``encode``/``decode`` give the one-rank version (the same steps on x).
    """

    name = "powersgd"
    aggregation = "lowrank"
    wraps_exact = True

    def __init__(self, rank: int = 4, warm: int = 1):
        if not 1 <= int(rank) <= 1024:
            raise ValueError(f"powersgd: rank must be in 1..1024, got {rank}")
        if int(warm) not in (0, 1):
            raise ValueError(f"powersgd: warm must be 0 or 1, got {warm}")
        self.rank, self.warm = int(rank), int(warm)
        self.params = {"rank": self.rank, "warm": self.warm}
        #: the last all-reduced Q of every bucket (warm start), keyed by
        #: (bucket, size, dtype, rank) - the same on every rank
        self.last_q: dict[tuple, np.ndarray] = {}

    def state_dict(self) -> dict:
        return {slot: q.copy() for slot, q in self.last_q.items()}

    def load_state_dict(self, state: dict) -> None:
        """Copies of ``state``'s warm starts, each kept in the memory it came in."""
        self.last_q = {tuple(slot): array_module(q).array(q) for slot, q in state.items()}

    def _slot(self, n: int, key: Key, dtype) -> tuple:
        return (key.bucket, n, np.dtype(dtype).str, self.rank)

    def start_q(self, n: int, key: Key, dtype, like=None) -> np.ndarray:
        """The Q a call starts from: the bucket's last one (warm start) or a fresh one (in
        the memory of ``like``)."""
        q = self.last_q.get(self._slot(n, key, dtype)) if self.warm else None
        return self.initial_q(n, key, dtype, like) if q is None else q

    def keep_q(self, n: int, key: Key, q: np.ndarray) -> None:
        """Remember the all-reduced Q for the bucket's next call."""
        self.last_q[self._slot(n, key, q.dtype)] = q

    def shape(self, n: int) -> tuple[int, int, int]:
        """(m, k, R): matrix rows, columns and the rank actually used."""
        m = max(1, math.isqrt(max(n - 1, 0)) + 1)
        k = max(1, -(-n // m))
        return m, k, min(self.rank, m, k)

    def nbytes(self, n: int) -> int:
        m, k, rank = self.shape(n)
        return 4 * (m + k) * rank

    def matrix(self, x: np.ndarray) -> np.ndarray:
        """``x`` as the zero-padded m x k matrix (a copy)."""
        m, k, _ = self.shape(x.size)
        padded = array_module(x).zeros(m * k, x.dtype)
        padded[:x.size] = x
        return padded.reshape(m, k)

    def initial_q(self, n: int, key: Key, dtype, like=None) -> np.ndarray:
        """The shared-seed starting Q (k x R standard normal), the same on every rank
        (drawn on the host, then placed in the memory of ``like``)."""
        _, k, rank = self.shape(n)
        rng = np.random.Generator(np.random.PCG64([key.at(0, key.offset).stream(), n]))
        q = rng.standard_normal((k, rank)).astype(dtype)
        return q if like is None else array_module(like).asarray(q)

    def encode(self, x: np.ndarray, key: Key) -> np.ndarray:
        m, k, rank = self.shape(x.size)
        mat = self.matrix(x.astype(np.float32))
        p = orthonormalize(mat @ self.initial_q(x.size, key, np.float32, x))
        q = mat.T @ p
        return array_module(x).concatenate([p.reshape(-1), q.reshape(-1)]).view(np.uint8)

    def decode(self, payload: np.ndarray, n: int, out: np.ndarray) -> np.ndarray:
        m, k, rank = self.shape(n)
        factors = payload.view(np.float32)
        p, q = factors[:m * rank].reshape(m, rank), factors[m * rank:].reshape(k, rank)
        full = outer_sum(p, q, array_module(out).empty((m, k), np.float32))
        out[...] = full.reshape(-1)[:n]
        return out
