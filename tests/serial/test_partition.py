"""Block and segment arithmetic (pure functions), property-tested."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringcomp.partition import (
    block_bounds,
    ceil_log2,
    even_segments,
    largest_power_of_two_at_most,
)


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_blocks_cover_in_order_and_balance(n, p):
    blocks = block_bounds(n, p)
    assert len(blocks) == p
    assert blocks[0][0] == 0 and blocks[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
    sizes = [hi - lo for lo, hi in blocks]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the longer blocks come first


@given(st.integers(0, 5000), st.integers(0, 5000), st.integers(1, 700))
def test_segments_cover_without_empty_pieces(lo, length, seg):
    hi = lo + length
    pieces = even_segments(lo, hi, seg)
    assert all(b > a and b - a <= seg for a, b in pieces)
    assert sum(b - a for a, b in pieces) == length
    if pieces:
        assert pieces[0][0] == lo and pieces[-1][1] == hi
    assert len(pieces) == -(-length // seg)  # the fewest segments that fit
    even = [b - a for a, b in even_segments(lo, hi, seg)]
    assert not even or max(even) - min(even) <= 1


def test_powers_of_two():
    assert [largest_power_of_two_at_most(p) for p in (1, 2, 3, 4, 5, 7, 8, 9)] == \
        [1, 2, 2, 4, 4, 4, 8, 8]
    assert [ceil_log2(p) for p in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]


def test_bad_arguments():
    with pytest.raises(ValueError):
        block_bounds(5, 0)
    with pytest.raises(ValueError):
        block_bounds(-1, 3)


def test_torus_shapes_auto_resolution_and_groups():
    """"auto" puts one node per row when nodes hold equal numbers of ranks, else the
    squarest shape; explicit shapes must multiply to p; rows and columns partition p."""
    import types

    from ringcomp.checks import LocalError, parse_torus
    from ringcomp.collectives.torus import squarest, torus_groups, torus_shape

    def transport(size, local_sizes):
        return types.SimpleNamespace(size=size, local_size=local_sizes[0],
                                     kept=types.SimpleNamespace(torus_auto=None),
                                     allgather_obj=lambda _: list(local_sizes))

    assert [squarest(p) for p in (1, 2, 4, 6, 7, 12, 16)] == [
        (1, 1), (1, 2), (2, 2), (2, 3), (1, 7), (3, 4), (4, 4)]
    assert torus_shape(transport(8, [4] * 8), "auto") == (2, 4)  # 2 nodes x 4 ranks
    assert torus_shape(transport(8, [8] * 8), "auto") == (2, 4)  # one node: squarest
    assert torus_shape(transport(6, [4, 4, 4, 4, 2, 2]), "auto") == (2, 3)  # uneven
    assert torus_shape(transport(6, [6] * 6), "3x2") == (3, 2)
    assert parse_torus((2, 3), 6) == (2, 3) and parse_torus("auto", 6) is None
    for bad in ("2x4", "6", "x", (2, 3.0), (True, 6), "1x2x3"):
        with pytest.raises(LocalError, match="torus="):
            parse_torus(bad, 6)
    rows, cols = 3, 4
    for r in range(12):
        row, col = torus_groups(r, rows, cols)
        assert r in row and r in col and len(row) == cols and len(col) == rows
        assert set(row) & set(col) == {r}
