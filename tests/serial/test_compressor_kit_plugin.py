"""docs/compressors.md's worked compressor through the kit's pytest option, as a user runs it:
its own directory, no test file, ``--compressor-contract`` from the installed plugin."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from test_cli import MPIEXEC, ROOT, env

#: the page's example: the fenced block that starts with its file name
EXAMPLE = re.compile(r"```python\n(# int8q\.py .*?)```", re.S)


def kit(tmp_path: Path, source: str, ranks: int) -> subprocess.CompletedProcess:
    (tmp_path / "int8q.py").write_text(source)
    return subprocess.run(MPIEXEC + ["-n", str(ranks), sys.executable, "-m", "pytest", "-q",
                                     "-p", "no:cacheprovider", "--with-mpi",
                                     "--compressor-import", "int8q",
                                     "--compressor-contract", "int8q"],
                          capture_output=True, text=True, timeout=240, env=env(),
                          cwd=tmp_path)


def test_the_documented_compressor_passes_and_a_biased_edit_fails_unbiased(tmp_path):
    source = EXAMPLE.search((Path(ROOT) / "docs" / "compressors.md").read_text()).group(1)
    passed = kit(tmp_path, source, 2)
    assert passed.returncode == 0 and "10 passed" in passed.stdout, passed.stdout[-3000:]
    rounding = "np.floor(x / scale + draws.random(x.size))"
    assert rounding in source
    failed = kit(tmp_path, source.replace(rounding, "np.round(x / scale)"), 1)
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert "1 failed, 9 passed" in failed.stdout, failed.stdout[-3000:]
    assert "FAILED ::TestNamedCompressor::test_unbiased[int8q]" in failed.stdout
    assert "ContractViolation: unbiased: compressor 'int8q'" in failed.stdout, \
        failed.stdout[-3000:]
