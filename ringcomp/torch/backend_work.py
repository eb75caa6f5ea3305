"""The ``"ringcomp"`` backend's work: each group's collectives on a thread of its own, in call
order, and the ``Work`` handles torch waits on."""

from __future__ import annotations

import functools
import queue
import threading

import torch.distributed as dist
from torch.futures import Future

from ringcomp.torch.backend_tensors import producers_done


class Queued(dist.Work):
    """A collective handed to its group's thread: ``wait`` blocks until it ran (raising what
    it raised, torch's error types kept), ``is_completed`` says whether it has, and
    ``get_future`` is its result (the tensors it wrote), as gloo's work returns them."""

    def __init__(self, future: Future):
        super().__init__()
        self._future = future

    def wait(self, timeout=None) -> bool:
        # no timeout of its own: the group's transport aborts a collective at its deadline
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 - a failed collective is what this reports
            return False
        return True

    def get_future(self) -> Future:
        return self._future


def done(result) -> Queued:
    """A work that is already complete (a call run where it was made)."""
    future = Future()
    future.set_result(result)
    return Queued(future)


class GroupThread:
    """Runs one group's collectives one after another on a thread of its own.

    Invariants: 1. every collective of the group runs on this thread, in the order the
    calls were made (every rank makes them in the same order, so they pair up); 2. a call
    made on the thread itself (a coalesced form calling the plain one) runs at once; 3. a
    collective's exception reaches its ``wait``, never the thread, which goes on with the
    next call."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._started = False
        self._lock = threading.Lock()

    def submit(self, fn) -> Queued:
        if threading.current_thread() is self._thread:
            return done(fn())
        with self._lock:
            if not self._started:
                self._thread.start()
                self._started = True
        future = Future()
        self._jobs.put((fn, future))
        return Queued(future)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's wait
                future.set_exception(exc)
            else:
                future.set_result(result)

    def stop(self) -> None:
        """Run what was queued, then end the thread."""
        if self._started:
            self._jobs.put(None)
            self._thread.join()


def queued(method):
    """A ProcessGroup method whose body (returning what its work's future holds) runs on
    the group's thread (``self.thread``); the caller gets its ``Queued`` work at once."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        producers_done(args)  # this thread's CUDA streams, before another thread reads
        return self.thread.submit(lambda: method(self, *args, **kwargs))

    return call


def coalesced(single: str):
    """A ProcessGroup method that runs its method named ``single`` on each (output, input)
    pair, in order, on the group's thread (torch's coalesced all_gather_into_tensor and
    reduce_scatter_tensor)."""

    @queued
    def each(self, outputs, inputs, opts=None):
        run = getattr(self, single)
        for output, tensor in zip(outputs, inputs, strict=True):
            run(output, tensor, opts)
        return outputs

    each.__name__ = f"{single}_coalesced"
    return each


class Posted(dist.Work):
    """Point-to-point messages posted when called (``isend``/``irecv`` return at once);
    ``wait`` completes them on the waiting thread, under the transport's deadline."""

    def __init__(self, transport, pendings: list, result):
        super().__init__()
        self._transport, self._pendings, self._result = transport, pendings, result
        self._future = Future()

    def wait(self, timeout=None) -> bool:
        if not self._future.done():
            for pending in self._pendings:
                self._transport.complete(pending)
            self._future.set_result(self._result)
        return True

    def is_completed(self) -> bool:
        return self._future.done() or all(self._transport.test(p) for p in self._pendings)

    def get_future(self) -> Future:
        """Set once ``wait`` ran (torch's p2p futures are rarely read before it)."""
        return self._future
