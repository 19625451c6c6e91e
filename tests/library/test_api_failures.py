"""Loud failures and identities (async API; the sync one shares the core), against real
redis-server processes. The transition logs, acquire timeouts and closed Electors, the library's
own logic, are tested on the in-memory lease in virtual time (test_api_logic.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket

import pytest
import redis.asyncio

from elector import Elector, LeadershipTimeout
from tests.support.seed import seed_used_lock_async
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import until

LOCK = "jobs"
#: How long a first warning may take before the test calls it a hang.
WARNING_HANG_S = 10.0


@pytest.fixture
async def raw(raw: redis.asyncio.Redis) -> redis.asyncio.Redis:
    await seed_used_lock_async(raw, LOCK)
    return raw


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "elector.api" and r.levelno == level]


async def test_a_wrong_url_warns_within_a_request_timeout_and_the_timeout_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="elector")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        e = Elector(LOCK, redis=f"redis://127.0.0.1:{port}/0", identity="a")  # default ttl: 10 s
        async with e:
            # A bound on a hang (the claim is the warning and what it says, not when a loaded
            # machine gets round to it): one request timeout failed in loaded run #14.
            await until(lambda: records(caplog, logging.WARNING), timeout_s=WARNING_HANG_S)
            with pytest.raises(LeadershipTimeout, match="Redis was not reached") as info:
                await e.wait_for_leadership(timeout=0.2)
    assert not info.value.redis_reached
    assert "Connect" in (info.value.last_error or "") or "connect" in (info.value.last_error or "")
    [warning] = records(caplog, logging.WARNING)
    assert "Redis unreachable" in warning.getMessage()


async def test_refused_auth_is_a_warning(redis_url: str, raw, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="elector")
    await raw.config_set("requirepass", "secret")
    e = Elector(LOCK, redis=redis_url.replace("redis://", "redis://:wrong@"), identity="a")
    async with e:
        await until(lambda: records(caplog, logging.WARNING), timeout_s=WARNING_HANG_S)  # see above
    assert "wrong" not in records(caplog, logging.WARNING)[0].getMessage()  # no secrets in logs


async def test_one_warning_when_redis_goes_away_and_one_info_when_it_is_back(
    tcp_proxy: TcpProxy, raw, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elector")
    async with Elector(LOCK, redis=tcp_proxy.url, identity="a", ttl_s=1.0) as e:
        await e.wait_for_leadership(timeout=5)
        # Judged from the cut on: on a loaded machine a request of a 1 s ttl can time out before
        # it, which is an outage of its own, rightly logged with its own two edges.
        cut_at = len(caplog.records)
        tcp_proxy.cut()
        await until(lambda: not e.is_leader, timeout_s=5)
        await asyncio.sleep(1.0)  # many failed tries meanwhile
        tcp_proxy.restore()
        await e.wait_for_leadership(timeout=10)
    # The outage is the cut up to the first answer; later ones (a loaded machine's timeouts)
    # are outages of their own.
    after_cut = [(r.levelno, r.getMessage()) for r in caplog.records[cut_at:]]
    back = (logging.INFO, "lock 'jobs': Redis answers again")
    assert back in after_cut, after_cut
    outage = after_cut[: after_cut.index(back)]
    warnings = [message for level, message in outage if level == logging.WARNING]
    assert len(warnings) == 1 and "Redis unreachable" in warnings[0], warnings


def test_the_default_identity_is_host_pid_and_a_random_suffix() -> None:
    one = Elector(LOCK, redis="redis://127.0.0.1:1/0")
    two = Elector(LOCK, redis="redis://127.0.0.1:1/0")
    host = os.environ.get("POD_NAME") or socket.gethostname()
    for e in (one, two):
        assert re.fullmatch(rf"{re.escape(host)}-{os.getpid()}-[0-9a-f]{{6}}", e.identity), e.identity
    assert one.identity != two.identity


async def test_two_live_candidates_with_one_identity_are_warned_about(
    redis_url: str, raw, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elector")
    # ttl 3 s: a leads throughout (at 1 s a slow renewal on a loaded machine can hand the lock
    # to b, which shares the identity, and change who warns about what).
    async with Elector(LOCK, redis=redis_url, identity="same", ttl_s=3.0) as a:
        await a.wait_for_leadership(timeout=5)
        async with Elector(LOCK, redis=redis_url, identity="same", ttl_s=3.0) as b:
            # The follower sees the holder under its identity; the leader, at a renewal, sees the
            # follower's registration (its second: a first one may be a restarted predecessor's).
            await until(lambda: len(records(caplog, logging.WARNING)) >= 2, timeout_s=10)
            assert a.status().identity_clash and b.status().identity_clash
    by_follower, by_leader = sorted(r.getMessage() for r in records(caplog, logging.WARNING))
    assert "another live process holds it under our identity 'same' (fencing token" in by_follower
    assert "another live process registered as a candidate under our identity 'same'" in by_leader
