"""Numba's on-disk cache made safe for many processes at once: a file lock per function.

Numba saves a compiled signature by reading the function's index, picking a data file
name no entry uses, writing the index, then the data (``IndexDataCacheFile.save``), with
no lock between processes; it loads by reading the index, then the named data file, and
never checks that the loaded code is for the signature asked. Two ranks compiling two
signatures of one kernel at once (the first run on a machine, or two jobs) can both pick
the same name: the index then sends one signature to the other's code (measured here: a
float32 call got the float64 kernel; two element types of one width would compute garbage
without a word), and a reader between a writer's index and data can meet a stale file.
(Numba's maintainers proposed a file lock for the same family of races: numba#10128,
numba#4807.)

``lock_cache()`` wraps both in ``fcntl.flock`` on ``<index file>.lock`` - exclusive to
save, shared to load - so each save is one step for every other process. Where the lock
file cannot be made (a read-only cache), Numba's own behaviour stands.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time

_LOCKED = False
_ANNOUNCING = False
log = logging.getLogger("ringcomp.kernels")


@contextlib.contextmanager
def _flocked(index_path: str, mode: int):
    try:
        fd = os.open(index_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only or missing cache directory: nothing to lock against
        yield
        return
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # (closing drops the lock)


def lock_cache() -> None:
    """Make Numba's cache saves exclusive and its loads shared, per function, across
    processes (idempotent; before the first kernel compiles or loads)."""
    global _LOCKED
    if _LOCKED:
        return
    from numba.core import caching

    cache_file = caching.IndexDataCacheFile
    save, load = cache_file.save, cache_file.load

    def locked_save(self, key, data):  # (Numba made the cache directory before this)
        with _flocked(self._index_path, fcntl.LOCK_EX):
            return save(self, key, data)

    def locked_load(self, key):
        with _flocked(self._index_path, fcntl.LOCK_SH):
            return load(self, key)

    cache_file.save, cache_file.load = locked_save, locked_load
    _LOCKED = True


def prepare() -> None:
    """What every process does before its first Numba kernel or walk compiles or loads:
    the cache's locks (``lock_cache``) and the compile announcements
    (``announce_compiles``); idempotent."""
    lock_cache()
    announce_compiles()


def announce_compiles() -> None:
    """Say so before Numba starts compiling in this process (a compile, not a load from
    its cache): the first run on a machine compiles ringcomp's kernels and walks for tens
    of seconds to minutes, and a job that says nothing meanwhile looks hung. The first
    compile is announced before it starts and timed when it ends; later ones are logged
    at debug level (idempotent; Numba is imported only here, so exact jobs never load it)."""
    global _ANNOUNCING
    if _ANNOUNCING:
        return
    from numba.core import event

    class Announcer(event.Listener):
        """Numba's ``numba:compile`` events: the outermost compile's start and end."""

        def __init__(self):
            self.depth, self.t0, self.first = 0, 0.0, True

        def on_start(self, ev) -> None:
            self.depth += 1
            if self.depth == 1:
                self.t0 = time.perf_counter()
                _started(ev, self.first)

        def on_end(self, ev) -> None:
            self.depth -= 1
            if self.depth == 0 and self.first:
                self.first = False
                log.log(_level(), f"compiled the first Numba function in "
                                  f"{time.perf_counter() - self.t0:.1f} s")

    event.register("numba:compile", Announcer())
    _ANNOUNCING = True


def _started(ev, first: bool) -> None:
    name = getattr(ev.data.get("dispatcher"), "__qualname__", "a kernel")
    if not first:
        log.debug(f"compiling {name}")
        return
    log.log(_level(), f"compiling Numba code ({name}, then whatever else this run needs): "
                      f"once per machine, tens of seconds to minutes; later runs load it "
                      f"from Numba's cache. 'python -m ringcomp.warm' compiles everything "
                      f"ahead of time")


def _level() -> int:
    """Info where a ringcomp tool set up logging, else warning: a script that set up no
    logging (Python shows warnings and above) would otherwise wait without a word."""
    return logging.INFO if logging.getLogger("ringcomp").handlers else logging.WARNING
