"""Sends held for their GPU work (``ringcomp.transport.heldsends``): posted in the order they were
made, as soon as their events have passed, and all of them before the host may block."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ringcomp.transport.heldsends import HeldSends


class Event:
    """A CUDA event that passes when the test says so (or when waited for)."""

    def __init__(self):
        self.done, self.waited = False, False

    def synchronize(self):
        self.waited = self.done = True


def send(name, ready=True):
    return SimpleNamespace(name=name, ready=Event() if ready else None, request=None)


@pytest.fixture
def held():
    posted, syncs = [], []
    def wait(pending):
        syncs.append(1)
        pending.ready.synchronize()

    queue = HeldSends(lambda p: posted.append(p.name), wait)
    return queue, posted, syncs


def test_a_send_is_posted_once_its_event_has_passed_and_not_before(held):
    queue, posted, syncs = held
    a = send("a")
    queue.add(a)
    queue.post()
    assert posted == [] and len(queue) == 1
    a.ready.done = True
    queue.post()
    assert posted == ["a"] and not queue and syncs == [] and not a.ready.waited


def test_a_later_send_ready_first_waits_behind_an_earlier_one(held):
    """MPI matches a peer's receives in posting order: b must not overtake a."""
    queue, posted, _ = held
    a, b = send("a"), send("b")
    queue.add(a)
    queue.add(b)
    b.ready.done = True
    queue.post()
    assert posted == []
    a.ready.done = True
    queue.post()
    assert posted == ["a", "b"]


def test_a_host_send_made_behind_held_ones_waits_for_them_on_the_gpu(held):
    queue, posted, syncs = held
    a, b, host = send("a"), send("b"), send("host", ready=False)
    for pending in (a, b, host):
        queue.add(pending)
    assert posted == ["a", "b", "host"] and a.ready.waited and b.ready.waited
    assert syncs == [1, 1] and not queue


def test_waiting_for_one_send_posts_it_and_every_older_one_only(held):
    queue, posted, syncs = held
    a, b, c = send("a"), send("b"), send("c")
    for pending in (a, b, c):
        queue.add(pending)
    queue.post(b)
    assert posted == ["a", "b"] and len(queue) == 1 and not c.ready.waited
    queue.post_all()
    assert posted == ["a", "b", "c"] and syncs == [1, 1, 1]
    queue.post_all()  # nothing held: nothing happens
    assert posted == ["a", "b", "c"]


def test_an_event_that_passed_costs_no_wait(held):
    queue, posted, syncs = held
    a = send("a")
    a.ready.done = True
    queue.add(a)
    assert posted == ["a"] and syncs == []
