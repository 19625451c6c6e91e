"""One shared watch of pods for every LeaderElection, instead of a LIST per LeaderElection every few
seconds (200 of them made some 40 LISTs a second on the API server). kmock + redis-server.

Counted from the requests kmock received: behaviour, not timing. The figures per minute for 200
LeaderElections are measured by bench/kube_operator/api_calls.py (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio

from elector.backend import RedisLeaseBackend
from elector.lease import Granted
from elector.testing.redis_server import RedisServerProcess
from tests.kube.operator_fixtures import (
    OPERATOR_KMOCK,
    Cluster,
    eventually,
    leader_election,
    pod,
    seeded_redis,
)

pytestmark = OPERATOR_KMOCK

ELECTIONS = 6


def pod_requests(cluster: Cluster) -> list[Any]:
    return [r for r in list(cluster.mock) if r.resource is not None and r.resource.plural == "pods"]


def pod_reads(cluster: Cluster) -> tuple[int, int]:
    """(LISTs, watches) of pods so far."""
    reads = [r for r in pod_requests(cluster) if r.method == "GET"]
    watches = [r for r in reads if str(r.params.get("watch", "")).lower() in ("true", "1")]
    return len(reads) - len(watches), len(watches)


async def test_pods_are_read_through_one_watch_whatever_the_number_of_elections(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess
) -> None:
    locks = [f"job-{i}" for i in range(ELECTIONS)]
    seeded_redis(redis_server, *locks)
    for i in range(ELECTIONS):
        for replica in ("a", "b"):
            await cluster.create(pod(f"job-{i}-{replica}", app=f"job-{i}"))
        election = leader_election(f"job-{i}", lock=f"job-{i}", redis_url=redis_server.url)
        election["spec"]["selector"] = {"matchLabels": {"app": f"job-{i}"}}
        await cluster.create(election)
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        grants = [
            await RedisLeaseBackend(client, lock=f"job-{i}").acquire(f"job-{i}-a", ttl_ms=60_000)
            for i in range(ELECTIONS)
        ]
        assert all(isinstance(granted, Granted) for granted in grants)
        await start_operator()
        await eventually(
            lambda: all(
                cluster.leader_label(f"job-{i}-a") == "true" and cluster.leader_label(f"job-{i}-b") == "false"
                for i in range(ELECTIONS)
            ),
            what="every election's pods labelled",
        )
        lists_before, _ = pod_reads(cluster)
        patches_before = sum(1 for r in pod_requests(cluster) if r.method == "PATCH")
        # Every watcher looks at its lock and its candidates every 0.2 s (the tests' poll_s): over
        # 6 s that is some 180 cycles; each watcher used to LIST its pods every 5 s.
        await asyncio.sleep(6.0)
        lists, watches = pod_reads(cluster)
        assert lists == lists_before, "pods were listed again: the watchers do not read the shared watch"
        assert lists <= 2 and watches <= 2 * max(1, lists), (lists, watches)
        # Labels that are right are not patched again (the watch brings each patched pod back).
        assert sum(1 for r in pod_requests(cluster) if r.method == "PATCH") == patches_before
        assert patches_before == 2 * ELECTIONS

        # Still following the lock: a handoff flips the labels of one election.
        assert isinstance(grants[0], Granted)
        assert await RedisLeaseBackend(client, lock="job-0").release(grants[0].lease)
        regrant = await RedisLeaseBackend(client, lock="job-0").acquire("job-0-b", ttl_ms=60_000)
        assert isinstance(regrant, Granted)
        await eventually(
            lambda: cluster.leader_label("job-0-b") == "true" and cluster.leader_label("job-0-a") == "false",
            what="job-0's labels flipped",
        )
        # A pod created later gets its label from the watch, without a LIST.
        await cluster.create(pod("job-1-c", app="job-1"))
        await eventually(lambda: cluster.leader_label("job-1-c") == "false", what="the late pod labelled")
        assert pod_reads(cluster)[0] == lists_before
    finally:
        await client.aclose()
