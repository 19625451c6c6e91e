"""`Elector` on every topology the daemon runs on, through its public parameters, on real servers:
a Sentinel set (`redis=` a `redis+sentinel://` URL), a Redis Cluster (`cluster=True`) and Redlock
(`redlock=[...]`); and the same refusals as the daemon for topologies that cannot work.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio

from elector import Elector, ElectorConfigError
from elector.backend.lua.lease import LockKeys
from elector.testing.redis_server import RedisServerProcess
from tests.support.cluster import LocalCluster
from tests.support.sentinel import SentinelSet
from tests.support.tiers import REDIS, needs

LOCK = "jobs"
KEYS = LockKeys(LOCK)
TTL_S = 2.0
#: A bound, not a measurement: a new lock's quiet period (one ttl) plus plenty of room.
LEAD_WITHIN_S = 4 * TTL_S


async def lead_then_hand_over(
    make: Callable[[str], Elector], *, lease_seen: Callable[[], Awaitable[bool]]
) -> None:
    """`a` leads with the lease where the topology keeps it; once `a` closes, `b` leads after it."""
    a, b = make("a"), make("b")
    try:
        await a.start()
        async with asyncio.timeout(LEAD_WITHIN_S):
            first = await a.wait_for_leadership()
        assert first.identity == "a" and a.is_leader
        assert await lease_seen()
        await b.start()
        await asyncio.sleep(0.2)
        assert not b.is_leader  # a holds it
        await a.aclose()  # releases
        async with asyncio.timeout(LEAD_WITHIN_S):
            second = await b.wait_for_leadership()
        assert second.identity == "b" and second.fencing_token > first.fencing_token
    finally:
        await a.aclose()
        await b.aclose()


def elector_factory(**where: Any) -> Callable[[str], Elector]:
    def make(identity: str) -> Elector:
        return Elector(LOCK, identity=identity, ttl_s=TTL_S, **where)

    return make


# -- Sentinel ------------------------------------------------------------------------------------


@pytest.fixture
@needs(REDIS)
def sentinel_set() -> Iterator[SentinelSet]:
    with SentinelSet(replicas=1) as deployment:
        yield deployment


async def test_a_sentinel_url_leads_on_the_master(sentinel_set: SentinelSet) -> None:
    host, port = sentinel_set.master_address()

    async def on_master() -> bool:
        async with redis.asyncio.Redis(host=host, port=port) as master:
            return bool(await master.exists(KEYS.lease))

    await lead_then_hand_over(elector_factory(redis=sentinel_set.url), lease_seen=on_master)


# -- Redis Cluster -------------------------------------------------------------------------------


@pytest.fixture
@needs(REDIS)
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(masters=3) as local:
        yield local


async def test_a_cluster_leads_on_the_master_of_the_locks_slot(cluster: LocalCluster) -> None:
    owner = cluster.node_owning(cluster.keyslot(KEYS.lease))

    async def on_slot_owner() -> bool:
        with owner.client() as node:
            return bool(node.exists(KEYS.lease))

    await lead_then_hand_over(
        elector_factory(redis=cluster.startup_url, cluster=True), lease_seen=on_slot_owner
    )


# -- Redlock -------------------------------------------------------------------------------------


@pytest.fixture
@needs(REDIS)
def servers() -> Iterator[list[RedisServerProcess]]:
    started = [RedisServerProcess().start() for _ in range(3)]
    yield started
    for server in started:
        server.stop()


async def test_redlock_leads_on_a_majority_of_independent_servers(servers: list[RedisServerProcess]) -> None:
    urls = [f"redis://127.0.0.1:{server.port}/0" for server in servers]

    async def on_a_majority() -> bool:
        held = 0
        for url in urls:
            async with redis.asyncio.Redis.from_url(url) as raw:
                held += bool(await raw.exists(KEYS.lease))
        return held >= 2

    await lead_then_hand_over(elector_factory(redlock=urls), lease_seen=on_a_majority)


async def test_redlock_keeps_leading_with_one_server_of_three_down(servers: list[RedisServerProcess]) -> None:
    urls = [f"redis://127.0.0.1:{server.port}/0" for server in servers]
    async with Elector(LOCK, redlock=urls, identity="a", ttl_s=TTL_S) as a:
        async with asyncio.timeout(LEAD_WITHIN_S):
            term = await a.wait_for_leadership()
        servers[2].stop()
        await asyncio.sleep(3 * TTL_S)  # several renewals, each answered by 2 of 3
        if term.active:
            assert a.is_leader
        else:
            # Two of three are still a majority. On a loaded machine a renewal can miss its
            # deadline (a correct step-down); the two remaining servers then grant a new term.
            async with asyncio.timeout(LEAD_WITHIN_S + TTL_S):
                again = await a.wait_for_leadership()
            assert again.fencing_token > term.fencing_token


# -- refusals, as the daemon's -------------------------------------------------------------------


@pytest.fixture
async def user_client() -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0", retry=None)
    yield client
    await client.aclose()


URLS = ["redis://a:6379", "redis://b:6379", "redis://c:6379"]


@pytest.mark.parametrize(
    ("kwargs", "parameter", "text"),
    [
        ({"redlock": URLS[:2]}, "redlock", "odd number of at least 3"),
        ({"redlock": [*URLS, "redis://d:6379"]}, "redlock", "odd number of at least 3"),
        ({"redlock": [URLS[0], URLS[0], URLS[1]]}, "redlock", "given twice"),
        ({"redlock": [*URLS[:2], "redis+sentinel://s:26379/m"]}, "redlock", "not Sentinel sets"),
        ({"redlock": [*URLS[:2], "http://c"]}, "redlock", "redis://"),
        ({"redlock": "redis://a:6379"}, "redlock", "list of redis:// URLs"),
        ({"redlock": []}, "redlock", "odd number of at least 3"),
        ({"redlock": URLS, "redis": "redis://x:6379"}, "redis, redlock", "one or the other"),
        ({"redlock": URLS, "cluster": True}, "cluster", "not a cluster"),
        ({"redis": "redis+sentinel://s:26379/m", "cluster": True}, "cluster", "Redis Cluster"),
        ({"redis": "unix:///run/redis.sock", "cluster": True}, "cluster", "Redis Cluster"),
        ({"redis": "redis://x:6379", "cluster": "yes"}, "cluster", "True or False"),
        ({}, "redis", "a URL or a redis.asyncio.Redis"),
    ],
)
def test_topologies_that_cannot_work_are_refused_naming_the_parameter(
    kwargs: dict[str, Any], parameter: str, text: str
) -> None:
    with pytest.raises(ElectorConfigError) as info:
        Elector(LOCK, identity="a", **kwargs)
    assert info.value.parameter == parameter
    assert text in str(info.value), str(info.value)


def test_a_cluster_is_reached_through_a_url_not_a_client(user_client: redis.asyncio.Redis) -> None:
    with pytest.raises(ElectorConfigError) as info:
        Elector(LOCK, identity="a", redis=user_client, cluster=True)
    assert info.value.parameter == "cluster" and "redis=URL" in str(info.value)
