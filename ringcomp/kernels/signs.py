"""Sign kernels (pack, unpack, Marsit merge) through the backend dispatcher."""

from __future__ import annotations

from ringcomp.kernels import backends, signs_ref

words_for = signs_ref.words_for


def backend(name: str | None = None):
    """The sign-kernel module: ``name``, else ``RINGCOMP_KERNELS``, else Numba if present."""
    return backends.backend("signs", name)
