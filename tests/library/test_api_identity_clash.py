"""Two live processes with one identity: the library warns once per episode, against a real
redis-server, whether the two are followers (another candidate leads) or one of them leads.

Each Elector is one instance of the candidate registry (its own nonce, lua/lease.py). Two
Electors in one process stand for two processes: they share nothing but Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from elector import Elector
from elector.backend.lua import lease as scripts
from tests.support.cancel import cancel_and_wait
from tests.support.seed import seed_used_lock_async
from tests.support.waiting import until

LOCK = "jobs"
KEYS = scripts.LockKeys(LOCK)
# 2 s, not 1 s: every test here has a boss (or nobody) lead throughout while same-identity followers
# register; at 1 s a stall at load 8 can lapse the boss's lease and let a twin lead (loaded run #33,
# the daemon's twin of this module). Registrations come about every 1.7 ttl.
TTL_S = 2.0


@pytest.fixture
async def raw(raw: redis.asyncio.Redis) -> redis.asyncio.Redis:
    await seed_used_lock_async(raw, LOCK)
    return raw


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The library's warnings but those of Redis outages: on a loaded machine a request of a short
    ttl can time out, which says nothing about identities."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "elector.api"
        and r.levelno >= logging.WARNING
        and getattr(r, "error_kind", None) is None
        and "Redis unreachable" not in r.getMessage()
    ]


@contextlib.asynccontextmanager
async def boss(redis_url: str) -> AsyncIterator[Elector]:
    """A third process leads the lock all along, so the others stay followers."""
    async with Elector(LOCK, redis=redis_url, identity="boss", ttl_s=TTL_S) as e:
        await e.wait_for_leadership(timeout=10)
        yield e


async def registrations_in_turn(raw: redis.asyncio.Redis, identity: str, *, turns: int) -> None:
    """Wait until the instance that last registered `identity` changed `turns` times: each
    change is one instance registering after the other, so each has seen the other's entry."""
    last, changes = None, 0
    while changes < turns:
        nonce = await raw.hget(KEYS.candidate_instances, identity)
        if nonce is not None and nonce != last:
            changes += last is not None
            last = nonce
        await asyncio.sleep(0.01)


async def test_two_followers_with_one_identity_each_warn_once(
    redis_url: str, raw, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elector")
    async with boss(redis_url):
        async with (
            Elector(LOCK, redis=redis_url, identity="same", ttl_s=TTL_S) as one,
            Elector(LOCK, redis=redis_url, identity="same", ttl_s=TTL_S) as two,
        ):
            await until(lambda: one.status().identity_clash and two.status().identity_clash, timeout_s=20)
            # More clashes while both live, each seen by both: still one warning each. (A second
            # warning of one Elector needs 3 ttl without a clash, which status would show.) Four
            # turns took 9-11 s at a 2 s ttl on a quiet machine; 60 s bounds a hang.
            await asyncio.wait_for(registrations_in_turn(raw, "same", turns=4), timeout=60)
            assert one.status().identity_clash and two.status().identity_clash
            assert not one.is_leader and not two.is_leader
    found = warnings(caplog)
    assert (
        found
        == [
            "lock 'jobs': another live process registered as a candidate under our identity 'same': give "
            "each process its own identity (the default, host-pid-random, is unique; a chosen one must "
            "differ per process)"
        ]
        * 2
    ), found


async def test_followers_with_distinct_identities_do_not_warn(
    redis_url: str, raw, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elector")
    async with boss(redis_url):
        async with (
            Elector(LOCK, redis=redis_url, identity="x", ttl_s=TTL_S) as x,
            Elector(LOCK, redis=redis_url, identity="y", ttl_s=TTL_S) as y,
        ):
            # Each registers several times, and never finds another instance's nonce.
            await refreshed(raw, ("x", "y"), times=4)
            assert not x.status().identity_clash and not y.status().identity_clash
    assert warnings(caplog) == []


async def refreshed(raw: redis.asyncio.Redis, identities: tuple[str, ...], *, times: int) -> None:
    """Wait until every identity's entry was refreshed `times` more times (its expiry moved)."""
    for identity in identities:
        last, moves = await raw.zscore(KEYS.candidate_expiry, identity), 0
        async with asyncio.timeout(30):
            while moves < times:
                now = await raw.zscore(KEYS.candidate_expiry, identity)
                moves += now != last
                last = now
                await asyncio.sleep(0.01)


async def test_an_older_daemons_entry_under_our_identity_is_no_warning_and_no_error(
    redis_url: str, raw, caplog: pytest.LogCaptureFixture
) -> None:
    """An older daemon registers without a nonce: it cannot be told apart, so it is never
    reported, and nothing fails (the mixed fleet of a rolling upgrade)."""
    caplog.set_level(logging.INFO, logger="elector")
    keys = [KEYS.lease, KEYS.fencing, KEYS.quiet, KEYS.server, KEYS.candidates, KEYS.candidate_expiry]
    keys += [KEYS.handoff, KEYS.meta]

    async def older_daemon() -> None:  # ACQUIRE as an older release calls it: no nonce
        while True:
            await raw.eval(
                scripts.ACQUIRE, 8, *keys, '"same"', "0" * 32, int(TTL_S * 1000), KEYS.channel, 0, 0, 0
            )
            await asyncio.sleep(TTL_S / 4)

    async with boss(redis_url):
        older = asyncio.create_task(older_daemon())
        try:
            async with Elector(LOCK, redis=redis_url, identity="same", ttl_s=TTL_S) as new:
                await refreshed(raw, ("same",), times=8)
                assert await raw.hexists(KEYS.candidate_instances, "same")
                status = new.status()
                assert status.backend_up and not status.identity_clash
        finally:
            await cancel_and_wait(older)  # inside a Redis write, one cancellation can be lost
    assert warnings(caplog) == []


async def test_a_restart_under_a_dead_leaders_identity_is_no_warning(
    redis_url: str, raw, caplog: pytest.LogCaptureFixture
) -> None:
    """A leader died without releasing (SIGKILL; a container restart keeps $POD_NAME) and comes
    back under its identity: its predecessor's lease and registry entry (with the predecessor's
    nonce) are still there, but nobody renews them. Not a clash: it leads once the lease lapsed."""
    caplog.set_level(logging.INFO, logger="elector")
    ttl_ms = int(TTL_S * 1000)
    value = {"identity": "same", "fencing_token": 1, "token": "ab" * 16, "v": 2, "ttl_ms": ttl_ms}
    await raw.set(KEYS.lease, json.dumps(value, separators=(",", ":")), px=ttl_ms)
    seconds, micros = await raw.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    await raw.hset(KEYS.candidates, "same", f'{{"priority":0,"seen_ms":{now_ms}}}')
    await raw.zadd(KEYS.candidate_expiry, {"same": now_ms + 3 * ttl_ms})
    await raw.hset(KEYS.candidate_instances, "same", "0123456789abcdef")
    async with Elector(LOCK, redis=redis_url, identity="same", ttl_s=TTL_S) as again:
        await again.wait_for_leadership(timeout=10)
        assert not again.status().identity_clash
    assert warnings(caplog) == []
