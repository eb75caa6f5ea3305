"""The contracts ``--compressor-contract`` names (``ringcomp.testing.plugin``): collected only
when the option is given."""

from __future__ import annotations

import importlib

import pytest

from ringcomp.testing.contract import CompressorContract


def pytest_generate_tests(metafunc) -> None:
    config = metafunc.config
    for module in config.getoption("compressor_import"):
        importlib.import_module(module)
    if "named_spec" in metafunc.fixturenames:
        metafunc.parametrize("named_spec", config.getoption("compressor_contract"),
                             scope="class")


class TestNamedCompressor(CompressorContract):
    @pytest.fixture(autouse=True)
    def _spec(self, named_spec) -> None:
        self.spec = named_spec
