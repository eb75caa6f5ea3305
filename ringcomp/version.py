"""The version: the one place it is written (``ringcomp.__version__``, ``--version`` and
setup.cfg's ``attr:`` read it)."""

__version__ = "0.1.0"
