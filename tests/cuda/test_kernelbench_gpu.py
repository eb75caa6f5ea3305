"""The device kernel benchmark's rows on a GPU, small: every kernel of every family gets a
throughput row and a per-call hop row, each positive and finite (the figures themselves
are the benchmark's, not asserted). On a GPU only: the benchmark times CuPy arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import XP

from ringcomp import kernelbench

pytestmark = pytest.mark.skipif(XP is np, reason="the benchmark times CuPy arrays on a GPU")


def test_every_kernel_has_a_throughput_and_a_hop_row():
    x = np.random.default_rng(1).standard_normal(1 << 16).astype(np.float32)
    rows = kernelbench._gpu_rows(x)
    hops = kernelbench.hop_rows(1 << 14)
    assert rows[0]["kernel"] == "device copy" and hops[0]["kernel"] == "device copy"
    assert [r["kernel"] for r in rows] == [r["kernel"] for r in hops]
    assert len(rows) > 10
    assert all(math.isfinite(r["GBps"]) and r["GBps"] > 0 for r in rows)
    assert all(math.isfinite(r["us"]) and r["us"] > 0 for r in hops)
    assert all(math.isfinite(r["us_dispatcher"]) and r["us_dispatcher"] > 0 for r in hops[1:])
