"""Single-process simulations of every compressed collective: the oracles of the MPI tests.

Each takes the compressor, every rank's input (in rank order) and the key, and returns what
every rank must end with, bit for bit, by replaying the collective's hop order.
"""

from __future__ import annotations

import numpy as np

from ringcomp.collectives.ring import PHASE_RS, ring_chunk
from ringcomp.partition import block_bounds, even_segments

SEG_BYTES = 2048


def simulate_ring(comp, xs, key):
    """What the compressed ring must produce: walking the ring's schedule (``ring_chunk``),
    at reduce-scatter step s every rank joins the chunk it receives - a partial aggregate
    of s + 1 ranks - by the compressor's aggregation rule; everyone decodes the end."""
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
                joiner, payload = xs[r][a:b], payloads[c][i]
                if comp.aggregation == "cascade":
                    partial = comp.decode(payload, b - a, np.empty(b - a, out.dtype)) + joiner
                    payload = comp.encode(partial, key.at(s + 1, a))
                elif comp.aggregation == "linear":
                    payload = comp.add(payload, comp.encode(joiner, key.at(0, a)), b - a)
                else:
                    payload = comp.merge(payload, comp.encode(joiner, key.at(0, a)), b - a,
                                         s + 1, 1, key.at(s + 1, a))
                payloads[c][i] = payload
    for c in range(p):
        for (a, b), payload in zip(segments[c], payloads[c], strict=True):
            comp.decode(payload, b - a, out[a:b])
    return out


def simulate_tree(comp, xs, key):
    """What the compressed binomial tree must produce (same merge order, counts and keys)."""
    p, n, dtype = len(xs), xs[0].size, xs[0].dtype
    segs = even_segments(0, n, SEG_BYTES // xs[0].itemsize)

    def encoded(state, hop):
        if comp.aggregation != "cascade":
            return state
        return [comp.encode(state[a:b], key.at(hop, a)) for a, b in segs]

    if comp.aggregation == "cascade":
        states = {v: xs[v].copy() for v in range(p)}
    else:
        states = {v: [comp.encode(xs[v][a:b], key.at(0, a)) for a, b in segs] for v in range(p)}
    counts = dict.fromkeys(range(p), 1)
    mask, level = 1, 0
    while mask < p:
        for v in range(0, p, 2 * mask):
            child = v + mask
            if child >= p:
                continue
            incoming = encoded(states[child], (level + 1) * p + child)
            for i, (a, b) in enumerate(segs):
                if comp.aggregation == "cascade":
                    states[v][a:b] += comp.decode(incoming[i], b - a, np.empty(b - a, dtype))
                elif comp.aggregation == "linear":
                    states[v][i] = comp.add(states[v][i], incoming[i], b - a)
                else:
                    states[v][i] = comp.merge(states[v][i], incoming[i], b - a, counts[v],
                                              counts[child], key.at((level + 1) * p + v, a))
            counts[v] += counts[child]
        mask <<= 1
        level += 1
    out = np.empty(n, dtype)
    for (a, b), payload in zip(segs, encoded(states[0], (level + 1) * p), strict=True):
        comp.decode(payload, b - a, out[a:b])
    return out


def simulate_gather(comp, xs, key):
    """Every rank's own payload decoded and summed in rank order."""
    n, dtype = xs[0].size, xs[0].dtype
    out, part = np.zeros(n, dtype), np.empty(n, dtype)
    for x in xs:
        for a, b in even_segments(0, n, SEG_BYTES // x.itemsize):
            comp.decode(comp.encode(x[a:b], key.at(0, a)), b - a, part[a:b])
        out += part
    if comp.aggregation == "marsit":  # signSGD majority vote
        out = np.where(out >= 0, 1, -1).astype(dtype)
    return out


def simulate_twostage(comp, xs, key, memory=None):
    """Owner c aggregates chunk c of every rank's payload in rank order, re-encodes once
    (cascade; with ``memory`` a dict of worker and server residuals, DeepSpeed's two error
    buffers, updated in place), everyone decodes the owners' payloads."""
    p, n, dtype = len(xs), xs[0].size, xs[0].dtype
    if memory is not None:
        xs = [x + memory.get(("worker", m), 0) for m, x in enumerate(xs)]
    out = np.empty(n, dtype)
    for c, (lo, hi) in enumerate(block_bounds(n, p)):
        total = np.zeros(hi - lo, dtype)
        finals = []
        for a, b in even_segments(lo, hi, SEG_BYTES // xs[0].itemsize):
            payloads = [comp.encode(x[a:b], key.at(0, a)) for x in xs]
            if memory is not None:
                for m, (x, payload) in enumerate(zip(xs, payloads, strict=True)):
                    res = memory.setdefault(("worker-next", m), np.zeros(n, dtype))
                    res[a:b] = x[a:b] - comp.decode(payload, b - a, np.empty(b - a, dtype))
            if comp.aggregation == "cascade":
                for payload in payloads:
                    total[a - lo:b - lo] += comp.decode(payload, b - a, np.empty(b - a, dtype))
                finals.append(None)
                continue
            final = payloads[0]
            for k in range(1, p):
                final = (comp.add(final, payloads[k], b - a) if comp.aggregation == "linear"
                         else comp.merge(final, payloads[k], b - a, k, 1, key.at(k, a)))
            finals.append(final)
        if comp.aggregation == "cascade":
            if memory is not None:
                total = total + memory.get(("server", c), 0)
            server = np.empty(hi - lo, dtype)
            for i, (a, b) in enumerate(even_segments(lo, hi, SEG_BYTES // xs[0].itemsize)):
                finals[i] = comp.encode(total[a - lo:b - lo], key.at(1, a))
                server[a - lo:b - lo] = total[a - lo:b - lo] - comp.decode(
                    finals[i], b - a, np.empty(b - a, dtype))
            if memory is not None:
                memory[("server", c)] = server
        for (a, b), final in zip(even_segments(lo, hi, SEG_BYTES // xs[0].itemsize), finals,
                                 strict=True):
            comp.decode(final, b - a, out[a:b])
    if memory is not None:
        for m in range(p):
            memory[("worker", m)] = memory.pop(("worker-next", m))
    return out


def simulate_dbtree(comp, xs, key):
    """Half t on tree t of ``double_tree(p)``: each node joins its children's subtree
    aggregates in tree order (same counts and keys as the collective), the root encodes
    once, everyone decodes the roots' payloads."""
    from ringcomp.collectives.compressed_dbtree import subtree_sizes
    from ringcomp.collectives.dbtree import double_tree

    p, n, dtype = len(xs), xs[0].size, xs[0].dtype
    out = np.empty(n, dtype)
    for t, (lo, hi) in enumerate(block_bounds(n, 2)):
        segs = even_segments(lo, hi, SEG_BYTES // xs[0].itemsize)
        parents, children = double_tree(p)[t] if p > 1 else ((-1,), ((),))
        sizes = subtree_sizes(p, t) if p > 1 else (1,)

        def sent(r, t=t, segs=segs, children=children, sizes=sizes):
            if comp.aggregation == "cascade":
                state = xs[r].copy()
            else:
                state = [comp.encode(xs[r][a:b], key.at(0, a)) for a, b in segs]
            count = 1
            for i, kid in enumerate(children[r]):
                incoming = sent(kid)
                for s, (a, b) in enumerate(segs):
                    if comp.aggregation == "cascade":
                        state[a:b] += comp.decode(incoming[s], b - a, np.empty(b - a, dtype))
                    elif comp.aggregation == "linear":
                        state[s] = comp.add(state[s], incoming[s], b - a)
                    else:
                        state[s] = comp.merge(state[s], incoming[s], b - a, count, sizes[kid],
                                              key.at(1 + 2 * p + 2 * (t * p + r) + i, a))
                count += sizes[kid]
            if comp.aggregation != "cascade":
                return state
            return [comp.encode(state[a:b], key.at(1 + t * p + r, a)) for a, b in segs]

        for (a, b), payload in zip(segs, sent(parents.index(-1)), strict=True):
            comp.decode(payload, b - a, out[a:b])
    return out


SIMULATIONS = {"ring": simulate_ring, "tree": simulate_tree, "dbtree": simulate_dbtree,
               "allgather": simulate_gather, "twostage": simulate_twostage}


