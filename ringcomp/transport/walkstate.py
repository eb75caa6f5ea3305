"""A compiled walk's state: where it waits (for the deadline's message), the guard's word
to stop sending, and what its return codes besides MPI's mean."""

from __future__ import annotations

import numpy as np

#: the fields of a walk's state (an int32 array the transport keeps, ``new``): the guard's
#: word to stop sending, then where the walk last waited and what arrived there
STOP, PHASE, STEP, KIND, PEER, TAG, NBYTES, GOT = range(8)
#: what it waited for (KIND): nothing yet, a receive, its posted sends
IDLE, RECEIVING, SENDING = range(3)
#: a walk's return codes besides MPI's error codes (>= 0): it stopped sending (the guard's
#: word), a message of another size arrived, a payload's contents were out of range
STOPPED, MISMATCH, BAD_PAYLOAD = -1, -2, -3
PHASES = ("reduce-scatter", "all-gather")


def new() -> np.ndarray:
    """A walk state, all fields zero."""
    return np.zeros(8, np.int32)


def where(state) -> str:
    """Where the walk of ``state`` waits (or waited last), in words."""
    phase = PHASES[state[PHASE]] if 0 <= state[PHASE] < len(PHASES) else "walk"
    if state[KIND] == RECEIVING:
        return (f"{phase} step {state[STEP]}: a receive of {state[NBYTES]} bytes from rank "
                f"{state[PEER]} (tag {state[TAG]})")
    if state[KIND] == SENDING:
        return f"end of the {phase}: its sends to rank {state[PEER]} (tag {state[TAG]})"
    return "its first message"


class Waiting:
    """A compiled walk's ``what`` for the deadline message: read from its state only when
    the message is made (the walk runs in compiled code, the watchdog in its own thread)."""

    __slots__ = ("state", "what")

    def __init__(self, state, what: str):
        self.state, self.what = state, what

    def __str__(self) -> str:
        return f"{self.what}, waiting at its {where(self.state)}"


def refusal(rc: int, state, name: str, rank: int) -> str:
    """The message of a walk that met a message it cannot take: ``MISMATCH`` (another
    byte count than ``state[NBYTES]`` arrived, ``state[GOT]``), ``BAD_PAYLOAD`` (top-k
    indices past the chunk's end), or an MPI truncation (``rc`` > 0: more bytes than
    expected)."""
    phase = PHASES[state[PHASE]] if 0 <= state[PHASE] < len(PHASES) else "walk"
    at = f"from rank {state[PEER]} (tag {state[TAG]}) at its {phase} step {state[STEP]}"
    if rc == MISMATCH:
        return (f"{name}: rank {rank} received {state[GOT]} bytes {at}, where this call "
                f"expects {state[NBYTES]}")
    if rc == BAD_PAYLOAD:
        return (f"{name}: rank {rank} received a payload that does not fit this call {at} "
                f"(top-k indices past the chunk's end)")
    return f"{name}: rank {rank} received more bytes than it expects {at}"
