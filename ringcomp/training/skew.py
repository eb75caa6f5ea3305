"""Non-IID data: which training samples each rank owns (``--partition``)."""

from __future__ import annotations

import math

import numpy as np

from ringcomp.kernels.arrays import to_numpy

KINDS = ("iid", "label-skew:<alpha>", "shard:<k>")


def parse_partition(spec: str) -> tuple[str, float]:
    """``("iid", 0)``, ``("label-skew", alpha)`` or ``("shard", k)``; ValueError naming
    the accepted forms otherwise."""
    kind, _, value = spec.partition(":")
    try:
        if kind == "iid" and not value:
            return "iid", 0.0
        if kind == "label-skew" and math.isfinite(alpha := float(value)) and alpha > 0:
            return "label-skew", alpha
        if kind == "shard" and value.isdigit() and int(value) >= 1:
            return "shard", int(value)
    except ValueError:
        pass
    raise ValueError(f"--partition {spec}: need one of {', '.join(KINDS)} (alpha > 0, "
                     f"k >= 1 classes per rank)")


def split(labels: np.ndarray, ranks: int, spec: str, seed: int) -> list[np.ndarray] | None:
    """The training-sample indices each of ``ranks`` ranks owns (sorted), the same on
    every rank for the same arguments; None for ``iid`` (every rank reads the shared
    global order, ``data.Shards``).

    - ``label-skew:<alpha>`` (Hsu et al. 2019, the usual federated-learning split): for
      every class, the shares of the ranks are drawn from Dirichlet(alpha, ..., alpha) and
      the class's samples are cut accordingly. Every sample is owned once; small alpha
      (0.1) gives each rank a few dominant classes, large alpha (100) is near IID.
    - ``shard:<k>`` (McMahan et al. 2017): samples sorted by label are cut into
      ``ranks·k`` equal shards and every rank gets k of them at random, so it sees about
      k classes.

    A rank left without samples gets one from the rank that owns most (a step needs
    something to read); ValueError when there are fewer samples than ranks.
    """
    kind, value = parse_partition(spec)
    if kind == "iid":
        return None
    if len(labels) < ranks:
        raise ValueError(f"--partition {spec}: {len(labels)} samples for {ranks} ranks")
    rng = np.random.default_rng([seed, 0x5E3D])
    owned: list[list[int]] = [[] for _ in range(ranks)]
    if kind == "label-skew":
        for c in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet([value] * ranks))[:-1] * len(members)).astype(int)
            for r, part in enumerate(np.split(members, cuts)):
                owned[r] += part.tolist()
    else:
        order = np.argsort(labels, kind="stable")
        shards = np.array_split(order, ranks * int(value))
        for i, s in enumerate(rng.permutation(len(shards))):
            owned[i % ranks] += shards[s].tolist()
    for r in range(ranks):
        if not owned[r]:
            richest = max(range(ranks), key=lambda q: len(owned[q]))
            owned[r].append(owned[richest].pop())
    return [np.sort(np.array(part, dtype=np.int64)) for part in owned]


def owned_by(labels, ranks: int, rank: int, spec: str, seed: int) -> np.ndarray | None:
    """``rank``'s samples under ``spec`` (None for iid); ``labels`` on the host or a GPU."""
    if spec == "iid":
        return None
    return split(np.asarray(to_numpy(labels)), ranks, spec, seed)[rank]


def class_shares(labels: np.ndarray, parts: list[np.ndarray], classes: int) -> np.ndarray:
    """(ranks, classes) fraction of each rank's samples in each class: how skewed."""
    shares = np.zeros((len(parts), classes))
    for r, part in enumerate(parts):
        counts = np.bincount(labels[part], minlength=classes)
        shares[r] = counts / max(1, counts.sum())
    return shares
