"""pytest plugin: ``--compressor-contract SPEC`` checks a compressor with the kit, no test file
needed (installed with ringcomp as a ``pytest11`` entry point; nothing happens without the
option)."""

from __future__ import annotations

import os

#: the test module the option collects: a ``CompressorContract`` per spec named
CONTRACT_MODULE = os.path.join(os.path.dirname(__file__), "named_contracts.py")


def pytest_addoption(parser) -> None:
    group = parser.getgroup("ringcomp", "ringcomp's compressor kit")
    group.addoption("--compressor-contract", action="append", default=[], metavar="SPEC",
                    help="check this registered compressor's contract (repeatable); a "
                         "compressor of a package of yours: its entry point, or "
                         "--compressor-import MODULE")
    group.addoption("--compressor-import", action="append", default=[], metavar="MODULE",
                    help="import MODULE first (it registers the compressors it defines)")


def pytest_configure(config) -> None:
    if config.getoption("compressor_contract") and CONTRACT_MODULE not in config.args:
        config.args.append(CONTRACT_MODULE)
