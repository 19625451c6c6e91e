"""`Election.run(start_delay_s=...)`: how a daemon of many locks spreads their starts."""

from __future__ import annotations

import asyncio

import pytest

from elector.election import Election, OutcomeKind, State, StepDownReason
from tests.election.fake_backend import FakeBackend, FakeStore
from tests.support.election import Recorder, timing

pytestmark = pytest.mark.looptime


async def test_the_first_try_waits_for_the_start_delay(store: FakeStore) -> None:
    recorder = Recorder()
    backend = FakeBackend(store)
    election = Election(backend, identity="a", timing=timing(), hooks=recorder.hooks())
    task = asyncio.create_task(election.run(start_delay_s=2.5))
    await asyncio.sleep(2.4)
    assert sum(backend.requests.values()) == 0  # not even the subscription yet
    status = election.status()
    assert status.started and status.state is State.FOLLOWER
    assert status.cycle_due_by is not None and status.cycle_due_by > status.now  # not wedged
    await asyncio.sleep(0.2)
    assert election.status().is_leader
    assert recorder.first(OutcomeKind.ACQUIRED).at == pytest.approx(2.5, abs=0.01)
    election.stop()
    await task
    assert store.lease is None


async def test_a_stop_during_the_start_delay_ends_the_run_without_a_request(store: FakeStore) -> None:
    recorder = Recorder()
    backend = FakeBackend(store)
    election = Election(backend, identity="a", timing=timing(), hooks=recorder.hooks())
    task = asyncio.create_task(election.run(start_delay_s=60.0))
    await asyncio.sleep(1.0)
    election.stop()
    await asyncio.wait_for(task, timeout=1.0)
    assert sum(backend.requests.values()) == 0
    assert election.status().state is State.STOPPED
    # The run's own end: on_stopped_leading is still called once, as for any run that never led.
    assert [(name, reason) for name, reason, _ in recorder.calls] == [("stopped", StepDownReason.SHUTDOWN)]


async def test_a_negative_start_delay_is_refused(store: FakeStore) -> None:
    election = Election(FakeBackend(store), identity="a", timing=timing())
    with pytest.raises(ValueError, match="start_delay_s"):
        await election.run(start_delay_s=-1.0)
