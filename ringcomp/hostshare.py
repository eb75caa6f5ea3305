"""How much a job's ranks slow each other's host work down: a Python loop alone and all at once."""

from __future__ import annotations

import time

import numpy as np

#: iterations of the loop: about 35-70 ms on one core of the development machines
LOOP = 1_000_000
#: rounds, each timing the loop on every rank together and then on rank 0 alone (paired:
#: a shared machine's speed drifts within seconds, so the two are interleaved)
ROUNDS = 5


def _loop() -> float:
    """Seconds a fixed pure-Python loop takes: host work as a rank's Python does it."""
    t0 = time.perf_counter()
    total = 0
    for i in range(LOOP):
        total += i
    return time.perf_counter() - t0


def rank_slowdown(transport) -> list[float]:
    """Collective: how many times longer the same host work takes when every rank runs it
    at once (until the last rank is done) than on rank 0 alone (while the others sleep
    instead of polling in MPI), one ratio per round; the same list on every rank. About
    1 where each rank has a core of its own, the ranks per core where they share them; a
    timing table's per-call host costs (Python, codecs, copies) stretch about as much, so
    the table states it (a virtual machine's "cores" may be shared with other tenants:
    its two can run two busy processes slower than one).

    Steps, per round: 1. every rank runs the loop after a barrier; 2. rank 0 runs it
    again alone while the others sleep a little longer than their own run took; 3. the
    slowest rank's first time over rank 0's second."""
    if transport.size == 1:
        return [1.0] * ROUNDS
    together, alone = [], []
    for _ in range(ROUNDS):
        transport.barrier()
        together.append(_loop())  # 1.
        transport.barrier()
        if transport.rank == 0:  # 2.
            alone.append(_loop())
        else:
            time.sleep(1.2 * together[-1])
    _, slowest = transport.agree(np.array([int(t * 1e9) for t in together], np.int64))
    alone_ns = transport.bcast_obj([int(t * 1e9) for t in alone])
    return [round(float(a) / max(b, 1), 2) for a, b in zip(slowest, alone_ns, strict=True)]
