"""`Election.run(start_delay_s=..., start_gate=...)`: how a daemon of many locks spreads their starts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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


class OneTurnGate:
    """A start gate that admits when the test says so, and records the ends of turns."""

    def __init__(self) -> None:
        self.admits: list[Callable[[], None]] = []
        self.ended = 0

    def request(self, admit: Callable[[], None]) -> OneTurnGate:
        self.admits.append(admit)
        return self

    def end(self) -> None:
        self.ended += 1


async def test_the_first_try_waits_for_a_turn_of_the_start_gate_and_ends_it_after_the_first_cycle(
    store: FakeStore,
) -> None:
    recorder = Recorder()
    backend = FakeBackend(store)
    gate = OneTurnGate()
    election = Election(backend, identity="a", timing=timing(), hooks=recorder.hooks())
    task = asyncio.create_task(election.run(start_gate=gate))
    await asyncio.sleep(30.0)
    assert sum(backend.requests.values()) == 0  # not even the subscription yet
    status = election.status()
    assert status.started and status.cycle_due_by is None  # waiting, and no cycle overdue
    assert gate.ended == 0
    gate.admits[0]()
    await asyncio.sleep(0.1)
    assert election.status().is_leader
    assert gate.ended == 1  # the first cycle ended: the turn is given back, once
    await asyncio.sleep(5.0)
    assert gate.ended == 1
    election.stop()
    await task
    assert gate.ended == 1 and store.lease is None


async def test_a_stop_while_waiting_for_a_turn_ends_the_run_without_a_request(store: FakeStore) -> None:
    recorder = Recorder()
    backend = FakeBackend(store)
    gate = OneTurnGate()
    election = Election(backend, identity="a", timing=timing(), hooks=recorder.hooks())
    task = asyncio.create_task(election.run(start_gate=gate))
    await asyncio.sleep(1.0)
    election.stop()
    await asyncio.wait_for(task, timeout=1.0)
    assert sum(backend.requests.values()) == 0
    assert gate.ended == 1  # the place is given up, so the gate skips it
    assert election.status().state is State.STOPPED
    assert [(name, reason) for name, reason, _ in recorder.calls] == [("stopped", StepDownReason.SHUTDOWN)]
