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
import os

_LOCKED = False


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
