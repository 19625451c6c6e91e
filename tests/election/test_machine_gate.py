"""The gate something outside the lease puts on contending (`Election.gate_contending`), and a
resignation for the app's health (`resign(reason=APP_UNHEALTHY)`): what the daemon's app-health
check uses. Virtual time, the in-memory backend."""

from __future__ import annotations

import asyncio

import pytest

from elector.election import OutcomeKind, State, StepDownReason
from tests.election.test_machine_handoff import TTL_S, leader_of
from tests.support.election import now

pytestmark = pytest.mark.looptime


async def test_a_closed_gate_never_acquires_but_keeps_looking(start, store) -> None:
    a = start("a")
    a.election.gate_contending(may_contend=False)
    b = start("b")
    await asyncio.sleep(0.1)
    assert leader_of(a, b) == ["b"]
    # It is no candidate either: no hand-over or pre-emption can name it.
    assert "a" not in store.live_candidates() and "b" in store.live_candidates()
    b.election.stop()
    await asyncio.sleep(3 * TTL_S)  # the lock is free all that time
    assert leader_of(a) == []
    assert a.backend.requests["acquire"] == 0
    status = a.election.status()
    assert status.state is State.FOLLOWER and status.backend_up  # it looks: /readyz stays as it was
    assert a.backend.requests["observe"] >= 3
    opened_at = now()
    a.election.gate_contending(may_contend=True)
    await asyncio.sleep(0.05)
    assert leader_of(a) == ["a"]
    assert a.recorder.first(OutcomeKind.ACQUIRED).at - opened_at < 0.01  # at once, not at the next look


async def test_a_resignation_for_the_apps_health_hands_over_at_once(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.1)
    b = start("b")
    await asyncio.sleep(2.0)
    resigned_at = now()
    a.election.gate_contending(may_contend=False)
    a.election.resign(stand_back_s=0.0, reason=StepDownReason.APP_UNHEALTHY)
    await asyncio.sleep(0.1)
    released = a.recorder.first(OutcomeKind.RELEASED)
    assert released.step_down_reason is StepDownReason.APP_UNHEALTHY
    assert ("stopped", StepDownReason.APP_UNHEALTHY) in [call[:2] for call in a.recorder.calls]
    assert b.recorder.first(OutcomeKind.ACQUIRED).at - resigned_at < 0.01  # woken by the release
    # b dies: a's gate is still closed, so a never takes the lapsed lease.
    b.task.cancel()
    await asyncio.sleep(3 * TTL_S)
    assert leader_of(a, b) == []
    assert b.election.status().state is State.STOPPED


async def test_a_resignation_reason_is_resigned_or_app_unhealthy(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.1)
    with pytest.raises(ValueError, match="reason"):
        a.election.resign(stand_back_s=0.0, reason=StepDownReason.LOST)
    assert leader_of(a) == ["a"]


async def test_a_candidate_whose_gate_closes_withdraws_at_its_next_cycle(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.1)
    b = start("b", priority=5)
    await asyncio.sleep(0.1)
    assert "b" in store.live_candidates()
    b.election.gate_contending(may_contend=False)
    await asyncio.sleep(TTL_S)  # b's next look is at a's lease end at the latest
    assert "b" not in store.live_candidates()
    # So a never yields to it, higher priority or not, and leads on.
    await asyncio.sleep(3 * TTL_S)
    assert leader_of(a, b) == ["a"]
    assert not [o for o in a.recorder.outcomes if o.step_down_reason is not None]
