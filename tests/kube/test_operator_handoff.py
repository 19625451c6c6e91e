"""The handoff annotation and Redis outages, against real contenders (elector.Elector) and kmock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

import elector
from elector.kube.operator import handoff_annotation as handoff
from elector.kube.operator import resource
from elector.testing.redis_server import RedisServerProcess
from tests.kube.operator_fixtures import (
    OPERATOR_KMOCK,
    Cluster,
    eventually,
    leader_election,
    pod,
    seeded_redis,
)
from tests.support.tcp_proxy import TcpProxy

pytestmark = OPERATOR_KMOCK


async def _lead_forever(candidate: elector.Elector) -> None:
    while True:
        with contextlib.suppress(elector.LeadershipLost):
            async with candidate.leadership():
                await asyncio.Event().wait()


@contextlib.asynccontextmanager
async def contenders(redis_url: str, *identities: str) -> AsyncIterator[list[elector.Elector]]:
    """Real candidates of lock "jobs" that lead whenever they can (and honour handoffs)."""
    async with contextlib.AsyncExitStack() as stack:
        electors = [
            # ttl 10 s: handoffs do not wait for it (a release announces itself), and at ttl 2 s a
            # loaded test process (kopf, kmock and both candidates on one loop) once lost the lease
            # between two handoffs: the holder then changed without one.
            await stack.enter_async_context(elector.Elector("jobs", redis=redis_url, identity=i, ttl_s=10.0))
            for i in identities
        ]
        tasks = []
        for candidate in electors:
            tasks.append(asyncio.create_task(_lead_forever(candidate)))
        try:
            yield electors
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _holder(cluster: Cluster) -> str | None:
    status = cluster.election("jobs").get("status") or {}
    holder: str | None = status.get("holder")
    return holder


def _annotations(cluster: Cluster) -> dict[str, str]:
    annotations: dict[str, str] = cluster.election("jobs")["metadata"].get("annotations") or {}
    return annotations


async def test_the_handoff_annotation_hands_over_and_is_cleared(
    cluster: Cluster, start_operator, redis_server: RedisServerProcess
) -> None:
    seeded_redis(redis_server, "jobs")
    for name in ("pod-a", "pod-b"):
        await cluster.create(pod(name))
    election = leader_election("jobs", lock="jobs", redis_url=redis_server.url, handoffTimeoutSeconds=10)
    await cluster.create(election)
    await start_operator()
    async with contenders(redis_server.url, "pod-a", "pod-b"):
        # Both contend from the start: whoever won, the test hands over to the other one.
        await eventually(lambda: _holder(cluster) in ("pod-a", "pod-b"))
        first = _holder(cluster)
        other = "pod-b" if first == "pod-a" else "pod-a"
        await eventually(lambda: cluster.leader_label(first) == "true")
        await eventually(lambda: len(cluster.election("jobs")["status"].get("candidates") or []) == 2)

        await cluster.patch(election, {"metadata": {"annotations": {resource.HANDOFF_ANNOTATION: other}}})
        await eventually(lambda: _holder(cluster) == other, what=f"handed over to {other}")
        await eventually(
            lambda: cluster.leader_label(other) == "true" and cluster.leader_label(first) == "false"
        )
        await eventually(
            lambda: resource.HANDOFF_ANNOTATION not in _annotations(cluster), what="annotation cleared"
        )
        await eventually(lambda: "HandoffSucceeded" in cluster.event_reasons(kind=resource.KIND, name="jobs"))
        assert "HandoffFailed" not in cluster.event_reasons(kind=resource.KIND, name="jobs")

        # "any": to anyone but the holder.
        await cluster.patch(election, {"metadata": {"annotations": {resource.HANDOFF_ANNOTATION: "any"}}})
        await eventually(lambda: _holder(cluster) == first, what="handed over to anyone else")
        await eventually(lambda: resource.HANDOFF_ANNOTATION not in _annotations(cluster))
        await eventually(
            lambda: cluster.event_reasons(kind=resource.KIND, name="jobs").count("HandoffSucceeded") >= 2
        )

        # Not a candidate: refused, reported, cleared; the holder stays.
        await cluster.patch(election, {"metadata": {"annotations": {resource.HANDOFF_ANNOTATION: "pod-zz"}}})
        await eventually(lambda: "HandoffFailed" in cluster.event_reasons(kind=resource.KIND, name="jobs"))
        await eventually(lambda: resource.HANDOFF_ANNOTATION not in _annotations(cluster))
        failed = [e for e in cluster.events() if e.get("reason") == "HandoffFailed"]
        assert "not a live candidate" in failed[-1]["message"]
        assert failed[-1]["type"] == "Warning"
        assert _holder(cluster) == first


async def test_a_redis_outage_shows_in_the_status_and_the_operator_recovers(
    cluster: Cluster, start_operator, redis_server: RedisServerProcess, tcp_proxy: TcpProxy
) -> None:
    seeded_redis(redis_server, "jobs")
    await cluster.create(pod("pod-a"))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=tcp_proxy.url))
    # The operator's own lease goes to Redis directly: only the watched lock's link is cut.
    operator = await start_operator()

    def reachable() -> str:
        conditions = cluster.election("jobs")["status"]["conditions"]
        return next(c for c in conditions if c["type"] == "RedisReachable")["status"]

    async with contenders(redis_server.url, "pod-a"):
        await eventually(lambda: _holder(cluster) == "pod-a" and reachable() == "True")
        errors_before = operator.sample("elector_operator_reconcile_errors_total", reason="redis") or 0.0

        tcp_proxy.cut()
        await eventually(lambda: reachable() == "False", what="RedisReachable False during the outage")
        condition = next(
            c for c in cluster.election("jobs")["status"]["conditions"] if c["type"] == "RedisReachable"
        )
        assert condition["reason"] == "Unreachable" and "Redis" in condition["message"]
        assert _holder(cluster) == "pod-a"  # the last known holder stays
        assert (
            operator.sample("elector_operator_reconcile_errors_total", reason="redis") or 0
        ) > errors_before
        assert not operator.task.done()
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{operator.http_port}/healthz") as response:
                assert response.status == 200

        tcp_proxy.restore()
        await eventually(lambda: reachable() == "True", what="recovered after the outage")
        assert _holder(cluster) == "pod-a"


@pytest.mark.parametrize(
    ("spec_change", "message"),
    [
        ({"lock": "bad lock!"}, "spec.lock"),
        ({"selector": {}}, "spec.selector"),
        ({"redis": {"url": "redis://:hunter2@localhost:6379/0"}}, "spec.redis.url"),
    ],
)
async def test_an_invalid_spec_is_reported_not_crashed_on(
    cluster: Cluster,
    start_operator,
    redis_server: RedisServerProcess,
    spec_change: dict[str, object],
    message: str,
) -> None:
    body = leader_election("jobs", lock="jobs", redis_url=redis_server.url)
    body["spec"].update(spec_change)
    await cluster.create(body)
    operator = await start_operator()

    def spec_valid() -> dict[str, str]:
        conditions = cluster.election("jobs")["status"]["conditions"]
        condition: dict[str, str] = next(c for c in conditions if c["type"] == "SpecValid")
        return condition

    await eventually(lambda: spec_valid()["status"] == "False")
    assert message in spec_valid()["message"]
    assert "hunter2" not in str(cluster.election("jobs")["status"])
    await eventually(lambda: "InvalidSpec" in cluster.event_reasons(kind=resource.KIND, name="jobs"))
    assert all("hunter2" not in str(e) for e in cluster.events())
    assert operator.sample("elector_operator_reconcile_errors_total", reason="invalid_spec") == 1.0
    assert not operator.task.done()


async def test_an_unexpected_handoff_error_is_a_failed_handoff_with_an_event(
    cluster: Cluster, start_operator, redis_server: RedisServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_hand_over(*_: object, **__: object) -> object:
        raise RuntimeError("a bug in the handoff")

    monkeypatch.setattr(handoff, "hand_over", broken_hand_over)
    seeded_redis(redis_server, "jobs")
    await cluster.create(pod("pod-a"))
    election = leader_election("jobs", lock="jobs", redis_url=redis_server.url)
    await cluster.create(election)
    operator = await start_operator()
    async with contenders(redis_server.url, "pod-a"):
        await eventually(lambda: _holder(cluster) == "pod-a")
        await cluster.patch(election, {"metadata": {"annotations": {resource.HANDOFF_ANNOTATION: "any"}}})
        await eventually(lambda: "HandoffFailed" in cluster.event_reasons(kind=resource.KIND, name="jobs"))
        await eventually(lambda: resource.HANDOFF_ANNOTATION not in _annotations(cluster))
        failed = [e for e in cluster.events() if e.get("reason") == "HandoffFailed"]
        assert "failed unexpectedly (RuntimeError)" in failed[-1]["message"]
        assert failed[-1]["type"] == "Warning"
        assert operator.sample("elector_operator_reconcile_errors_total", reason="handoff") == 1.0
        assert not operator.task.done() and _holder(cluster) == "pod-a"
