"""Watching a lock's leader without contending (async iterator and sync callback), on real Redis."""

from __future__ import annotations

import asyncio
import threading

import redis.asyncio

import elector
import elector.sync
from elector import Elector, Leader
from tests.support.seed import seed_used_lock_async
from tests.support.waiting import until, wait_until

LOCK = "jobs"


async def collect(watch: elector.LeaderWatch, seen: list[Leader]) -> None:
    async for leader in watch:
        seen.append(leader)


async def test_the_watch_follows_the_leader_through_a_handover_without_contending(redis_url: str) -> None:
    raw = redis.asyncio.Redis.from_url(redis_url)
    await seed_used_lock_async(raw, LOCK)
    seen: list[Leader] = []
    # ttl 3 s, not 1 s: a must lead until it closes; at 1 s one slow renewal on a loaded machine
    # can end its term early and show the watch a third term. Every change here is a release.
    async with elector.watch(LOCK, redis=redis_url, ttl_s=3.0) as watch:
        follower = asyncio.create_task(collect(watch, seen))
        try:
            await until(lambda: seen == [Leader(None, None)])
            async with Elector(LOCK, redis=redis_url, identity="a", ttl_s=3.0) as a:
                term = await a.wait_for_leadership(timeout=5)
                await until(lambda: seen[-1] == Leader("a", term.fencing_token))
                # The watch is no candidate: only a is registered.
                assert await raw.hkeys(f"elector:{{{LOCK}}}:candidates") == [b"a"]
                async with Elector(LOCK, redis=redis_url, identity="b", ttl_s=3.0) as b:
                    await asyncio.sleep(0.2)
                    await a.aclose()  # released: b takes over on the announcement
                    second = await b.wait_for_leadership(timeout=5)
                    await until(lambda: seen[-1] == Leader("b", second.fencing_token))
            await until(lambda: seen[-1] == Leader(None, None))
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
    identities = [leader.identity for leader in seen]
    assert [name for name in identities if name] == ["a", "b"]
    await raw.aclose()


async def test_a_quiet_held_lock_costs_the_watch_no_reads_before_its_lease_would_run_out(
    redis_url: str,
) -> None:
    raw = redis.asyncio.Redis.from_url(redis_url)
    await seed_used_lock_async(raw, LOCK)
    seen: list[Leader] = []
    async with Elector(LOCK, redis=redis_url, identity="a", ttl_s=30.0) as a:
        await a.wait_for_leadership(timeout=5)
        async with elector.watch(LOCK, redis=redis_url, ttl_s=30.0) as watch:
            follower = asyncio.create_task(collect(watch, seen))
            try:
                await until(lambda: len(seen) == 1)
                before = (await raw.info("stats"))["total_commands_processed"]
                await asyncio.sleep(2.0)
                after = (await raw.info("stats"))["total_commands_processed"]
            finally:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)
    # Our INFO, and at most one renewal of the holder (every 9 s at ttl 30 s): the watch reads
    # again only when the holder's lease would run out, not on a polling period.
    assert after - before <= 3, after - before
    await raw.aclose()


def test_the_sync_watch_calls_back_on_its_own_thread(redis_url: str, seeded) -> None:
    seen: list[tuple[Leader, str]] = []
    with elector.sync.watch(
        LOCK,
        redis=redis_url,
        ttl_s=1.0,
        on_change=lambda leader: seen.append((leader, threading.current_thread().name)),
    ) as watcher:
        wait_until(lambda: seen, timeout_s=5)
        with elector.sync.Elector(LOCK, redis=redis_url, identity="a", ttl_s=1.0) as a:
            term = a.wait_for_leadership(timeout=5)
            wait_until(lambda: watcher.leader == Leader("a", term.fencing_token), timeout_s=5)
    assert seen[0][0] == Leader(None, None)
    assert Leader("a", term.fencing_token) in [leader for leader, _ in seen]
    assert all(name == f"elector:{LOCK}:watch" for _, name in seen)
