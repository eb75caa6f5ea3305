"""Shadow mode: each hop's compressed partial aggregate against the exact one of its ranks."""

from __future__ import annotations

import time

import numpy as np

from ringcomp.collectives.ring import gather_rows
from ringcomp.kernels.arrays import to_numpy

PHASE_SHADOW = 2


def _exact(values: np.ndarray) -> np.ndarray:
    """A (2, n) float64 block: the values and their signs (+1 for >= 0, as the kernels)."""
    values = to_numpy(values)
    block = np.empty((2, values.size))
    block[0] = values
    block[1] = np.where(values >= 0, 1.0, -1.0)
    return block


def decoded_on_host(ctx, payload, n: int) -> np.ndarray:
    """The ``n`` values a payload stands for, decoded where it lives, as a host array."""
    return to_numpy(ctx.compressor.decode(payload, n, ctx.empty(n, ctx.src.dtype)))


def hop_error(decoded: np.ndarray, exact: np.ndarray, contributors: int) -> dict:
    """Error of a compressed partial aggregate against the exact one of the same ranks.

    ``rel_err`` and ``cosine`` compare with the exact sum of values; ``rel_err_signs``
    compares with the exact mean of signs (what Marsit's ±1 output estimates) and
    ``sign_agree`` is the fraction of elements whose sign matches the exact sum's.
    """
    d = to_numpy(decoded).astype(np.float64)
    raw, signs = exact[0], exact[1] / contributors
    norm = np.linalg.norm(raw)
    dn = np.linalg.norm(d)
    return {
        "contributors": contributors,
        "rel_err": float(np.linalg.norm(d - raw) / norm) if norm else 0.0,
        "cosine": float(d @ raw / (dn * norm)) if dn and norm else 1.0,
        "rel_err_signs": float(np.linalg.norm(d - signs) / (np.linalg.norm(signs) or 1.0)),
        "sign_agree": float(np.mean((d >= 0) == (raw >= 0))) if d.size else 1.0,
    }


def _emit(ctx, phase: str, step: int, seg: int, chunk: int, lo: int, hi: int,
          errors: dict) -> None:
    """One tracer record of kind ``shadow`` (zero bytes, zero duration) holding ``errors``
    of elements [lo, hi)."""
    now = time.perf_counter()
    ctx.tracer.hop(op=ctx.op_id, alg=ctx.algorithm, phase=phase, step=step, chunk=chunk,
                   seg=seg, kind="shadow", src=ctx.rank, dst=ctx.rank, bytes=0, t0=now,
                   t1=now, wait=0.0, lo=lo, hi=hi, **errors)


class Oracle:
    """Shadow mode for the tree, double tree, two-stage and gather schemes.

    Every rank's input is all-gathered once in float64 (untraced), so a rank can form the
    exact partial sum of any set of contributors locally and compare the aggregate it is
    about to send (or has finished) with it. Costs p·n·8 bytes per rank: for measurement
    runs of moderate size only. The ring keeps its own ``Shadow``, which forwards exact
    partials hop by hop and scales to any size.
    """

    def __init__(self, ctx):
        self.ctx = ctx
        self.rows = gather_rows(ctx, np.asarray(to_numpy(ctx.src), np.float64), tracer=None)

    def values(self, decoded: np.ndarray, a: int, b: int, ranks, phase: str, step: int,
               seg: int) -> None:
        """Record decoded values of elements [a, b) aggregated over ``ranks``."""
        part = self.rows[list(ranks), a:b]
        exact = np.stack([part.sum(axis=0), np.where(part >= 0, 1.0, -1.0).sum(axis=0)])
        _emit(self.ctx, phase, step, seg, -1, a, b, hop_error(decoded, exact, len(ranks)))

    def payloads(self, payloads, segments, ranks, phase: str, step: int) -> None:
        """Record one payload per segment, each aggregated over ``ranks``."""
        for seg, ((a, b), payload) in enumerate(zip(segments, payloads, strict=True)):
            self.values(decoded_on_host(self.ctx, payload, b - a), a, b, ranks, phase, step, seg)


def oracle(ctx) -> Oracle | None:
    """The shadow oracle when this call runs in shadow mode (collective: every rank)."""
    return Oracle(ctx) if ctx.shadow else None


class Shadow:
    """Carries, for every segment of a compressed ring, the exact (values, signs) partial
    sums of the same contributors on a separate tag, and records each hop's error into the
    tracer (records of kind ``shadow``). Doubles the traffic; for measurement only."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.sends = []

    def send_own(self, a: int, b: int, dest: int) -> None:
        block = _exact(self.ctx.src[a:b])
        self.sends.append((block, self.ctx.isend(block, dest, PHASE_SHADOW)))

    def post(self, segments, source: int):
        blocks = [np.empty((2, b - a)) for a, b in segments]
        return blocks, [self.ctx.irecv(block, source, PHASE_SHADOW) for block in blocks]

    def join(self, posted, seg: int, a: int, b: int, step: int, chunk: int, payload,
             dest: int | None) -> None:
        """Complete segment ``seg``'s exact partial, compare the compressed ``payload`` of
        step ``step`` (step + 2 contributors) with it, and forward it to ``dest``."""
        blocks, recvs = posted
        self.ctx.wait(recvs[seg], "shadow", step, seg, chunk)
        exact = blocks[seg] + _exact(self.ctx.src[a:b])
        decoded = decoded_on_host(self.ctx, payload, b - a)
        _emit(self.ctx, "reduce-scatter", step, seg, chunk, a, b,
              hop_error(decoded, exact, step + 2))
        if dest is not None:
            self.sends.append((exact, self.ctx.isend(exact, dest, PHASE_SHADOW)))

    def finish(self) -> None:
        self.ctx.waitall([pending for _, pending in self.sends], "shadow")
