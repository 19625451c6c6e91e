"""`on_stopped_leading` is "always, once" (client-go's contract), kept by the election itself.

Every term is closed by exactly one call; a run that never led makes one call as it ends; a raising
call still withholds the release. Virtual time (looptime), fake backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from elector.election import (
    CycleOutcome,
    Election,
    ElectionHooks,
    ElectionTiming,
    OutcomeKind,
    State,
    StepDownReason,
)
from elector.lease import Lease
from tests.election.fake_backend import FakeBackend, FakeStore

pytestmark = pytest.mark.looptime

TTL_S = 3.0


class WorkThatWillNotStop(Exception):
    pass


class Run:
    """One election that records its start/stop calls (with the state the election was in)."""

    def __init__(self, store: FakeStore, identity: str) -> None:
        self.calls: list[tuple[str, object]] = []
        self.outcomes: list[CycleOutcome] = []
        self.stop_fails = False
        self.stop_blocks = False

        async def started(lease: Lease) -> None:
            self.calls.append(("started", lease.fencing_token))

        async def stopped(reason: StepDownReason) -> None:
            self.calls.append(("stopped", reason))
            if self.stop_blocks:
                self.stop_blocks = False
                await asyncio.Event().wait()  # work that takes forever to stop: cut short by a cancel
            if self.stop_fails:
                raise WorkThatWillNotStop("the command survived SIGKILL")

        self.election = Election(
            FakeBackend(store),
            identity=identity,
            timing=ElectionTiming.from_ttl(TTL_S, renew_interval_s=1.0),
            hooks=ElectionHooks(
                on_outcome=self.outcomes.append, on_started_leading=started, on_stopped_leading=stopped
            ),
            rng=random.Random(5),
        )
        self.task = asyncio.create_task(self.election.run(), name=identity)

    def stops(self) -> list[object]:
        return [arg for name, arg in self.calls if name == "stopped"]

    def kinds(self) -> list[OutcomeKind]:
        return [o.kind for o in self.outcomes]


def start(runs: list[Run], store: FakeStore, identity: str) -> Run:
    runs.append(Run(store, identity))
    return runs[-1]


async def test_a_run_that_never_led_calls_it_once_as_it_stops(store, runs) -> None:
    start(runs, store, "a")
    await asyncio.sleep(0.5)
    b = start(runs, store, "b")
    await asyncio.sleep(5.0)  # a follower through several looks at the lock
    assert b.calls == []  # nothing while the run goes on
    b.election.stop()
    await b.task
    assert b.calls == [("stopped", StepDownReason.SHUTDOWN)]
    assert b.election.status().state is State.STOPPED


async def test_a_cancelled_run_that_never_led_calls_it_once(store, runs) -> None:
    start(runs, store, "a")
    await asyncio.sleep(0.5)
    b = start(runs, store, "b")
    await asyncio.sleep(1.0)
    b.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await b.task
    assert b.calls == [("stopped", StepDownReason.SHUTDOWN)]


async def test_each_term_is_closed_by_one_call_and_the_end_of_the_run_adds_none(store, runs) -> None:
    a = start(runs, store, "a")
    await asyncio.sleep(0.5)
    store.overwrite("intruder", ttl_s=2.0)  # a finds it lost at its renewal at 1.0
    await asyncio.sleep(4.0)  # the intruder's key lapsed at 2.5: a leads again
    assert a.election.status().is_leader
    a.election.stop()
    await a.task
    assert a.calls == [
        ("started", 1),
        ("stopped", StepDownReason.LOST),
        ("started", 3),
        ("stopped", StepDownReason.SHUTDOWN),
    ]
    assert a.kinds()[-1] is OutcomeKind.RELEASED


async def test_a_run_that_led_and_lost_makes_no_extra_call_at_its_end(store, runs) -> None:
    a = start(runs, store, "a")
    await asyncio.sleep(0.5)
    store.overwrite("intruder", ttl_s=30.0)  # lost at 1.0, and not regained before the stop
    await asyncio.sleep(2.0)
    a.election.stop()
    await a.task
    assert a.calls == [("started", 1), ("stopped", StepDownReason.LOST)]


async def test_a_raising_call_withholds_the_release_and_is_not_repeated(store, runs) -> None:
    a = start(runs, store, "a")
    await asyncio.sleep(1.5)
    a.stop_fails = True
    a.election.stop()
    await a.task
    assert a.stops() == [StepDownReason.SHUTDOWN]  # counted as made: not called again at the end
    assert OutcomeKind.RELEASE_WITHHELD in a.kinds() and OutcomeKind.RELEASED not in a.kinds()
    assert store.lease is not None and store.lease.holder.identity == "a"  # left to lapse


async def test_a_raising_call_of_a_run_that_never_led_is_only_logged(
    store, runs, caplog: pytest.LogCaptureFixture
) -> None:
    start(runs, store, "a")
    await asyncio.sleep(0.5)
    b = start(runs, store, "b")
    await asyncio.sleep(0.5)
    b.stop_fails = True
    b.election.stop()
    await b.task  # the run still ends cleanly
    assert b.stops() == [StepDownReason.SHUTDOWN]
    assert OutcomeKind.RELEASE_WITHHELD not in b.kinds()  # nothing was held
    assert "on_stopped_leading hook failed" in caplog.text


async def test_a_call_cut_short_by_cancelling_the_run_is_made_again(store, runs) -> None:
    a = start(runs, store, "a")
    await asyncio.sleep(0.5)
    a.stop_blocks = True
    a.election.stop()
    await asyncio.sleep(0.5)  # the step-down waits in the hook
    assert a.stops() == [StepDownReason.SHUTDOWN]
    a.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await a.task
    # The first call never returned: the work is told to stop once more, from the run's cleanup.
    assert a.stops() == [StepDownReason.SHUTDOWN, StepDownReason.SHUTDOWN]
    assert a.election.status().state is State.STOPPED
    assert store.lease is not None  # cancelled: nothing released
