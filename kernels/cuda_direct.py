"""Launching compiled Numba CUDA kernels straight through ``cuLaunchKernel``: the arguments
packed by one ``struct.pack_into`` into a block laid out once per kernel and argument kinds.

On an H100 a launch through Numba's dispatcher took 33-130 us of host time (typing every
argument, packing each through ctypes or cuda.core), CuPy's ``RawKernel`` 8 us, and a
1 MiB hop's kernel runs for a few: the dispatcher, not the bytes, decided a hop's cost
(docs/gpu.md). Here a launch of kinds seen before costs a dictionary lookup, the packing
and one driver call. What Numba would pass is learnt, never assumed: the first launch of
each (kernel, argument kinds, device) goes through Numba's own path, and its layout is
kept only if, for that launch's very arguments, the block packed here equals byte for byte
what Numba's ``_prepare_args`` produced; otherwise (another Numba's argument ABI, a debug
or cooperative kernel, an extension) the kernel keeps Numba's path, said once.

Numba's kernel ABI, per argument, one 8-byte slot per kernel parameter (the driver copies
each parameter from the address given for it, so a narrower one sits at its slot's start):
an array of ndim d is meminfo, parent, nitems, itemsize, data, shape[d], strides[d]; a
scalar is its own value. Only C-contiguous arrays and NumPy/Python scalars are packed
here; anything else takes Numba's path (``launch`` returns False).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import warnings

import numpy as np

try:  # numba-cuda's own type system (the same objects as Numba's where both exist)
    from numba.cuda import types as nbtypes
except ImportError:
    from numba.core import types as nbtypes


#: a scalar parameter's struct code, padded to its 8-byte slot
_SCALAR_CODES = {nbtypes.int64: "q", nbtypes.uint64: "Q", nbtypes.int32: "i4x",
                 nbtypes.uint32: "I4x", nbtypes.int16: "h6x", nbtypes.uint16: "H6x",
                 nbtypes.int8: "b7x", nbtypes.uint8: "B7x", nbtypes.float64: "d",
                 nbtypes.float32: "f4x", nbtypes.boolean: "?7x"}
#: scalar argument types packed here (what Numba types them as decides the slot)
SCALAR_TYPES = frozenset({int, float, bool, np.int64, np.uint64, np.int32, np.uint32,
                          np.int16, np.uint16, np.int8, np.uint8, np.float64, np.float32,
                          np.bool_})
_SLOT = 8


def enabled() -> bool:
    """``RINGCOMP_DIRECT_LAUNCH`` (1, the default, or 0: every launch through Numba's
    dispatcher, to compare or to rule this path out)."""
    raw = os.environ.get("RINGCOMP_DIRECT_LAUNCH", "1").strip()
    if raw not in ("0", "1"):
        raise ValueError(f"RINGCOMP_DIRECT_LAUNCH must be 0 or 1, got {raw!r}")
    return raw == "1"


def kinds(args) -> tuple | None:
    """What decides the kernel overload and the argument layout of ``args``: the type of a
    scalar, (dtype, ndim) of a C-contiguous CuPy array; None when an argument is neither."""
    out = []
    for a in args:
        t = type(a)
        if t in SCALAR_TYPES:
            out.append(t)
        elif (t in _ARRAY_TYPES or _is_array_type(t)) and a.flags.c_contiguous:
            out.append((a.dtype, a.ndim))
        else:
            return None
    return tuple(out)


_ARRAY_TYPES: set = set()


def _is_array_type(t) -> bool:
    """True for CuPy's array type (remembered: ``kinds`` runs on every launch)."""
    if t.__module__.split(".")[0] != "cupy":
        return False
    _ARRAY_TYPES.add(t)
    return True


def array_fields(a) -> tuple:
    """A C-contiguous array's parameters as Numba passes them: strides from the shape (as
    Numba computes them for an interface that gives none), a null pointer when empty."""
    shape, itemsize, size = a.shape, a.itemsize, a.size
    ptr = a.data.ptr if size else 0
    if len(shape) == 1:  # nearly every argument
        return 0, 0, size, itemsize, ptr, size, itemsize
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return (0, 0, size, itemsize, ptr, *shape, *reversed(strides))


class Layout:
    """The argument block of one kernel overload: a struct format of whole 8-byte slots."""

    def __init__(self, argument_types):
        codes = ["<"]
        for ty in argument_types:
            if isinstance(ty, nbtypes.Array):
                codes.append("qqqqQ" + "q" * (2 * ty.ndim))
            elif ty in _SCALAR_CODES:
                codes.append(_SCALAR_CODES[ty])
            else:
                raise TypeError(f"no slot layout for a {ty} argument")
        self.format = "".join(codes)
        self.slots = struct.calcsize(self.format) // _SLOT
        self.is_array = [isinstance(ty, nbtypes.Array) for ty in argument_types]

    def values(self, args) -> list:
        out = []
        for is_array, a in zip(self.is_array, args, strict=True):
            if is_array:
                out.extend(array_fields(a))
            else:
                out.append(a)
        return out

    def pack(self, args, block) -> None:
        """Write ``args`` into ``block`` (a buffer of ``slots`` 8-byte slots)."""
        struct.pack_into(self.format, block, 0, *self.values(args))


def numba_arg_bytes(value) -> bytes:
    """One parameter of Numba's own argument list as the bytes the driver copies: ctypes
    values as they are, Python integers as 8 bytes (cuda.core's and ctypes' ``intptr_t``),
    booleans as one byte, NumPy scalars as their bytes."""
    if isinstance(value, ctypes._SimpleCData):
        return ctypes.string_at(ctypes.addressof(value), ctypes.sizeof(value))
    if isinstance(value, (bool, np.bool_)):
        return bytes([bool(value)])
    if isinstance(value, int):
        return value.to_bytes(8, "little", signed=value < 0)
    if isinstance(value, np.generic):
        return value.tobytes()
    if isinstance(value, float):
        return struct.pack("<d", value)
    raise TypeError(f"cannot read Numba's {type(value).__name__} parameter")


def same_as_numba(layout: Layout, block, theirs: list) -> str:
    """'' when ``block`` holds exactly Numba's parameters ``theirs``, else what differs."""
    if len(theirs) != layout.slots:
        return f"Numba passes {len(theirs)} parameters, the layout has {layout.slots}"
    raw = bytes(block)
    for i, value in enumerate(theirs):
        want = numba_arg_bytes(value)
        if len(want) > _SLOT or raw[_SLOT * i:_SLOT * i + len(want)] != want:
            return f"parameter {i}: Numba passes {want.hex()}, packed " \
                   f"{raw[_SLOT * i:_SLOT * (i + 1)].hex()}"
    return ""


class Blocks(threading.local):
    """Each thread's argument blocks, one per layout, and the parameter pointer arrays into
    them (the driver copies the parameters during the call, so a block is free again as
    soon as the launch returns; threads launching at once need their own)."""

    def __init__(self):
        self.by_layout = {}

    def get(self, layout: Layout):
        found = self.by_layout.get(id(layout))
        if found is None:
            block = np.zeros(layout.slots, np.uint64)
            base = block.__array_interface__["data"][0]
            params = np.arange(layout.slots, dtype=np.uint64) * _SLOT + np.uint64(base)
            found = self.by_layout[id(layout)] = \
                (layout, block, params, params.__array_interface__["data"][0])
        return found


def _function_handle(compiled) -> int:
    """The ``CUfunction`` of a compiled kernel in the current context (cuda.core loads a
    context-independent ``CUkernel``: the driver names its function in this context)."""
    handle = compiled._codelibrary.get_cufunc().handle
    if type(handle).__name__ == "CUkernel":
        from cuda.bindings import driver

        err, handle = driver.cuKernelGetFunction(handle)
        if int(err):
            raise RuntimeError(f"cuKernelGetFunction failed: {err}")
    return int(getattr(handle, "value", handle))


class DirectLauncher:
    """The learnt layouts and the launches through them (module-level ``LAUNCHER``)."""

    def __init__(self, driver_launch=None, device_id=None):
        self._driver_launch = driver_launch  # tests stand in for cupy.cuda.driver
        self._device_id = device_id
        self.layouts: dict = {}  # (kernel, kinds, device) -> (function, Layout) | None
        self.refused: dict = {}  # kernel name -> why its layout was not kept (said once)
        self.launched: set = set()  # layouts the driver has launched once
        self.blocks = Blocks()

    def _device(self) -> int:
        if self._device_id is not None:
            return self._device_id()
        import cupy

        return cupy.cuda.runtime.getDevice()

    def _launch_call(self):
        if self._driver_launch is None:
            from cupy.cuda import driver

            self._driver_launch = driver.launchKernel
        return self._driver_launch

    def launch(self, kernel, blocks: int, threads: int, stream: int, args) -> bool:
        """Launch ``kernel`` on ``args`` when a layout for their kinds was learnt; False
        (nothing launched) when not, or when the values do not fit the slots. The driver
        refusing a layout's first launch (a function handle this path got wrong) drops
        the layout, said once: Numba's path launches instead."""
        key = (kernel, kinds(args), self._device())
        found = self.layouts.get(key)
        if found is None:
            return False
        function, layout = found
        _, block, _, params = self.blocks.get(layout)
        try:
            layout.pack(args, block)
        except (struct.error, OverflowError):  # a value beyond its slot: Numba decides
            return False
        try:
            self._launch_call()(function, blocks, 1, 1, threads, 1, 1, 0, stream, params, 0)
        except Exception as err:
            if layout in self.launched:  # it launched before: an error of this launch
                raise
            self.layouts[key] = None
            self._refuse(kernel, f"the driver refused its launch: {err}")
            return False
        self.launched.add(layout)
        return True

    def _refuse(self, kernel, why: str) -> None:
        """Say once per kernel why it keeps Numba's dispatcher."""
        name = getattr(getattr(kernel, "py_func", None), "__name__", str(kernel))
        if name not in self.refused:
            self.refused[name] = why
            warnings.warn(f"ringcomp: kernel {name} launches through Numba's dispatcher "
                          f"({why})", RuntimeWarning, stacklevel=4)

    def learn(self, kernel, args, views, stream) -> None:
        """After Numba launched ``kernel`` on ``views`` (the Numba forms of ``args``), keep
        the layout of these argument kinds if packing ``args`` gives Numba's own block."""
        found = kinds(args)
        if found is None:
            return
        key = (kernel, found, self._device())
        if key in self.layouts:
            return
        try:
            self.layouts[key] = self._learnt(kernel, args, views, stream)
        except Exception as err:  # Numba's internals differ: keep its own path
            self.layouts[key] = None
            self._refuse(kernel, f"{type(err).__name__}: {err}")

    def _learnt(self, kernel, args, views, stream):
        if getattr(kernel, "_launch_config_sensitive", False):
            raise TypeError("compiled per launch configuration")
        signature = tuple(kernel.typeof_pyval(v) for v in views)
        compiled = kernel.overloads[signature]
        if compiled.debug or getattr(compiled, "cooperative", False) \
                or getattr(compiled, "extensions", None) \
                or getattr(compiled, "launch_config_sensitive", False):
            raise TypeError("a debug, cooperative or extended kernel")
        layout = Layout(compiled.argument_types)
        theirs, keep = [], []
        for ty, view in zip(compiled.argument_types, views, strict=True):
            compiled._prepare_args(ty, view, stream, keep, theirs)
        block = np.zeros(layout.slots, np.uint64)
        layout.pack(args, block)
        differs = same_as_numba(layout, block, theirs)
        if differs:
            raise ValueError(differs)
        return _function_handle(compiled), layout


LAUNCHER = DirectLauncher()
