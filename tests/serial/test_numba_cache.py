"""Numba's on-disk cache under processes compiling at once: ringcomp's lock keeps every
signature's code its own (``ringcomp.kernels.numba_cache``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: a cached kernel, compiled for two element types by two processes at once
KERNEL = """
from numba import njit

@njit(cache=True)
def first_plus_one(x):
    return x[0] + 1.0
"""

#: one writer: both writers read the function's index before either writes it (a pause
#: after the read), and the second's data lands last (a pause before it): the
#: interleaving that sends one signature to the other's code without a lock
WRITER = """
import sys, time
sys.path.insert(0, sys.argv[4])
if sys.argv[2] == "lock":
    from ringcomp.kernels import numba_cache
    numba_cache.lock_cache()
from numba.core import caching
cache_file = caching.IndexDataCacheFile
save, load_index, save_data = cache_file.save, cache_file._load_index, cache_file._save_data

def slow_load_index(self):
    out = load_index(self)
    if getattr(self, "saving", False):
        time.sleep(1.0 + float(sys.argv[3]))
    return out

def slow_save_data(self, name, data):
    time.sleep(0.0 if sys.argv[3] != "0" else 0.8)
    return save_data(self, name, data)

def flagged_save(self, key, data):
    self.saving = True
    try:
        return save(self, key, data)
    finally:
        self.saving = False

cache_file._load_index, cache_file._save_data = slow_load_index, slow_save_data
cache_file.save = flagged_save
import numpy as np, kernel
print(kernel.first_plus_one(np.array([2.0], dtype=sys.argv[1])))
"""

READER = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, kernel
print(kernel.first_plus_one(np.array([2.0], np.float32)),
      kernel.first_plus_one(np.array([2.0], np.float64)))
"""


def _race(tmp_path, mode: str) -> tuple[list[str], subprocess.CompletedProcess]:
    """Two writers compile the kernel for float32 and float64 at once (``mode``: "lock"
    with ringcomp's lock, "none" without); then a reader loads both. Returns the data
    files the cache holds and the reader's run."""
    (tmp_path / "kernel.py").write_text(KERNEL)
    (tmp_path / "writer.py").write_text(textwrap.dedent(WRITER))
    (tmp_path / "reader.py").write_text(READER)
    writers = [subprocess.Popen([sys.executable, str(tmp_path / "writer.py"), dtype, mode,
                                 delay, str(tmp_path)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
               for dtype, delay in (("float32", "0.3"), ("float64", "0"))]
    for writer in writers:
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0 and out.strip() == "3.0", err
    reader = subprocess.run([sys.executable, str(tmp_path / "reader.py"), str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    return sorted(p.name for p in (tmp_path / "__pycache__").glob("*.nbc")), reader


def test_two_processes_compiling_two_signatures_at_once_keep_each_its_own_code(tmp_path):
    """With the lock each save is one step for the other process: two data files, and
    each signature loads its own code."""
    data, reader = _race(tmp_path, "lock")
    assert len(data) == 2, data
    assert reader.returncode == 0 and reader.stdout.split() == ["3.0", "3.0"], reader.stderr


def test_without_the_lock_numba_still_gives_one_signature_the_others_code(tmp_path):
    """The same interleaving without ringcomp's lock, as Numba ships: both writers take the
    same data file and the float32 call meets the float64 kernel. (If Numba ever fixes
    this, this test fails: then the lock may go.)"""
    data, reader = _race(tmp_path, "none")
    assert len(data) == 1, data
    assert reader.returncode != 0 or reader.stdout.split() != ["3.0", "3.0"], reader.stdout
