"""A late body whose cancellation redis-py swallows, against a real redis-server: the Redis
client's own behaviour. That an Elector stands back until its own late body exited is the
library's logic, tested on the in-memory lease in virtual time (test_api_logic.py)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from elector import Elector, LeadershipLost
from tests.support.seed import seed_used_lock_async

LOCK = "jobs"
KEY = f"elector:{{{LOCK}}}:lease"


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
