"""Double binary tree all-reduce with compressed payloads, aggregated by the hop rule."""

from __future__ import annotations

from functools import lru_cache

from ringcomp.collectives.base import DEFAULT_SEGMENT_BYTES, register_compressed
from ringcomp.collectives.compressed_tree import Partial
from ringcomp.collectives.dbtree import double_tree
from ringcomp.collectives.hops import Hops
from ringcomp.collectives.shadow import oracle
from ringcomp.partition import block_bounds, even_segments

PHASE_UP, PHASE_DOWN = (0, 1), (2, 3)


@lru_cache(maxsize=64)
def subtree_members(p: int, tree: int) -> tuple[tuple[int, ...], ...]:
    """The ranks of the subtree under each rank of ``double_tree(p)[tree]``, sorted."""
    if p == 1:
        return ((0,),)
    parents, children = double_tree(p)[tree]
    members: list[tuple[int, ...]] = [()] * p

    def collect(r: int) -> tuple[int, ...]:
        members[r] = tuple(sorted((r, *(m for c in children[r] for m in collect(c)))))
        return members[r]

    collect(parents.index(-1))
    return tuple(members)


def subtree_sizes(p: int, tree: int) -> tuple[int, ...]:
    """How many ranks the subtree under each rank covers in ``double_tree(p)[tree]``."""
    return tuple(len(m) for m in subtree_members(p, tree))


def dbtree_segments(n: int, p: int, seg_elems: int) -> list[tuple[int, int]]:
    """The ``(a, b)`` segments a rank encodes: each half of the vector, cut evenly."""
    return [seg for lo, hi in block_bounds(n, 2) for seg in even_segments(lo, hi,
                                                                          max(1, seg_elems))]


@register_compressed("dbtree", segments=dbtree_segments)
def compressed_dbtree_allreduce(ctx) -> None:
    """NCCL's double binary tree with compressed aggregates (half t of the vector on tree t).

    Steps, for both trees at once (tree t carries half t, cut into segments):
      1. Start from the own contribution of the half (``start``: raw values for a
         cascading rule, payloads otherwise).
      2. Receive the children's subtree aggregates in tree order and ``combine`` each
         (stream hop 1 + 2p + 2·(t·p + r) + i for child i): cascade decodes and adds;
         linear adds payloads; Marsit keeps the child's bit with probability (child's
         subtree size) / (ranks joined so far).
      3. A non-root sends its aggregate to its parent (``finish``: cascade encodes it here,
         once, from stream hop 1 + t·p + r); the root encodes the total once.
      4. The root's bytes go down the tree unchanged; every rank decodes them.

    Invariant: each aggregate covers exactly its subtree's ranks; every rank decodes the
    roots' bytes, so results are bit-identical; Marsit's bit of every element is the sign
    of a uniformly chosen rank.
    """
    p, r = ctx.size, ctx.rank
    hops, shadow = Hops(ctx), oracle(ctx)
    seg_elems = max(1, int(ctx.options.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
                    // ctx.itemsize)
    trees = double_tree(p) if p > 1 else (((-1,), ((),)), ((-1,), ((),)))
    sizes = [subtree_sizes(p, t) for t in (0, 1)]
    states, sends = [], []
    for t, (lo, hi) in enumerate(block_bounds(ctx.src.size, 2)):
        segments = even_segments(lo, hi, seg_elems)
        partial = Partial(hops, segments)
        nbytes = partial.payload_sizes()
        kids = trees[t][1][r]
        incoming = [[ctx.empty(size) for size in nbytes] for _ in kids]
        recvs = [[ctx.irecv(buf, kid, PHASE_UP[t]) for buf in bufs]
                 for kid, bufs in zip(kids, incoming, strict=True)]
        states.append((segments, partial, kids, incoming, recvs, nbytes))
    finals = []
    for t, (segments, partial, kids, incoming, recvs, nbytes) in enumerate(states):
        for i, (kid, bufs, pending) in enumerate(zip(kids, incoming, recvs, strict=True)):
            ctx.waitall(pending, "reduce", i)
            partial.combine(bufs, sizes[t][kid], 1 + 2 * p + 2 * (t * p + r) + i, i)
        parent = trees[t][0][r]
        up = partial.encoded(1 + t * p + r, len(kids))
        if shadow is not None:
            shadow.payloads(up, segments, subtree_members(p, t)[r], f"reduce tree {t}",
                            len(kids))
        if parent < 0:
            finals.append(up)
            continue
        sends += [ctx.isend(payload, parent, PHASE_UP[t]) for payload in up]
        final = [ctx.empty(size) for size in nbytes]
        finals.append((final, [ctx.irecv(buf, parent, PHASE_DOWN[t]) for buf in final]))
    for t, (segments, _, kids, *_rest) in enumerate(states):
        final = finals[t]
        if trees[t][0][r] >= 0:
            final, pending = final
            ctx.waitall(pending, "broadcast", 0)
        sends += [ctx.isend(payload, kid, PHASE_DOWN[t]) for kid in kids for payload in final]
        for seg, ((a, b), payload) in enumerate(zip(segments, final, strict=True)):
            hops.decode(payload, a, b, t, seg)
    ctx.waitall(sends, "sends")
