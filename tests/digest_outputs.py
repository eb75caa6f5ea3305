"""Digest of compressed all-reduces and short training runs, to compare two commits bit for bit.

A restructuring must not change results. Run it on both and compare the printed digests::

    git worktree add /tmp/old <commit>
    PYTHONPATH=/tmp/old mpiexec -n 3 .venv/bin/python tests/digest_outputs.py   # before
    mpiexec -n 3 .venv/bin/python tests/digest_outputs.py                       # now

Covers every compressor on every compressed algorithm (with and without error feedback, two
steps so residuals matter) and 12 training steps of four configurations. Every rank prints
its digest; they must also agree with each other.
"""

import hashlib

import numpy as np
from mpi4py import MPI

import ringcomp
from ringcomp.training.config import parse
from ringcomp.training.trainer import Trainer
from ringcomp.transports import get_transport

ALGORITHMS = ["ring", "tree", "dbtree", "allgather", "twostage"]
COMPRESSORS = ["fp16", "bf16", "sign", "marsit", "topk:ratio=0.05", "randomk:ratio=0.1", "qsgd",
               "terngrad", "countsketch", "powersgd"]
RUNS = [["--compressor", "marsit"],
        ["--compressor", "topk:ratio=0.1", "--error-feedback", "--algorithm", "tree"],
        ["--compressor", "sign", "--algorithm", "twostage", "--error-feedback"],
        []]


def main() -> None:
    rank, digest = MPI.COMM_WORLD.rank, hashlib.sha256()
    for dtype in (np.float32, np.float64):
        x = np.random.default_rng(rank).standard_normal(5000).astype(dtype)
        for algorithm in ALGORITHMS:
            for compressor in COMPRESSORS:
                for feedback in (False, True):
                    if feedback and compressor == "marsit":
                        continue  # Marsit keeps global compensation instead
                    for step in (2, 3):
                        y = ringcomp.allreduce(x, algorithm=algorithm, compressor=compressor,
                                               seed=5, step=step, bucket=1,
                                               error_feedback=feedback,
                                               segment_bytes=4096)
                    digest.update(y.tobytes())
    for extra in RUNS:
        trainer = Trainer(parse(["--no-progress", "--steps", "12", "--model", "mlp:32x16",
                                 *extra]), get_transport())
        for step in range(12):
            trainer.train_step(step)
            trainer.step = step + 1
        trainer.engine.close()
        digest.update(trainer.store.flat.tobytes())
    print(rank, digest.hexdigest()[:16], flush=True)


if __name__ == "__main__":
    main()
