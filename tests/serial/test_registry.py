"""One registry for exact and compressed forms; Ctx has declared fields only."""

from __future__ import annotations

import numpy as np
import pytest

from ringcomp.collectives import REGISTRY, Ctx, compressed_algorithms, register_compressed


def test_compressed_forms_sit_beside_their_exact_forms():
    assert compressed_algorithms() == ["allgather", "dbtree", "ring", "torus", "tree",
                                       "twostage"]
    for name in compressed_algorithms():
        algorithm = REGISTRY[name]
        assert callable(algorithm.run) and callable(algorithm.compressed)
        segments = algorithm.segments(1000, 3, 64)
        covered = sorted(segments)
        assert covered[0][0] == 0 and all(b > a for a, b in covered)
    assert REGISTRY["rd"].compressed is None  # exact only


def test_a_compressed_form_needs_its_exact_form_and_comes_once():
    with pytest.raises(ValueError, match="register the exact algorithm 'nosuch'"):
        register_compressed("nosuch", segments=lambda n, p, s: [])(lambda ctx: None)
    with pytest.raises(ValueError, match="registered twice"):
        register_compressed("ring", segments=lambda n, p, s: [])(lambda ctx: None)


class OneRank:
    rank, size, op_id = 0, 1, 1

    def begin_op(self, name, algorithm, nbytes):
        return 0


def test_ctx_declares_every_field():
    """No side doors: the compression fields are declared (None/False when exact), and an
    undeclared attribute cannot be set."""
    ctx = Ctx(OneRank(), np.zeros(4, np.float32), "sum", "ring", {})
    assert (ctx.compressor, ctx.key, ctx.memory, ctx.shadow) == (None, None, None, False)
    assert ctx.in_place and ctx.src is ctx.buf and ctx.itemsize == 4
    with pytest.raises(AttributeError):
        ctx.compresor = "typo"


def test_auto_trial_decides_on_paired_calls_by_the_worst_rank():
    """The model's choice is kept only where its calls, each paired with the MPI call made
    right after it, are PREFER_NATIVE faster by the median ratio - on the worst rank (the
    agreement's max). A load that drifts during the trial moves both calls of a pair."""
    from ringcomp.collectives.auto import PREFER_NATIVE, _Trial

    class Ranks:  # the agreement's (min, max) over ranks whose ratios are given
        def __init__(self, *others):
            self.others = others

        def agree(self, values):
            everyone = [values[0], *(int(r * 1e6) for r in self.others)]
            return [min(everyone)], [max(everyone)]

    def trial(model, native):
        t = _Trial(("rd", "mpi"))
        for a, b in zip(model, native, strict=True):
            t.record("rd", a)
            t.record("mpi", b)
        return t

    drifting = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]  # the load grows during the trial
    fast = trial([0.8 * s for s in drifting], drifting)
    assert fast.verdict(Ranks()) == "rd"
    assert fast.verdict(Ranks(1.0)) == "mpi"  # another rank saw no gain: MPI's own
    near = trial([s / (PREFER_NATIVE * 0.99) for s in drifting], drifting)
    assert near.verdict(Ranks()) == "mpi"  # a near tie keeps MPI's own
