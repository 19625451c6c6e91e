"""Giving leadership up on purpose: resign, a requested handoff, and priority pre-emption.

In virtual time (looptime) against the in-memory backend, so hand-over instants are exact.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from elector.election import OutcomeKind, State, StepDownReason
from tests.support.election import Candidate, now

pytestmark = pytest.mark.looptime

TTL_S = 3.0


def leader_of(*candidates: Candidate) -> list[str]:
    return [c.election.identity for c in candidates if c.election.status().is_leader]


async def test_resign_releases_stops_the_work_first_and_stands_back(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.1)
    b = start("b")
    await asyncio.sleep(2.0)
    resigned_at = now()
    a.election.resign(stand_back_s=5.0)
    await asyncio.sleep(0.1)
    released = a.recorder.first(OutcomeKind.RELEASED)
    assert released.step_down_reason is StepDownReason.RESIGNED
    assert ("stopped", StepDownReason.RESIGNED) in [c[:2] for c in a.recorder.calls]
    # The follower is woken by the release announcement: no waiting for a ttl.
    assert b.recorder.first(OutcomeKind.ACQUIRED).at - resigned_at < 0.01
    assert a.election.status().state is State.FOLLOWER
    # a stands back (sends nothing) for the window, then contends again as an ordinary follower.
    acquires_before = a.backend.requests["acquire"]
    await asyncio.sleep(4.8)
    assert a.backend.requests["acquire"] == acquires_before
    await asyncio.sleep(0.5)
    assert a.backend.requests["acquire"] == acquires_before + 1
    assert leader_of(a, b) == ["b"]


async def test_resign_is_a_no_op_for_a_follower(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.1)
    b = start("b")
    await asyncio.sleep(0.5)
    b.election.resign(stand_back_s=10.0)
    a.task.cancel()  # a crash: b must still take over at the expiry
    with contextlib.suppress(asyncio.CancelledError):
        await a.task
    await asyncio.sleep(TTL_S + 0.5)
    assert leader_of(b) == ["b"]


async def test_requested_handoff_to_a_named_candidate(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.1)
    b, c = start("b"), start("c")
    await asyncio.sleep(1.5)
    asked_at = now()
    store.request_handoff(to="c", window_s=TTL_S)
    await asyncio.sleep(0.2)
    stepped = a.recorder.first(OutcomeKind.STEPPED_DOWN)
    assert stepped.step_down_reason is StepDownReason.HANDOFF
    assert stepped.at - asked_at < 0.01  # the announcement triggers the verifying renewal at once
    assert leader_of(a, b, c) == ["c"]
    assert c.recorder.first(OutcomeKind.ACQUIRED).at - asked_at < 0.02
    # b was woken by the release too, and stood back rather than racing c.
    assert OutcomeKind.STAND_BACK in b.recorder.kinds() or OutcomeKind.HELD in b.recorder.kinds()
    assert OutcomeKind.ACQUIRED not in b.recorder.kinds()
    await asyncio.sleep(10)
    assert leader_of(a, b, c) == ["c"]


async def test_handoff_without_a_target_goes_to_anyone_but_the_old_leader(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.1)
    b = start("b")
    await asyncio.sleep(1.5)
    store.request_handoff(to=None, window_s=TTL_S)
    await asyncio.sleep(0.2)
    assert leader_of(a, b) == ["b"]
    a_kinds = a.recorder.kinds()
    assert a_kinds[a_kinds.index(OutcomeKind.RELEASED) :].count(OutcomeKind.ACQUIRED) == 0


async def test_a_handoff_request_naming_someone_else_is_ignored(start, store) -> None:
    a = start("a")
    await asyncio.sleep(0.1)
    # A stale request from an earlier term: its "from" is not the current holder.
    store.handoff = ("someone-before", "x", now() + 60)
    await asyncio.sleep(5)
    assert leader_of(a) == ["a"]
    assert OutcomeKind.STEPPED_DOWN not in a.recorder.kinds()


async def test_leader_yields_to_a_higher_priority_candidate_after_the_dwell_time(start, store) -> None:
    low = start("low", priority=1)
    await asyncio.sleep(0.1)
    high = start("high", priority=5)
    await asyncio.sleep(0.2)
    joined_at = now()
    await asyncio.sleep(10)
    stepped = low.recorder.first(OutcomeKind.STEPPED_DOWN)
    assert stepped.step_down_reason is StepDownReason.PREEMPTED
    # Not before the rival was seen for a whole ttl (renewals every 1 s), not much later either.
    assert joined_at + TTL_S <= stepped.at <= joined_at + TTL_S + 1.1
    acquired = high.recorder.first(OutcomeKind.ACQUIRED)
    assert acquired.at - stepped.at < 0.01
    assert leader_of(low, high) == ["high"]


async def test_priority_never_flaps(start, store) -> None:
    """Equal priorities never pre-empt; a lower one never takes it back; one change per rival."""
    a = start("a", priority=3)
    await asyncio.sleep(0.1)
    b = start("b", priority=3)
    c = start("c", priority=1)
    await asyncio.sleep(30)
    assert leader_of(a, b, c) == ["a"]
    d = start("d", priority=7)
    await asyncio.sleep(60)
    assert leader_of(a, b, c, d) == ["d"]
    assert store.counter == 2  # exactly two grants in 90 s: a, then d
    assert OutcomeKind.STEPPED_DOWN not in d.recorder.kinds()


async def test_a_rival_that_comes_and_goes_does_not_trigger_preemption(start, store) -> None:
    low = start("low", priority=1)
    await asyncio.sleep(0.1)
    for _ in range(3):
        # Seen for less than the dwell time, then gone (its entry lapses after 3 ttl).
        high = start("high", priority=9)
        await asyncio.sleep(2.0)
        high.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await high.task
        store.candidates.pop("high", None)
        await asyncio.sleep(2.0)
    assert leader_of(low) == ["low"]
    assert OutcomeKind.STEPPED_DOWN not in low.recorder.kinds()


async def test_preemption_waits_for_the_leaders_minimum_tenure(start, store) -> None:
    high = start("high", priority=9)
    low = start("low", priority=1)
    # low can only win while high is down; then high comes back at once.
    await asyncio.sleep(0.1)
    assert leader_of(high, low) == ["high"] or leader_of(high, low) == ["low"]
    await asyncio.sleep(20)
    assert leader_of(high, low) == ["high"]
    assert store.counter <= 2


async def test_stop_withdraws_the_candidate_entry(start, store) -> None:
    a = start("a", priority=2)
    await asyncio.sleep(0.5)
    assert "a" in store.live_candidates()
    a.election.stop()
    await a.task
    assert "a" not in store.candidates
