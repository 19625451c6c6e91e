"""LeaderElection specs that change or cannot work: old labels go, a bad URL is a spec problem.

kmock as the API server, a real redis-server for the watched lock, the operator as in production.
"""

from __future__ import annotations

import asyncio
from typing import Any

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
    secret,
    seeded_redis,
)

pytestmark = OPERATOR_KMOCK

NEW_LABEL = "example.com/active"


async def test_a_new_leader_label_or_selector_takes_the_old_label_off(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess
) -> None:
    seeded_redis(redis_server, "jobs")
    for name in ("pod-a", "pod-b"):
        await cluster.create(pod(name))
    await cluster.create(pod("pod-c", app="other"))
    election = leader_election("jobs", lock="jobs", redis_url=redis_server.url)
    await cluster.create(election)
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        granted = await RedisLeaseBackend(client, lock="jobs").acquire("pod-a", ttl_ms=60_000)
        assert isinstance(granted, Granted)
        await start_operator()
        await eventually(
            lambda: cluster.leader_label("pod-a") == "true" and cluster.leader_label("pod-b") == "false"
        )

        # A new label name: it goes on, and the old one comes off every pod (no stale "true").
        await cluster.patch(election, {"spec": {"leaderLabel": NEW_LABEL}})
        await eventually(
            lambda: (
                cluster.leader_label("pod-a", NEW_LABEL) == "true"
                and cluster.leader_label("pod-b", NEW_LABEL) == "false"
            ),
            what="the new label on the candidates",
        )
        await eventually(
            lambda: cluster.leader_label("pod-a") is None and cluster.leader_label("pod-b") is None,
            what=lambda: (
                f"old label removed: pod-a {cluster.leader_label('pod-a')!r}, "
                f"pod-b {cluster.leader_label('pod-b')!r}"
            ),
        )

        # A new selector: the pods it no longer chooses lose the label; the new candidates get it.
        await cluster.patch(election, {"spec": {"selector": {"matchLabels": {"app": "other"}}}})
        await eventually(lambda: cluster.leader_label("pod-c", NEW_LABEL) == "false")
        await eventually(
            lambda: (
                cluster.leader_label("pod-a", NEW_LABEL) is None
                and cluster.leader_label("pod-b", NEW_LABEL) is None
            ),
            what="label removed from the pods the old selector chose",
        )
        assert cluster.leader_label("pod-c") is None  # the first label never was on pod-c
        # Other labels are left alone.
        assert cluster.get("v1/pods", "pod-a")["metadata"]["labels"]["app"] == "worker"
    finally:
        await client.aclose()


async def test_a_malformed_url_from_a_secret_is_an_invalid_spec_not_a_crash(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess
) -> None:
    seeded_redis(redis_server, "jobs")
    redis_secret = secret("redis", url="redis://[::1", password="hunter2")
    await cluster.create(redis_secret)
    body = leader_election("jobs", lock="jobs", redis_url="unused")
    body["spec"]["redis"] = {
        "urlSecretRef": {"name": "redis", "key": "url"},
        "passwordSecretRef": {"name": "redis", "key": "password"},
    }
    await cluster.create(body)
    operator = await start_operator()

    def spec_valid() -> dict[str, str]:
        conditions = cluster.election("jobs")["status"]["conditions"]
        condition: dict[str, str] = next(c for c in conditions if c["type"] == "SpecValid")
        return condition

    await eventually(lambda: spec_valid()["status"] == "False", what="SpecValid False")
    message = spec_valid()["message"]
    assert "Secret redis" in message and "Invalid IPv6 URL" in message, message
    await eventually(lambda: "InvalidSpec" in cluster.event_reasons(kind=resource.KIND, name="jobs"))
    await asyncio.sleep(1.5)  # three retries (max_backoff_s 0.5): still one report, no crash
    assert cluster.event_reasons(kind=resource.KIND, name="jobs").count("InvalidSpec") == 1
    assert operator.sample("elector_operator_reconcile_errors_total", reason="invalid_spec") == 1.0
    assert not operator.task.done()
    for text in (str(cluster.election("jobs")["status"]), *(str(e) for e in cluster.events())):
        assert "hunter2" not in text and "[::1" not in text

    # The Secret is fixed: the operator connects and the spec is valid again.
    fixed = secret("redis", url=redis_server.url, password="")
    await cluster.patch(redis_secret, {"data": fixed["data"]})
    await eventually(lambda: spec_valid()["status"] == "True", what="SpecValid True after the fix")
    await eventually(lambda: cluster.election("jobs")["status"].get("lock") == "jobs")


async def test_a_leader_label_that_is_a_selector_key_never_touches_the_pods(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess
) -> None:
    """`leaderLabel: app` with `selector: {app: worker}` rewrote the pods' `app` to "true"/"false" (on a
    cluster their ReplicaSet would lose them and make new ones without end). kmock evaluates no CEL, so
    this is the operator's own check: SpecValid False, an Event, and the pods left as they were."""
    seeded_redis(redis_server, "jobs")
    for name in ("pod-a", "pod-b"):
        await cluster.create(pod(name))
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        assert isinstance(
            await RedisLeaseBackend(client, lock="jobs").acquire("pod-a", ttl_ms=60_000), Granted
        )
        await cluster.create(
            leader_election("jobs", lock="jobs", redis_url=redis_server.url, leaderLabel="app")
        )
        await start_operator()

        def spec_valid() -> dict[str, str]:
            conditions = cluster.election("jobs")["status"]["conditions"]
            condition: dict[str, str] = next(c for c in conditions if c["type"] == "SpecValid")
            return condition

        await eventually(lambda: spec_valid()["status"] == "False", what="SpecValid False")
        assert "leaderLabel" in spec_valid()["message"] and "selector" in spec_valid()["message"]
        await eventually(lambda: "InvalidSpec" in cluster.event_reasons(kind=resource.KIND, name="jobs"))
        await asyncio.sleep(1.0)  # five polls (0.2 s) in which a relabel could have happened
        assert [cluster.leader_label(p, "app") for p in ("pod-a", "pod-b")] == ["worker", "worker"]
        assert not [
            r
            for r in list(cluster.mock)
            if r.method == "PATCH" and r.resource and r.resource.plural == "pods"
        ]
    finally:
        await client.aclose()
