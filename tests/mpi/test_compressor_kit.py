"""The compressor kit (``ringcomp.testing``): every registered compressor passes it, and each
check fails - on every rank, naming its property - on a compressor broken its way."""

from __future__ import annotations

import re

import pytest
from broken_compressors import BROKEN, registered
from conftest import every_rank
from registered import all_compressors

from ringcomp.testing import CHECKS, ContractViolation, check_compressor
from ringcomp.testing.contract import CompressorContract


class TestEveryRegisteredCompressor(CompressorContract):
    """The kit's tests, one per property, for each registered compressor (a spec for small
    vectors where its defaults keep too little: ``registered.SMALL_VECTOR_SPECS``)."""

    @pytest.fixture(autouse=True, params=all_compressors())
    def _spec(self, request) -> None:
        self.spec = request.param


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("broken,prop,ranks", BROKEN,
                         ids=[f"{cls.name}-{prop}" for cls, prop, _ in BROKEN])
def test_each_check_fails_on_a_compressor_broken_its_way(comm, broken, prop, ranks):
    if comm.size < ranks:
        pytest.skip(f"shows at {ranks} ranks or more")
    with registered(broken) as name, pytest.raises(ContractViolation) as raised:
        CHECKS[prop](name, comm)
    assert every_rank(comm, re.match(f"{re.escape(prop)}: compressor '{name}'",
                                     str(raised.value)) is not None), str(raised.value)


@pytest.mark.mpi(min_size=1)
def test_check_compressor_runs_what_applies_and_stops_at_the_first_broken(comm):
    """``check_compressor``: the properties that apply, in order (Marsit takes no error
    feedback); a broken one raises at its property, on every rank."""
    checked = check_compressor("marsit", comm)
    assert "error feedback's invariant" not in checked and "unbiased" in checked
    assert checked == [prop for prop in CHECKS if prop in checked]
    from broken_compressors import LastElementUnwritten

    with registered(LastElementUnwritten) as name, pytest.raises(
            ContractViolation, match="^decode fills out"):
        check_compressor(name, comm)
