"""The election's policy (elector/election/policy.py): renewals on the grid, when a leader steps
down, when it yields."""

from __future__ import annotations

import random

import pytest

from elector.election.outcome import StepDownReason
from elector.election.policy import (
    RENEW_GRID_S,
    YieldVerdict,
    next_renewal_at,
    should_yield,
    step_down_due,
    withheld_stand_back_until,
)
from elector.lease import Candidate, Handoff

#: The coarsest grid a daemon of many locks picks (daemon/many_locks/grid.py).
COARSEST_GRID_S = 0.1


@pytest.mark.parametrize("grid_s", [RENEW_GRID_S, 0.09, COARSEST_GRID_S])
def test_renewals_fall_on_the_grid_never_later_than_the_interval(grid_s: float) -> None:
    rng = random.Random(7)
    for i in range(500):
        sent = 1000.0 + i * 0.0137
        for first in (True, False):
            due = next_renewal_at(sent, interval_s=3.0, jitter_share=0.1, first=first, rng=rng, grid_s=grid_s)
            assert due <= sent + 3.0
            assert due >= sent + 3.0 * (1 - (0.9 if first else 0.1)) - 1e-9
            assert due / grid_s == pytest.approx(round(due / grid_s), abs=1e-6)


# -- when a leader steps down ---------------------------------------------------------------------


def test_a_leader_steps_down_once_its_validity_or_its_renew_deadline_has_come() -> None:
    assert step_down_due(1.0, valid_until=3.0, renew_deadline_at=2.0) is None
    assert step_down_due(2.0, valid_until=3.0, renew_deadline_at=2.0) is StepDownReason.RENEW_DEADLINE
    # A leader not scheduled in time: the lease may be gone already, whatever the deadline says.
    assert step_down_due(3.0, valid_until=3.0, renew_deadline_at=2.0) is StepDownReason.LEASE_EXPIRED
    assert step_down_due(3.0, valid_until=3.0, renew_deadline_at=5.0) is StepDownReason.LEASE_EXPIRED


def test_a_withheld_release_stands_back_until_the_lease_lapses_and_a_handover_window_after_it() -> None:
    for reason in (StepDownReason.RENEW_DEADLINE, StepDownReason.SHUTDOWN, StepDownReason.RESIGNED):
        assert withheld_stand_back_until(last_renew_sent_at=10.0, ttl_s=3.0, reason=reason) == 13.0
    for reason in (StepDownReason.HANDOFF, StepDownReason.PREEMPTED):
        assert withheld_stand_back_until(last_renew_sent_at=10.0, ttl_s=3.0, reason=reason) == 16.0


# -- when a leader yields ---------------------------------------------------------------------------


def rival(identity: str = "b", *, priority: int = 5, last_seen_ms_ago: int = 0) -> Candidate:
    return Candidate(identity=identity, priority=priority, last_seen_ms_ago=last_seen_ms_ago)


def decide(
    handoff: Handoff | None = None,
    candidate: Candidate | None = None,
    *,
    now: float = 10.0,
    led_since: float = 0.0,
    rival_seen_since: float | None = None,
) -> YieldVerdict:
    return should_yield(
        handoff,
        candidate,
        now=now,
        identity="a",
        priority=1,
        led_since=led_since,
        rival_seen_since=rival_seen_since,
        preempt_after_s=3.0,
        ttl_s=3.0,
    )


def test_a_handoff_asked_of_us_ends_the_term_towards_its_target() -> None:
    asked = Handoff(from_identity="a", to_identity="c", remaining_ms=3000)
    assert decide(asked, rival_seen_since=7.0) == YieldVerdict(StepDownReason.HANDOFF, "c", 7.0)
    # One asked of someone else is no news for us.
    other = Handoff(from_identity="x", to_identity="c", remaining_ms=3000)
    assert decide(other) == YieldVerdict(None, None, None)


def test_no_rival_or_no_better_or_no_live_rival_resets_the_watch() -> None:
    assert decide(None, None, rival_seen_since=5.0) == YieldVerdict(None, None, None)
    assert decide(None, rival(priority=1), rival_seen_since=5.0) == YieldVerdict(None, None, None)
    # Not seen within a ttl: a dead pod's entry, not a rival.
    assert decide(None, rival(last_seen_ms_ago=3001), rival_seen_since=5.0) == YieldVerdict(None, None, None)


def test_a_better_live_rival_is_yielded_to_only_after_the_dwell_and_a_refresh() -> None:
    # First seen now: watched from now on, no yield yet.
    assert decide(None, rival(), now=10.0) == YieldVerdict(None, None, 10.0)
    # Watched for the dwell and refreshed since: yield to it.
    assert decide(None, rival(last_seen_ms_ago=100), now=13.0, rival_seen_since=10.0) == YieldVerdict(
        StepDownReason.PREEMPTED, "b", 10.0
    )
    # Its entry is not younger than the watch by the clocks' slack: it may have died at once.
    stale = rival(last_seen_ms_ago=2900)
    assert decide(None, stale, now=13.0, rival_seen_since=10.0) == YieldVerdict(None, None, 10.0)
    # We have not led for the dwell yet: no flapping right after a grant.
    assert decide(None, rival(), now=13.0, rival_seen_since=10.0, led_since=11.0) == YieldVerdict(
        None, None, 10.0
    )
