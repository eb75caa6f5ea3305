"""Miniature runs of the value studies, hashed: the digests that say whether a record's values
still follow from the code.

A record of computed values (the convergence study's accuracies, the hop study's errors, the
tuned rates) names the parts of the code its values came from, one per method:

- ``train:OPTIONS`` (``train:exact`` without options): ``STEPS`` training steps of each
  fixture in ``FIXTURES`` (an MLP and a CNN on digits, IID and label-skewed with the
  validation split, the synthetic teacher) with the method's training options, hashing the
  parameters after them and the evaluated accuracy. Marsit-K runs with K = 2, so its
  full-precision round happens inside the miniature.
- ``hops:ALGORITHM+COMPRESSOR``: ``STEPS`` shadow-mode all-reduces of the hop study's own
  inputs, hashing every rank's outputs and the per-hop error table.

A digest depends on the rank count: ``digests`` computes each at 4 and 5 ranks (where the
study's job has them) and ``make test`` computes them again. This module uses only the
stable public surface (``allreduce``, ``Trainer``, ``parse``), so a digest can also be
computed against an older checkout, as the records measured before it existed were::

    PYTHONPATH=/tmp/old mpiexec -n 4 python ringcomp/experiments/miniatures.py PART...
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys

import numpy as np

from ringcomp.experiments.hop_error import inputs
from ringcomp.plans.call import allreduce
from ringcomp.trace import Tracer, shadow_table
from ringcomp.training.config import parse
from ringcomp.training.trainer import Trainer
from ringcomp.transport.cache import get_transport

#: steps of every miniature run
STEPS = 4
#: elements per rank of a hop miniature
ELEMENTS = 1536
#: the training fixtures every ``train:`` part runs
FIXTURES = (
    "--model mlp:32x16 --dataset digits --batch-size 8",
    "--model mlp:32x16 --dataset digits --batch-size 8 --partition label-skew:0.1 "
    "--eval-on validation",
    "--model cnn:4x8 --dataset digits --batch-size 8 --partition label-skew:0.1",
    "--model mlp:32x16 --dataset synthetic --samples 512 --features 16 --batch-size 8",
)


def train_part(options: list[str]) -> str:
    """The part name of a method's training options."""
    return "train:" + (shlex.join(options) or "exact")


def _training_options(part: str) -> list[str]:
    words = [] if part == "exact" else shlex.split(part)
    if "--marsit-k" in words:  # its full-precision round inside the miniature
        words[words.index("--marsit-k") + 1] = "2"
    return words


def training(transport, part: str) -> str:
    """``STEPS`` steps of every fixture with these training options, hashed."""
    digest = hashlib.sha256()
    for fixture in FIXTURES:
        args = parse([*shlex.split(fixture), *_training_options(part), "--lr", "0.05",
                      "--seed", "0", "--steps", str(STEPS), "--no-progress"])
        trainer = Trainer(args, transport)
        for step in range(STEPS):
            trainer.train_step(step)
            trainer.step = step + 1
        trainer.reducer.close()
        digest.update(trainer.store.flat.tobytes())
        digest.update(np.float64(trainer.evaluate()).tobytes())
    return digest.hexdigest()[:16]


def hops(transport, method: str) -> str:
    """``STEPS`` shadow-mode all-reduces of ``method`` (algorithm+compressor), hashed: every
    rank's outputs and the error table of every hop."""
    algorithm, compressor = method.split("+", 1)
    x = inputs(transport.rank, ELEMENTS, 0)
    tracer, digest = Tracer(), hashlib.sha256()
    for step in range(STEPS):
        out = allreduce(x, algorithm=algorithm, compressor=compressor, comm=transport,
                        seed=0, step=step, tracer=tracer, shadow=True)
        digest.update(out.tobytes())
    mine = [r for r in tracer.records if r["type"] == "op"
            or (r["type"] == "hop" and r["kind"] == "shadow")]
    rows = shadow_table([r for part in transport.allgather_obj(mine) for r in part])
    digest.update(json.dumps(rows, sort_keys=True).encode())
    everyone = "".join(transport.allgather_obj(digest.hexdigest()))  # every rank's outputs
    return hashlib.sha256(everyone.encode()).hexdigest()[:16]


#: part prefix -> the miniature that computes it
MINIATURES = {"train": training, "hops": hops}


def digest(transport, part: str) -> str:
    """The digest of one part (``train:...`` or ``hops:...``) on this transport's ranks."""
    kind, _, name = part.partition(":")
    if kind not in MINIATURES or not name:
        raise ValueError(f"unknown digest part {part!r}; parts are "
                         f"{', '.join(k + ':...' for k in MINIATURES)}")
    return MINIATURES[kind](transport, name)


def main(parts: list[str]) -> None:
    """Print ``{part@ranks: digest}`` (rank 0) of ``parts`` on the world's ranks."""
    transport = get_transport()
    found = {f"{part}@{transport.size}": digest(transport, part) for part in parts}
    if transport.rank == 0:
        print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
