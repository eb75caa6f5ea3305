"""Atomic, multi-rank checkpoints: every rank's state, committed by one manifest."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import sys
import time

import numpy as np

from ringcomp.checks import probe_writable
from ringcomp.kernels.arrays import on_device, to_numpy
from ringcomp.transport.agree import everywhere

STEP_DIR = re.compile(r"^step-(\d{8})$")
MANIFEST = "manifest.json"
#: held (flock) by rank 0 of the job writing into the directory, for the job's lifetime
LOCK_FILE = ".ringcomp.lock"


def _pack(state: dict) -> dict[str, np.ndarray]:
    """Flatten ``{group: array | {tuple key: array}}`` into npz names ``group`` and
    ``group:<json key>``, device arrays copied to the host (a checkpoint loads anywhere)."""
    flat = {}
    for group, value in state.items():
        if isinstance(value, dict):
            for key, array in value.items():
                flat[f"{group}:{json.dumps(list(key))}"] = _host(array)
        else:
            flat[group] = _host(value)
    return flat


def _host(value) -> np.ndarray:
    return to_numpy(value) if on_device(value) else np.asarray(value)


def _unpack(flat) -> dict:
    state: dict = {}
    for name in flat.files:
        group, sep, key = name.partition(":")
        if sep:
            state.setdefault(group, {})[tuple(json.loads(key))] = flat[name]
        else:
            state[group] = flat[name]
    return state


def _write_atomically(path: str, write) -> None:
    """``write(file)`` to ``path.tmp``, flushed to disk, then renamed to ``path``; a failed
    write (a full disk) leaves neither a half file nor the temporary behind."""
    try:
        with open(path + ".tmp", "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")
        raise


def save(transport, directory: str, step: int, state: dict, meta: dict, keep: int = 3) -> str:
    """Write this rank's ``state`` for ``step``; collective.

    Steps: 1. rank 0 creates ``directory/step-<step>``; 2. every rank writes
    ``rank-<r>.npz.tmp`` and renames it to ``rank-<r>.npz`` (a rename is atomic); a write
    that fails on any rank raises on every rank and leaves no temporary file; 3. rank 0
    writes the manifest the same way - a checkpoint without a manifest was interrupted and
    is never loaded; 4. rank 0 prunes older checkpoints (``_prune``).
    Invariant: the newest directory with a manifest holds a complete, consistent state of
    every rank for one step; nothing written earlier is touched until a newer one is
    complete, and the checkpoint just written is never pruned.
    """
    target = os.path.join(directory, f"step-{step:08d}")
    everywhere(transport, lambda: os.makedirs(target, exist_ok=True)
               if transport.rank == 0 else None)
    path = os.path.join(target, f"rank-{transport.rank:05d}.npz")
    # a full disk on one rank fails all, before any manifest
    everywhere(transport, lambda: _write_atomically(
        path, lambda f: np.savez(f, **_pack(state))))

    def commit():
        if transport.rank == 0:
            text = json.dumps({**meta, "step": step, "ranks": transport.size}, indent=1)
            _write_atomically(os.path.join(target, MANIFEST), lambda f: f.write(text.encode()))
            _prune(directory, keep, step)

    everywhere(transport, commit)
    return target


def _prune(directory: str, keep: int, newest: int) -> None:
    """Keep the checkpoint just written (``newest``) and the ``keep - 1`` newest complete
    ones before it; remove older complete ones and incomplete ones before it. Nothing at or
    after ``newest`` is touched."""
    older = [s for s in _steps(directory) if s < newest]
    complete = [s for s in older if _complete(directory, s)]
    # max(0, ...): with fewer complete ones than keep - 1 a negative start kept only the
    # newest few (keep 5 with 3 older checkpoints deleted 2 of them)
    kept = set(complete[max(0, len(complete) - (keep - 1)):]) if keep > 1 else set()
    for s in older:
        if s not in kept:
            shutil.rmtree(os.path.join(directory, f"step-{s:08d}"), ignore_errors=True)


class DirectoryLock:
    """One job at a time per checkpoint directory: an exclusive ``flock`` on
    ``directory/.ringcomp.lock``, taken by rank 0 and held until ``release`` or the end of
    the process.

    The kernel drops the lock when the holding process ends in any way (kill -9 included),
    so a dead job's lock file is stale by construction: the next job takes it and writes
    itself in. The file names the holder (host, pid, ranks, start, command) for the
    refusal a second job gets. (On NFS, flock works where the mount supports locks, as
    NFSv4 does.)
    """

    def __init__(self, directory: str, ranks: int):
        self.path = os.path.join(directory, LOCK_FILE)
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            self.release()
            raise FileExistsError(
                f"checkpoint directory {directory!r} is in use by another job ({holder}): "
                f"two jobs writing into one directory overwrite each other's checkpoints. "
                f"Wait for it to end, or choose another --checkpoint-dir") from None
        me = {"host": socket.gethostname(), "pid": os.getpid(), "ranks": ranks,
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)}
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(me).encode(), 0)

    def _holder(self) -> str:
        try:
            with open(self.path) as f:
                h = json.load(f)
            return (f"pid {h['pid']} on {h['host']}, {h['ranks']} ranks, started "
                    f"{h['started']}: {h['command']}")
        except (OSError, ValueError, KeyError):  # the holder has not written itself yet
            return "its holder is still starting"

    def release(self) -> None:
        """Give the directory up (closing the file drops the lock); twice is fine."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def prepare(transport, directory: str, *, resume: bool, overwrite: bool,
            check_outputs=None):
    """Before training, collectively: take the directory for this job (a second job is
    refused, naming the holder), check that it is writable on every rank and holds no
    other run's checkpoints unless resuming (``overwrite`` deletes them - last, after
    ``check_outputs()``, the job's other outputs' collective check, so that a run refused
    for a bad ``--metrics`` or ``--trace`` path loses nothing). Returns a context manager
    that releases the directory (rank 0 holds the lock; keep it for the job)."""
    def take():
        if transport.rank != 0:
            return None, []
        os.makedirs(directory, exist_ok=True)
        lock = DirectoryLock(directory, transport.size)  # first: nothing is deleted under
        try:  # a running job's feet
            steps = complete_steps(directory)
            if steps and not resume and not overwrite:
                raise FileExistsError(
                    f"checkpoint directory {directory!r} already holds checkpoints of another "
                    f"run (steps {', '.join(map(str, steps[-3:]))}): pass --resume to continue "
                    f"that run, --overwrite to delete them and start afresh, or choose another "
                    f"--checkpoint-dir")
        except BaseException:
            lock.release()
            raise
        # an incomplete checkpoint can never be loaded: it goes too
        return lock, (_steps(directory) if overwrite or not steps else [])

    lock, doomed = everywhere(transport, take)
    try:
        # fail now, not at the first checkpoint many steps later
        everywhere(transport, lambda: probe_writable(
            os.path.join(directory, f".write-test-rank-{transport.rank:05d}")))
        if check_outputs is not None:
            check_outputs()
        everywhere(transport, lambda: [shutil.rmtree(os.path.join(directory,
                                                                  f"step-{s:08d}"))
                                       for s in doomed])
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock if lock is not None else contextlib.nullcontext()


def _steps(directory: str) -> list[int]:
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for m in map(STEP_DIR.match, os.listdir(directory)) if m)


def _complete(directory: str, step: int) -> bool:
    return os.path.exists(os.path.join(directory, f"step-{step:08d}", MANIFEST))


def complete_steps(directory: str) -> list[int]:
    """Steps of the complete checkpoints (those with a manifest), oldest first."""
    return [s for s in _steps(directory) if _complete(directory, s)]


def latest(directory: str) -> int | None:
    """The newest complete checkpoint's step, or None."""
    complete = complete_steps(directory)
    return complete[-1] if complete else None


def load(transport, directory: str, step: int) -> tuple[dict, dict]:
    """This rank's state and the manifest of checkpoint ``step``.

    Raises CorruptCheckpoint naming the file when a file cannot be read completely (every
    array is read, so a zip CRC mismatch is found here, not later)."""
    target = os.path.join(directory, f"step-{step:08d}")
    manifest = os.path.join(target, MANIFEST)
    try:
        with open(manifest) as f:
            meta = json.load(f)
        ranks = int(meta["ranks"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpoint(f"{manifest}: {type(exc).__name__}: {exc}") from None
    if ranks != transport.size:
        raise ValueError(f"checkpoint {target} was written by {ranks} ranks; this "
                         f"job has {transport.size} (per-rank error-feedback and compensation "
                         f"state cannot be re-sharded)")
    path = os.path.join(target, f"rank-{transport.rank:05d}.npz")
    try:
        with np.load(path) as flat:
            return _unpack(flat), meta
    except Exception as exc:  # BadZipFile, Bad CRC-32, EOFError, ValueError, OSError ...
        raise CorruptCheckpoint(f"{path}: {type(exc).__name__}: {exc}") from None


def load_newest_intact(transport, directory: str, say=print) -> tuple[int, dict, dict] | None:
    """Load the newest complete checkpoint that every rank can read; collective.

    A checkpoint with an unreadable file on any rank (truncated, flipped bytes, empty, a
    cut manifest) is reported with the file and skipped for the next older one, so every
    rank resumes from the same step. Returns (step, state, meta), or None when there is no
    complete checkpoint; raises CorruptCheckpoint when none is intact.
    """
    steps = transport.bcast_obj(complete_steps(directory) if transport.rank == 0 else None)
    problems = []
    for step in reversed(steps):
        try:
            state, meta, error = *load(transport, directory, step), None
        except CorruptCheckpoint as exc:
            state = meta = None
            error = str(exc)
        except Exception as exc:  # not corruption (a rank count mismatch): refuse
            state = meta = None
            error = f"!{type(exc).__name__}: {exc}"
        errors = [(r, e) for r, e in enumerate(transport.allgather_obj(error)) if e]
        fatal = [e[1:] for _, e in errors if e.startswith("!")]
        if fatal:
            raise ValueError(fatal[0])
        if not errors:
            if problems and transport.rank == 0:
                say(f"resuming from step {step}, the newest intact checkpoint in "
                    f"{directory}")
            return step, state, meta
        problems.append(f"step {step}: " + "; ".join(f"rank {r}: {e}" for r, e in errors))
        if transport.rank == 0:
            say(f"checkpoint step {step} is unreadable ({problems[-1]}); trying the "
                f"next older one")
    if problems:
        raise CorruptCheckpoint(f"no intact checkpoint in {directory}: " + " | ".join(problems))
    return None


class CorruptCheckpoint(ValueError):
    """A checkpoint file exists but cannot be read completely."""
