"""The ring with nothing of ringcomp's per-call path around it: the floor a benchmark sets
ringcomp's ring against (``bench --raw-mpi``, row ``mpi4py-ring``)."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ringcomp.collectives import schedule
from ringcomp.collectives.schedule import PHASE_AG, PHASE_RS
from ringcomp.compression import Key
from ringcomp.kernels import reduce_pair_into
from ringcomp.partition import block_bounds

#: the row's name in a benchmark table
BARE = "mpi4py-ring"


class BareRing:
    """A ring all-reduce written straight on mpi4py, as a reader would write it by hand:
    one message per chunk and hop, the compressor's ``encode``, ``join`` and ``decode``
    called directly, no argument checks, agreement, tracing, deadline, scratch cache or
    device support. Host arrays only; its own duplicate of ``comm``, so its messages never
    match ringcomp's.

    Steps (chunk c = ``block_bounds(n, p)[c]``; rs and ag the rank's ``schedule.ring``,
    the schedule ringcomp's ring reads):
      1. Reduce-scatter: send chunk rs[0] (exact: the input; compressed: its payload, key
         hop 0); at step s receive chunk rs[s + 1], join this rank's part (exact: input +
         incoming, in that operand order; compressed: ``join`` as contributor s + 2, key
         hop s + 1) and forward it, except at the last step: the rank then owns it (ag[0]).
      2. All-gather: post every receive, send the owned chunk, forward each arriving chunk
         but the last step's; compressed, decode every final payload into the output.

    Invariant: where every chunk of ringcomp's ring is one segment (chunks up to its
    ``segment_bytes``), the same operations on the same bytes in the same order: the
    output is bit-identical to ``allreduce(x, algorithm="ring", compressor=...)`` with
    the same key (tests/mpi/test_bare_ring.py). Only the per-call path differs.
    """

    def __init__(self, comm, compressor=None, op: str = "sum"):
        if compressor is not None and (op != "sum" or compressor.wraps_exact):
            raise ValueError("a compressed bare ring sums hop-by-hop payloads: op='sum', "
                             "not a compressor summed exactly (powersgd)")
        self.comm = comm.Dup()
        self.comp, self.op = compressor, op
        self.p, self.r = self.comm.Get_size(), self.comm.Get_rank()

    def close(self) -> None:
        self.comm.Free()

    def __call__(self, x: np.ndarray, out: np.ndarray, key: Key | None = None) -> None:
        """``out`` = the reduction of every rank's ``x`` (flat host arrays; ``out`` may be
        ``x``), compressed with ``key`` (default: seed, step and bucket 0, as a call of
        ``allreduce`` without them)."""
        p, r = self.p, self.r
        key = Key(0, 0, 0) if key is None else key
        if p == 1:  # one rank: its own values, through the codec as the ring's are
            if self.comp is None:
                out[...] = x
            else:
                self.comp.decode(self.comp.encode(x, key.at(0, 0)), x.size, out)
            return
        bounds = block_bounds(x.size, p)
        ring = schedule.ring(p, r)
        rs, ag = (ring.order[phase].tolist() for phase in (PHASE_RS, PHASE_AG))
        if self.comp is None:
            final = self._reduce_scatter_exact(x, out, bounds, rs, ring.right, ring.left)
        else:
            final = self._reduce_scatter_compressed(x, bounds, rs, ring.right, ring.left, key)
        self._allgather(final, out, bounds, ag, ring.right, ring.left)

    def _reduce_scatter_exact(self, x, out, bounds, rs, right, left):
        p, comm = self.p, self.comm
        lo, hi = bounds[rs[0]]
        sends = [comm.Isend(x[lo:hi], right, 0)]
        incoming = np.empty(max(hi - lo for lo, hi in bounds), x.dtype)
        for step in range(p - 1):
            lo, hi = bounds[rs[step + 1]]
            comm.Recv(incoming[:hi - lo], left, 0)
            reduce_pair_into(self.op, x[lo:hi], incoming[:hi - lo], out[lo:hi])
            if step < p - 2:
                sends.append(comm.Isend(out[lo:hi], right, 0))
        MPI.Request.Waitall(sends)
        return out[lo:hi]

    def _reduce_scatter_compressed(self, x, bounds, rs, right, left, key):
        p, comm, comp = self.p, self.comm, self.comp
        lo, hi = bounds[rs[0]]
        payload = comp.encode(x[lo:hi], key.at(0, lo))
        sends, kept = [comm.Isend(payload, right, 0)], [payload]
        for step in range(p - 1):
            lo, hi = bounds[rs[step + 1]]
            incoming = np.empty(comp.nbytes(hi - lo), np.uint8)
            comm.Recv(incoming, left, 0)
            scratch = np.empty(hi - lo, x.dtype) if comp.join_uses_scratch else None
            payload = comp.join(incoming, x[lo:hi], step + 1, key.at(step + 1, lo), scratch)
            kept.append(payload)  # referenced until its send completes
            if step < p - 2:
                sends.append(comm.Isend(payload, right, 0))
        MPI.Request.Waitall(sends)
        return payload

    def _allgather(self, final, out, bounds, ag, right, left):
        p, comm, comp = self.p, self.comm, self.comp
        arriving = ag[1:]
        bufs = [out[bounds[c][0]:bounds[c][1]] if comp is None
                else np.empty(comp.nbytes(bounds[c][1] - bounds[c][0]), np.uint8)
                for c in arriving]
        recvs = [comm.Irecv(buf, left, 1) for buf in bufs]
        sends = [comm.Isend(final, right, 1)]
        if comp is not None:
            lo, hi = bounds[ag[0]]
            comp.decode(final, hi - lo, out[lo:hi])
        for step, (c, buf, recv) in enumerate(zip(arriving, bufs, recvs, strict=True)):
            recv.Wait()
            if step < p - 2:
                sends.append(comm.Isend(buf, right, 1))
            if comp is not None:
                comp.decode(buf, bounds[c][1] - bounds[c][0], out[bounds[c][0]:bounds[c][1]])
        MPI.Request.Waitall(sends)
