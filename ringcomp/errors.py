"""Exception types that ringcomp raises on every rank alike."""


class RingcompError(RuntimeError):
    """Base class of ringcomp's own run-time errors."""


class LauncherError(RingcompError):
    """The processes were launched wrongly (for example N singletons of size 1)."""


class ArgumentMismatchError(ValueError):
    """Ranks called the same collective with arguments that do not agree."""
