"""NumPy reference of the finiteness test: does a float array hold any NaN or Inf?

The other backends test the exponent field (all ones: NaN or ±Inf) through an integer
view, ``(bits & EXP) + EXP_LSB`` carrying into the sign bit exactly then; the reference
sums in the array's own type (float16: float32) - one memory-speed pass - and counts only
when the sum is not finite, since a sum may also overflow from finite values.
"""

from __future__ import annotations

import numpy as np

#: float dtype -> (integer view, exponent mask, the exponent's lowest bit, the sign bit)
MASKS = {
    "float16": (np.uint16, np.uint16(0x7C00), np.uint16(0x0400), np.uint16(0x8000)),
    "float32": (np.uint32, np.uint32(0x7F800000), np.uint32(0x00800000),
                np.uint32(0x80000000)),
    "float64": (np.uint64, np.uint64(0x7FF0000000000000), np.uint64(0x0010000000000000),
                np.uint64(0x8000000000000000)),
}


def nonfinite(x) -> bool:
    """Whether any element of ``x`` is NaN or ±Inf (False for integer dtypes)."""
    if x.dtype.name not in MASKS or x.size == 0:
        return False
    accumulate = np.float32 if x.dtype == np.float16 else x.dtype
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is no error here
        if bool(np.isfinite(np.sum(x, dtype=accumulate))):
            return False
    return not bool(np.isfinite(x).all())
