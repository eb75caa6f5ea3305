"""ruff over the README's Python examples, as the user's own scripts they become (ringcomp a
package they installed): ``make lint`` runs it after ``ruff check .``; so does the suite."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
#: a user's script imports ringcomp as an installed package, not this checkout's source
AS_INSTALLED = 'lint.isort.known-third-party = ["ringcomp"]'


def problems(path: Path = ROOT / "README.md") -> list[str]:
    """ruff's findings over every ```python block of ``path``, one line each."""
    found = []
    for i, block in enumerate(BLOCK.findall(path.read_text())):
        out = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format",
                              "concise", "--config", AS_INSTALLED, "--stdin-filename",
                              f"{path.name}.example{i + 1}.py", "-"], input=block, text=True,
                             capture_output=True, cwd=ROOT)
        found += [line for line in out.stdout.splitlines() if ".example" in line]
    return found


if __name__ == "__main__":
    found = problems()
    print("\n".join(found) or "README examples: ruff clean")
    sys.exit(1 if found else 0)
