"""Digest of compressed all-reduces and short training runs, to compare two commits bit for bit.

A restructuring must not change results. Run it on both and compare the printed digests::

    git worktree add /tmp/old <commit>
    PYTHONPATH=/tmp/old mpiexec -n 3 .venv/bin/python tests/digest_outputs.py   # before
    mpiexec -n 3 .venv/bin/python tests/digest_outputs.py                       # now

Covers every compressor on every compressed algorithm (with and without error feedback, two
steps so residuals matter) and 12 training steps of seven configurations (the convergence
study's models, data sets and label skew among them, and a PyTorch model). Every rank prints
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
        [],
        ["--model", "cnn:4x8", "--compressor", "marsit", "--partition", "label-skew:0.1"],
        ["--dataset", "synthetic", "--samples", "512", "--features", "16", "--compressor",
         "qsgd", "--eval-on", "validation"],
        ["--model", "torch:cnn:4x8", "--compressor", "topk:ratio=0.1", "--error-feedback"]]


def _parameters(trainer) -> bytes:
    model = getattr(trainer.binding, "model", None)
    if model is not None and hasattr(model, "named_parameters"):  # a PyTorch model
        return b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())
    return trainer.store.flat.tobytes()


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
        model = [] if "--model" in extra else ["--model", "mlp:32x16"]
        args = parse(["--no-progress", "--steps", "12", *model, *extra])
        if args.model.startswith("torch:"):
            from ringcomp.torch.job import make_trainer  # torch: the [torch] extra

            trainer = make_trainer(args, get_transport())
        else:
            trainer = Trainer(args, get_transport())
        for step in range(12):
            trainer.train_step(step)
            trainer.step = step + 1
        trainer.engine.close()
        digest.update(_parameters(trainer))
        digest.update(np.float64(trainer.evaluate()).tobytes())
    print(rank, digest.hexdigest()[:16], flush=True)


if __name__ == "__main__":
    main()
