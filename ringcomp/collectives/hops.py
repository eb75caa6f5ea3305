"""The per-hop helper every compressed collective uses: the compressor's hop rule, timed."""

from __future__ import annotations

import time

import numpy as np

from ringcomp.devices import device


class Hops:
    """Call the compressor's codec and hop operations on segments [a, b) of the input,
    recording each in the tracer (kind ``encode``, ``merge`` or ``decode``)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.comp = ctx.compressor
        self.key = ctx.key

    def timed(self, kind, phase, step, seg, fn, *args, same=None):
        """``fn(*args)``, recorded unless the tracer is off or the result ``is same``
        (a hop operation that handed its input back did no work).

        On a GPU the duration is the kernels' time between two CUDA events on the stream,
        not the Python time of launching them; the tracer reads it when the call ends, so
        tracing makes the host wait for no hop's kernels (it would undo the overlap of one
        hop's kernels with the next hop's messages, ``ringcomp.transport.heldsends``).
        """
        if self.ctx.tracer is None:
            return fn(*args)
        events = device.event_pair(self.ctx.buf)
        t0 = time.perf_counter()
        if events:
            events[0].record()
        result = fn(*args)
        if result is not None and result is same:
            return result
        if events:
            events[1].record()
        self.ctx.tracer.hop(op=self.ctx.op_id, alg=self.ctx.algorithm, phase=phase, step=step,
                            chunk=-1, seg=seg, kind=kind, src=self.ctx.rank, dst=self.ctx.rank,
                            bytes=int(getattr(result, "nbytes", 0)), t0=t0,
                            t1=time.perf_counter(), wait=0.0, gpu_events=events)
        return result

    def own(self, a: int, b: int, step: int, seg: int) -> np.ndarray:
        """This rank's payload of elements [a, b) (hop 0 key: shared by every rank)."""
        return self.timed("encode", "reduce-scatter", step, seg, self.comp.encode,
                          self.ctx.read(a, b), self.key.at(0, a))

    def join(self, incoming: np.ndarray, a: int, b: int, step: int, seg: int,
             hop: int | None = None, phase: str = "reduce-scatter") -> np.ndarray:
        """A ring hop: this rank's elements [a, b) join a partial aggregate of ``step + 1``
        ranks (stream ``hop``, default ``step + 1``: a ring that is one of several, as a
        torus row, names its own)."""
        hop = step + 1 if hop is None else hop
        scratch = self.ctx.scratch(b - a, slot=2) if self.comp.join_uses_scratch else None
        return self.timed("merge", phase, step, seg, self.comp.join, incoming,
                          self.ctx.read(a, b), step + 1, self.key.at(hop, a), scratch)

    def start(self, a: int, b: int, seg: int):
        """This rank's elements [a, b) as a partial aggregate of one rank."""
        x = self.ctx.read(a, b)
        return self.timed("encode", "reduce", 0, seg, self.comp.start, x, self.key.at(0, a),
                          same=x)

    def combine(self, agg, payload, a: int, b: int, have: int, joining: int, hop: int,
                phase: str, step: int, seg: int):
        """Add a payload of ``joining`` ranks to ``agg`` of ``have`` (stream ``hop``)."""
        return self.timed("merge", phase, step, seg, self.comp.combine, agg, payload, b - a,
                          have, joining, self.key.at(hop, a), self.ctx.scratch(b - a, slot=3))

    def finish(self, agg, a: int, hop: int, phase: str, step: int, seg: int,
               carry=None) -> np.ndarray:
        """The payload of ``agg`` to send (a re-encode draws from stream ``hop``)."""
        return self.timed("encode", phase, step, seg, self.comp.finish, agg,
                          self.key.at(hop, a), carry, same=agg)

    def decode(self, payload: np.ndarray, a: int, b: int, step: int, seg: int) -> None:
        self.timed("decode", "all-gather", step, seg, self.comp.decode, payload, b - a,
                   self.ctx.buf[a:b])
