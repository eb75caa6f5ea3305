"""The per-hop helper every compressed collective uses: encode, join, decode, timed."""

from __future__ import annotations

import time

import numpy as np

#: the default unit of compression of every compressed collective
DEFAULT_SEGMENT_BYTES = 1 << 20


class Hops:
    """Encode, combine and decode segments, timing each for the tracer (ring and tree)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.comp = ctx.compressor
        self.key = ctx.key

    def timed(self, kind, phase, step, seg, fn, *args):
        if self.ctx.tracer is None:
            return fn(*args)
        t0 = time.perf_counter()
        result = fn(*args)
        self.ctx.tracer.hop(op=self.ctx.op_id, alg=self.ctx.algorithm, phase=phase, step=step,
                            chunk=-1, seg=seg, kind=kind, src=self.ctx.rank, dst=self.ctx.rank,
                            bytes=int(getattr(result, "nbytes", 0)), t0=t0,
                            t1=time.perf_counter(), wait=0.0)
        return result

    def own(self, a: int, b: int, step: int, seg: int) -> np.ndarray:
        """This rank's payload of elements [a, b) (hop 0 key: shared by every rank)."""
        return self.timed("encode", "reduce-scatter", step, seg, self.comp.encode,
                           self.ctx.src[a:b], self.key.at(0, a))

    def encode(self, values: np.ndarray, a: int, hop: int, step: int, seg: int) -> np.ndarray:
        """Payload of a partial aggregate's raw values starting at element ``a``, drawing
        from stream ``hop`` (distinct per encoding node, so rounding errors of different
        nodes are independent)."""
        return self.timed("encode", "reduce", step, seg, self.comp.encode, values,
                          self.key.at(hop, a))

    def combine(self, incoming: np.ndarray, a: int, b: int, step: int, seg: int):
        """Join this rank's elements [a, b) to a partial aggregate of ``step + 1`` ranks."""
        return self.timed("merge", "reduce-scatter", step, seg, self._combine, incoming, a, b,
                           step, seg)

    def _combine(self, incoming, a, b, step, seg):
        comp, n = self.comp, b - a
        if comp.aggregation == "cascade":
            partial = self.ctx.scratch(n, slot=2)
            comp.decode(incoming, n, partial)
            partial += self.ctx.src[a:b]
            return comp.encode(partial, self.key.at(step + 1, a))
        own = comp.encode(self.ctx.src[a:b], self.key.at(0, a))
        if comp.aggregation == "linear":
            return comp.add(incoming, own, n)
        return comp.merge(incoming, own, n, step + 1, 1, self.key.at(step + 1, a))

    def decode(self, payload: np.ndarray, a: int, b: int, step: int, seg: int) -> None:
        self.timed("decode", "all-gather", step, seg, self.comp.decode, payload, b - a,
                    self.ctx.buf[a:b])
