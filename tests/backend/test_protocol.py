"""Protocol 2 against real redis-servers: the quiet period after a failback and after an empty
restart during a rolling ttl change, fencing tokens after a counter loss, live rivals, data
from an unknown protocol, and the scripts of the previous release (cbaaac6) on the same lock.

Safety is judged on the test's own clock (time.monotonic, one clock for every party): a lease
is believed from the send time of its last successful request for one ttl, and the next grant
must be sent no earlier.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from elector.backend import RedisLeaseBackend, RedisSettings, make_client, protocol
from elector.backend.lua import lease as scripts
from elector.lease import BackendErrorKind, Granted, Held, Lease, LeaseBackendError, QuietPeriod, Renewed
from elector.testing.redis_server import RedisServerProcess
from tests.support.cancel import cancel_and_wait
from tests.support.seed import seed_used_lock_async
from tests.support.tcp_proxy import TcpProxy

KEYS = scripts.LockKeys("jobs")
PREVIOUS_RELEASE = "cbaaac6"
REPO = Path(__file__).resolve().parents[2]
#: The old holder's ttl in the failback test (longer than the new contender's).
TTL_A_MS = 3000


@pytest.fixture
async def clients() -> AsyncIterator[Callable[[str], redis.asyncio.Redis]]:
    made: list[redis.asyncio.Redis] = []

    def make(url: str) -> redis.asyncio.Redis:
        client = make_client(RedisSettings(url=url, request_timeout_s=1.0))
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


async def acquire_until_granted(
    backend: RedisLeaseBackend, identity: str, *, ttl_ms: int, within_s: float = 20.0
) -> tuple[Lease, float]:
    """Contend like an election (retry when the quiet period says); the grant and its send time."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        sent = time.monotonic()
        result = await backend.acquire(identity, ttl_ms=ttl_ms)
        if isinstance(result, Granted):
            return result.lease, sent
        await asyncio.sleep(0.02)
    raise AssertionError(f"{identity} was not granted the lock within {within_s} s")


async def renew(backend: RedisLeaseBackend, lease: Lease) -> float:
    """Renew; the send time (the start of the holder's belief in its lease)."""
    sent = time.monotonic()
    assert isinstance(await backend.renew(lease), Renewed)
    return sent


async def wait_replica_synced(replica: redis.asyncio.Redis) -> None:
    for _ in range(200):
        info = await replica.info("replication")
        if info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the replica did not sync: {info}")


async def synced_while_renewing(
    replica: redis.asyncio.Redis, backend: RedisLeaseBackend, lease: Lease
) -> None:
    """Wait for `replica`'s full sync while the holder renews as a live one would. At load 8
    (`make test-loaded` #24) R2 was promoted without A's lease (its renewal there: Lost, no
    holder): the sync had taken most of the 3 s ttl and the renewal before the promotion had not
    reached R2 (hence `replicated`). The test is about a lagging replica later, not this one."""

    async def keep_renewed() -> None:
        while True:
            await renew(backend, lease)
            await asyncio.sleep(0.3)

    renewing = asyncio.create_task(keep_renewed())
    try:
        await wait_replica_synced(replica)
    finally:
        # Cancelled until it ends: one cancellation was lost in a renewal's write (3.11's
        # wait_for, elector/tasks.py) and the test waited on a task still renewing (loaded #28).
        await cancel_and_wait(renewing)


async def replicated(master: redis.asyncio.Redis) -> None:
    """Until every write so far has reached the one replica (WAIT): a fixed pause did not at load."""
    acknowledged = await master.execute_command("WAIT", 1, 10_000)
    assert acknowledged == 1, "the replica did not acknowledge the writes within 10 s"


async def snapshot(client: redis.asyncio.Redis) -> dict[Any, Any]:
    """Every key with its serialised value (DUMP), to prove nothing was written."""
    return {key: await client.dump(key) for key in await client.keys("*")}


# -- item 8: the quiet period after a promotion or failback --------------------------------------


async def test_a_failback_to_a_lagging_replica_waits_out_the_old_holders_lease(
    redis_server: RedisServerProcess, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    """R1 grants A; failover to R2 (A renews there); R1 follows R2 but lags; R2 dies and R1 is
    promoted again. R1 recorded its own run_id at A's grant, so before protocol 2 B was granted
    at once while A still believed in its lease. A's ttl (3 s) is longer than B's (0.5 s): the
    quiet period must also cover the longest ttl in use, recorded in the meta hash."""
    r1_raw = redis.asyncio.Redis.from_url(redis_server.url)
    await seed_used_lock_async(r1_raw)
    a_on_r1 = RedisLeaseBackend(clients(redis_server.url), lock="jobs")
    lease, _ = await acquire_until_granted(a_on_r1, "a", ttl_ms=TTL_A_MS)

    with RedisServerProcess() as r2:
        r2_raw = redis.asyncio.Redis.from_url(r2.url)
        proxy = TcpProxy("127.0.0.1", r2.port)
        await proxy.start()
        try:
            for server in (r1_raw, r2_raw):  # a full sync at once, not after the default 5 s
                await server.config_set("repl-diskless-sync-delay", 0)
            await r2_raw.replicaof("127.0.0.1", redis_server.port)
            await synced_while_renewing(r2_raw, a_on_r1, lease)
            await renew(a_on_r1, lease)
            await replicated(r1_raw)  # an in-sync replica is promoted: A's lease is there
            await r2_raw.replicaof("NO", "ONE")  # failover: R2 is the master now ...
            a_on_r2 = RedisLeaseBackend(clients(r2.url), lock="jobs")
            await renew(a_on_r2, lease)
            await r1_raw.replicaof("127.0.0.1", proxy.port)  # ... and R1 follows it
            await synced_while_renewing(r1_raw, a_on_r2, lease)
            await renew(a_on_r2, lease)
            await replicated(r2_raw)  # the renewal reached R1
            assert await r1_raw.get(KEYS.lease) == lease.value.encode()
            last_replicated = time.monotonic()
            proxy.blackhole()  # R1 lags from now on
            await asyncio.sleep(1.0)
            believed_from = await renew(a_on_r2, lease)  # R1 never sees this renewal
            # R1's copy of the lease expires while A still believes in it.
            await asyncio.sleep(max(0.0, last_replicated + TTL_A_MS / 1000 + 0.2 - time.monotonic()))
        finally:
            await proxy.stop()
            await r2_raw.aclose()
    await r1_raw.replicaof("NO", "ONE")  # R2 died: the lagging R1 is promoted again
    b = RedisLeaseBackend(clients(redis_server.url), lock="jobs")
    _, granted_sent = await acquire_until_granted(b, "b", ttl_ms=500)
    await r1_raw.aclose()
    assert granted_sent >= believed_from + TTL_A_MS / 1000, (
        f"b was granted {believed_from + TTL_A_MS / 1000 - granted_sent:.3f} s before a's lease ran out"
    )


# -- item 10: an empty restart during a rolling ttl change ---------------------------------------


async def test_after_an_empty_restart_the_quiet_period_covers_the_longest_ttl_seen(
    redis_url: str, raw: redis.asyncio.Redis, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    """A (old config, ttl 3 s) leads; B (new config, ttl 1 s) follows and saw A's ttl in the lease
    value. Redis comes back empty: every key is lost, the stored longest ttl with them. A fresh
    contender C (never saw A) starts a quiet period of its own 1.5 s; B stretches it to A's 3 s."""
    await seed_used_lock_async(raw)
    a = RedisLeaseBackend(clients(redis_url), lock="jobs")
    b = RedisLeaseBackend(clients(redis_url), lock="jobs")
    c = RedisLeaseBackend(clients(redis_url), lock="jobs")
    lease, _ = await acquire_until_granted(a, "a", ttl_ms=3000)
    assert isinstance(await b.acquire("b", ttl_ms=1000), Held)
    believed_from = await renew(a, lease)
    await raw.flushall()  # an empty restart: nothing survives
    assert isinstance(await c.acquire("c", ttl_ms=1500), QuietPeriod)
    # B contends within C's quiet period (a contender that only comes after it ended is the
    # limit of in-memory knowledge: docs/protocol.md).
    stretched = await b.acquire("b", ttl_ms=1000)
    assert isinstance(stretched, QuietPeriod) and stretched.remaining_ms > 1500
    granted_sent = None
    while granted_sent is None:  # b and c take turns, as their elections would
        for backend, identity, ttl_ms in ((b, "b", 1000), (c, "c", 1500)):
            sent = time.monotonic()
            if isinstance(await backend.acquire(identity, ttl_ms=ttl_ms), Granted):
                granted_sent = sent
                break
        await asyncio.sleep(0.02)
    assert granted_sent >= believed_from + 3.0, (
        f"granted {believed_from + 3.0 - granted_sent:.3f} s before a's lease ran out"
    )


# -- item 11: fencing tokens after a counter loss ---------------------------------------------------


async def test_after_a_counter_loss_tokens_exceed_every_token_the_contender_saw(
    redis_url: str, raw: redis.asyncio.Redis, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    """Tokens ahead of the server's clock (a server whose clock is behind the one that issued
    them): after the counter is lost, the server clock alone would issue lower tokens."""
    now_ms = int(time.time() * 1000)
    await seed_used_lock_async(raw, counter=now_ms + 10**9)
    a = RedisLeaseBackend(clients(redis_url), lock="jobs")
    b = RedisLeaseBackend(clients(redis_url), lock="jobs")
    lease_a, _ = await acquire_until_granted(a, "a", ttl_ms=2000)
    assert isinstance(await b.acquire("b", ttl_ms=2000), Held)  # b sees a's token
    await raw.flushall()
    lease_b, _ = await acquire_until_granted(b, "b", ttl_ms=2000)
    assert lease_b.fencing_token > lease_a.fencing_token


# -- item 12: only live candidates are rivals ---------------------------------------------------


async def test_a_candidate_not_seen_within_a_ttl_is_no_rival(
    redis_url: str, raw: redis.asyncio.Redis, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    await seed_used_lock_async(raw)
    leader = RedisLeaseBackend(clients(redis_url), lock="jobs")
    other = RedisLeaseBackend(clients(redis_url), lock="jobs")
    lease, _ = await acquire_until_granted(leader, "a", ttl_ms=3000)
    assert isinstance(await other.acquire("c", ttl_ms=3000, priority=10), Held)
    registered_by = time.monotonic()
    renewed = await leader.renew(lease)
    assert isinstance(renewed, Renewed) and renewed.best_rival is not None
    assert renewed.best_rival.identity == "c"
    # c registered once and died. The leader renews as a live one would, well inside its ttl,
    # until a renewal is sent more than that ttl (the rival window) after c was last seen. With
    # a 1 s ttl and two 0.6 s sleeps, 0.4 s was left for lateness: the lease itself lapsed at
    # load 8 (`make test-loaded` #26).
    while True:
        await asyncio.sleep(0.5)
        sent = time.monotonic()
        renewed = await leader.renew(lease)
        assert isinstance(renewed, Renewed), renewed
        if sent > registered_by + 3.1:
            break
    assert renewed.best_rival is None
    assert isinstance(await other.acquire("c", ttl_ms=1000, priority=10), Held)  # alive again
    renewed = await leader.renew(lease)
    assert isinstance(renewed, Renewed) and renewed.best_rival is not None


# -- data from an unknown protocol: held, never written ------------------------------------------


async def test_a_meta_hash_of_an_unknown_protocol_is_left_alone_and_the_lock_counts_as_held(
    redis_url: str, raw: redis.asyncio.Redis, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    await seed_used_lock_async(raw)
    await raw.hset(KEYS.meta, mapping={"protocol": "3", "replid": "x", "epoch": "7"})
    before = await snapshot(raw)
    backend = RedisLeaseBackend(clients(redis_url), lock="jobs")
    for _ in range(2):
        with pytest.raises(LeaseBackendError) as caught:
            await backend.acquire("a", ttl_ms=1000)
        assert caught.value.kind is BackendErrorKind.DATA
        assert "protocol 3" in str(caught.value) and "held" in str(caught.value)
    assert await snapshot(raw) == before  # not even a candidate entry
    observation = await backend.observe()
    assert observation.unknown_protocol is not None and "protocol 3" in observation.unknown_protocol


async def test_a_lease_value_of_an_unknown_version_is_held_and_never_overwritten(
    redis_url: str, raw: redis.asyncio.Redis, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    await seed_used_lock_async(raw)
    value = json.dumps({"identity": "future", "fencing_token": 9, "token": "f" * 32, "v": 3, "x": [1]})
    await raw.set(KEYS.lease, value, px=5000)
    backend = RedisLeaseBackend(clients(redis_url), lock="jobs")
    with pytest.raises(LeaseBackendError) as caught:
        await backend.acquire("a", ttl_ms=1000)
    assert caught.value.kind is BackendErrorKind.DATA and "protocol 3" in str(caught.value)
    assert await raw.get(KEYS.lease) == value.encode()
    observation = await backend.observe()
    assert observation.unknown_protocol is not None and "protocol 3" in observation.unknown_protocol


async def test_registry_entries_of_another_format_are_skipped_and_kept(
    redis_url: str, raw: redis.asyncio.Redis, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    await seed_used_lock_async(raw)
    future_entry = '{"priority":50,"seen_ms":1,"zone":"b"}'
    await raw.hset(KEYS.candidates, "future", future_entry)
    await raw.zadd(KEYS.candidate_expiry, {"future": 2 * 10**13})
    backend = RedisLeaseBackend(clients(redis_url), lock="jobs")
    lease, _ = await acquire_until_granted(backend, "a", ttl_ms=1000)
    renewed = await backend.renew(lease)
    assert isinstance(renewed, Renewed) and renewed.best_rival is None
    assert [c.identity for c in await backend.candidates()] == ["a"]
    assert await raw.hget(KEYS.candidates, "future") == future_entry.encode()


# -- the previous release on the same lock ---------------------------------------------------------


def previous_scripts() -> types.SimpleNamespace:
    """The Lua scripts of the previous release, from git history (no venv needed)."""
    try:
        source = subprocess.run(
            # The previous release's path: PREVIOUS_RELEASE:elector/backend/scripts.py.
            ["git", "show", f"{PREVIOUS_RELEASE}:elector/backend/scripts.py"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"cannot read the previous release's scripts from git: {exc}", pytrace=False)
    namespace: dict[str, Any] = {}
    exec(compile(source, f"{PREVIOUS_RELEASE}:scripts.py", "exec"), namespace)
    return types.SimpleNamespace(**namespace)


class PreviousRelease:
    """A contender running the previous release's scripts, as its RedisLeaseBackend did."""

    def __init__(self, client: redis.asyncio.Redis, identity: str, *, ttl_ms: int) -> None:
        self.old = previous_scripts()
        self.client, self.identity, self.ttl_ms = client, identity, ttl_ms
        self.value = ""
        #: When the last acquire was sent (time.monotonic).
        self.last_sent = 0.0

    async def acquire(self) -> tuple[int, Any, int]:
        keys = [KEYS.lease, KEYS.fencing, KEYS.quiet, KEYS.server, KEYS.candidates]
        keys += [KEYS.candidate_expiry, KEYS.handoff]
        args: list[str | int] = [json.dumps(self.identity), "ab" * 16, self.ttl_ms, KEYS.channel, 0]
        self.last_sent = time.monotonic()
        code, second, third = await self.client.eval(self.old.ACQUIRE, len(keys), *keys, *args)
        if code == 1:
            self.value = third.decode()
        return int(code), second, int(third) if code != 1 else 0

    async def acquire_after_quiet_period(self, *, within_s: float = 10.0) -> int:
        """Retry while the answer is "quiet period"; the first other answer's code."""
        for _ in range(int(within_s / 0.05)):
            code = (await self.acquire())[0]
            if code != 2:
                return code
            await asyncio.sleep(0.05)
        raise AssertionError(f"still in a quiet period after {within_s} s")

    async def renew(self) -> int:
        keys = [KEYS.lease, KEYS.candidates, KEYS.candidate_expiry, KEYS.handoff]
        reply = await self.client.eval(
            self.old.RENEW, len(keys), *keys, self.value, self.ttl_ms, json.dumps(self.identity), 0
        )
        return int(reply[0])

    async def release(self) -> int:
        message = json.dumps({"event": "released", "identity": self.identity, "fencing_token": 0})
        keys = [KEYS.lease, KEYS.handoff]
        return int(
            await self.client.eval(self.old.RELEASE, 2, *keys, self.value, KEYS.channel, message, "", 0)
        )


async def test_the_previous_release_and_this_one_grant_to_each_other_without_extra_quiet_periods(
    redis_url: str, raw: redis.asyncio.Redis, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    old = PreviousRelease(raw, "old", ttl_ms=2000)
    new = RedisLeaseBackend(clients(redis_url), lock="jobs")
    # A new lock: the new code starts the quiet period, and the old one does not start another.
    first = await new.acquire("new", ttl_ms=2000)
    assert isinstance(first, QuietPeriod)
    assert await old.acquire_after_quiet_period() == 1  # granted at its first attempt after it
    held = await new.acquire("new", ttl_ms=2000)
    assert isinstance(held, Held) and held.holder is not None and held.holder.identity == "old"
    assert await old.renew() == 1
    assert await old.release() == 1
    granted = await new.acquire("new", ttl_ms=2000)  # no quiet period: the old grant was normal
    assert isinstance(granted, Granted)
    assert granted.lease.fencing_token > json.loads(old.value)["fencing_token"]
    code, value, _ = await old.acquire()  # the old code reads the new value as held ...
    assert code == 0 and json.loads(value)["identity"] == "new"
    assert await new.release(granted.lease)
    code, token, _ = await old.acquire()  # ... and is granted once it is released
    assert code == 1 and int(token) > granted.lease.fencing_token
    assert await old.release() == 1
    assert isinstance(await new.acquire("new", ttl_ms=2000), Granted)


async def test_on_a_lock_the_previous_release_started_the_new_code_adds_no_quiet_period(
    redis_url: str, raw: redis.asyncio.Redis, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    old = PreviousRelease(raw, "old", ttl_ms=2000)
    assert await old.acquire_after_quiet_period() == 1  # the old code's new-lock quiet period
    assert await old.release() == 1
    new = RedisLeaseBackend(clients(redis_url), lock="jobs")
    assert isinstance(await new.acquire("new", ttl_ms=2000), Granted)
    assert await raw.hget(KEYS.meta, "protocol") == str(protocol.PROTOCOL).encode()


async def test_a_quiet_period_the_previous_release_started_is_stretched_to_the_longest_ttl_seen(
    redis_url: str, raw: redis.asyncio.Redis, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    """The previous release noticed an empty restart first and started a quiet period of its own
    ttl (2 s); a contender that saw a 6 s lease stretches it (the quiet key's value is its start
    in both protocols). Once a quiet period was served, nothing starts another: a handoff right
    after it must not be stalled (tests/faults/test_mixed_fleet.py).

    The old code's ttl is 2 s, not 0.5 s: its grant must outlive the round trip to its release,
    which took longer than 0.5 s at a load average of 10 (`make test-loaded`)."""
    await seed_used_lock_async(raw)
    holder = RedisLeaseBackend(clients(redis_url), lock="jobs")
    follower = RedisLeaseBackend(clients(redis_url), lock="jobs")
    lease, _ = await acquire_until_granted(holder, "a", ttl_ms=6000)
    assert isinstance(await follower.acquire("b", ttl_ms=2000), Held)  # saw the 6 s ttl
    believed_from = await renew(holder, lease)
    await raw.flushall()
    old = PreviousRelease(raw, "old", ttl_ms=2000)
    assert (await old.acquire())[0] == 2  # the old code's quiet period: 2 s
    quiet = await follower.acquire("b", ttl_ms=2000)
    # Stretched: more left of it than the old code's own 2 s (6 s less the time since it began).
    assert isinstance(quiet, QuietPeriod) and quiet.remaining_ms > 3000, quiet
    assert await old.acquire_after_quiet_period() == 1  # the stretched quiet holds the old code too
    assert old.last_sent >= believed_from + 6.0
    assert await old.release() == 1
    assert isinstance(await follower.acquire("b", ttl_ms=2000), Granted)  # no second quiet period


async def test_after_a_failover_the_quiet_period_the_previous_release_served_is_not_repeated(
    redis_server: RedisServerProcess, clients: Callable[[str], redis.asyncio.Redis]
) -> None:
    """A failover: the promoted replica has a new run_id and a new replid. The previous release
    notices the run_id first and serves the quiet period there; protocol 2 must not start a second
    one for the replid (it would stall a handoff right after, as in the mixed-fleet test)."""
    r1_raw = redis.asyncio.Redis.from_url(redis_server.url)
    await seed_used_lock_async(r1_raw)
    new_on_r1 = RedisLeaseBackend(clients(redis_server.url), lock="jobs")
    with RedisServerProcess() as r2:
        r2_raw = redis.asyncio.Redis.from_url(r2.url)
        try:
            await r1_raw.config_set("repl-diskless-sync-delay", 0)
            # R2 attached first: a master's first replica gives it a new replid (its backlog's).
            await r2_raw.replicaof("127.0.0.1", redis_server.port)
            await wait_replica_synced(r2_raw)
            lease, _ = await acquire_until_granted(new_on_r1, "new", ttl_ms=2000)  # records R1's replid
            assert await new_on_r1.release(lease)
            replid = await r1_raw.hget(KEYS.meta, "replid")
            for _ in range(200):
                if await r2_raw.hget(KEYS.meta, "replid") == replid:
                    break
                await asyncio.sleep(0.02)
            await r2_raw.replicaof("NO", "ONE")  # the failover
            old = PreviousRelease(r2_raw, "old", ttl_ms=2000)
            first = await old.acquire()
            assert first[0] == 2  # the run_id changed: the old code serves the quiet period
            assert await old.acquire_after_quiet_period() == 1
            assert await old.release() == 1
            new_on_r2 = RedisLeaseBackend(clients(r2.url), lock="jobs")
            assert isinstance(await new_on_r2.acquire("new", ttl_ms=2000), Granted)
        finally:
            await r2_raw.aclose()
    await r1_raw.aclose()
