"""--min-replicas-ack: grants and renewals WAIT for replicas on the script's own connection."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from elector.backend import RedisLeaseBackend, RedisSettings, make_client
from elector.backend.pipeline import ScriptBatcher
from elector.backend.replication import ReplicaAck, ReplicationAckError
from elector.lease import BackendErrorKind, Granted, Renewed
from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock, seed_used_lock_async
from tests.support.tiers import REDIS, needs

ACK = ReplicaAck(replicas=1, timeout_ms=150)
#: For the steps that must succeed: a busy 2-core CI machine can take longer than 150 ms to get
#: the replica's ack (still inside the 1 s request timeout).
GENEROUS = ReplicaAck(replicas=1, timeout_ms=600)


@pytest.fixture
@needs(REDIS)
def replicated() -> Iterator[tuple[RedisServerProcess, RedisServerProcess]]:
    """A master and one replica linked by REPLICAOF (the link is up before the test starts)."""
    # No diskless-sync delay (5 s by default): the replica links at once.
    with RedisServerProcess(extra_args=("--repl-diskless-sync-delay", "0")) as master:
        with RedisServerProcess(extra_args=("--replicaof", "127.0.0.1", str(master.port))) as replica:
            probe = redis.Redis(port=replica.port, decode_responses=True)
            wait_until(lambda: probe.info("replication")["master_link_status"] == "up", timeout_s=10)
            probe.close()
            yield master, replica


@pytest.fixture
async def client(
    replicated: tuple[RedisServerProcess, RedisServerProcess],
) -> AsyncIterator[redis.asyncio.Redis]:
    master, _ = replicated
    c = make_client(RedisSettings(url=master.url, request_timeout_s=1.0))
    for lock in ("jobs", *(f"l{i}" for i in range(5))):
        await seed_used_lock_async(c, lock)  # no quiet period of a new lock
    yield c
    await c.aclose()


async def test_acknowledged_grant_and_renewal(client: redis.asyncio.Redis) -> None:
    backend = RedisLeaseBackend(client, lock="jobs", replica_ack=GENEROUS)
    granted = await backend.acquire("pod-a", ttl_ms=5000)
    assert isinstance(granted, Granted)
    assert isinstance(await backend.renew(granted.lease), Renewed)


async def test_unacknowledged_grant_fails_and_is_released(
    client: redis.asyncio.Redis, replicated: tuple[RedisServerProcess, RedisServerProcess]
) -> None:
    _, replica = replicated
    backend = RedisLeaseBackend(client, lock="jobs", replica_ack=ACK)
    replica.pause()
    try:
        started = time.monotonic()
        with pytest.raises(ReplicationAckError, match=r"only 0 of 1 replicas acknowledged") as info:
            await backend.acquire("pod-a", ttl_ms=5000)
        waited_s = time.monotonic() - started
    finally:
        replica.resume()
    assert info.value.kind is BackendErrorKind.SERVER
    assert "the grant was released" in str(info.value)
    assert waited_s >= ACK.timeout_ms / 1000 * 0.9  # WAIT really waited for its timeout
    assert await client.get(backend.keys.lease) is None
    # Once the replica is back (and has caught up: on a loaded machine that can take a while after
    # SIGCONT), an attempt is granted: a new grant, not the released one.
    generous = RedisLeaseBackend(client, lock="jobs", replica_ack=GENEROUS)
    deadline = time.monotonic() + 10
    while True:
        try:
            assert isinstance(await generous.acquire("pod-a", ttl_ms=5000), Granted)
            break
        except ReplicationAckError:
            if time.monotonic() > deadline:
                raise


async def test_unacknowledged_renewal_is_a_failed_renewal(
    client: redis.asyncio.Redis, replicated: tuple[RedisServerProcess, RedisServerProcess]
) -> None:
    _, replica = replicated
    backend = RedisLeaseBackend(client, lock="jobs", replica_ack=ACK)
    generous = RedisLeaseBackend(client, lock="jobs", replica_ack=GENEROUS)
    granted = await generous.acquire("pod-a", ttl_ms=5000)
    assert isinstance(granted, Granted)
    replica.pause()
    try:
        with pytest.raises(ReplicationAckError, match=r"renew: only 0 of 1 replicas"):
            await backend.renew(granted.lease)
    finally:
        replica.resume()
    assert isinstance(await generous.renew(granted.lease), Renewed)


async def test_a_refused_wait_releases_the_grant_instead_of_leaving_it_to_nobody(
    redis_server: RedisServerProcess,
) -> None:
    """An ACL user without +wait: the script grants, WAIT is refused. The grant must be given back
    (else the lock is held by nobody for a ttl, again and again) and the error must say why."""
    admin = redis.Redis(port=redis_server.port)
    admin.execute_command("ACL", "SETUSER", "el", "on", ">pw", "~*", "&*", "+@all", "-wait")
    seed_used_lock(admin, "jobs")
    settings = RedisSettings(url=f"redis://el:pw@127.0.0.1:{redis_server.port}/0", min_replicas_ack=1)
    client = make_client(settings)
    try:
        backend = RedisLeaseBackend(client, lock="jobs", replica_ack=settings.replica_ack)
        with pytest.raises(ReplicationAckError, match=r"WAIT was refused .*NOPERM|WAIT was refused") as info:
            await backend.acquire("pod-a", ttl_ms=5000)
        assert "the grant was released" in str(info.value)
        assert admin.exists("elector:{jobs}:lease") == 0
    finally:
        await client.aclose()
        admin.close()


async def test_a_batch_shares_one_wait(
    client: redis.asyncio.Redis, replicated: tuple[RedisServerProcess, RedisServerProcess]
) -> None:
    import asyncio

    _, replica = replicated
    batcher = ScriptBatcher(client)
    # Grants with room for a busy machine; the renewals below, with the replica paused, use ACK.
    granting = [
        RedisLeaseBackend(client, lock=f"l{i}", batcher=batcher, replica_ack=GENEROUS) for i in range(5)
    ]
    backends = [RedisLeaseBackend(client, lock=f"l{i}", batcher=batcher, replica_ack=ACK) for i in range(5)]
    results = await asyncio.gather(*(b.acquire("pod-a", ttl_ms=5000) for b in granting))
    assert all(isinstance(r, Granted) for r in results)
    # Five scripts and ONE WAIT in one round trip (plus one reload on this fresh server).
    assert batcher.stats.largest_batch == 5
    assert batcher.stats.pipelines == 1 + bool(batcher.stats.noscript_retries)
    assert batcher.stats.batched_calls == 5  # one batch script call carried the five grants
    waits_before, reloads_before = await wait_calls(client), batcher.stats.noscript_retries
    replica.pause()
    try:
        errors = await asyncio.gather(
            *(b.renew(r.lease) for b, r in zip(backends, results, strict=True) if isinstance(r, Granted)),
            return_exceptions=True,
        )
    finally:
        replica.resume()
    assert all(isinstance(e, ReplicationAckError) for e in errors), errors
    # One WAIT for the batch, not five in a row (plus one for the retry that loads the renewal
    # script on this fresh server): counted by the server. This replaces an elapsed-time bound
    # (0.8 s, against five WAITs' 0.75 s) that a loaded machine could break either way.
    reloaded = batcher.stats.noscript_retries > reloads_before
    assert await wait_calls(client) == waits_before + 1 + reloaded
    await batcher.aclose()


async def wait_calls(client: redis.asyncio.Redis) -> int:
    """How many WAIT commands the server has run (INFO commandstats)."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


async def test_without_replicas_every_grant_fails(redis_server: RedisServerProcess) -> None:
    client = make_client(RedisSettings(url=redis_server.url))
    try:
        await seed_used_lock_async(client)
        backend = RedisLeaseBackend(client, lock="jobs", replica_ack=ReplicaAck(replicas=1, timeout_ms=50))
        with pytest.raises(ReplicationAckError, match="only 0 of 1"):
            await backend.acquire("pod-a", ttl_ms=5000)
        assert await client.get(backend.keys.lease) is None
    finally:
        await client.aclose()


def test_daemon_steps_down_when_renewals_are_not_acknowledged(
    replicated: tuple[RedisServerProcess, RedisServerProcess], tmp_path: Path
) -> None:
    master, replica = replicated
    with redis.Redis(port=master.port) as seeder:
        seed_used_lock(seeder)
    daemon = DaemonProcess(
        redis_url=master.url,
        identity="pod-a",
        log_dir=tmp_path,
        ttl="1s",
        # Debug: the first failure may be a renewal cut by the deadline (a timeout); the WAIT
        # errors that follow are then logged at debug level (one INFO line per outage).
        extra_args=("--min-replicas-ack", "1", "--log-level", "debug"),
    ).start()
    try:
        daemon.wait_http()
        wait_until(daemon.is_leader, timeout_s=10)
        replica.pause()
        try:
            paused_at = time.time()
            wait_until(lambda: not daemon.is_leader(), timeout_s=5)
            # As a follower its grants are not acknowledged either: logged with the reason.
            wait_until(lambda: "only 0 of 1 replicas acknowledged" in daemon.logs_text(), timeout_s=5)
            metrics = daemon.metrics()
        finally:
            replica.resume()
        # The renew deadline (2/3 ttl) after the last acknowledged renewal, never the ttl itself:
        # judged by when the daemon stepped down (its log), not by when an HTTP poll of the test
        # got the CPU to notice, which on a loaded machine can be much later.
        stepped_at = daemon.logged_at("stepped_down", reason="renew_deadline")
        assert stepped_at is not None and stepped_at - paused_at < 1.0, daemon.logs_text()[-3000:]
        assert 'elector_renewals_total{lock="jobs",result="error"}' in metrics
        assert 'reason="renew_deadline"' in metrics
        assert 'elector_acquire_attempts_total{lock="jobs",result="error"}' in metrics
        wait_until(daemon.is_leader, timeout_s=10)  # leads again once the replica acknowledges
    finally:
        daemon.stop()
