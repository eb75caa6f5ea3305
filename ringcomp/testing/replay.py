"""Single-process replays of every compressed collective: the oracles of the tests and the kit.

Each takes the compressor, every rank's input (in rank order) and the key, and returns what
every rank must end with, bit for bit, by replaying the collective's hop order with the
compressor's own hop operations (``join``; ``start``/``combine``/``finish``; ``settle``),
whose rules are checked against their definitions in ``tests/serial/test_hop_rules.py``.
``REPLAYS`` maps each compressed algorithm's name to its replay.
"""

from __future__ import annotations

import numpy as np

from ringcomp.collectives.compressed_dbtree import subtree_sizes
from ringcomp.collectives.dbtree import double_tree
from ringcomp.collectives.schedule import PHASE_RS, ring_chunk
from ringcomp.collectives.torus import squarest
from ringcomp.partition import block_bounds, even_segments

SEG_BYTES = 2048


def simulate_ring(comp, xs, key):
    """What the compressed ring must produce: walking the ring's schedule (``ring_chunk``),
    at reduce-scatter step s every rank joins its values to the chunk it receives - a
    partial aggregate of s + 1 ranks - with ``join``; everyone decodes the end."""
    p, n = len(xs), xs[0].size
    out = np.empty(n, xs[0].dtype)
    seg = SEG_BYTES // xs[0].itemsize
    segments = [even_segments(lo, hi, seg) for lo, hi in block_bounds(n, p)]
    payloads = {}
    for r in range(p):  # step -1: every rank encodes its own chunk
        c = ring_chunk(r, -1, p, PHASE_RS)
        payloads[c] = [comp.encode(xs[r][a:b], key.at(0, a)) for a, b in segments[c]]
    for s in range(p - 1):
        for r in range(p):
            c = ring_chunk(r, s, p, PHASE_RS)
            for i, (a, b) in enumerate(segments[c]):
                payloads[c][i] = comp.join(payloads[c][i], xs[r][a:b], s + 1,
                                           key.at(s + 1, a), np.empty(b - a, out.dtype))
    for c in range(p):
        for (a, b), payload in zip(segments[c], payloads[c], strict=True):
            comp.decode(payload, b - a, out[a:b])
    return out


def _combine(comp, agg, payload, a, b, have, joining, key, dtype):
    return comp.combine(agg, payload, b - a, have, joining, key, np.empty(b - a, dtype))


def simulate_tree(comp, xs, key):
    """What the compressed binomial tree must produce (same merge order, counts and keys)."""
    p, n, dtype = len(xs), xs[0].size, xs[0].dtype
    segs = even_segments(0, n, SEG_BYTES // xs[0].itemsize)

    def finished(aggs, hop):
        return [comp.finish(agg, key.at(hop, a)) for (a, _), agg in zip(segs, aggs,
                                                                        strict=True)]

    states = {v: [comp.start(xs[v][a:b], key.at(0, a)) for a, b in segs] for v in range(p)}
    counts = dict.fromkeys(range(p), 1)
    mask, level = 1, 0
    while mask < p:
        for v in range(0, p, 2 * mask):
            child = v + mask
            if child >= p:
                continue
            incoming = finished(states[child], (level + 1) * p + child)
            for i, (a, b) in enumerate(segs):
                states[v][i] = _combine(comp, states[v][i], incoming[i], a, b, counts[v],
                                        counts[child], key.at((level + 1) * p + v, a), dtype)
            counts[v] += counts[child]
        mask <<= 1
        level += 1
    out = np.empty(n, dtype)
    for (a, b), payload in zip(segs, finished(states[0], (level + 1) * p), strict=True):
        comp.decode(payload, b - a, out[a:b])
    return out


def simulate_gather(comp, xs, key):
    """Every rank's own payload decoded and summed in rank order, then ``settle``d."""
    n, dtype = xs[0].size, xs[0].dtype
    out, part = np.zeros(n, dtype), np.empty(n, dtype)
    for x in xs:
        for a, b in even_segments(0, n, SEG_BYTES // x.itemsize):
            comp.decode(comp.encode(x[a:b], key.at(0, a)), b - a, part[a:b])
        out += part
    comp.settle(out)
    return out


def simulate_twostage(comp, xs, key, memory=None):
    """Owner c combines chunk c of every rank's payload in rank order and finishes it once
    (with ``memory`` a dict of worker and server residuals, DeepSpeed's two error buffers,
    updated in place: the server residual is the owner's ``finish`` carry), everyone decodes
    the owners' payloads."""
    p, n, dtype = len(xs), xs[0].size, xs[0].dtype
    if memory is not None:
        xs = [x + memory.get(("worker", m), 0) for m, x in enumerate(xs)]
    out = np.empty(n, dtype)
    for c, (lo, hi) in enumerate(block_bounds(n, p)):
        carry = None if memory is None else memory.get(("server", c),
                                                       np.zeros(hi - lo, dtype)).copy()
        for a, b in even_segments(lo, hi, SEG_BYTES // xs[0].itemsize):
            payloads = [comp.encode(x[a:b], key.at(0, a)) for x in xs]
            if memory is not None:
                for m, (x, payload) in enumerate(zip(xs, payloads, strict=True)):
                    res = memory.setdefault(("worker-next", m), np.zeros(n, dtype))
                    res[a:b] = x[a:b] - comp.decode(payload, b - a, np.empty(b - a, dtype))
            agg = None
            for k, payload in enumerate(payloads):
                agg = _combine(comp, agg, payload, a, b, k, 1, key.at(k, a), dtype)
            final = comp.finish(agg, key.at(1, a),
                                None if carry is None else carry[a - lo:b - lo])
            comp.decode(final, b - a, out[a:b])
        if memory is not None:
            memory[("server", c)] = carry
    if memory is not None:
        for m in range(p):
            memory[("worker", m)] = memory.pop(("worker-next", m))
    return out


def simulate_dbtree(comp, xs, key):
    """Half t on tree t of ``double_tree(p)``: each node combines its children's subtree
    aggregates in tree order (same counts and keys as the collective), the root finishes
    once, everyone decodes the roots' payloads."""
    p, n, dtype = len(xs), xs[0].size, xs[0].dtype
    out = np.empty(n, dtype)
    for t, (lo, hi) in enumerate(block_bounds(n, 2)):
        segs = even_segments(lo, hi, SEG_BYTES // xs[0].itemsize)
        parents, children = double_tree(p)[t] if p > 1 else ((-1,), ((),))
        sizes = subtree_sizes(p, t) if p > 1 else (1,)

        def sent(r, t=t, segs=segs, children=children, sizes=sizes):
            state = [comp.start(xs[r][a:b], key.at(0, a)) for a, b in segs]
            count = 1
            for i, kid in enumerate(children[r]):
                incoming = sent(kid)
                for s, (a, b) in enumerate(segs):
                    state[s] = _combine(comp, state[s], incoming[s], a, b, count, sizes[kid],
                                        key.at(1 + 2 * p + 2 * (t * p + r) + i, a), dtype)
                count += sizes[kid]
            return [comp.finish(agg, key.at(1 + t * p + r, a))
                    for (a, _), agg in zip(segs, state, strict=True)]

        for (a, b), payload in zip(segs, sent(parents.index(-1)), strict=True):
            comp.decode(payload, b - a, out[a:b])
    return out


def simulate_torus(comp, xs, key, shape=None):
    """What the compressed R x C torus must produce (default: the squarest shape, what
    "auto" picks on one node): every row runs the compressed ring over its chunks
    (``join``, stream hop 1 + row·C + s); then in every column, at step s, the incoming
    piece of (s + 1)·C ranks and the rank's own row aggregate of C ranks ``combine`` and
    ``finish`` (stream hop 1 + p + column·R + s); everyone decodes the owners' payloads."""
    p, n, dtype = len(xs), xs[0].size, xs[0].dtype
    rows, cols = shape or squarest(p)
    blocks = [even_segments(lo, hi, SEG_BYTES // xs[0].itemsize)
              for lo, hi in block_bounds(n, p)]
    chunks = [[s for k in range(rows) for s in blocks[c * rows + k]] for c in range(cols)]
    row_final = {}
    for i in range(rows):  # 1. one compressed ring per row
        ranks = [i * cols + j for j in range(cols)]
        payloads = {}
        for j, r in enumerate(ranks):
            c = ring_chunk(j, -1, cols, PHASE_RS)
            payloads[c] = [comp.encode(xs[r][a:b], key.at(0, a)) for a, b in chunks[c]]
        for s in range(cols - 1):
            for j, r in enumerate(ranks):
                c = ring_chunk(j, s, cols, PHASE_RS)
                for t, (a, b) in enumerate(chunks[c]):
                    payloads[c][t] = comp.join(payloads[c][t], xs[r][a:b], s + 1,
                                               key.at(1 + i * cols + s, a),
                                               np.empty(b - a, dtype))
        for c in range(cols):
            row_final[i, c] = payloads[c]
    out = np.empty(n, dtype)
    for j in range(cols):  # 2. one ring per column, on the chunk column j owns
        c = (j + 1) % cols
        pieces = [blocks[c * rows + k] for k in range(rows)]
        starts = np.cumsum([0] + [len(piece) for piece in pieces])
        mine = {i: [row_final[i, c][starts[k]:starts[k + 1]] for k in range(rows)]
                for i in range(rows)}
        state = {ring_chunk(i, -1, rows, PHASE_RS): list(mine[i][ring_chunk(
            i, -1, rows, PHASE_RS)]) for i in range(rows)}
        for s in range(rows - 1):
            hop, have = 1 + p + j * rows + s, (s + 1) * cols
            for i in range(rows):
                k = ring_chunk(i, s, rows, PHASE_RS)
                for t, (a, b) in enumerate(pieces[k]):
                    agg = _combine(comp, None, state[k][t], a, b, 0, have, key.at(hop, a),
                                   dtype)
                    agg = _combine(comp, agg, mine[i][k][t], a, b, have, cols,
                                   key.at(hop, a), dtype)
                    state[k][t] = comp.finish(agg, key.at(hop, a))
        for k in range(rows):  # 3-4. everyone decodes the owners' payloads
            for (a, b), payload in zip(pieces[k], state[k], strict=True):
                comp.decode(payload, b - a, out[a:b])
    return out


REPLAYS = {"ring": simulate_ring, "tree": simulate_tree, "dbtree": simulate_dbtree,
               "allgather": simulate_gather, "twostage": simulate_twostage,
               "torus": simulate_torus}
