"""How a daemon of many locks starts and stops them (elector/daemon/many_locks/engine.py) and picks its
metrics mode."""

from __future__ import annotations

import asyncio
import math
from typing import cast

import pytest

from elector.daemon.lock_election import (
    REPUBLISH_CYCLE_S,
    REPUBLISH_MIN_BATCH,
    REPUBLISH_PERIOD_S,
    republish_batch,
)
from elector.daemon.many_locks import engine as many_locks
from elector.daemon.many_locks.engine import (
    FREEZE_PERIOD_S,
    MANY_LOCKS_GC_THRESHOLDS,
    MIN_START_SPACING_S,
    STOP_BATCH,
    STOP_BATCH_INTERVAL_S,
    BatchedStop,
    StartGate,
    start_spacing_s,
)
from elector.daemon.settings import SettingsError, build_settings


def test_a_single_lock_starts_at_once() -> None:
    assert start_spacing_s(1, ttl_s=10.0, renew_interval_s=3.0) == 0.0


def test_locks_are_spread_over_one_renew_interval() -> None:
    assert start_spacing_s(1000, ttl_s=10.0, renew_interval_s=3.0) * 1000 == pytest.approx(3.0)
    assert start_spacing_s(2, ttl_s=10.0, renew_interval_s=3.0) == pytest.approx(1.5)


def test_many_locks_start_no_faster_than_the_minimum_spacing_within_one_ttl() -> None:
    assert start_spacing_s(5000, ttl_s=10.0, renew_interval_s=3.0) == pytest.approx(MIN_START_SPACING_S)
    # Never longer than one ttl in all: start-up to all acquired stays within 2 ttl.
    assert start_spacing_s(10_000, ttl_s=2.0, renew_interval_s=0.6) * 10_000 == pytest.approx(2.0)


def test_metrics_are_per_lock_for_one_lock_and_aggregate_for_many_by_default() -> None:
    assert build_settings(lock="jobs", identity="a", redis_url="redis://h:6379/0").per_lock_metrics
    many = [f"l{i}" for i in range(101)]
    assert not build_settings(lock=many, identity="a", redis_url="redis://h:6379/0").per_lock_metrics
    assert build_settings(
        lock=many, identity="a", redis_url="redis://h:6379/0", metrics_per_lock="always"
    ).per_lock_metrics


def test_an_unknown_metrics_mode_names_its_flag() -> None:
    with pytest.raises(SettingsError) as caught:
        build_settings(lock="jobs", identity="a", redis_url="redis://h:6379/0", metrics_per_lock="x")
    assert caught.value.setting == "--metrics-per-lock"


def test_a_daemon_of_many_locks_stops_them_in_batches_in_order() -> None:
    """Releases go out STOP_BATCH at a time (10,000 at once timed out); the first batch at once."""
    count = 2 * STOP_BATCH + 7
    stopped: list[int] = []

    async def main() -> list[int]:
        all_stopped = asyncio.Event()

        class FakeElection:
            def __init__(self, index: int) -> None:
                self.index = index

            def stop(self) -> None:
                stopped.append(self.index)
                if len(stopped) == count:
                    all_stopped.set()

        batched = BatchedStop([FakeElection(i) for i in range(count)])
        batched.start()
        at_once = list(stopped)
        await asyncio.wait_for(all_stopped.wait(), timeout=30)
        assert batched.handle is None
        return at_once

    assert asyncio.run(main()) == list(range(STOP_BATCH))
    assert stopped == list(range(count))


def test_every_lock_is_republished_within_the_republish_cycle() -> None:
    for locks in (1, 10, REPUBLISH_MIN_BATCH, 1000, 10_000, 100_000):
        batch = republish_batch(locks)
        wakes = math.ceil(locks / batch)
        assert wakes * REPUBLISH_PERIOD_S <= REPUBLISH_CYCLE_S
    # A small daemon republishes every lock at every wake, as before.
    assert republish_batch(REPUBLISH_MIN_BATCH) >= REPUBLISH_MIN_BATCH


class Starter:
    """An election's side of a StartGate: its turn, admitted or not."""

    def __init__(self, gate: StartGate, admitted: list[int], index: int) -> None:
        self.index = index
        self.turn = gate.request(lambda: admitted.append(index))


def test_the_start_gate_admits_in_order_spaced_and_a_few_at_a_time() -> None:
    async def main() -> None:
        gate = StartGate(spacing_s=0.01, max_in_flight=3)
        admitted: list[int] = []
        starters = [Starter(gate, admitted, i) for i in range(5)]
        assert admitted == [0]  # the first at once
        await asyncio.sleep(0.2)
        # Three admitted, none ended: the fourth waits however long, spacing or not.
        assert admitted == [0, 1, 2] and gate.in_flight == 3
        starters[1].turn.end()
        assert admitted == [0, 1, 2, 3]  # a turn given back admits the next (the spacing is past)
        starters[1].turn.end()  # ending twice gives back one place only
        assert gate.in_flight == 3
        starters[0].turn.end()
        assert admitted == [0, 1, 2, 3]  # not sooner than the spacing after the last admission
        await asyncio.sleep(0.05)
        assert admitted == [0, 1, 2, 3, 4]

    asyncio.run(main())


def test_a_turn_ended_while_waiting_is_skipped_and_takes_no_place() -> None:
    async def main() -> None:
        gate = StartGate(spacing_s=0.0, max_in_flight=1)
        admitted: list[int] = []
        first, second, third = (Starter(gate, admitted, i) for i in range(3))
        second.turn.end()  # stopped before its turn came
        first.turn.end()
        assert admitted == [0, 2] and gate.in_flight == 1
        third.turn.end()
        assert gate.in_flight == 0

    asyncio.run(main())


def test_the_start_gate_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="spacing_s"):
        StartGate(spacing_s=-1.0)
    with pytest.raises(ValueError, match="max_in_flight"):
        StartGate(spacing_s=0.001, max_in_flight=0)


def test_a_batched_stop_waits_for_the_stops_under_way_when_it_can_see_them_end() -> None:
    """With `finished`, no more than STOP_BATCH elections are stopping at once: a slow loop slows
    the releases down instead of timing them out."""
    count = 3 * STOP_BATCH
    stopped: list[int] = []
    ended: set[int] = set()
    #: Set when as many elections as the key were stopped.
    reached: dict[int, asyncio.Event] = {}

    class FakeElection:
        def __init__(self, index: int) -> None:
            self.index = index

        def stop(self) -> None:
            stopped.append(self.index)
            if len(stopped) in reached:
                reached[len(stopped)].set()

    async def main() -> None:
        reached.update({STOP_BATCH + 10: asyncio.Event(), count: asyncio.Event()})
        batched = BatchedStop(
            [FakeElection(i) for i in range(count)],
            finished=lambda election: cast(FakeElection, election).index in ended,
        )
        batched.start()
        assert stopped == list(range(STOP_BATCH))
        await asyncio.sleep(10 * STOP_BATCH_INTERVAL_S)
        assert len(stopped) == STOP_BATCH  # none of them ended: nothing more is stopped
        ended.update(range(10))
        await asyncio.wait_for(reached[STOP_BATCH + 10].wait(), timeout=30)
        await asyncio.sleep(5 * STOP_BATCH_INTERVAL_S)
        assert stopped == list(range(STOP_BATCH + 10))  # as many as ended, in order, no more
        ended.update(range(count))
        await asyncio.wait_for(reached[count].wait(), timeout=30)
        assert stopped == list(range(count))

    asyncio.run(main())


def test_what_start_up_builds_is_frozen_until_the_last_lock_started_and_settled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A start-up slowed down by a busy machine (the gate) is frozen to its end, not to a schedule."""
    freezes: list[float] = []
    thresholds: list[tuple[int, ...]] = []
    starting = True

    async def main() -> None:
        nonlocal starting
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(many_locks.gc, "freeze", lambda: freezes.append(loop.time()))
        settled = asyncio.Event()

        def set_threshold(*values: int) -> None:
            thresholds.append(values)
            settled.set()

        monkeypatch.setattr(many_locks.gc, "set_threshold", set_threshold)
        start = loop.time()
        many_locks.freeze_long_lived(
            until=start + FREEZE_PERIOD_S, starting=lambda: starting, settle_s=3 * FREEZE_PERIOD_S
        )
        await asyncio.sleep(6 * FREEZE_PERIOD_S)
        assert not thresholds  # still starting, past `until`: still freezing
        assert len(freezes) >= 4
        starting = False
        ended = loop.time()
        await asyncio.wait_for(settled.wait(), timeout=30)
        assert thresholds == [MANY_LOCKS_GC_THRESHOLDS]
        assert freezes[-1] >= ended + 2 * FREEZE_PERIOD_S  # settle_s after the start-up's end

    asyncio.run(main())
