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
