"""The election when leader work cannot be stopped, and the smaller lease-protocol guards of the
state machine: validity ends handed out, token regressions noticed, stale rivals ignored, a
breaking subscription backed off, suspended time counted. Virtual time (looptime), fake backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable

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
from elector.election.clock import COUNTS_SUSPEND, boottime
from elector.lease import BackendErrorKind, Candidate, Holder, Lease, LeaseBackendError, Renewed
from tests.election.fake_backend import FakeBackend, FakeStore, FakeSubscription
from tests.support.election import now

pytestmark = pytest.mark.looptime

TTL_S = 3.0


def timing() -> ElectionTiming:
    return ElectionTiming.from_ttl(TTL_S, renew_interval_s=1.0)


class WorkThatWillNotStop(Exception):
    pass


class Run:
    """One election with recorded outcomes and a stop hook that can be told to fail."""

    def __init__(
        self,
        store: FakeStore,
        identity: str,
        *,
        clock: Callable[[], float] | None = None,
        priority: int = 0,
    ) -> None:
        self.outcomes: list[CycleOutcome] = []
        self.stop_fails = False
        self.backend = FakeBackend(store)

        async def stopped(reason: StepDownReason) -> None:
            if self.stop_fails:
                raise WorkThatWillNotStop("the command survived SIGKILL")

        self.election = Election(
            self.backend,
            identity=identity,
            timing=timing(),
            hooks=ElectionHooks(on_outcome=self.outcomes.append, on_stopped_leading=stopped),
            rng=random.Random(3),
            clock=clock,
            priority=priority,
        )
        self.task = asyncio.create_task(self.election.run(), name=identity)

    def kinds(self) -> list[OutcomeKind]:
        return [o.kind for o in self.outcomes]

    def first(self, kind: OutcomeKind) -> CycleOutcome:
        return next(o for o in self.outcomes if o.kind is kind)


async def test_a_failed_stop_at_shutdown_leaves_the_lease_to_lapse(store, runs) -> None:
    a = Run(store, "a")
    runs.append(a)
    await asyncio.sleep(0.5)
    b = Run(store, "b")
    runs.append(b)
    await asyncio.sleep(1.2)  # a renewed at 1.0
    a.stop_fails = True
    a.election.stop()
    await a.task
    withheld = a.first(OutcomeKind.RELEASE_WITHHELD)
    assert withheld.step_down_reason is StepDownReason.SHUTDOWN
    assert "survived SIGKILL" in (withheld.error or "")
    assert OutcomeKind.RELEASED not in a.kinds()
    assert a.election.status().state is State.STOPPED
    # The key is still a's: b leads only once it lapses (renewed at 1.0 -> gone at 4.0).
    assert store.lease is not None and store.lease.holder.identity == "a"
    await asyncio.sleep(4.0)
    acquired = b.first(OutcomeKind.ACQUIRED)
    assert acquired.at >= 1.0 + TTL_S - 0.001


async def test_a_failed_stop_on_resign_neither_releases_nor_contends_before_the_lapse(store, runs) -> None:
    a = Run(store, "a")
    runs.append(a)
    await asyncio.sleep(1.5)  # granted at 0, renewed at 1.0
    a.stop_fails = True
    a.election.resign(stand_back_s=0.0)
    await asyncio.sleep(0.01)
    assert a.kinds().count(OutcomeKind.RELEASE_WITHHELD) == 1
    assert a.first(OutcomeKind.RELEASE_WITHHELD).step_down_reason is StepDownReason.RESIGNED
    assert store.lease is not None  # not released
    assert not a.election.status().is_leader
    a.stop_fails = False
    acquires_before = a.backend.requests["acquire"]
    await asyncio.sleep(1.0 + TTL_S - now() - 0.01)  # until just before the old lease lapses
    assert a.backend.requests["acquire"] == acquires_before  # stood back: nothing sent
    await asyncio.sleep(0.5)
    regained = [o for o in a.outcomes if o.kind is OutcomeKind.ACQUIRED]
    assert len(regained) == 2 and regained[1].at >= 1.0 + TTL_S


async def test_a_failed_stop_after_a_lost_lease_is_reported_once(store, runs) -> None:
    a = Run(store, "a")
    runs.append(a)
    await asyncio.sleep(0.5)
    a.stop_fails = True
    store.overwrite("intruder", ttl_s=10)
    await asyncio.sleep(1.0)
    lost = a.first(OutcomeKind.RENEW_LOST)
    assert lost.step_down_reason is StepDownReason.LOST
    withheld = a.first(OutcomeKind.RELEASE_WITHHELD)
    assert withheld.step_down_reason is None  # counted once, by the RENEW_LOST outcome
    assert a.election.status().state is State.FOLLOWER


async def test_grants_and_renewals_carry_their_validity_end(store, runs) -> None:
    a = Run(store, "a")
    runs.append(a)
    await asyncio.sleep(2.5)
    validity_s = timing().validity_s
    for outcome in a.outcomes:
        if outcome.kind in (OutcomeKind.ACQUIRED, OutcomeKind.RENEWED):
            assert outcome.valid_until == pytest.approx(outcome.at + validity_s)
        else:
            assert outcome.valid_until is None
    assert [o.kind for o in a.outcomes][:3] == [
        OutcomeKind.ACQUIRED,
        OutcomeKind.RENEWED,
        OutcomeKind.RENEWED,
    ]


async def test_a_lower_fencing_token_than_one_seen_before_is_reported(store, runs) -> None:
    a = Run(store, "a")
    runs.append(a)
    await asyncio.sleep(0.1)
    store.overwrite("x", ttl_s=2.0)  # token 2
    await asyncio.sleep(1.0)
    assert a.first(OutcomeKind.RENEW_LOST).holder == Holder(identity="x", fencing_token=2)
    assert all(o.token_regressed_from is None for o in a.outcomes)
    store.counter = 0  # the counter lost; the next grant's token is below what a has seen
    store.overwrite("y", ttl_s=2.0)  # token 1 < 2
    await asyncio.sleep(3.0)
    regressions = [o for o in a.outcomes if o.token_regressed_from is not None]
    assert len(regressions) == 1
    assert regressions[0].token_regressed_from == 2
    assert regressions[0].holder == Holder(identity="y", fencing_token=1)


async def test_a_higher_priority_rival_not_seen_within_a_ttl_is_no_reason_to_yield(store, runs) -> None:
    a = Run(store, "a")
    runs.append(a)
    stale = Candidate(identity="ghost", priority=10, last_seen_ms_ago=round(TTL_S * 1000) + 1)
    live = Candidate(identity="ghost", priority=10, last_seen_ms_ago=200)
    renew = a.backend.renew
    rival = [stale]

    async def renew_with_rival(lease: Lease, *, priority: int = 0) -> Renewed:
        result = await renew(lease, priority=priority)
        assert isinstance(result, Renewed)
        return Renewed(handoff=result.handoff, best_rival=rival[0])

    a.backend.renew = renew_with_rival  # type: ignore[method-assign]
    await asyncio.sleep(4 * TTL_S)
    assert a.election.status().is_leader  # the dead candidate never got the lock
    assert all(o.step_down_reason is None for o in a.outcomes)
    rival[0] = live
    await asyncio.sleep(3 * TTL_S)
    preempted = [o for o in a.outcomes if o.step_down_reason is StepDownReason.PREEMPTED]
    assert preempted  # a live one does


class BreakingSubscription(FakeSubscription):
    """A link cut right after every subscribe (an idle-timeout proxy in front of Redis)."""

    async def next_event(self, timeout_s: float) -> None:
        await asyncio.sleep(0.01)
        raise LeaseBackendError("subscription: connection closed", kind=BackendErrorKind.CONNECTION)


async def test_a_subscription_that_keeps_breaking_backs_off_more_and_more(store, runs) -> None:
    holder = Run(store, "holder")
    runs.append(holder)
    await asyncio.sleep(0.1)
    follower = Run(store, "f")
    runs.append(follower)

    async def subscribe(*, keepalive_s: float) -> FakeSubscription:
        follower.backend.requests["subscribe"] += 1
        return BreakingSubscription(store)

    follower.backend.subscribe = subscribe  # type: ignore[method-assign]
    await asyncio.sleep(120)
    # A fixed 0.2-0.4 s back-off would subscribe (and look at the lock) 300+ times; growing to
    # the 30 s cap it is about a dozen.
    assert follower.backend.requests["subscribe"] <= 15
    assert follower.backend.requests["acquire"] <= 120 / (0.9 * TTL_S) + 15


class CancellationDroppingSubscription(FakeSubscription):
    """A link whose read drops its first cancellation, as a redis-py write inside CPython 3.11's
    wait_for can (elector/tasks.py): the read goes on as if never cancelled."""

    def __init__(self, store: FakeStore, dropped: list[float]) -> None:
        super().__init__(store)
        self.dropped = dropped

    async def next_event(self, timeout_s: float) -> None:
        try:
            await asyncio.sleep(timeout_s)
        except asyncio.CancelledError:
            if self.dropped:
                raise
            self.dropped.append(now())
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            await asyncio.sleep(timeout_s)


async def test_a_listener_that_drops_its_cancellation_does_not_hang_the_runs_end(store, runs) -> None:
    a = Run(store, "a")
    runs.append(a)
    dropped: list[float] = []

    async def subscribe(*, keepalive_s: float) -> FakeSubscription:
        return CancellationDroppingSubscription(store, dropped)

    a.backend.subscribe = subscribe  # type: ignore[method-assign]
    await asyncio.sleep(1.5)
    a.election.stop()
    stopped_at = now()
    # Cancelled once and awaited, the listener would listen on and the run would never end.
    await asyncio.wait_for(a.task, timeout=30)
    assert len(dropped) == 1
    # Virtual time: the one sent again a request timeout later ended it (the old code waited
    # out the 30 s).
    assert now() - stopped_at <= a.election.timing.request_timeout_s + 0.1
    assert OutcomeKind.RELEASED in a.kinds()
    assert a.election.status().state is State.STOPPED


async def test_suspended_time_ends_the_validity_at_once() -> None:
    store = FakeStore()
    suspended_s = [0.0]

    def clock() -> float:  # CLOCK_BOOTTIME: loop time plus the time spent suspended
        return now() + suspended_s[0]

    a = Run(store, "a", clock=clock)
    try:
        await asyncio.sleep(0.5)
        assert a.election.status().is_leader
        suspended_s[0] = 2 * TTL_S  # the host slept; the loop's own clock did not move
        assert not a.election.status().is_leader  # no renewal can have kept it
        await asyncio.sleep(1.0)
        down = [o for o in a.outcomes if o.step_down_reason is not None]
        assert down and down[0].step_down_reason is StepDownReason.LEASE_EXPIRED
    finally:
        a.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await a.task


@pytest.mark.looptime(False)
def test_the_lease_clock_is_clock_boottime_on_linux() -> None:
    assert COUNTS_SUSPEND, "CLOCK_BOOTTIME is missing: validity would not count suspended time"
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    reading = boottime()
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert before <= reading <= after


async def test_a_failed_stop_on_preemption_leaves_the_lapsed_lease_to_the_rival(store, runs) -> None:
    a = Run(store, "a")
    runs.append(a)
    await asyncio.sleep(0.5)
    a.stop_fails = True
    b = Run(store, "b", priority=5)
    runs.append(b)
    await asyncio.sleep(2 * TTL_S)  # b seen for a ttl, a led for a ttl: a yields
    withheld = a.first(OutcomeKind.RELEASE_WITHHELD)
    preempted = next(o for o in a.outcomes if o.step_down_reason is StepDownReason.PREEMPTED)
    a.stop_fails = False
    await asyncio.sleep(3 * TTL_S)
    grants = [(o.at, "a") for o in a.outcomes if o.kind is OutcomeKind.ACQUIRED][1:]
    grants += [(o.at, "b") for o in b.outcomes if o.kind is OutcomeKind.ACQUIRED]
    first_at, first_to = sorted(grants)[0]
    assert first_to == "b"  # no handoff key without a release: a stood back for the rival
    assert first_at >= preempted.at + (TTL_S - 1.0)  # only once the unreleased lease lapsed
    assert withheld.at >= preempted.at


async def test_a_rival_that_never_refreshed_since_it_was_noticed_is_no_reason_to_yield(store, runs) -> None:
    a = Run(store, "a")
    runs.append(a)
    noticed_at: list[float] = []
    renew = a.backend.renew

    async def renew_with_a_dead_rival(lease: Lease, *, priority: int = 0) -> Renewed:
        # It registered once, just as we first saw it, and died. Its age is on Redis's clock,
        # 5 ms behind ours: when the dwell ends it still looks seen within the ttl.
        result = await renew(lease, priority=priority)
        assert isinstance(result, Renewed)
        if not noticed_at:
            noticed_at.append(now())
        age_ms = max(0, round((now() - noticed_at[0]) * 1000) - 5)
        rival = Candidate("ghost", priority=10, last_seen_ms_ago=age_ms)
        return Renewed(handoff=result.handoff, best_rival=rival)

    a.backend.renew = renew_with_a_dead_rival  # type: ignore[method-assign]
    await asyncio.sleep(4 * TTL_S)
    assert all(o.step_down_reason is None for o in a.outcomes)
    assert a.election.status().is_leader
