"""Truthful, quiet failures (async API; the sync one shares the core), against real redis-server
processes: fail-fast for what retrying cannot cure, errors that say whether Redis answered, one
log line per event and the reason the exception gives, the watch's "unknown"."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio

import elector
import elector.sync
from elector import Elector, LeadershipTimeout, RedisSetupError
from tests.support.seed import seed_used_lock_async
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import until

LOCK = "jobs"
#: Bounds on a hang: a refusal is seen at the first request (one request timeout at most).
HANG_S = 10.0


@pytest.fixture
async def raw(raw: redis.asyncio.Redis) -> redis.asyncio.Redis:
    await seed_used_lock_async(raw, LOCK)
    return raw


def with_password(url: str, password: str | None) -> str:
    return url if password is None else url.replace("redis://", f"redis://:{password}@")


@pytest.mark.parametrize(
    ("password", "database", "said"),
    [
        ("wrong", "0", "Redis refused access"),
        (None, "0", "requires a password and none was given"),
        ("secret", "99", "DB index is out of range"),
    ],
    ids=["wrong-password", "no-password", "bad-db"],
)
async def test_fail_fast_raises_what_retrying_cannot_cure_at_leadership(
    redis_url: str, raw: redis.asyncio.Redis, password: str | None, database: str, said: str
) -> None:
    await raw.config_set("requirepass", "secret")
    url = with_password(redis_url, password).rsplit("/", 1)[0] + f"/{database}"
    async with Elector(LOCK, redis=url, ttl_s=2.0, fail_fast=True) as e:
        with pytest.raises(RedisSetupError, match=said) as info:
            async with e.leadership(timeout=HANG_S):
                pytest.fail("cannot lead")
    assert info.value.redis_answered
    assert "HELLO must be called" not in str(info.value)
    assert "secret" not in str(info.value) and "wrong" not in str(info.value).replace("Redis refused", "")


async def test_fail_fast_is_raised_for_a_cluster_that_is_a_plain_server(redis_url: str, raw) -> None:
    async with Elector(LOCK, redis=redis_url, cluster=True, ttl_s=2.0, fail_fast=True) as e:
        with pytest.raises(RedisSetupError, match="Cluster mode is not enabled"):
            await e.wait_for_leadership(timeout=HANG_S)


async def test_without_fail_fast_the_timeout_says_redis_answered(
    redis_url: str, raw, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elector")
    async with Elector(LOCK, redis=redis_url.rsplit("/", 1)[0] + "/99", ttl_s=2.0) as e:
        await until(lambda: e._log.redis_reached, timeout_s=HANG_S)
        with pytest.raises(LeadershipTimeout, match=r"Redis answered with an error \(.*DB index") as info:
            await e.wait_for_leadership(timeout=0.2)
    assert info.value.redis_reached
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned and "Redis answered with an error" in warned[0] and "unreachable" not in warned[0]


async def test_an_overrun_is_one_error_line_without_an_internal_traceback(
    redis_url: str, raw, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elector")
    async with Elector(LOCK, redis=redis_url, ttl_s=1.0, stop_work_s=0.05) as e:
        async with e.leadership(resign_on_exit=False) as lease:
            token = lease.fencing_token
        body_done = asyncio.Event()

        async def stubborn() -> None:
            try:
                async with e.leadership(resign_on_exit=False):
                    try:
                        await asyncio.sleep(60)
                    except asyncio.CancelledError:
                        await asyncio.shield(asyncio.sleep(0.3))  # past stop_work_s
                        raise
            except elector.LeadershipLost:
                body_done.set()

        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0.05)
        await raw.delete(f"elector:{{{LOCK}}}:lease")  # the next renewal finds the lease lost
        await asyncio.wait_for(body_done.wait(), timeout=HANG_S)
        await task
        await until(lambda: any(r.levelno == logging.ERROR for r in caplog.records), timeout_s=HANG_S)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "release withheld" in errors[0].getMessage() and str(token) in errors[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not any("on_stopped_leading" in r.getMessage() for r in caplog.records)


def test_sigterm_in_the_sync_api_logs_shutdown_as_uvicorn_does(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elector")
    with pytest.raises(SystemExit), elector.sync.Elector(LOCK, redis=redis_url, ttl_s=2.0) as e:
        with e.leadership(timeout=HANG_S):
            raise SystemExit(143)  # what elector.sync.run makes of SIGTERM
    stepped = [r.getMessage() for r in caplog.records if "stepped down" in r.getMessage()]
    assert len(stepped) == 1 and "stepped down (shutdown)" in stepped[0], stepped


async def test_a_release_found_already_taken_is_no_warning(
    redis_url: str, raw, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elector")
    async with Elector(LOCK, redis=redis_url, ttl_s=1.0) as e:
        async with e.leadership(resign_on_exit=False) as lease:
            await raw.set(f"elector:{{{LOCK}}}:lease", b"someone else")  # taken under us
        await until(lambda: lease.end_reason is not None, timeout_s=HANG_S)
        await raw.delete(f"elector:{{{LOCK}}}:lease")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_the_watch_reports_unknown_once_redis_is_gone_for_over_a_ttl(tcp_proxy: TcpProxy, raw) -> None:
    seen: list[elector.Leader] = []
    async with Elector(LOCK, redis=tcp_proxy.url, identity="a", ttl_s=1.0) as a:
        term = await a.wait_for_leadership(timeout=HANG_S)
        async with elector.watch(LOCK, redis=tcp_proxy.url, ttl_s=1.0) as watch:

            async def follow() -> None:
                async for leader in watch:
                    seen.append(leader)

            follower = asyncio.create_task(follow())
            try:
                await until(lambda: seen[-1:] == [elector.Leader("a", term.fencing_token)], timeout_s=HANG_S)
                tcp_proxy.cut()
                await until(lambda: seen[-1:] == [elector.Leader(None, None, known=False)], timeout_s=HANG_S)
            finally:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)
    assert not seen[-1].known
