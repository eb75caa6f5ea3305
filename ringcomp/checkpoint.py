"""Atomic, multi-rank checkpoints: every rank's state, committed by one manifest."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np

from ringcomp.validate import everywhere

STEP_DIR = re.compile(r"^step-(\d{8})$")
MANIFEST = "manifest.json"


def _pack(state: dict) -> dict[str, np.ndarray]:
    """Flatten ``{group: array | {tuple key: array}}`` into npz names ``group`` and
    ``group:<json key>``."""
    flat = {}
    for group, value in state.items():
        if isinstance(value, dict):
            for key, array in value.items():
                flat[f"{group}:{json.dumps(list(key))}"] = np.asarray(array)
        else:
            flat[group] = np.asarray(value)
    return flat


def _unpack(flat) -> dict:
    state: dict = {}
    for name in flat.files:
        group, sep, key = name.partition(":")
        if sep:
            state.setdefault(group, {})[tuple(json.loads(key))] = flat[name]
        else:
            state[group] = flat[name]
    return state


def save(transport, directory: str, step: int, state: dict, meta: dict, keep: int = 3) -> str:
    """Write this rank's ``state`` for ``step``; collective.

    Steps: 1. rank 0 creates ``directory/step-<step>``; 2. every rank writes
    ``rank-<r>.npz.tmp`` and renames it to ``rank-<r>.npz`` (a rename is atomic); a write
    that fails on any rank raises on every rank; 3. rank 0 writes the manifest the same
    way - a checkpoint without a manifest was interrupted and is never loaded; 4. rank 0
    removes all but the ``keep`` newest complete checkpoints and any incomplete older ones.
    Invariant: the newest directory with a manifest holds a complete, consistent state of
    every rank for one step; nothing written earlier is touched until a newer one is complete.
    """
    target = os.path.join(directory, f"step-{step:08d}")
    if transport.rank == 0:
        os.makedirs(target, exist_ok=True)
    transport.barrier()
    path = os.path.join(target, f"rank-{transport.rank:05d}.npz")

    def write():
        with open(path + ".tmp", "wb") as f:
            np.savez(f, **_pack(state))
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    everywhere(transport, write)  # a full disk on one rank fails all, before any manifest
    if transport.rank == 0:
        manifest = os.path.join(target, MANIFEST)
        with open(manifest + ".tmp", "w") as f:
            json.dump({**meta, "step": step, "ranks": transport.size}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(manifest + ".tmp", manifest)
        _prune(directory, keep, step)
    transport.barrier()
    return target


def _prune(directory: str, keep: int, newest: int) -> None:
    complete = [s for s in _steps(directory) if _complete(directory, s)]
    for s in _steps(directory):
        if (s in complete and s not in complete[-keep:]) or (s not in complete and s < newest):
            shutil.rmtree(os.path.join(directory, f"step-{s:08d}"), ignore_errors=True)


def _steps(directory: str) -> list[int]:
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for m in map(STEP_DIR.match, os.listdir(directory)) if m)


def _complete(directory: str, step: int) -> bool:
    return os.path.exists(os.path.join(directory, f"step-{step:08d}", MANIFEST))


def latest(directory: str) -> int | None:
    """The newest complete checkpoint's step, or None."""
    complete = [s for s in _steps(directory) if _complete(directory, s)]
    return complete[-1] if complete else None


def load(transport, directory: str, step: int) -> tuple[dict, dict]:
    """This rank's state and the manifest of checkpoint ``step``."""
    target = os.path.join(directory, f"step-{step:08d}")
    with open(os.path.join(target, MANIFEST)) as f:
        meta = json.load(f)
    if meta["ranks"] != transport.size:
        raise ValueError(f"checkpoint {target} was written by {meta['ranks']} ranks; this "
                         f"job has {transport.size} (per-rank error-feedback and compensation "
                         f"state cannot be re-sharded)")
    with np.load(os.path.join(target, f"rank-{transport.rank:05d}.npz")) as flat:
        return _unpack(flat), meta
