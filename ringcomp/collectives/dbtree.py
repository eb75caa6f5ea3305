"""Pipelined double binary tree all-reduce (NCCL-style): two trees, each carries half."""

from __future__ import annotations

from functools import lru_cache

from ringcomp.collectives.base import register
from ringcomp.partition import block_bounds, even_segments

#: the double binary tree's own pipelining segment, smaller than the ring's (a pipeline
#: log p levels deep fills sooner with smaller segments)
TREE_SEGMENT_BYTES = 256 << 10


@lru_cache(maxsize=64)
def binary_tree(p: int) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """In-order binary tree over 0..p-1 rooted at 0: ``(parent, children)`` per rank.

    Rule: for r > 0 with lowest set bit b, the parent is (r ^ b) | (b << 1), or r ^ b when
    that is >= p. The parent's lowest set bit is strictly larger, so the rule is acyclic;
    every node has at most two children, and all odd ranks are leaves.
    """
    parent = [-1] * p
    children: list[list[int]] = [[] for _ in range(p)]
    for r in range(1, p):
        low = r & -r
        up = (r ^ low) | (low << 1)
        if up >= p:
            up = r ^ low
        parent[r] = up
        children[up].append(r)
    return tuple(parent), tuple(tuple(c) for c in children)


@lru_cache(maxsize=64)
def double_tree(p: int):
    """Two complementary trees: tree 1 is tree 0 mirrored (p even) or shifted by one (p odd).

    A rank that is a leaf in one tree is an inner node in the other (for p even), so both
    halves of the data keep every link busy.
    """
    parent0, children0 = binary_tree(p)
    if p % 2 == 0:
        to0 = [p - 1 - r for r in range(p)]
    else:
        to0 = [(r - 1) % p for r in range(p)]
    back = {v: k for k, v in enumerate(to0)}
    parent1 = tuple(-1 if parent0[to0[r]] < 0 else back[parent0[to0[r]]] for r in range(p))
    children1 = tuple(tuple(back[c] for c in children0[to0[r]]) for r in range(p))
    return (parent0, children0), (parent1, children1)


@register("dbtree", options={"segment_bytes": TREE_SEGMENT_BYTES},
          summary="pipelined double binary tree (NCCL-style), two halves on two trees")
def dbtree_allreduce(ctx) -> None:
    """Double binary tree all-reduce, pipelined in segments.

    Steps (half t of the buffer travels on tree t, cut into segments):
      1. For every segment k, in order, for each tree: wait for the children's partial sums
         of k, add them (own data first, then children in tree order) - into the buffer at
         the root, into a scratch accumulator elsewhere - and send the result up; the root
         sends the finished segment down at once. A non-root then posts the receive of the
         finished segment k from its parent straight into the buffer.
      2. Between segments, forward every finished segment that has already arrived to the
         children, so the broadcast of early segments overlaps the reduction of later ones.
      3. Forward the remaining finished segments in order; wait for all sends.

    Invariant: each segment is summed once, at its tree's root, in a fixed order, and every
    rank ends with the root's bytes: results are bit-identical across ranks.
    """
    p, r = ctx.size, ctx.rank
    n = ctx.buf.size
    ctx.materialize()
    if p == 1 or n == 0:
        return
    seg_elems = max(1, int(ctx.options.get("segment_bytes", TREE_SEGMENT_BYTES))
                    // ctx.itemsize)
    buf = ctx.buf
    trees = double_tree(p)
    halves = block_bounds(n, 2)
    segs = [even_segments(lo, hi, seg_elems) for lo, hi in halves]
    reduce_phase = (0, 1)
    bcast_phase = (2, 3)
    state = []
    for t, (parents, children) in enumerate(trees):
        lo, hi = halves[t]
        kids = children[r]
        slots = [ctx.scratch(hi - lo, slot=2 * t + i) for i in range(len(kids))]
        acc = ctx.scratch(hi - lo, slot=4 + t) if parents[r] >= 0 else None
        recvs = [[ctx.irecv(slot[a - lo:b - lo], kid, reduce_phase[t]) for a, b in segs[t]]
                 for kid, slot in zip(kids, slots, strict=True)]
        state.append({"lo": lo, "parent": parents[r], "kids": kids, "slots": slots,
                      "acc": acc, "recvs": recvs, "down": [], "next_down": 0})
    up_sends, down_sends = [], []

    def forward_down(t: int, blocking: bool) -> None:
        st = state[t]
        while st["next_down"] < len(st["down"]):
            k = st["next_down"]
            recv = st["down"][k]
            if not blocking and not ctx.test(recv):
                return
            ctx.wait(recv, "broadcast", k)
            a, b = segs[t][k]
            down_sends.extend(ctx.isend(buf[a:b], kid, bcast_phase[t]) for kid in st["kids"])
            st["next_down"] += 1

    for k in range(max(len(s) for s in segs)):
        for t in (0, 1):
            if k >= len(segs[t]):
                continue
            st = state[t]
            a, b = segs[t][k]
            lo = st["lo"]
            for recv in (rs[k] for rs in st["recvs"]):
                ctx.wait(recv, "reduce", k)
            if st["parent"] < 0:
                for slot in st["slots"]:
                    ctx.reduce(buf[a:b], slot[a - lo:b - lo])
                down_sends.extend(ctx.isend(buf[a:b], kid, bcast_phase[t])
                                  for kid in st["kids"])
                continue
            # a non-root sends its partial sum from an accumulator, because the finished
            # segment will arrive into buf[a:b] while that send may still be reading
            out = st["acc"][a - lo:b - lo]
            if st["slots"]:
                ctx.reduce_ordered(buf[a:b], st["slots"][0][a - lo:b - lo], True, out=out)
                for slot in st["slots"][1:]:
                    ctx.reduce(out, slot[a - lo:b - lo])
            else:
                out[...] = buf[a:b]
            up_sends.append(ctx.isend(out, st["parent"], reduce_phase[t]))
            st["down"].append(ctx.irecv(buf[a:b], st["parent"], bcast_phase[t]))
        for t in (0, 1):
            forward_down(t, blocking=False)
    for t in (0, 1):
        forward_down(t, blocking=True)
    ctx.waitall(up_sends, "reduce")
    ctx.waitall(down_sends, "broadcast")
