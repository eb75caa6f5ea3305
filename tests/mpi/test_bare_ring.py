"""The bare mpi4py ring (the benchmark's floor row) gives ringcomp's ring's bits, exactly."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank

import ringcomp
from ringcomp.bare_ring import BareRing
from ringcomp.compression import Key, get_compressor

#: below one segment a chunk at every rank count (the default 1 MB), odd and n < p too
SIZES = [1, 7, 1000, 4099]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compressor", [None, "marsit", "sign", "qsgd", "topk:ratio=0.1"])
@pytest.mark.parametrize("in_place", [False, True])
def test_bare_ring_has_the_rings_bits(comm, compressor, in_place):
    """Out of place and in place, exact and with every kind of hop rule (Marsit's merge,
    the sign and QSGD cascades, top-k's): the bare ring's output is byte for byte what
    ``allreduce(algorithm="ring")`` returns with the same key, on every rank."""
    comp = get_compressor(compressor) if compressor else None
    ring = BareRing(comm, comp)
    try:
        for n in SIZES:
            if comp is not None and n < comm.size:
                continue  # a compressed ring encodes no empty chunk; the bare one would
            x = np.random.default_rng(comm.rank + 17 * n).standard_normal(n).astype(np.float32)
            want = ringcomp.allreduce(x, algorithm="ring", comm=comm, compressor=compressor,
                                      seed=3, step=5, bucket=2)
            got = x.copy() if in_place else np.empty_like(x)
            ring(got if in_place else x, got, Key(3, 5, 2))
            assert every_rank(comm, got.tobytes() == want.tobytes()), n
    finally:
        ring.close()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_bare_exact_ring_reduces_with_every_op_as_mpi_does(comm, op):
    x = (np.arange(1, 102, dtype=np.int64) * (comm.rank + 1)) % 7
    ring = BareRing(comm, op=op)
    got = np.empty_like(x)
    ring(x, got)
    ring.close()
    want = ringcomp.allreduce(x, algorithm="mpi", comm=comm, op=op)
    assert every_rank(comm, np.array_equal(got, want))


@pytest.mark.mpi(min_size=1)
def test_a_compressed_bare_ring_is_refused_where_the_ring_would_refuse_it(comm):
    with pytest.raises(ValueError, match="op='sum'"):
        BareRing(comm, get_compressor("sign"), op="max")
    with pytest.raises(ValueError, match="powersgd"):
        BareRing(comm, get_compressor("powersgd"))
