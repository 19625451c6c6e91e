"""The announcements an election composes (elector/election/announcements.py): the subscription
queues what arrives and wakes the election; what an event means is the election's to decide."""

from __future__ import annotations

import asyncio
import random

import pytest

from elector.election.announcements import Announcements
from elector.lease import Holder, LeaseEventKind
from tests.election.fake_backend import FakeBackend, FakeStore

pytestmark = pytest.mark.looptime


async def test_events_are_queued_in_order_wake_the_election_and_are_taken_once() -> None:
    store = FakeStore()
    woken = asyncio.Event()
    announcements = Announcements(
        FakeBackend(store, lock="lock"),
        request_timeout_s=0.5,
        stable_after_s=5.0,
        keepalive_s=60.0,
        clock=asyncio.get_running_loop().time,
        rng=random.Random(1),
        wake=woken.set,
    )
    announcements.start(name="announcements")
    await announcements.first_try(within_s=1.0)
    assert not announcements.pending
    store.publish(LeaseEventKind.ACQUIRED, Holder(identity="b", fencing_token=7))
    store.publish(LeaseEventKind.RELEASED, Holder(identity="b", fencing_token=7))
    await asyncio.wait_for(woken.wait(), timeout=1.0)
    await asyncio.sleep(0)  # both queued
    assert announcements.pending
    assert [event.kind for event in announcements.take_events()] == [
        LeaseEventKind.ACQUIRED,
        LeaseEventKind.RELEASED,
    ]
    assert not announcements.pending and announcements.take_events() == []
    # A first subscription is no re-subscription: nothing was missed.
    assert not announcements.take_resubscribed()
    await announcements.stop(lock="lock")
    assert not store.subscriptions  # the subscription was closed


async def test_stop_before_start_is_a_no_op() -> None:
    announcements = Announcements(
        FakeBackend(FakeStore(), lock="lock"),
        request_timeout_s=0.5,
        stable_after_s=5.0,
        keepalive_s=60.0,
        clock=asyncio.get_running_loop().time,
        rng=random.Random(1),
        wake=lambda: None,
    )
    await announcements.stop(lock="lock")
