"""Redis Sentinel: URL checks, a client that follows the master, leadership across failovers.

The daemon-level tests print their measurements (run with -s to see them); the figures are in
docs/_draft_sentinel_tls.md.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

from elector.backend import (
    InvalidRedisSettingsError,
    RedisLeaseBackend,
    RedisSettings,
    make_client,
    redact_url,
)
from elector.backend.topologies.sentinel import SentinelTarget, parse_sentinel_url
from elector.election import ElectionTiming
from elector.lease import Granted
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock_async
from tests.support.sentinel import SentinelSet, renew_until_ok

# --- URL --------------------------------------------------------------------------------------


def test_sentinel_url_is_parsed() -> None:
    target = parse_sentinel_url(
        "rediss+sentinel://app:p%40ss@s1:26380,s2,[::1]:5000/cache/3?ssl_cert_reqs=none"
    )
    assert target == SentinelTarget(
        sentinels=(("s1", 26380), ("s2", 26379), ("::1", 5000)),
        master_name="cache",
        db=3,
        tls=True,
        username="app",
        password="p@ss",
        options=(("ssl_cert_reqs", "none"),),
    )
    assert "p@ss" not in repr(target)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis+sentinel://:secret@s1:26379", "no master name"),
        ("redis+sentinel://:secret@s1:26379/", "no master name"),
        ("redis+sentinel://:secret@s1:notaport/m", "invalid port"),
        ("redis+sentinel://:secret@s1:99999/m", "invalid port"),
        ("redis+sentinel://:secret@/m", "no sentinel address"),
        ("redis+sentinel://:secret@s1,s1/m", "listed twice"),
        ("redis+sentinel://:secret@s1/m/x", "/<master-name>/<db number>"),
        ("redis+sentinel://:secret@s1/m?db=2", "in the path"),
        ("redis+sentinel://:secret@s1/m?socket_timeout=9", "'socket_timeout' is not supported"),
        ("redis+sentinel://:secret@s1/m?ssl_cert_reqs=none", r"use rediss\+sentinel://"),
    ],
)
def test_bad_sentinel_urls_are_refused_clearly_without_the_secret(url: str, fragment: str) -> None:
    with pytest.raises(InvalidRedisSettingsError, match=fragment) as info:
        RedisSettings(url=url).validate()
    assert "secret" not in str(info.value)


def test_sentinel_url_is_redacted() -> None:
    assert (
        redact_url("redis+sentinel://app:secret@s1:26379,s2:26379/m")
        == "redis+sentinel://app:***@s1:26379,s2:26379/m"
    )


# --- a deployment -------------------------------------------------------------------------------


async def test_backend_follows_the_master_across_a_crash(deployment: SentinelSet) -> None:
    client = make_client(RedisSettings(url=deployment.url, request_timeout_s=0.5))
    try:
        await seed_used_lock_async(client)
        backend = RedisLeaseBackend(client, lock="jobs")
        granted = await backend.acquire("pod-a", ttl_ms=10_000)
        assert isinstance(granted, Granted)
        old = deployment.master_address()
        await asyncio.sleep(0.2)  # let the replicas have the grant
        killed_at = time.monotonic()
        new = await asyncio.to_thread(deployment.kill_master)
        promoted_s = time.monotonic() - killed_at
        again = await renew_until_ok(backend, granted.lease, timeout_s=10)
        failures, back_s = again.failures, again.after_s
        assert new != old
        # The grant was replicated before the crash: the new master renews it, same fencing token.
        assert client.connection_pool.master_address == new  # type: ignore[attr-defined]
        print(
            f"\nSIGKILL: promoted after {promoted_s:.2f}s; lease renewed on the new master {back_s:.2f}s "
            f"after the promotion, {failures} failed renewals"
        )
    finally:
        await client.aclose()


def _watch_overlap(a: DaemonProcess, b: DaemonProcess, *, seconds: float) -> tuple[float, float | None]:
    """Poll both /leader for `seconds`: (seconds both said leader, when b first led or None)."""
    both_s, b_led_at, last = 0.0, None, time.monotonic()
    end = last + seconds
    while (now := time.monotonic()) < end:
        a_leads, b_leads = a.is_leader(), b.is_leader()
        if b_leads and b_led_at is None:
            b_led_at = now
        if a_leads and b_leads:
            both_s += now - last
        last = now
        time.sleep(0.02)
    return both_s, b_led_at


#: Tries of the planned-failover scenario before it fails for never having met its hazard (the old
#: master still a master while pod-b connects).
FAILOVER_TRIES = 3
#: How often the sentinels read each node's INFO during a try: the old master stays writable until
#: one of them has read its role after the failover (~10 s at Sentinel's default period). Under
#: `make test-loaded` pod-b's start alone took 11-13.6 s (loaded run #5): three tries in a row
#: missed the window. 30 s keeps it open past such a start.
HAZARD_INFO_PERIOD_MS = 30_000


@pytest.mark.timeout(360)
@pytest.mark.parametrize("min_replicas_ack", [0, 1])
def test_planned_failover_never_strands_a_leader_on_the_old_master(
    deployment: SentinelSet, tmp_path: Path, min_replicas_ack: int
) -> None:
    """SENTINEL FAILOVER leaves the old master writable for ~10 s (Sentinel demotes it only then).

    A leader whose pooled connections stayed on it would keep renewing THERE while the new master's
    copy expires, and a replica that connects afresh (a restarted pod) would be granted the lock:
    two leaders. The sentinel watcher (backend/topologies/sentinel_watch.py) moves every connection to the new
    master at once, with or without --min-replicas-ack (tests/backend/topologies/test_sentinel_switch.py shows
    the bug with the watcher off). A try in which the old master was demoted before pod-b had
    connected did not meet the hazard: it proves nothing and is run again (FAILOVER_TRIES).
    """
    missed = []
    for attempt in range(FAILOVER_TRIES):
        old_role, b_started_s = _planned_failover_try(
            deployment, tmp_path / f"try-{attempt}", min_replicas_ack=min_replicas_ack
        )
        if old_role == "master":
            return
        missed.append(f"old master {old_role} once pod-b was up ({b_started_s:.1f}s after the failover)")
    pytest.fail(f"the hazard (the old master still takes writes) was never met: {missed}")


def _planned_failover_try(
    deployment: SentinelSet, log_dir: Path, *, min_replicas_ack: int
) -> tuple[str, float]:
    """One failover under a leader; asserts no leader stranded, never two. (old master's role
    1.5 s after pod-b was up, seconds from the failover to pod-b up)."""
    log_dir.mkdir()
    extra = ("--min-replicas-ack", str(min_replicas_ack)) if min_replicas_ack else ()
    a = DaemonProcess(redis_url=deployment.url, identity="pod-a", log_dir=log_dir, ttl="1s", extra_args=extra)
    b = DaemonProcess(redis_url=deployment.url, identity="pod-b", log_dir=log_dir, ttl="1s", extra_args=extra)
    lease_key = "elector:{jobs}:lease"
    try:
        a.start().wait_http()
        wait_until(a.is_leader, timeout_s=10)
        old = deployment.master_address()
        time.sleep(0.3)
        failed_over_at = time.monotonic()
        with deployment.info_period(period_ms=HAZARD_INFO_PERIOD_MS):
            new = deployment.failover()
            b.start().wait_http()  # fresh connections: the sentinels now name the new master
            b_started_s = time.monotonic() - failed_over_at
            time.sleep(1.5)
            with redis.Redis(port=old[1]) as old_master, redis.Redis(port=new[1]) as new_master:
                old_role = old_master.info("replication")["role"]
                stranded = (
                    a.is_leader() and old_master.pttl(lease_key) > 0 and new_master.exists(lease_key) == 0
                )
            both_s, b_led_at = _watch_overlap(a, b, seconds=4.0)
        first_b = None if b_led_at is None else round(b_led_at - failed_over_at, 2)
        print(
            f"\nplanned failover, min-replicas-ack {min_replicas_ack}: pod-b up {b_started_s:.2f}s after "
            f"it, old master {old_role} 1.5s later; pod-a leading on it alone: {stranded}; both leaders "
            f"for {both_s:.2f}s; pod-b first led {first_b}s after the failover"
        )
        # Whether or not the hazard was met: never a stranded leader, never two.
        assert not stranded
        assert both_s == 0.0, "two leaders at once across a planned failover"
        return old_role, b_started_s
    finally:
        a.stop()
        b.stop()


def test_daemon_keeps_its_lease_across_a_master_crash(deployment: SentinelSet, tmp_path: Path) -> None:
    a = DaemonProcess(redis_url=deployment.url, identity="pod-a", log_dir=tmp_path, ttl="6s")
    b = DaemonProcess(redis_url=deployment.url, identity="pod-b", log_dir=tmp_path, ttl="6s")
    try:
        a.start().wait_http()
        wait_until(a.is_leader, timeout_s=15)  # a new lock: one ttl of quiet period first
        b.start().wait_http()
        time.sleep(0.3)
        before = a.leader() or {}
        token = before.get("fencing_token")
        killed_at = time.monotonic()
        deployment.kill_master()
        promoted_s = time.monotonic() - killed_at
        both_s, b_led_at = _watch_overlap(a, b, seconds=6.0)
        kept = a.is_leader() and (a.leader() or {}).get("fencing_token") == token
        # Whether the lease CAN be kept depends on how long Sentinel took to promote (2.3 s here
        # usually, 3.8 s on a loaded machine): pod-a steps down at its renew deadline, which is
        # validity - (ttl - margin - deadline) after the kill; a renewal on the new master needs
        # the promotion, the watcher's move (it polls every 0.9 s at this ttl), a retry (0.2 s)
        # and one round trip: 1.5 s of room for all but the promotion.
        timing = ElectionTiming.from_ttl(6.0)
        validity_left_s = (before.get("lease_remaining_ms") or 0) / 1000
        deadline_left_s = validity_left_s - (timing.validity_s - timing.renew_deadline_s)
        must_keep = promoted_s + 1.5 < deadline_left_s
        print(
            f"\nmaster SIGKILL, ttl 6s: promoted after {promoted_s:.2f}s, renew deadline "
            f"{deadline_left_s:.2f}s after the kill; pod-a kept its lease: {kept} (required: {must_keep}); "
            f"pod-b led: {b_led_at is not None}; checked for {time.monotonic() - killed_at:.1f}s"
        )
        assert both_s == 0.0  # the safety property holds whatever the promotion took
        if must_keep:
            assert kept, a.logs_text()[-3000:]
            assert b_led_at is None
        else:  # a correct step-down: then someone leads again, with a higher token
            wait_until(lambda: a.is_leader() or b.is_leader(), timeout_s=15)
            leader = a.leader() if a.is_leader() else b.leader()
            assert (leader or {}).get("fencing_token", 0) >= (token or 0)
    finally:
        a.stop()
        b.stop()
