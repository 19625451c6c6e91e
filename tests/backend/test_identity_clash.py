"""Two live instances of one identity in the candidate registry, against a real redis-server.

Each `RedisLeaseBackend` is one instance with its own nonce (lua/lease.py): a registration that
finds its identity's live entry registered under another nonce answers a clash, except on the
instance's first registration (the entry may be a restarted predecessor's). Older daemons'
entries (no nonce) and anything garbage in the instances hash are never a clash nor an error,
and the entries older daemons parse keep their exact format.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio
import redis.exceptions
from redis.crc import key_slot

from elector.backend import RedisLeaseBackend, RedisSettings, make_client
from elector.backend.lua import lease as scripts
from elector.backend.lua.common import PRUNE_LIMIT
from elector.backend.pipeline import ScriptBatcher
from elector.lease import Granted, Held, Lease, Lost, Renewed
from tests.support.seed import seed_used_lock_async

TTL_MS = 2000
KEYS = scripts.LockKeys("jobs")
#: The entry pattern every release since the registry's start parses (lua/common.py, `live`).
OLD_ENTRY = re.compile(r'\{"priority":(-?\d+),"seen_ms":(\d+)\}')


@pytest.fixture
async def raw(raw: redis.asyncio.Redis) -> redis.asyncio.Redis:
    await seed_used_lock_async(raw)  # skip the new-lock quiet period
    return raw


@pytest.fixture
async def instance(
    redis_url: str, raw: redis.asyncio.Redis
) -> AsyncIterator[Callable[..., RedisLeaseBackend]]:
    """A new instance (backend, with its own nonce) on a client of its own; the locks are seeded."""
    await seed_used_lock_async(raw, "other")
    clients: list[redis.asyncio.Redis] = []

    def make(lock: str = "jobs", *, batcher: ScriptBatcher | None = None) -> RedisLeaseBackend:
        # 5 s, not the default 1 s: these tests are about what the scripts store and answer, and
        # under `make test-loaded` a new client's connect alone timed out at 1 s.
        settings = RedisSettings(url=redis_url, request_timeout_s=5.0)
        client = batcher.client if batcher is not None else make_client(settings)
        clients.append(client)
        return RedisLeaseBackend(client, lock=lock, batcher=batcher)

    yield make
    for client in clients:
        await client.aclose()


async def held_by_boss(instance: Callable[..., RedisLeaseBackend], lock: str = "jobs") -> Lease:
    """A third party leads the lock, so that the instances under test stay followers."""
    result = await instance(lock).acquire("boss", ttl_ms=60_000)
    assert isinstance(result, Granted), result
    return result.lease


async def clashes(backend: RedisLeaseBackend, identity: str = "same") -> bool:
    result = await backend.acquire(identity, ttl_ms=TTL_MS)
    assert isinstance(result, Held), result
    return result.identity_clash


async def server_ms(raw: redis.asyncio.Redis) -> int:
    seconds, micros = await raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def lapsed(raw: redis.asyncio.Redis, identity: str) -> None:
    """Wait until `identity`'s entry lapsed (three ttl), on the server's clock."""
    lapses_at = await raw.zscore(KEYS.candidate_expiry, identity)
    while await server_ms(raw) <= lapses_at:  # noqa: ASYNC110 - the server's clock is the point
        await asyncio.sleep(0.01)


async def old_acquire(raw: redis.asyncio.Redis, identity: str = "same") -> list[object]:
    """ACQUIRE as an older daemon calls it: eight keys, seven arguments, no nonce."""
    keys = [KEYS.lease, KEYS.fencing, KEYS.quiet, KEYS.server, KEYS.candidates, KEYS.candidate_expiry]
    args = [f'"{identity}"', "0" * 32, TTL_MS, KEYS.channel, 0, 0, 0]
    reply: list[object] = await raw.eval(scripts.ACQUIRE, 8, *keys, KEYS.handoff, KEYS.meta, *args)
    return reply


async def test_two_followers_of_one_identity_clash_but_never_on_a_first_registration(instance) -> None:
    await held_by_boss(instance)
    one, two = instance(), instance()
    assert one.nonce != two.nonce
    assert not await clashes(one)  # alone so far
    assert not await clashes(two)  # finds one's entry, but may be its restarted successor
    assert await clashes(one)  # two registered since
    assert await clashes(two)
    assert not await clashes(two)  # its own entry: nothing new
    assert await clashes(one)


async def test_distinct_identities_never_clash(instance) -> None:
    await held_by_boss(instance)
    one, two = instance(), instance()
    for _ in range(3):
        assert not await clashes(one, "x")
        assert not await clashes(two, "y")


async def test_the_leader_and_a_follower_of_one_identity_clash_on_renew_and_on_acquire(instance) -> None:
    leader, follower = instance(), instance()
    granted = await leader.acquire("same", ttl_ms=TTL_MS)
    assert isinstance(granted, Granted) and not granted.identity_clash
    assert not await clashes(follower)  # held under its own identity: the log's other sign
    renewed = await leader.renew(granted.lease)
    assert renewed == Renewed(identity_clash=True)
    assert await clashes(follower)
    assert await leader.release(granted.lease)
    lost = await leader.renew(granted.lease)
    assert isinstance(lost, Lost) and lost.identity_clash  # the follower registered last


async def test_a_clash_is_not_hidden_by_the_batched_renewal(instance, redis_url: str) -> None:
    batcher = ScriptBatcher(make_client(RedisSettings(url=redis_url)), min_flush_interval_s=0)
    try:
        leaders = [instance(lock, batcher=batcher) for lock in ("jobs", "other")]
        leases = []
        for backend in leaders:
            granted = await backend.acquire("same", ttl_ms=TTL_MS)
            assert isinstance(granted, Granted)
            leases.append(granted.lease)
        twin = instance("jobs")
        assert not await clashes(twin)
        before = batcher.stats.batch_scripts
        renewed = await asyncio.gather(*(b.renew(lease) for b, lease in zip(leaders, leases, strict=True)))
        assert batcher.stats.batch_scripts == before + 1  # both in one RENEW_BATCH call
        assert renewed == [Renewed(identity_clash=True), Renewed()]
    finally:
        await batcher.aclose()


async def test_an_entry_an_older_daemon_wrote_is_no_clash_and_no_error(instance, raw) -> None:
    await held_by_boss(instance)
    # An older daemon's entry, without a nonce: then both keep registering, in turns.
    future = await server_ms(raw) + 60_000
    await raw.hset(KEYS.candidates, "same", f'{{"priority":0,"seen_ms":{future - 60_000}}}')
    await raw.zadd(KEYS.candidate_expiry, {"same": future})
    new = instance()
    for _ in range(3):
        assert not await clashes(new)
        reply = await old_acquire(raw)
        assert reply[0] == 0 and reply[3] == 0  # held; no nonce, so never a clash
    # What the new scripts store is what the older ones parse: the entry keeps its exact format.
    for entry in (await raw.hgetall(KEYS.candidates)).values():
        assert OLD_ENTRY.fullmatch(entry.decode()), entry
    listed = await raw.eval(scripts.CANDIDATES, 2, KEYS.candidates, KEYS.candidate_expiry)
    assert sorted(listed[0::3]) == [b"boss", b"same"]


@pytest.mark.parametrize("stored", ["not hex!", "f" * 65, ""])
async def test_a_garbage_nonce_record_is_no_clash_and_no_error(instance, raw, stored: str) -> None:
    await held_by_boss(instance)
    new = instance()
    assert not await clashes(new)
    await raw.hset(KEYS.candidate_instances, "same", stored)
    assert not await clashes(new)


async def test_an_instances_key_of_another_type_never_blocks_an_election(instance, raw) -> None:
    await raw.set(KEYS.candidate_instances, "a string")
    one, two = instance(), instance()
    granted = await one.acquire("same", ttl_ms=TTL_MS)
    assert isinstance(granted, Granted) and not granted.identity_clash
    assert not await clashes(two) and not await clashes(two)
    assert await one.renew(granted.lease) == Renewed()
    assert await one.release(granted.lease)
    assert [c.identity for c in await one.candidates()] == ["same"]
    await one.withdraw("same")
    assert await one.candidates() == []


async def test_a_lapsed_entry_of_another_instance_is_no_clash(instance, raw) -> None:
    await held_by_boss(instance)
    one, two = instance(), instance()
    assert not await clashes(two, "elsewhere")  # two's first registration is behind it
    result = await one.acquire("same", ttl_ms=20)
    assert isinstance(result, Held)
    await lapsed(raw, "same")
    assert not await clashes(two)


async def test_withdraw_removes_the_nonce_with_the_entry(instance, raw) -> None:
    await held_by_boss(instance)
    one, two = instance(), instance()
    assert not await clashes(one)
    assert not await clashes(two)
    await two.withdraw("same")
    assert await raw.hexists(KEYS.candidate_instances, "same") == 0
    assert not await clashes(one)


async def test_the_instances_hash_stays_bounded_when_older_daemons_pruned_entries(instance, raw) -> None:
    # Nonces whose entries an older daemon pruned (it does not know the instances hash).
    await raw.hset(KEYS.candidate_instances, mapping={f"gone-{i}": "ab" for i in range(PRUNE_LIMIT + 50)})
    await instance().acquire("same", ttl_ms=TTL_MS)
    assert await raw.hkeys(KEYS.candidate_instances) == [b"same"]


async def test_pruning_a_lapsed_entry_drops_its_nonce(instance, raw) -> None:
    one = instance()
    await one.acquire("brief", ttl_ms=20)
    await lapsed(raw, "brief")
    await one.acquire("same", ttl_ms=TTL_MS)
    assert sorted(await raw.hkeys(KEYS.candidate_instances)) == [b"same"]


async def test_the_scripts_refuse_a_bad_nonce(raw) -> None:
    keys = [KEYS.lease, KEYS.fencing, KEYS.quiet, KEYS.server, KEYS.candidates, KEYS.candidate_expiry]
    keys += [KEYS.handoff, KEYS.meta, KEYS.candidate_instances]
    for bad in ("xyz", "a" * 65, "12 34"):
        with pytest.raises(redis.exceptions.ResponseError, match="instance nonce must be hex"):
            await raw.eval(scripts.ACQUIRE, 9, *keys, '"a"', "t", "1000", KEYS.channel, 0, 0, 0, bad)
    assert await raw.exists(KEYS.lease, KEYS.candidates) == 0


def test_the_instances_key_is_in_the_lock_slot() -> None:
    assert KEYS.candidate_instances == "elector:{jobs}:candidates:instances"
    assert key_slot(KEYS.candidate_instances.encode()) == key_slot(KEYS.lease.encode())
