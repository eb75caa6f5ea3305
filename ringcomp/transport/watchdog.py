"""A daemon thread that aborts the job when any blocking wait passes its deadline.

Waiting itself stays inside MPI (full speed, GIL released); the watchdog only looks at the
registered deadlines a few times a second and, past one, prints what was being waited for.
"""

from __future__ import annotations

import sys
import threading
import time


class Watchdog:
    """One daemon thread per process that aborts the job when a wait passes its deadline."""

    def __init__(self, rank, abort):
        self._rank = rank  # callables, so this module needs no MPI import
        self._abort = abort
        self._waits: dict[int, tuple] = {}
        self._lock = threading.Lock()
        self._thread = None

    def enter(self, key: int, deadline: float, describe, *args) -> None:
        """Watch the wait ``key`` (a thread's id) until ``leave``: past ``deadline``,
        ``describe(*args)`` says what it was (made only then: small calls are many)."""
        self._waits[key] = (deadline, describe, args)
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="ringcomp-watchdog",
                                                    daemon=True)
                    self._thread.start()

    def leave(self, key: int) -> None:
        self._waits.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            for deadline, describe, args in list(self._waits.values()):
                if now > deadline:
                    sys.stderr.write(f"[ringcomp rank {self._rank()}] {describe(*args)}\n")
                    sys.stderr.flush()
                    time.sleep(1.0)  # let the launcher forward the message before the kill
                    self._abort()


def deadline_message(waited: float, timeout: float, context: str, where, what: str) -> str:
    """What the job says when a blocking wait passes its deadline, before aborting."""
    place = " phase {} step {}".format(*where) if isinstance(where, tuple) else ""
    return (f"deadline passed: waited {waited:.1f} s (timeout {timeout:g} s, "
            f"RINGCOMP_TIMEOUT) in {context}{place}: {what}. Aborting the job. Usual "
            "causes: another rank died or raised, or ranks called different collectives or "
            "the same one with different arguments.")
