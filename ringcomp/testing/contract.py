"""``CompressorContract``: the kit as a pytest test class, one test per property."""

from __future__ import annotations

import pytest

from ringcomp.testing import CHECKS, not_applicable
from ringcomp.testing.codec_checks import codecs


class CompressorContract:
    """Subclass it in a test file and name the compressor's spec::

        class TestClip8(CompressorContract):
            spec = "clip8:bits=8"

    Each property is one test; run at any number of ranks (``mpiexec -n 3 python -m
    pytest --with-mpi``), every test reaches the same verdict on every rank."""

    spec = ""


def _test(prop: str, check):
    def test(self):
        comp = codecs(self.spec)
        reason = not_applicable(prop, comp)
        if reason:
            pytest.skip(reason)
        check(self.spec)

    test.__name__ = "test_" + "".join(c if c.isalnum() else "_" for c in prop.replace("'s", ""))
    test.__doc__ = check.__doc__
    return test


for _prop, _check in CHECKS.items():
    _method = _test(_prop, _check)
    setattr(CompressorContract, _method.__name__, _method)
