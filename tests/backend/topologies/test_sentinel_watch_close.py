"""The Sentinel master watcher's close is bounded: a task that swallows its cancellation is named
in the log and left behind, never a shutdown that hangs (a loaded run once hung 120 s in a test's
teardown, in one of the closes after a failover test)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
import redis.asyncio.client

from elector.backend import RedisSettings, make_client
from elector.backend.topologies import sentinel_watch
from elector.backend.topologies.sentinel_watch import SentinelMasterWatcher, watch_master


@contextlib.asynccontextmanager
async def _watcher_on_absent_sentinels() -> AsyncIterator[SentinelMasterWatcher]:
    """A started watcher on Sentinels that are not there (ports 1 and 2 refuse): its listeners
    retry with a back-off and end when cancelled; what the test stubbed is what it closes."""
    url = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster"
    client = make_client(RedisSettings(url=url, request_timeout_s=0.2))
    try:
        watcher = watch_master(client, poll_interval_s=0.05, request_timeout_s=0.2)
        assert watcher is not None
        watcher.start()
        await asyncio.sleep(0.05)
        yield watcher
    finally:
        await client.aclose()


async def test_a_task_that_swallows_its_cancellation_is_named_and_left_behind(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    release = asyncio.Event()

    async def stubborn(self: SentinelMasterWatcher) -> None:
        while not release.is_set():  # every cancellation swallowed, as a faulty library might
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    monkeypatch.setattr(SentinelMasterWatcher, "_poll_loop", stubborn)
    monkeypatch.setattr(sentinel_watch, "CLOSE_WAIT_S", 0.3)
    async with _watcher_on_absent_sentinels() as watcher:
        try:
            with caplog.at_level(logging.ERROR, logger=sentinel_watch.__name__):
                started = time.monotonic()
                await asyncio.wait_for(watcher.aclose(), timeout=30)  # a hang bound, not a speed
                took = time.monotonic() - started
            [record] = [r for r in caplog.records if "did not end" in r.getMessage()]
            assert "elector:sentinel-watch:mymaster" in record.getMessage()
            assert "test_sentinel_watch_close.py" in record.getMessage()  # where it waits
            assert took >= 0.3  # it did wait for the task first
        finally:
            release.set()
            await asyncio.sleep(0)


async def test_a_task_that_loses_one_cancellation_is_cancelled_again_and_ends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What CPython 3.11's wait_for does inside redis-py's writes (python/cpython#86296): one
    cancellation dropped. The next one, sent by aclose, ends the task; nothing is left behind."""
    lost: list[int] = []

    async def loses_the_first(self: SentinelMasterWatcher) -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(1)
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    monkeypatch.setattr(SentinelMasterWatcher, "_poll_loop", loses_the_first)
    async with _watcher_on_absent_sentinels() as watcher:
        with caplog.at_level(logging.ERROR, logger=sentinel_watch.__name__):
            await asyncio.wait_for(watcher.aclose(), timeout=30)  # a hang bound, not a speed
        assert lost == [1]
        assert not [r for r in caplog.records if "did not end" in r.getMessage()]


async def test_a_listener_cancelled_on_a_live_subscription_ends_without_the_librarys_close(
    redis_server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A real server stands in for the sentinels: SUBSCRIBE works on any Redis, so the listeners
    # hold live subscriptions (the polls fail, as SENTINEL is unknown to it, and log that).
    release = asyncio.Event()
    closing = asyncio.Event()
    closes: list[str] = []
    library_close = redis.asyncio.client.PubSub.aclose

    async def stubborn_close(self: redis.asyncio.client.PubSub) -> None:
        if not closing.is_set():
            # A subscribe that failed before the close (a timeout at load 8, loaded run #27)
            # closes as the library does, then retries: stubborn here, it hung the listener and
            # it never subscribed.
            await library_close(self)  # type: ignore[no-untyped-call]
            return
        closes.append("aclose")
        while not release.is_set():  # swallows every cancellation, as in the loaded runs
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    monkeypatch.setattr(redis.asyncio.client.PubSub, "aclose", stubborn_close)
    url = f"redis+sentinel://127.0.0.1:{redis_server.port}/mymaster"
    client = make_client(RedisSettings(url=url, request_timeout_s=0.5))
    watcher = watch_master(client, poll_interval_s=0.2, request_timeout_s=0.5)
    assert watcher is not None
    subscribers_before = await _subscribers(redis_server.port)
    watcher.start()
    try:
        # The listener's subscription is live on the server (a hang bound, not a speed).
        deadline = time.monotonic() + 30
        while await _subscribers(redis_server.port) <= subscribers_before:
            assert time.monotonic() < deadline, "the listener never subscribed"
            await asyncio.sleep(0.05)
        closing.set()
        with caplog.at_level(logging.ERROR, logger=sentinel_watch.__name__):
            await asyncio.wait_for(watcher.aclose(), timeout=30)
        assert not [r for r in caplog.records if "did not end" in r.getMessage()]
        assert closes == []  # the library's close was not waited on
        # Its socket was closed all the same: the server drops the subscriber.
        deadline = time.monotonic() + 30
        while await _subscribers(redis_server.port) > subscribers_before:
            assert time.monotonic() < deadline, "the subscription's socket stayed open"
            await asyncio.sleep(0.05)
    finally:
        release.set()
        await client.aclose()


async def _subscribers(port: int) -> int:
    """Clients of the server subscribed to a channel (CLIENT LIST's `sub` count)."""
    async with redis.asyncio.Redis(port=port) as probe:
        return sum(1 for c in await probe.client_list() if int(c.get("sub", 0)))
