"""The version: the one place it is written (``ringcomp.__version__``, ``--version`` and
setup.cfg's ``attr:`` read it), and the commit of the checkout the package runs from."""

import os
import subprocess

__version__ = "0.1.0"

#: the checkout (or installed tree) the package runs from
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def git(*args: str) -> str:
    """``git ARGS`` in the project's checkout, stripped; '' without git or on failure."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def source_commit() -> str:
    """The commit the package runs from: the checkout's, else ``RINGCOMP_COMMIT`` (a copy
    without .git, as on a device machine), else ''."""
    return git("rev-parse", "HEAD") or os.environ.get("RINGCOMP_COMMIT", "")
