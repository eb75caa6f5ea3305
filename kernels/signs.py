"""Sign kernels (pack, unpack, Marsit merge, mean magnitude) through the backend dispatcher."""

from __future__ import annotations

from ringcomp.kernels import backends, signs_ref

words_for = signs_ref.words_for


def backend(name: str | None = None, like=None):
    """The sign-kernel module for arrays like ``like`` (see ``backends.backend``)."""
    return backends.backend("signs", name, like)
