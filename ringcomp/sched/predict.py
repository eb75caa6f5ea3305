"""Predicted iteration time of a workload under a method, a plan and a network, and the
bandwidth at which a compressor starts to pay off."""

from __future__ import annotations

import math

from ringcomp.sched.costs import Codec, Network, message_costs, parse_method
from ringcomp.sched.planners import make_plan
from ringcomp.sched.timeline import Problem, timeline
from ringcomp.sched.workload import Workload


def wire_bytes(method: str, p: int, nbytes: float) -> float:
    """Bytes one rank sends for one all-reduce of ``nbytes`` (ring-style accounting)."""
    algorithm, compressor = parse_method(method)
    size = nbytes if compressor is None else compressor.nbytes(max(1, int(nbytes // 4)))
    if algorithm == "allgather":
        return (p - 1) * size
    if algorithm == "tree":
        return 2 * size * (p > 1)
    return 2 * (p - 1) / p * size


def predict(workload: Workload, method: str, p: int, net: Network, codec: Codec | None,
            plan: str = "optimal", memo: dict | None = None) -> dict:
    """Every bucket sent as ``method`` says (compressed when it names a compressor).

    Returns iteration seconds overlapped (forward + backward with each bucket all-reduced
    as soon as it is ready, FIFO; ``plan`` groups the tensors) and without overlap (one
    all-reduce of the whole model after backward: SyncEASGD), and their parts. ``memo``:
    ``message_costs``'."""
    exact, compressed = message_costs(method, p, net, codec, memo)
    cost = compressed or exact
    problem = Problem(workload.sizes, workload.ready, cost, startup=cost(0.0))
    groups = make_plan(plan, problem)
    spans = timeline(problem, groups)
    total = sum(workload.sizes)
    iter_s = workload.forward_s + spans[-1][1]
    return {"method": method, "algorithm": parse_method(method)[0], "plan": plan,
            "workers": p, "buckets": len(groups), "iter_s": iter_s,
            "no_overlap_s": workload.compute_s + cost(total),
            "comm_s": sum(end - start for start, end in spans),
            "exposed_comm_s": iter_s - workload.compute_s,
            "compute_s": workload.compute_s,
            "wire_MB": sum(wire_bytes(method, p, problem.nbytes(g.first, g.last))
                           for g in groups) / 1e6}


def break_even(workload: Workload, method: str, p: int, latency: float, gamma: float,
               codec: Codec | None, plan: str = "optimal",
               low: float = 1e6, high: float = 1e13) -> float | None:
    """The bandwidth (bits/s) below which ``method`` is faster than the exact ring with the
    same plan; ``math.inf`` if it is faster even at ``high``, None if slower even at
    ``low``. Bisection on log(bandwidth)."""

    exact_memo, method_memo = {}, {}  # each size's costs apart from the network, once

    def gain(rate: float) -> float:
        net = Network.of(rate, latency, gamma)
        return (predict(workload, "none", p, net, None, plan, exact_memo)["iter_s"]
                - predict(workload, method, p, net, codec, plan, method_memo)["iter_s"])

    if gain(high) > 0:
        return math.inf
    if gain(low) <= 0:
        return None
    lo, hi = math.log(low), math.log(high)
    for _ in range(30):  # the log-range shrinks 2^30-fold: far below model accuracy
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gain(math.exp(mid)) > 0 else (lo, mid)
    return math.exp((lo + hi) / 2)
