"""Pure index arithmetic: block distribution of n elements over p parts, and segments."""

from __future__ import annotations


def block_bounds(n: int, p: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into ``p`` contiguous blocks whose sizes differ by at most one.

    The first ``n % p`` blocks get one extra element, so every rank computes the same bounds.

    Args:
        n: number of elements (>= 0).
        p: number of blocks (>= 1).

    Returns:
        ``p`` half-open ``(lo, hi)`` pairs covering ``range(n)`` in order; blocks may be empty
        when ``n < p``.
    """
    if p < 1:
        raise ValueError(f"need at least one block, got p={p}")
    if n < 0:
        raise ValueError(f"length must be >= 0, got n={n}")
    base, extra = divmod(n, p)
    bounds = []
    lo = 0
    for i in range(p):
        hi = lo + base + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def even_segments(lo: int, hi: int, max_elems: int) -> list[tuple[int, int]]:
    """Cut ``[lo, hi)`` into the fewest near-equal segments of at most ``max_elems`` elements.

    Near-equal segments keep a pipeline balanced (no tiny last segment).
    """
    n = hi - lo
    if n <= 0:
        return []
    count = -(-n // max(1, max_elems))
    return [(lo + a, lo + b) for a, b in block_bounds(n, count)]


def whole_vector_segments(n: int, p: int, seg_elems: int) -> list[tuple[int, int]]:
    """The segments of a compressed form that encodes its whole vector cut evenly (tree,
    all-gather): ``even_segments(0, n, seg_elems)``, in the registry's signature."""
    return even_segments(0, n, max(1, seg_elems))


def largest_power_of_two_at_most(p: int) -> int:
    """Return the largest power of two that is <= p (p >= 1)."""
    if p < 1:
        raise ValueError(f"need p >= 1, got {p}")
    return 1 << (p.bit_length() - 1)


def ceil_log2(p: int) -> int:
    """Return ceil(log2(p)) for p >= 1 (0 for p == 1)."""
    return (p - 1).bit_length()
