"""One API over the kernel backends: the NumPy reference (the spec), Numba, and CUDA.

Every kernel family is a set of modules with the same functions: ``<family>_ref`` (NumPy,
the specification), ``<family>_numba`` (parallel Numba on the host, compiled once and
cached) and ``<family>_cuda`` (Numba CUDA kernels on CuPy's current stream, bit for bit
equal to the reference). The array decides: device arrays (``__cuda_array_interface__``)
take the CUDA kernels, host arrays the fastest host backend. ``RINGCOMP_KERNELS`` (or
``name``) forces one; a host backend forced on a device array is an error, never a silent
copy to the host. ``cuda`` forced on host arrays runs the CUDA kernels on them: under
Numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) that is how CI tests them without a GPU.
"""

from __future__ import annotations

import importlib
import os
import sys

from ringcomp.kernels import numba_cache
from ringcomp.kernels.arrays import on_device

#: the kernel families: sign bits, Count-Sketch, stochastic quantization, float casts,
#: the fused optimizer update, the finiteness test, top-k selection (no Numba form: NumPy's
#: partition is already compiled introselect, so the host runs the reference; a compiled
#: walk's serial radix select, called from compiled code, is ``select_serial``)
FAMILIES = ("signs", "sketch", "quant", "cast", "optim", "finite", "select")
#: families whose host form is the reference alone: ``numba`` asked of them gets it
HOST_REFERENCE_ONLY = ("select",)
_SUFFIX = {"numpy": "ref", "numba": "numba", "cuda": "cuda"}
HOST = ("numpy", "numba")
_loaded: dict[tuple[str, str], object] = {}


def numba_loaded() -> bool:
    """Whether this process has imported Numba (a compressor or any kernel did). The one
    place that asks: what is compiled only pays where Numba is here anyway - its import
    costs a process about 0.6 s, more than a short exact NumPy job's small calls save
    (the exact ring's compiled walk, a plan's binding, the host finiteness test)."""
    return "numba" in sys.modules

_why_not: dict[str, str] = {}


def _load(family: str, name: str):
    key = (family, name)
    if key not in _loaded:
        try:
            if name == "numba":  # before its first kernel is compiled or loaded
                numba_cache.prepare()
            module = importlib.import_module(f"ringcomp.kernels.{family}_{_SUFFIX[name]}")
            usable = getattr(module, "usable", lambda: "")()  # CUDA: a device or the simulator
        except ImportError as err:  # numba / numba-cuda missing or broken
            module, usable = None, f"{err}"
        if usable:
            _why_not[name], module = usable, None
        _loaded[key] = module
    return _loaded[key]


def numba_compiled() -> tuple[int, str]:
    """(how many kernel signatures Numba compiled in this process rather than loading them
    from its on-disk cache, that cache's directory). Numba keys its cache by signature,
    CPU and Numba version and checks the source file's time stamp, so a kernel compiled
    for another CPU or another Numba, or from other source, is compiled again, never
    served; ``NUMBA_CACHE_DIR`` moves the cache (default: ``__pycache__`` beside the
    kernels, or a user directory where that is not writable)."""
    compiled, where = 0, ""
    for module in list(_loaded.values()):
        for obj in list(vars(module).values()) if module is not None else ():
            stats = getattr(obj, "stats", None)
            misses = getattr(stats, "cache_misses", None)
            if misses:
                compiled += sum(misses.values())
                where = where or str(stats.cache_path)
    return compiled, where


def available(family: str) -> list[str]:
    """The backend names that import and can run on this machine for ``family``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; known: {FAMILIES}")
    return [name for name in _SUFFIX if _load(family, name) is not None]


def backend(family: str, name: str | None = None, like=None):
    """The kernel module of ``family`` for arrays like ``like``: ``name``, else
    ``RINGCOMP_KERNELS``, else CUDA for device arrays and the fastest host backend
    otherwise. Resolved once per family, array kind (host or device) and choice, as CuPy
    names its kernels once: a call after the first is one dictionary lookup."""
    device = like is not None and on_device(like)
    key = (family, device, name or kernels_env())
    module = _RESOLVED.get(key)
    if module is None:
        module = _RESOLVED[key] = _resolve(family, key[2], device)
    return module


def _environ_reader(name: str):
    """A function reading the environment variable ``name`` ("" when unset), as
    ``os.environ.get`` does but without encoding the name on every call: it is read on
    every kernel call of every hop (0.7 us a time, a tenth of a small hop's codec call).
    The mapping under ``os.environ`` is read directly (CPython's ``_data``, with the key
    encoded once), so a change made through ``os.environ`` (a test's monkeypatch) still
    counts; where that mapping is missing, ``os.environ.get`` itself."""
    data, encode = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    if not isinstance(data, dict) or encode is None:
        return lambda: os.environ.get(name) or ""
    key = encode(name)
    decode = os.environ.decodevalue
    return lambda: decode(value) if (value := data.get(key)) else ""


#: ``RINGCOMP_KERNELS``, "" when unset
kernels_env = _environ_reader("RINGCOMP_KERNELS")


#: (family, on a device, backend asked for or "") -> the kernel module
_RESOLVED: dict[tuple[str, bool, str], object] = {}


def _resolve(family: str, name: str, device: bool):
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; known: {FAMILIES}")
    # only the backend asked for is loaded: host-only work never imports numba.cuda
    name = name or ("cuda" if device else
                    "numba" if _load(family, "numba") is not None else "numpy")
    if name not in _SUFFIX:
        raise ValueError(f"unknown kernel backend {name!r}; known: {', '.join(_SUFFIX)}")
    if name == "numba" and family in HOST_REFERENCE_ONLY:
        name = "numpy"
    if device and name != "cuda":
        raise ValueError(f"the {name!r} kernels run on host memory, and this {family} kernel "
                         f"was given a device array: unset RINGCOMP_KERNELS or set it to cuda")
    module = _load(family, name)
    if module is None:
        why = _why_not.get(name, "it does not import")
        raise ValueError(f"kernel backend {name!r} is not usable here ({why}); available: "
                         f"{', '.join(available(family))}")
    return module


#: host arrays smaller than this run a family's NumPy reference (bit for bit the same
#: results) unless RINGCOMP_KERNELS names a backend: Numba's first use costs about 0.6 s of
#: CPU per process (import, target set-up, cache load), which every rank pays at start-up,
#: while it saves only ~70 us per call at this size (SGD update, 2 cores): it would take
#: some 8,500 calls to pay back
NUMBA_FROM_ELEMENTS = 1 << 18


def for_size(family: str, size: int, like=None):
    """``backend(family, like=like)`` for work on ``size`` elements: the NumPy reference
    for host arrays below NUMBA_FROM_ELEMENTS (unless RINGCOMP_KERNELS says otherwise)."""
    small = size < NUMBA_FROM_ELEMENTS and not (like is not None and on_device(like))
    if small and not kernels_env():
        return backend(family, "numpy")
    return backend(family, like=like)


def share_cores(ranks_on_node: int) -> int:
    """Give Numba's parallel kernels this rank's share of the node's cores.

    Several ranks per node each running a full set of spinning kernel threads would fight
    over the cores (measured here: 4 ranks x 2 threads on 2 cores made a 64 KB sign
    all-reduce 100x slower). ``NUMBA_NUM_THREADS`` set by the user wins. Returns the
    thread count in use.
    """
    if _load("signs", "numba") is None:
        return 1
    import numba

    if "NUMBA_NUM_THREADS" not in os.environ:
        numba.set_num_threads(max(1, min(numba.config.NUMBA_NUM_THREADS,
                                         (os.cpu_count() or 1) // max(1, ranks_on_node))))
    return numba.get_num_threads()


def quiet_threads() -> str:
    """Make Numba's parallel kernels use its ``workqueue`` threads, whose idle threads
    sleep, unless the user chose a threading layer (``NUMBA_THREADING_LAYER``) or Numba
    already started one. Returns the layer asked for ('' when left alone).

    Beside PyTorch, whose CPU build brings its own OpenMP runtime, Numba's default
    OpenMP threads spin between kernels: a 3-rank ``torch:cnn`` run with ``--plan`` on 2
    cores took 7 s instead of 0.4 s, steps stalling for 100 ms at random. The workqueue
    layer is not re-entrant across threads; ringcomp launches its host kernels from one
    thread at a time (the engine's, or the caller's when there is no engine), and Numba
    aborts loudly - never silently - if two threads ever do so at once.
    """
    if "NUMBA_THREADING_LAYER" in os.environ or _load("signs", "numba") is None:
        return ""
    import numba
    from numba.np.ufunc import parallel

    if parallel._is_initialized:  # the layer is fixed once the first kernel ran
        return ""
    numba.config.THREADING_LAYER = "workqueue"
    return "workqueue"
