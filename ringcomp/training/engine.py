"""Wait-free back-propagation: a background thread all-reduces each bucket once it is full."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from ringcomp import log as ringcomp_log
from ringcomp.api import algorithm_options
from ringcomp.collectives import REGISTRY
from ringcomp.collectives.auto import COSTS_ENV, costs_for
from ringcomp.kernels import backends
from ringcomp.plans.plan import allreduce_init
from ringcomp.training import handoff
from ringcomp.transport.agree import everywhere
from ringcomp.transport.comm import Transport

log = logging.getLogger(__name__)


def load_kernels(compressor, xp, algorithm: str = "") -> float:
    """Load ``compressor``'s kernels for arrays of ``xp`` before the first step
    (``Compressor.warm_up``), and for host arrays on the ring (``algorithm``) the rings'
    compiled walks, so that a job's first collective is not charged with Numba compiling
    them or reading its cache (a compressed ring's first call took a quarter of a second
    more without); say once when they were compiled rather than loaded (the first run on
    a machine). Nothing for an exact job, nor on Numba's CUDA simulator (nothing compiles
    there). Returns the seconds it took."""
    if compressor is None or (xp is not np and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"):
        return 0.0
    before, _ = backends.numba_compiled()
    t0 = time.perf_counter()
    compressor.warm_up(xp)
    entry = REGISTRY.get(algorithm)  # ("": no algorithm named, only the codec's kernels)
    if xp is np and entry is not None and (entry.walk is not None or entry.binds == "choice"):
        # imported here, not above: they load Numba, which an exact job does without
        from ringcomp.collectives import compressed_ring_native, ring_native

        # the dtype warm_up ran: a job's gradients (the other compiles on first use)
        ring_native.compile_walks([np.float32])  # the exact small buckets' walk
        compressed_ring_native.compile_walks([np.float32])
    seconds = time.perf_counter() - t0
    compiled, where = backends.numba_compiled()
    if compiled > before:
        # a tool shows info; a script that set up no logging (Python's default shows
        # warnings and above) would otherwise wait tens of seconds without a word
        level = logging.INFO if ringcomp_log.configured() else logging.WARNING
        log.log(level, f"compiled {compiled - before} Numba kernel(s) for "
                       f"{compressor.spec()} in {seconds:.1f} s, once: later runs load them "
                       f"from Numba's cache ({where}; NUMBA_CACHE_DIR moves it)")
    return seconds


@dataclass(frozen=True)
class _Retrace:
    """A queued switch of the engine's tracer (``CommEngine.set_tracer``)."""

    tracer: object
    switched: Future


class CommEngine:
    """Runs every submitted all-reduce, in submission order, on its own thread and its own
    communicator (a duplicate of the training one), so the main thread keeps computing
    gradients while earlier buckets travel. One collective at a time (FIFO), like
    Horovod's and DDP's background communication. On a GPU the thread queues its work on
    a stream of its own, after the submitted bucket's producers only (``handoff``), so
    the collectives overlap the rest of backward.

    ``submit`` returns a Future of the reduced array; ``comm_s`` accumulates the time the
    thread spent in collectives and ``wire_bytes`` the bytes it sent.
    """

    def __init__(self, comm, *, algorithm: str, compressor, error_feedback, seed: int,
                 options: dict | None = None, tracer=None, shadow: bool = False,
                 on_start=None):
        """``on_start``: called first on the engine's thread (to make the rank's GPU the
        thread's current device: CuPy's current device is per thread; loading the
        compressor's kernels); the engine is ready, and this returns, once it has run on
        every rank (a rank's exception is raised on every rank, naming it:
        ``EverywhereError``)."""
        self.on_start = on_start
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self.transport = Transport(comm)
        self.algorithm, self.compressor = algorithm, compressor
        self.error_feedback, self.seed = error_feedback, seed
        self.options, self.tracer, self.shadow = dict(options or {}), tracer, shadow
        takes = algorithm_options(algorithm)
        self.exact_options = {k: v for k, v in self.options.items() if k in takes}
        self.comm_s = 0.0
        self.plans: dict[tuple, object] = {}  # (bucket, compressed, array kind) -> its plan
        self.closed = False
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="ringcomp-comm", daemon=True)
        self.thread.start()
        self._started.wait()
        if self._start_error is not None:
            self.thread.join()
            raise self._start_error

    @property
    def wire_bytes(self) -> int:
        return self.transport.bytes_sent

    @property
    def carries_riders(self) -> bool:
        """Whether a compressed call can carry an exact bucket in its walk
        (``submit(rider=...)``): a compressed ring (not PowerSGD's factors) of two or more
        ranks."""
        return (REGISTRY[self.algorithm].carries_riders and self.compressor is not None
                and not self.compressor.wraps_exact and self.transport.size > 1)

    def submit(self, buf: np.ndarray, *, step: int, bucket: int, compressed: bool,
               before=None, rider: tuple | None = None):
        """Queue the all-reduce of ``buf``; ``before``: called on the engine's thread just
        ahead of it (to wait for whatever still produces ``buf`` on a GPU stream the
        engine does not share, e.g. a CUDA tensor of PyTorch's). A closed engine refuses
        at once (its thread is gone: the Future would never be set). Returns its Future.

        ``rider``: ``(buffer, bucket, before)`` of an exact bucket to carry in this
        compressed call's walk (``carries_riders``; ``AllreducePlan.with_rider``): one
        call instead of two, the same bits. Returns the two Futures then."""
        if self.closed:
            raise RuntimeError("ringcomp: the communication engine was closed; no collective "
                               "can be submitted to it")
        future: Future = Future()
        riding = None
        if rider is not None:
            if not (compressed and self.carries_riders):
                raise ValueError("ringcomp: an exact bucket rides only on a compressed "
                                 "ring's call of two or more ranks")
            rider_buf, rider_bucket, rider_before = rider
            riding = (Future(), rider_buf, rider_bucket, rider_before,
                      handoff.ready(rider_buf))
        self.queue.put((future, buf, step, bucket, compressed, before, handoff.ready(buf),
                        riding))
        return future if riding is None else (future, riding[0])

    def set_tracer(self, tracer) -> Future:
        """Record the calls submitted from now on into ``tracer`` (None: stop recording),
        in submission order: the calls already queued keep the tracer they were submitted
        under. The bucket plans are made anew under it (each is checked and agreed again
        at its next call: collective, so every rank sets the same at the same point).
        Returns a Future set once the engine has switched - every earlier call is done,
        so a tracer set aside then holds all it will record."""
        if self.closed:
            raise RuntimeError("ringcomp: the communication engine was closed")
        switched: Future = Future()
        self.queue.put(_Retrace(tracer, switched))
        return switched

    def _calibrate(self) -> None:
        """``auto``'s constants measured now, before the first bucket (every rank's engine
        does, on its own communicator), so their traffic is neither a step's time nor the
        job's bytes: it is logged apart."""
        if REGISTRY[self.algorithm].binds != "choice" or self.transport.size == 1:
            return
        sent, t0 = self.transport.bytes_sent, time.perf_counter()
        calibrated = self.transport.kept.auto_costs is None
        costs_for(self.transport)
        if calibrated and not os.environ.get(COSTS_ENV):
            log.info(f"auto: calibrated in {time.perf_counter() - t0:.1f} s "
                     f"({(self.transport.bytes_sent - sent) / 1e6:.1f} MB sent per rank, not "
                     f"counted as the job's)")
        self.transport.bytes_sent = sent

    def _run(self) -> None:
        try:
            # every rank's verdict on its start (the communicator was duplicated on every
            # rank): one rank that cannot bind its GPU or load its kernels fails them all,
            # rather than leaving the others in auto's calibration until the deadline
            everywhere(self.transport, self.on_start or (lambda: None))
            self._calibrate()
        except BaseException as exc:  # raised by the constructor, on the caller's thread
            self._start_error = exc
            return
        finally:
            self._started.set()
        while True:
            item = self.queue.get()
            if item is None:
                return
            if isinstance(item, _Retrace):
                self.tracer, self.plans = item.tracer, {}
                item.switched.set_result(True)
                continue
            future, buf, step, bucket, compressed, before, produced, rider = item
            futures = [future] if rider is None else [future, rider[0]]
            t0 = time.perf_counter()
            try:
                with contextlib.ExitStack() as streams:
                    streams.enter_context(handoff.engine_stream(buf, produced))
                    if rider is not None:  # the same stream waits for the rider's producer
                        streams.enter_context(handoff.engine_stream(rider[1], rider[4]))
                    outs = self._reduce(buf, step, bucket, compressed, before, rider)
            except BaseException as exc:  # handed to the waiting main thread
                for waiting in futures:
                    waiting.set_exception(exc)
                continue
            self.comm_s += time.perf_counter() - t0
            for waiting, out in zip(futures, outs, strict=True):
                waiting.set_result(out)

    def _reduce(self, buf, step: int, bucket: int, compressed: bool, before,
                rider=None) -> tuple:
        """One submitted all-reduce, on the engine's thread, through the bucket's persistent
        plan (``allreduce_init``: checked and agreed when the bucket is first met - at
        the same call on every rank, since every rank submits the same buckets in the
        same order - then one small agreement a call); with a rider, its exact bucket's
        plan travels in the same call. Returns the result(s)."""
        if before is not None:
            before()
        plan = self._plan_of(buf, bucket, compressed)
        if rider is None:
            return (plan(buf, step=step),)
        _, rider_buf, rider_bucket, rider_before, _ = rider
        if rider_before is not None:
            rider_before()
        return plan.with_rider(buf, self._plan_of(rider_buf, rider_bucket, False), rider_buf,
                               step=step)

    def _plan_of(self, buf, bucket: int, compressed: bool):
        key = (bucket, compressed, type(buf), buf.shape, buf.dtype)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self._plan(buf, bucket, compressed)
        return plan

    def _plan(self, buf, bucket: int, compressed: bool):
        if compressed:
            plan = allreduce_init(
                buf, comm=self.transport, algorithm=self.algorithm,
                compressor=self.compressor, error_feedback=self.error_feedback, seed=self.seed,
                bucket=bucket, tracer=self.tracer,
                shadow=self.shadow and self.tracer is not None, **self.options)
        else:
            # exact: the same algorithm without compression (every compressed form is
            # registered beside its exact form), with the options it takes (a torus's
            # shape, a ring's segment)
            plan = allreduce_init(buf, comm=self.transport, algorithm=self.algorithm,
                                  tracer=self.tracer, bucket=bucket, **self.exact_options)
        plan.x = None  # each call passes its bucket: the first one need not be kept
        return plan

    def close(self) -> None:
        """Run what was submitted, then stop the thread; closing twice is fine."""
        if self.closed:
            return
        self.closed = True
        self.queue.put(None)
        self.thread.join()
