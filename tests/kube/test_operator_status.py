"""The operator follows a lock in Redis: status, pod labels, Events and metrics (kmock + redis-server)."""

from __future__ import annotations

import redis.asyncio

from elector.backend import RedisLeaseBackend
from elector.kube.operator import resource
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


async def test_status_labels_and_events_follow_the_holder(
    cluster: Cluster, start_operator, redis_server: RedisServerProcess
) -> None:
    seeded_redis(redis_server, "jobs")
    for name in ("pod-a", "pod-b", "pod-c"):
        await cluster.create(pod(name))
    await cluster.create(pod("other", app="unrelated"))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=redis_server.url))
    operator = await start_operator()

    client = redis.asyncio.Redis.from_url(redis_server.url)
    backend = RedisLeaseBackend(client, lock="jobs")
    try:
        # Nobody holds the lock: every candidate is "false", the status says so.
        await eventually(lambda: all(cluster.leader_label(p) == "false" for p in ("pod-a", "pod-b", "pod-c")))
        assert cluster.leader_label("other") is None  # not a candidate: untouched
        await eventually(lambda: cluster.election("jobs")["status"]["conditions"][1]["status"] == "False")

        granted = await backend.acquire("pod-a", ttl_ms=30_000)
        assert isinstance(granted, Granted)
        took = await eventually(
            lambda: (
                cluster.leader_label("pod-a") == "true"
                and cluster.leader_label("pod-b") == "false"
                and cluster.leader_label("pod-c") == "false"
            ),
            what="pod-a labelled leader",
        )
        print(f"\npod-a labelled leader {took:.2f}s after its grant")  # a second-ish, unloaded
        await eventually(lambda: cluster.election("jobs")["status"].get("holder") == "pod-a")
        status = cluster.election("jobs")["status"]
        assert status["holderPod"] == "pod-a"
        assert status["fencingToken"] == granted.lease.fencing_token
        assert status["lock"] == "jobs"
        assert status["transitions"] >= 1
        assert status["lastTransitionTime"]
        assert {c["type"]: c["status"] for c in status["conditions"]} == {
            "RedisReachable": "True",
            "HasLeader": "True",
            "SpecValid": "True",
            "LeaseMirrored": "True",
        }
        assert [c["identity"] for c in status["candidates"]] == ["pod-a"]
        assert (
            operator.sample("elector_lock_holder_info", namespace="apps", lock="jobs", holder="pod-a") == 1.0
        )

        # Failover: pod-a releases, pod-b acquires. The labels flip; the old series goes.
        transitions_before = status["transitions"]
        assert await backend.release(granted.lease)
        regrant = await backend.acquire("pod-b", ttl_ms=30_000)
        assert isinstance(regrant, Granted)
        took = await eventually(
            lambda: cluster.leader_label("pod-b") == "true" and cluster.leader_label("pod-a") == "false",
            what="labels flipped to pod-b",
        )
        print(f"labels flipped to pod-b {took:.2f}s after the regrant")
        await eventually(lambda: cluster.election("jobs")["status"].get("holder") == "pod-b")
        status = cluster.election("jobs")["status"]
        assert status["fencingToken"] == regrant.lease.fencing_token > granted.lease.fencing_token
        assert status["transitions"] > transitions_before
        await eventually(
            lambda: (
                operator.sample("elector_lock_holder_info", namespace="apps", lock="jobs", holder="pod-a")
                is None
            )
        )
        assert (
            operator.sample("elector_lock_holder_info", namespace="apps", lock="jobs", holder="pod-b") == 1.0
        )

        # Events on the LeaderElection and on the pods involved (kopf posts them from a queue).
        def events_posted() -> bool:
            on_election = cluster.event_reasons(kind=resource.KIND, name="jobs")
            return (
                {"LeaderElected", "LeaderLost"} <= set(cluster.event_reasons(kind="Pod", name="pod-a"))
                and "LeaderElected" in cluster.event_reasons(kind="Pod", name="pod-b")
                and on_election.count("LeaderElected") >= 2
                and "LeaderLost" in on_election
            )

        await eventually(
            events_posted, what=lambda: [(e["involvedObject"]["name"], e["reason"]) for e in cluster.events()]
        )
        assert cluster.event_reasons(kind="Pod", name="pod-c") == []
        assert cluster.event_reasons(kind="Pod", name="other") == []
    finally:
        await client.aclose()


async def test_a_pod_that_appears_later_gets_its_label(
    cluster: Cluster, start_operator, redis_server: RedisServerProcess
) -> None:
    seeded_redis(redis_server, "jobs")
    await cluster.create(pod("pod-a"))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=redis_server.url))
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        assert isinstance(
            await RedisLeaseBackend(client, lock="jobs").acquire("pod-b", ttl_ms=30_000), Granted
        )
        await start_operator()
        await eventually(lambda: cluster.leader_label("pod-a") == "false")
        # The holder's pod is created after the transition: the resync labels it.
        await cluster.create(pod("pod-b"))
        await eventually(lambda: cluster.leader_label("pod-b") == "true", what="late pod labelled")
        await eventually(lambda: cluster.election("jobs")["status"].get("holderPod") == "pod-b")
    finally:
        await client.aclose()


async def test_each_replica_says_whether_it_leads(cluster: Cluster, start_operator) -> None:
    """`elector_operator_leader`: what ElectorOperatorDown needs to page when no replica leads (a
    replica can be up, and scraped, while none holds the operator's lease: labels stand still then)."""
    first = await start_operator(identity="operator-0")
    await eventually(lambda: first.sample("elector_operator_leader") == 1.0, what="operator-0 leads")
    second = await start_operator(identity="operator-1")
    await eventually(lambda: second.sample("elector_operator_leader") == 0.0, what="operator-1 stands by")
    await first.close()  # a clean stop releases the lease: the standby takes over at once
    await eventually(lambda: second.sample("elector_operator_leader") == 1.0, what="operator-1 leads")
    assert first.sample("elector_operator_leader") == 0.0
