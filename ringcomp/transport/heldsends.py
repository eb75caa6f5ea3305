"""Sends of GPU buffers held until the work they carry has run, posted in the order made."""

from __future__ import annotations

from collections import deque


class HeldSends:
    """A transport's sends whose data a CUDA event guards (a CuPy buffer's copy out, or
    with a CUDA-aware MPI the kernel that wrote it, only queued on the stream).

    Invariants: 1. sends are posted in the order they were made, held or not, since MPI
    matches a peer's receives in posting order; 2. nothing blocks in MPI while a send is
    held (``post_all`` first): a peer may be waiting for it, and the GPU work it waits
    for needs nothing from MPI, so waiting for that can never deadlock.

    Args:
        post: posts one send (sets its ``request``).
        wait: waits for one send's ``ready`` event (the host waiting for the GPU).
    """

    def __init__(self, post, wait):
        self.queue = deque()  # (its truth, read on every message: anything held)
        self._post = post
        self._wait = wait

    def __len__(self) -> int:  # (also its truth: anything held)
        return len(self.queue)

    def add(self, pending) -> None:
        """Hold ``pending`` behind the sends held before it; post what is ready."""
        self.queue.append(pending)
        self.post(pending if pending.ready is None else None)

    def post(self, through=None) -> None:
        """Post the held sends, oldest first, while their events have passed, and every one
        up to ``through`` (waiting for the GPU where needed)."""
        while self.queue:
            head = self.queue[0]
            if head.ready is not None and not head.ready.done:
                if through is None:
                    return
                self._wait(head)
            self.queue.popleft()
            self._post(head)
            if head is through:
                return

    def post_all(self) -> None:
        """Post every held send (before the host blocks)."""
        if self.queue:
            self.post(self.queue[-1])
