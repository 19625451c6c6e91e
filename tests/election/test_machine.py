"""The state machine against an in-memory backend, in virtual time (looptime).

Times asserted here are exact loop times: looptime makes the loop's clock advance only by what
the code sleeps, so "stepped down at the renew deadline" is checked to the millisecond.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import random

import pytest

from elector.election import (
    CycleOutcome,
    Election,
    ElectionHooks,
    OutcomeKind,
    State,
    StepDownReason,
    policy,
)
from elector.lease import Holder, Lease, LeaseEventKind
from tests.election.fake_backend import FakeBackend, FakeStore, unreachable
from tests.support.election import Recorder, now, timing

pytestmark = pytest.mark.looptime

TTL_S = 3.0
RENEW_S = 1.0  # pinned (not the default 0.9 s) so that renewal times are round: 1, 2, 3 ...


async def test_single_candidate_acquires_at_once_and_renews_every_interval(start, store) -> None:
    a = start("a")
    await asyncio.sleep(10.05)
    status = a.election.status()
    assert status.is_leader and status.state is State.LEADER
    assert status.fencing_token == 1
    assert a.recorder.outcomes[0].kind is OutcomeKind.ACQUIRED
    assert a.recorder.outcomes[0].at == pytest.approx(0.0, abs=0.01)
    renewals = [o.at for o in a.recorder.outcomes if o.kind is OutcomeKind.RENEWED]
    assert renewals == pytest.approx([1.0 * i for i in range(1, 11)], abs=0.01)
    assert a.recorder.calls[:2] == [
        ("new_leader", "a", pytest.approx(0, abs=0.01)),
        ("started", 1, pytest.approx(0, abs=0.01)),
    ]


async def test_exactly_one_leader_among_many(start, store) -> None:
    candidates = [start(f"c{i}") for i in range(10)]
    for _ in range(30):
        await asyncio.sleep(0.37)
        leaders = [c for c in candidates if c.election.status().is_leader]
        assert len(leaders) == 1
    assert store.counter == 1  # one grant, no churn


async def test_follower_waits_for_the_holders_expiry_not_a_polling_tick(start, store) -> None:
    start("a")
    await asyncio.sleep(0.1)
    b = start("b")
    await asyncio.sleep(60)
    acquires = b.backend.requests["acquire"]
    # One request per remaining-lease period: never more than one per (ttl - renew interval).
    assert acquires <= 60 / (TTL_S * 2 / 3) + 1
    assert not b.election.status().is_leader
    assert b.election.status().holder == Holder(identity="a", fencing_token=1)


async def test_with_the_default_timing_an_idle_follower_looks_every_nine_tenths_of_a_ttl(
    start, store
) -> None:
    a = start("a", default_timing=True)
    await asyncio.sleep(0.1)
    b = start("b", default_timing=True)
    await asyncio.sleep(60)
    looks = [o.at for o in b.recorder.outcomes if o.kind is OutcomeKind.HELD]
    gaps = [later - earlier for earlier, later in itertools.pairwise(looks)]
    assert gaps and min(gaps[1:]) >= 0.9 * TTL_S - 0.01  # never racing a renewal
    assert len(looks) <= 60 / (0.9 * TTL_S) + 2
    assert a.election.status().is_leader


async def test_crashed_leader_is_replaced_when_its_lease_runs_out(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.1)
    b = start("b")
    await asyncio.sleep(5.5)
    a.task.cancel()  # a crash: no release, the key stays until its TTL runs out
    with contextlib.suppress(asyncio.CancelledError):
        await a.task
    crashed_at = now()
    expires_at = store.lease.expires_at if store.lease else crashed_at
    await asyncio.sleep(TTL_S + 1)
    acquired = b.recorder.first(OutcomeKind.ACQUIRED)
    assert expires_at <= acquired.at <= expires_at + 0.0021  # the expiry plus jitter, no polling tick
    assert acquired.at - crashed_at <= TTL_S + 0.0021
    assert acquired.holder == Holder(identity="b", fencing_token=2)


async def test_graceful_stop_releases_and_the_follower_takes_over_at_once(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.1)
    b = start("b")
    await asyncio.sleep(2.3)
    stopped_at = now()
    a.election.stop()
    await a.task
    await asyncio.sleep(0.1)
    released = a.recorder.first(OutcomeKind.RELEASED)
    assert released.step_down_reason is StepDownReason.SHUTDOWN
    assert [c[:2] for c in a.recorder.calls[-2:]] == [
        ("stopped", StepDownReason.SHUTDOWN),
        ("new_leader", None),
    ]
    assert a.election.status().state is State.STOPPED
    acquired = b.recorder.first(OutcomeKind.ACQUIRED)
    assert acquired.at - stopped_at < 0.02
    assert b.election.status().fencing_token == 2


async def test_a_cancelled_leader_still_stops_its_work(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.5)
    a.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await a.task
    assert a.recorder.calls[-1][:2] == ("stopped", StepDownReason.SHUTDOWN)
    status = a.election.status()
    assert status.state is State.STOPPED and not status.is_leader
    assert store.lease is not None  # not released: cancellation means "exit now"


async def test_leader_steps_down_at_the_renew_deadline_before_its_lease_expires(start, store) -> None:
    a = start("a")
    await asyncio.sleep(3.05)  # renewed at 1, 2, 3
    a.backend.fail_with = unreachable()
    await asyncio.sleep(3)
    down = next(o for o in a.recorder.outcomes if o.step_down_reason is not None)
    assert down.step_down_reason is StepDownReason.RENEW_DEADLINE
    timing = a.election.timing
    last_ok = max(o.at for o in a.recorder.outcomes if o.kind is OutcomeKind.RENEWED)
    stopped_at = next(t for name, _, t in a.recorder.calls if name == "stopped")
    assert stopped_at == pytest.approx(last_ok + timing.renew_deadline_s, abs=0.01)
    assert stopped_at < last_ok + TTL_S - timing.safety_margin_s  # Redis still holds our key
    assert not a.election.status().is_leader
    # Every renewal between was retried, each bounded by the per-request timeout.
    errors = [o for o in a.recorder.outcomes if o.kind is OutcomeKind.RENEW_ERROR]
    assert len(errors) >= 3
    # It tries to release (fails: Redis unreachable), then contends again.
    assert OutcomeKind.RELEASE_FAILED in a.recorder.kinds()
    assert a.recorder.kinds()[-1] is OutcomeKind.ACQUIRE_ERROR


async def test_a_blip_shorter_than_the_deadline_costs_nothing(start, store) -> None:
    a = start("a")
    await asyncio.sleep(1.95)
    a.backend.fail_with = unreachable()  # the renewal due at 2.0 and its retries fail
    await asyncio.sleep(0.8)
    a.backend.fail_with = None
    await asyncio.sleep(5)
    assert all(o.step_down_reason is None for o in a.recorder.outcomes)
    assert a.election.status().is_leader
    assert OutcomeKind.RENEW_ERROR in a.recorder.kinds()


async def test_hanging_redis_is_cut_by_the_request_timeout(start, store) -> None:
    a = start("a")
    await asyncio.sleep(1.05)
    a.backend.hang = True
    await asyncio.sleep(3)
    down = next(o for o in a.recorder.outcomes if o.step_down_reason is not None)
    assert down.step_down_reason is StepDownReason.RENEW_DEADLINE
    assert down.at + (down.duration_s or 0) == pytest.approx(
        1.0 + a.election.timing.renew_deadline_s, abs=0.01
    )


async def test_overwritten_key_means_immediate_step_down_without_release(start, store) -> None:
    a = start("a")
    await asyncio.sleep(1.5)
    store.overwrite("intruder", ttl_s=30)
    await asyncio.sleep(0.6)  # next renewal at 2.0
    lost = a.recorder.first(OutcomeKind.RENEW_LOST)
    assert lost.at == pytest.approx(2.0, abs=0.01)
    assert lost.step_down_reason is StepDownReason.LOST
    assert lost.holder is not None and lost.holder.identity == "intruder"
    assert "release" not in a.backend.requests
    assert not a.election.status().is_leader
    assert a.election.status().holder is not None


async def test_deleted_key_is_noticed_at_the_next_renewal(start, store) -> None:
    a = start("a")
    await asyncio.sleep(1.5)
    store.lease = None
    await asyncio.sleep(0.51)
    lost = a.recorder.first(OutcomeKind.RENEW_LOST)
    assert lost.at == pytest.approx(2.0, abs=0.01)
    # Contends again at once; the key is free so it wins with a higher token.
    assert a.election.status().is_leader and a.election.status().fencing_token == 2


async def test_an_announced_grant_to_someone_else_ends_leadership_at_once(start, store) -> None:
    a = start("a")
    await asyncio.sleep(1.5)
    store.lease = None
    b = start("b")
    await asyncio.sleep(0.05)
    assert b.election.status().is_leader
    down = next(o for o in a.recorder.outcomes if o.step_down_reason is not None)
    # The announcement made it renew at once; Redis said the key is gone.
    assert down.kind is OutcomeKind.RENEW_LOST and down.step_down_reason is StepDownReason.LOST
    assert down.at < 1.6  # long before its next renewal at 2.0
    assert not a.election.status().is_leader


async def test_stale_or_forged_announcements_cannot_end_leadership(start, store) -> None:
    a = start("a")
    await asyncio.sleep(1.5)
    renewals_before = a.backend.requests["renew"]
    store.publish(LeaseEventKind.ACQUIRED, Holder(identity="old", fencing_token=0))  # stale: ignored
    await asyncio.sleep(0.01)
    assert a.backend.requests["renew"] == renewals_before
    store.publish(LeaseEventKind.ACQUIRED, Holder(identity="forger", fencing_token=10**12))
    await asyncio.sleep(0.01)
    assert a.backend.requests["renew"] == renewals_before + 1  # verified at once ...
    assert a.election.status().is_leader  # ... and Redis says the lease is still ours
    assert all(o.step_down_reason is None for o in a.recorder.outcomes)


async def test_paused_process_past_its_validity_steps_down_without_renewing(start, store) -> None:
    offset = [0.0]
    loop = asyncio.get_running_loop()
    a = start("a", clock=lambda: loop.time() + offset[0])
    await asyncio.sleep(1.5)
    offset[0] = 10.0  # the process was frozen (SIGSTOP, GC) for 10 s
    assert not a.election.status().is_leader  # validity is checked when asked, not only per cycle
    await asyncio.sleep(0.6)
    down = next(o for o in a.recorder.outcomes if o.step_down_reason is not None)
    assert down.step_down_reason is StepDownReason.LEASE_EXPIRED
    assert a.backend.requests["renew"] == 1  # no renewal attempted past validity


async def test_quiet_period_delays_the_first_grant(start, store) -> None:
    store.quiet_until = 2.0
    a = start("a")
    await asyncio.sleep(2.5)
    kinds = a.recorder.kinds()
    assert kinds[0] is OutcomeKind.QUIET_PERIOD
    acquired = a.recorder.first(OutcomeKind.ACQUIRED)
    assert 2.0 <= acquired.at <= 2.011


async def test_redis_outage_for_a_follower_backs_off_and_recovers(start, store) -> None:
    start("a")
    await asyncio.sleep(0.1)
    b = start("b")
    await asyncio.sleep(0.1)
    b.backend.fail_with = unreachable()
    await asyncio.sleep(2.1)  # b's next try falls in the outage
    await asyncio.sleep(20)
    errors = [o.at for o in b.recorder.outcomes if o.kind is OutcomeKind.ACQUIRE_ERROR]
    gaps = [later - earlier for earlier, later in itertools.pairwise(errors)]
    cap = b.election.timing.renew_interval_s
    assert gaps[0] < gaps[3]  # exponential back-off ...
    assert all(0.5 * cap <= gap <= cap + 0.001 for gap in gaps[3:])  # ... capped at the renew interval
    assert not b.election.status().backend_up
    b.backend.fail_with = None
    await asyncio.sleep(2.1)
    assert b.election.status().backend_up
    assert b.recorder.outcomes[-1].kind is OutcomeKind.HELD


async def test_failing_hooks_never_stop_the_election(store) -> None:
    async def boom(lease: Lease) -> None:
        raise RuntimeError("hook bug")

    def bad_outcome(outcome: CycleOutcome) -> None:
        raise RuntimeError("metrics bug")

    election = Election(
        FakeBackend(store),
        identity="a",
        timing=timing(),
        hooks=ElectionHooks(on_started_leading=boom, on_outcome=bad_outcome),
    )
    task = asyncio.create_task(election.run())
    await asyncio.sleep(5)
    assert election.status().is_leader
    election.stop()
    await task
    assert store.lease is None


async def test_status_reports_cycle_due_and_backend_health(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.5)
    status = a.election.status()
    assert status.started and status.backend_up
    assert status.cycle_due_by == pytest.approx(1.0, abs=0.01)
    assert status.last_backend_ok_at == pytest.approx(0.0, abs=0.01)
    assert status.lease_remaining_s == pytest.approx(
        TTL_S - a.election.timing.safety_margin_s - 0.5, abs=0.01
    )


async def test_step_can_be_driven_by_hand(store) -> None:
    """Each cycle returns a value: here the test is the loop."""
    election = Election(FakeBackend(store), identity="a", timing=timing())
    first = await election.step()
    assert first.kind is OutcomeKind.ACQUIRED and first.state is State.LEADER
    assert first.next_cycle_at == pytest.approx(first.at + 1.0)
    second = await election.step()
    assert second.kind is OutcomeKind.RENEWED


async def run_jittered_locks(count: int, *, for_s: float) -> list[Recorder]:
    """`count` elections, each on a lock of its own, with renewal jitter on (as in a many-lock
    daemon), run for `for_s` of loop time; their recorders."""
    tasks, recorders = [], []
    for index in range(count):
        recorder = Recorder()
        election = Election(
            FakeBackend(FakeStore()),
            identity="a",
            timing=timing(),
            hooks=recorder.hooks(),
            rng=random.Random(index),
            renew_jitter_share=0.1,
        )
        recorders.append(recorder)
        tasks.append(asyncio.create_task(election.run()))
    try:
        await asyncio.sleep(for_s)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return recorders


async def test_locks_granted_together_spread_their_renewals_from_the_first_one() -> None:
    """With renewal jitter on (many locks), the first renewal of a term falls anywhere in the
    interval, so 50 locks granted at once never renew in one burst; later ones keep their phase."""
    recorders = await run_jittered_locks(50, for_s=5.0)
    renewals = [[o.at for o in r.outcomes if o.kind is OutcomeKind.RENEWED] for r in recorders]
    firsts = sorted(times[0] for times in renewals)
    interval = timing().renew_interval_s
    # Spread over (0.1, 1] x interval: no tenth of the interval holds more than a quarter of them.
    assert firsts[0] >= 0.1 * interval - 0.01 and firsts[-1] <= interval + 0.01
    buckets = collections.Counter(int(first / interval * 10) for first in firsts)
    assert max(buckets.values()) <= 12, buckets
    # Afterwards each keeps its phase: gaps within 10% of the interval.
    for times in renewals:
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(0.9 * interval - 0.01 <= gap <= interval + 0.01 for gap in gaps), gaps


async def test_renewals_of_many_locks_fall_due_together_on_a_grid() -> None:
    """With renewal jitter on, each renewal is due on a point of the RENEW_GRID_S grid inside its
    jitter range: many locks' renewals share instants, so they go out as one batch."""
    recorders = await run_jittered_locks(200, for_s=5.0)
    renewals = [o.at for r in recorders for o in r.outcomes if o.kind is OutcomeKind.RENEWED]
    assert len(renewals) >= 600
    for at in renewals:
        steps = at / policy.RENEW_GRID_S
        assert abs(steps - round(steps)) < 1e-6, at
    # 200 locks, 50 grid points per interval: renewals share instants, far fewer than renewals.
    assert len({round(at / policy.RENEW_GRID_S) for at in renewals}) < len(renewals) / 2
