"""Elections that share their wake-up timers (elector/daemon/many_locks/shared_timers.py), as a
daemon's locks do."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest

from elector.daemon.many_locks.shared_timers import SharedTimers
from elector.election import Election, OutcomeKind
from tests.election.fake_backend import FakeBackend, FakeStore
from tests.support.election import Recorder, timing

pytestmark = pytest.mark.looptime


async def test_callbacks_due_together_share_one_timer_and_run_in_order() -> None:
    loop = asyncio.get_running_loop()
    timers = SharedTimers(clock=loop.time)
    called: list[str] = []
    at = loop.time() + 1.0
    timers.call_at(at, lambda: called.append("a"))
    cancelled = timers.call_at(at, lambda: called.append("b"))
    timers.call_at(at, lambda: called.append("c"))
    timers.call_at(at + 0.5, lambda: called.append("later"))
    assert len(timers) == 2  # two wake-up times, two loop timers
    cancelled.cancel()
    await asyncio.sleep(1.1)
    assert called == ["a", "c"]
    assert len(timers) == 1
    await asyncio.sleep(0.5)
    assert called == ["a", "c", "later"] and len(timers) == 0


async def test_a_time_already_past_is_called_at_once() -> None:
    loop = asyncio.get_running_loop()
    timers = SharedTimers(clock=loop.time)
    called: list[int] = []
    timers.call_at(loop.time() - 1.0, lambda: called.append(1))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert called == [1]


async def test_elections_sharing_timers_renew_on_time_and_stop() -> None:
    loop = asyncio.get_running_loop()
    timers = SharedTimers(clock=loop.time)
    stores = [FakeStore() for _ in range(20)]  # one lock each
    recorders = [Recorder() for _ in range(20)]
    elections = [
        Election(
            FakeBackend(stores[i], lock=f"lock-{i}"),
            identity="a",
            timing=timing(),
            hooks=recorder.hooks(),
            renew_jitter_share=0.1,
            shared_timers=timers,
            # Seeded: with each election's own random jitter, 1 run in 300 put all 20 next
            # renewals on distinct grid points (CI, d9d4ff7), and the sharing below is what the
            # test shows, not a chance of it.
            rng=random.Random(i),
        )
        for i, recorder in enumerate(recorders)
    ]
    tasks = [asyncio.create_task(election.run()) for election in elections]
    ttl_s = timing().ttl_s
    await asyncio.sleep(5 * ttl_s)
    for election, recorder in zip(elections, recorders, strict=True):
        assert election.status().is_leader
        renewals = [o for o in recorder.outcomes if o.kind is OutcomeKind.RENEWED]
        assert len(renewals) >= 5 * ttl_s / timing().renew_interval_s - 2
        # Never later than a renew interval apart: the shared timer woke each one in time.
        times = [recorder.first(OutcomeKind.ACQUIRED).at] + [o.at for o in renewals]
        assert all(b - a <= timing().renew_interval_s + 1e-6 for a, b in itertools.pairwise(times))
        assert not [o for o in recorder.outcomes if o.step_down_reason is not None]
    # Locks whose renewals fall on the same grid points share those points' timers.
    assert len(timers) < len(elections)
    for election in elections:
        election.stop()
    await asyncio.gather(*tasks)
    assert all(store.lease is None for store in stores)  # each released
