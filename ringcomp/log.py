"""The ``ringcomp`` logger: messages of the library and its tools, on stderr, rank 0's alone.

Results (tables, JSON, a run's summary) are printed on stdout; everything else - progress,
"wrote FILE", notes and warnings - goes through the standard ``logging`` module under the
``ringcomp`` logger (each module logs to ``logging.getLogger(__name__)``; a tool, which runs
as ``__main__`` under ``python -m``, names itself: ``"ringcomp.train"``).

1. As a library, ringcomp configures nothing: its messages reach whatever handlers the
   application set up (Python's default shows warnings and above on stderr).
2. A tool (every ``ringcomp.cli.Parser``) calls ``configure`` once its command line is
   parsed: one handler on stderr, the level from ``--quiet`` (warnings and errors only) or
   ``--verbose`` (debug too), else from ``RINGCOMP_LOG`` (``debug``, ``info``,
   ``warning``, ``error``), else ``info``.
3. A job-level message is shown by rank 0 only (every rank knows the same thing); a
   message about one rank's own state passes ``extra=EVERY_RANK`` and is shown by every
   rank, prefixed ``[rank r]``.
Messages that end a job (a deadline, an exception on one rank, a bad command line) are
written to stderr directly, whatever the level: no configuration can lose them.
"""

from __future__ import annotations

import logging
import os
import sys
import time

LOGGER = logging.getLogger("ringcomp")
#: the environment variable that sets the tools' level when neither flag is given
ENV = "RINGCOMP_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}
#: ``extra=`` for a message every rank shows (about its own state)
EVERY_RANK = {"every_rank": True}


def _world():
    mpi = sys.modules.get("mpi4py.MPI")  # import ringcomp has started it; never start it here
    try:
        return mpi.COMM_WORLD if mpi is not None and mpi.Is_initialized() else None
    except ImportError:  # no MPI library loaded (``startup``'s stand-in): one process
        return None


def world_rank() -> int:
    """This process's rank in MPI's world (0 before MPI starts or without a launcher)."""
    world = _world()
    return 0 if world is None else world.Get_rank()


class _RankFilter(logging.Filter):
    """Rank 0 shows job-level messages; every rank shows its ``EVERY_RANK`` ones."""

    def filter(self, record: logging.LogRecord) -> bool:
        world = _world()
        rank, size = (0, 1) if world is None else (world.Get_rank(), world.Get_size())
        # a Python warning may concern this rank alone: every rank shows its own
        mine = getattr(record, "every_rank", False) or record.name == "py.warnings"
        record.rank_prefix = f"[rank {rank}] " if mine and size > 1 else ""
        return rank == 0 or mine


class _Stderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a message is written (a test's capture,
    a redirected stream), not the one it was when the tool started."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _Formatter(logging.Formatter):
    """``# message`` as the tools always wrote; ``# warning: ...`` and ``# error: ...``."""

    def format(self, record: logging.LogRecord) -> str:
        kind = "" if record.levelno < logging.WARNING else record.levelname.lower() + ": "
        return f"# {kind}{getattr(record, 'rank_prefix', '')}{record.getMessage()}"


def level_from_env() -> int:
    """``RINGCOMP_LOG``'s level (``info`` when unset); a nonsense value is refused."""
    text = os.environ.get(ENV, "").strip().lower()
    if not text:
        return logging.INFO
    if text not in LEVELS:
        raise ValueError(f"{ENV}={os.environ[ENV]!r}: use one of {', '.join(LEVELS)}")
    return LEVELS[text]


_HANDLER: logging.Handler | None = None


def configured() -> bool:
    """Whether a tool has set up logging in this process (``configure``)."""
    return _HANDLER is not None


def reset() -> None:
    """Undo ``configure``: the library's default again (a process that runs several tools
    in turn, as a test session does)."""
    global _HANDLER
    if _HANDLER is not None:
        LOGGER.removeHandler(_HANDLER)
        logging.getLogger("py.warnings").handlers = []
        logging.getLogger("py.warnings").propagate = True
    _HANDLER = None
    LOGGER.setLevel(logging.NOTSET)
    LOGGER.propagate = True
    logging.captureWarnings(False)


def configure(quiet: bool = False, verbose: bool = False) -> int:
    """Set up the tools' logging (idempotent: a second call replaces the first's handler);
    returns the level. ``quiet`` and ``verbose`` together are refused by the parser."""
    global _HANDLER
    level = logging.WARNING if quiet else logging.DEBUG if verbose else level_from_env()
    if _HANDLER is not None:
        LOGGER.removeHandler(_HANDLER)
    _HANDLER = _Stderr()
    _HANDLER.addFilter(_RankFilter())
    _HANDLER.setFormatter(_Formatter())
    LOGGER.addHandler(_HANDLER)
    LOGGER.setLevel(level)
    LOGGER.propagate = False  # the tool's handler only: no second copy through the root's
    logging.captureWarnings(True)  # warnings.warn() from the library, formatted alike
    logging.getLogger("py.warnings").handlers = [_HANDLER]
    logging.getLogger("py.warnings").propagate = False
    return level


class Heartbeat:
    """A long study's progress: called once per unit of work, it logs (info, rank 0's)
    ``what: done/total label (T s)`` whenever ``seconds`` have passed since the last line
    (or the start), so a study that runs for minutes says where it is at least that often
    while a short one stays silent."""

    def __init__(self, logger: logging.Logger, what: str, total: int | None = None,
                 seconds: float = 10.0):
        self.logger, self.what, self.total, self.seconds = logger, what, total, seconds
        self.done = 0
        self.start = self.last = time.monotonic()

    def __call__(self, label: str = "") -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last >= self.seconds:
            self.last = now
            of = f"/{self.total}" if self.total else ""
            self.logger.info(f"{self.what}: {self.done}{of} {label} ({now - self.start:.0f} s)")
