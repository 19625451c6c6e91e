"""An Elector never leads beside its own late body (issue 22, item 5), judged on the bodies' own
journal intervals on CLOCK_BOOTTIME, against a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from elector import Elector, LeadershipLost, State
from elector.election.clock import boottime
from tests.support.seed import seed_used_lock_async
from tests.support.waiting import until

LOCK = "jobs"
KEY = f"elector:{{{LOCK}}}:lease"


async def lead_again_and_again(
    e: Elector, journal: list[tuple[int, float, float]], entered: list[float], *, unwind_s: float
) -> None:
    """Term after term, a body that needs `unwind_s` to stop once cancelled (say, a slow flush)."""
    while True:
        with contextlib.suppress(LeadershipLost):
            async with e.leadership(resign_on_exit=False) as lease:
                entered_at = boottime()
                entered.append(entered_at)
                try:
                    await asyncio.Event().wait()
                finally:
                    try:
                        await asyncio.sleep(unwind_s)  # outlives stop_work_s and the lease itself
                    finally:
                        journal.append((lease.fencing_token, entered_at, boottime()))


async def test_an_elector_stands_back_until_its_own_late_body_exited(redis_url: str) -> None:
    raw = redis.asyncio.Redis.from_url(redis_url)
    await seed_used_lock_async(raw, LOCK)
    registry = CollectorRegistry()
    journal: list[tuple[int, float, float]] = []
    entered: list[float] = []
    e = Elector(LOCK, redis=redis_url, identity="a", ttl_s=1.0, registry=registry)
    await e.start()
    unwind_s = 2.5  # more than twice the ttl: on the old code a new term starts meanwhile
    workers = [asyncio.create_task(lead_again_and_again(e, journal, entered, unwind_s=unwind_s))]
    try:
        async with asyncio.timeout(5):
            await e.wait_for_leadership()
        await raw.delete(KEY)  # the lease is lost at the next renewal: the body overruns
        await until(lambda: e.status().state is State.FOLLOWER, timeout_s=5, every_s=0.005)
        # Another task of the program waits to lead, while the first body still unwinds.
        workers.append(asyncio.create_task(lead_again_and_again(e, journal, entered, unwind_s=0.0)))
        waiting_seen = gauge_seen = False
        async with asyncio.timeout(15):
            while len(entered) < 2:  # a second term's body entered
                waiting_seen |= getattr(e.status(), "waiting_for_own_work", False)
                gauge = registry.get_sample_value("elector_waiting_for_own_work", {"lock": LOCK})
                gauge_seen |= gauge == 1.0
                await asyncio.sleep(0.01)
        assert e.releases_withheld == 1
    finally:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await e.aclose()
        await raw.aclose()
    # Every body journaled its interval (the last ones when cancelled at the end): the old
    # term's body left before any body of the new term entered. (Bodies of one term may overlap.)
    assert len({token for token, _, _ in journal}) >= 2, journal  # two terms
    overlapping = [
        (one, other) for one in journal for other in journal if one[0] < other[0] and other[1] < one[2]
    ]
    assert overlapping == [], journal
    # And while it stood back, it said so.
    assert waiting_seen and gauge_seen
    assert not e.status().waiting_for_own_work


async def test_a_body_whose_cancellation_redis_py_swallows_is_cancelled_again(redis_url: str) -> None:
    """A cancellation landing inside a redis-py asyncio command can be lost (redis/redis-py#2028):
    a body that only awaits redis-py writes must still stop, term after term."""
    raw = redis.asyncio.Redis.from_url(redis_url)
    await seed_used_lock_async(raw, LOCK)
    client = redis.asyncio.Redis.from_url(redis_url)
    e = Elector(LOCK, redis=redis_url, identity="a", ttl_s=1.0)
    await e.start()
    try:
        for _ in range(5):
            lease = await e.wait_for_leadership(timeout=10)

            async def body(token: int) -> None:
                async with e.leadership(resign_on_exit=False):
                    while True:  # writes only: every cancellation lands inside a command
                        await client.rpush("{jobs}:journal", token)

            task = asyncio.create_task(body(lease.fencing_token))
            await asyncio.sleep(0.1)
            await raw.delete(KEY)
            done, _ = await asyncio.wait([task], timeout=5)
            if not done:  # swallowed for good: do not leave it writing behind the test
                task.get_loop().call_soon(task.cancel)
                pytest.fail("the body's cancellation was lost and it kept writing")
            with pytest.raises(LeadershipLost):
                await task
    finally:
        await e.aclose()
        await client.aclose()
        await raw.aclose()
