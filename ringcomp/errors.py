"""Exception types that ringcomp raises on every rank alike."""


class RingcompError(RuntimeError):
    """Base class of ringcomp's own run-time errors."""


class LauncherError(RingcompError):
    """The processes were launched wrongly (for example N singletons of size 1)."""


class ArgumentMismatchError(ValueError):
    """Ranks called the same collective with arguments that do not agree."""


class ConcurrentCallError(RingcompError):
    """Two threads called collectives on one communicator at the same time."""


class ClosedTransportError(RingcompError):
    """The communicator behind a transport was freed (or the transport closed)."""


class EverywhereError(RingcompError):
    """A failure raised alike on every rank (the same text), so a tool may exit cleanly."""
