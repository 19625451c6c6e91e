"""The operator's coordination.k8s.io Lease mirror (kmock with Lease concurrency + redis-server).

The lock lives in Redis and is driven here through the real backend (acquire, renew, release,
a holder that stops renewing); the Lease is read from the emulator's store, as `kubectl get
lease` would show it. Timing: the operator polls every 0.2 s, a Lease refresh is due half-way
through its duration (the ttl); waits are generous bounds, never measurements.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from elector.backend import RedisLeaseBackend, RedisSettings, make_client
from elector.kube.operator import resource
from elector.lease import Granted, Lease, LeaseBackendError, Renewed
from elector.testing.redis_server import RedisServerProcess
from tests.kube.lease_support import LEASE_KMOCK, LeaseEmulator, lease
from tests.kube.operator_fixtures import (
    CRD_PATH,
    NAMESPACE,
    Cluster,
    eventually,
    leader_election,
    pod,
    seeded_redis,
)
from tests.support.cancel import cancel_and_wait

pytestmark = LEASE_KMOCK

TTL_MS = 3000
#: A lapsed holder's lease is gone from Redis after its ttl; the bound only catches a hang.
TAKEOVER_TIMEOUT_S = 15.0


@pytest.fixture
async def backend(redis_server: RedisServerProcess) -> AsyncIterator[RedisLeaseBackend]:
    seeded_redis(redis_server, "jobs")
    # The daemon's own client (per-request timeouts): a raw redis-py client without them hung a
    # fresh-clone run for 120 s on one acquire whose answer never came.
    client = make_client(RedisSettings(url=redis_server.url, request_timeout_s=2.0))
    try:
        yield RedisLeaseBackend(client, lock="jobs")
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def renewing(backend: RedisLeaseBackend, held: Lease) -> AsyncIterator[None]:
    """Keep `held` renewed (a live leader) until the block ends."""

    async def loop() -> None:
        while True:
            result = await backend.renew(held)
            assert isinstance(result, Renewed), result
            await asyncio.sleep(TTL_MS / 1000 * 0.3)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        await cancel_and_wait(task)  # one cancellation can be lost on 3.11 (tests/support/cancel.py)
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def _spec(cluster: Cluster, name: str = "jobs") -> dict[str, Any]:
    found = lease(cluster.mock, name)
    assert found is not None, f"no Lease {name}"
    spec = found["spec"]
    assert isinstance(spec, dict)
    return spec


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _emulator(cluster: Cluster) -> LeaseEmulator:
    assert isinstance(cluster.mock, LeaseEmulator)
    return cluster.mock


async def _acquire_when_free(backend: RedisLeaseBackend, identity: str) -> Lease:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TAKEOVER_TIMEOUT_S
    while loop.time() < deadline:
        with contextlib.suppress(LeaseBackendError):  # a timeout on a loaded machine: try again
            result = await backend.acquire(identity, ttl_ms=TTL_MS)
            if isinstance(result, Granted):
                return result.lease
        await asyncio.sleep(0.1)
    raise AssertionError(f"{identity} could not acquire within {TAKEOVER_TIMEOUT_S} s")


async def test_lease_is_created_and_follows_a_takeover_and_a_handoff(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess, backend: RedisLeaseBackend
) -> None:
    for name in ("pod-a", "pod-b"):
        await cluster.create(pod(name))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=redis_server.url))
    await start_operator()

    # Created when missing, while the lock is free: nobody holds it, owned by the LeaderElection.
    await eventually(lambda: lease(cluster.mock, "jobs") is not None, what="the Lease created")
    created = lease(cluster.mock, "jobs")
    assert created is not None
    assert "holderIdentity" not in created["spec"] and created["spec"]["leaseTransitions"] == 0
    election = cluster.election("jobs")
    (owner,) = created["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        resource.KIND,
        "jobs",
        election["metadata"]["uid"],
    )
    assert created["metadata"]["labels"]["elector.io/leader-election"] == "jobs"

    # pod-a leads: holder, duration = the ttl, acquire and renew times.
    first = (await backend.acquire("pod-a", ttl_ms=TTL_MS)).lease  # type: ignore[union-attr]
    async with renewing(backend, first):
        await eventually(lambda: _spec(cluster).get("holderIdentity") == "pod-a", what="holder pod-a")
        spec = _spec(cluster)
        assert spec["leaseDurationSeconds"] == TTL_MS // 1000
        assert spec["leaseTransitions"] == 0  # the first holder of a free lock is no transition
        acquired_a = _time(spec["acquireTime"])
        assert _time(spec["renewTime"]) >= acquired_a
        # While pod-a renews, renewTime moves on (the Lease must not look expired to observers).
        await eventually(
            lambda: _time(_spec(cluster)["renewTime"]) > acquired_a + datetime.timedelta(seconds=1),
            timeout_s=TAKEOVER_TIMEOUT_S,
            what="renewTime refreshed",
        )
        annotations = lease(cluster.mock, "jobs")["metadata"]["annotations"]  # type: ignore[index]
        assert annotations["elector.io/fencing-token"] == str(first.fencing_token)

    # Takeover: pod-a stops renewing (a crash); its lease lapses and pod-b takes the lock.
    second = await _acquire_when_free(backend, "pod-b")
    await eventually(lambda: _spec(cluster).get("holderIdentity") == "pod-b", what="holder pod-b")
    spec = _spec(cluster)
    assert spec["leaseTransitions"] == 1
    assert _time(spec["acquireTime"]) > acquired_a
    acquired_b = _time(spec["acquireTime"])

    # Handoff: pod-b releases, pod-a acquires at once.
    assert await backend.release(second)
    third = (await backend.acquire("pod-a", ttl_ms=TTL_MS)).lease  # type: ignore[union-attr]
    await eventually(lambda: _spec(cluster).get("holderIdentity") == "pod-a", what="holder pod-a again")
    spec = _spec(cluster)
    assert spec["leaseTransitions"] == 2
    assert _time(spec["acquireTime"]) >= acquired_b
    annotations = lease(cluster.mock, "jobs")["metadata"]["annotations"]  # type: ignore[index]
    assert annotations["elector.io/fencing-token"] == str(third.fencing_token)


async def test_lease_writes_are_bounded_not_per_renewal(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess, backend: RedisLeaseBackend
) -> None:
    await cluster.create(pod("pod-a"))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=redis_server.url))
    held = (await backend.acquire("pod-a", ttl_ms=TTL_MS)).lease  # type: ignore[union-attr]
    await start_operator()
    # Renewed while the operator starts: in loaded run #14 its first look came later than the
    # 3 s ttl, found no holder, and the Lease never got one (a 30 s wait, then a failure).
    async with renewing(backend, held):
        await eventually(lambda: (lease(cluster.mock, "jobs") or {}).get("spec", {}).get("holderIdentity"))
    emulator = _emulator(cluster)
    writes_before = len(emulator.lease_puts)
    renewals = 0
    loop = asyncio.get_running_loop()
    started = loop.time()
    # Renew far more often than the Lease may be written: 20 renewals a second. For at least 4 s,
    # and on until there were more than 3 renewals per write allowed: a count a loaded machine
    # could otherwise fall short of (then an unthrottled writer would pass unseen).
    while True:
        elapsed = loop.time() - started
        # A refresh is due half-way through the duration (1.5 s here), at least 1 s apart; the
        # one extra covers a refresh already due when the window opened.
        bound = int(elapsed / 1.0) + 1
        if elapsed >= 4.0 and renewals > 3 * bound:
            break
        assert elapsed < 30.0, renewals  # a bound on a hang
        assert isinstance(await backend.renew(held), Renewed)
        renewals += 1
        await asyncio.sleep(0.05)
    writes = len(emulator.lease_puts) - writes_before
    assert 1 <= writes <= bound, (writes, bound, renewals)
    assert renewals > 3 * bound


async def test_a_deleted_lease_is_recreated_with_the_same_record(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess, backend: RedisLeaseBackend
) -> None:
    await cluster.create(pod("pod-a"))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=redis_server.url))
    held = (await backend.acquire("pod-a", ttl_ms=TTL_MS)).lease  # type: ignore[union-attr]
    await start_operator()
    async with renewing(backend, held):
        await eventually(lambda: (lease(cluster.mock, "jobs") or {}).get("spec", {}).get("holderIdentity"))
        before = _spec(cluster)
        path = f"{cluster.url}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/jobs"
        async with cluster.session.delete(path) as response:
            assert response.status < 400, await response.text()
        assert lease(cluster.mock, "jobs") is None
        await eventually(
            lambda: lease(cluster.mock, "jobs") is not None, timeout_s=TAKEOVER_TIMEOUT_S, what="recreated"
        )
        after = _spec(cluster)
        assert after["holderIdentity"] == "pod-a"
        assert after["acquireTime"] == before["acquireTime"]
        assert after["leaseTransitions"] == before["leaseTransitions"]


async def test_a_conflicting_write_is_read_again_and_redone(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess, backend: RedisLeaseBackend
) -> None:
    await cluster.create(pod("pod-a"))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=redis_server.url))
    held = (await backend.acquire("pod-a", ttl_ms=TTL_MS)).lease  # type: ignore[union-attr]
    await start_operator()
    async with renewing(backend, held):
        await eventually(lambda: (lease(cluster.mock, "jobs") or {}).get("spec", {}).get("holderIdentity"))
        # Someone else writes the Lease (a new resourceVersion): a label of their own, and a
        # holder that is not the lock's. The operator's next update carries a stale
        # resourceVersion: 409; it reads the Lease again, keeps the foreign label, and puts the
        # lock's holder back. The Lease is a mirror: writing it decides nothing.
        path = f"{cluster.url}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/jobs"
        change = {"metadata": {"labels": {"team": "payments"}}, "spec": {"holderIdentity": "intruder"}}
        headers = {"Content-Type": "application/merge-patch+json"}
        async with cluster.session.patch(path, json=change, headers=headers) as response:
            assert response.status < 400, await response.text()
        emulator = _emulator(cluster)
        await eventually(lambda: 409 in emulator.lease_puts, timeout_s=TAKEOVER_TIMEOUT_S, what="a 409")
        await eventually(
            lambda: _spec(cluster)["holderIdentity"] == "pod-a", timeout_s=TAKEOVER_TIMEOUT_S, what="fixed"
        )
        found = lease(cluster.mock, "jobs")
        assert found is not None and found["metadata"]["labels"]["team"] == "payments"
        assert emulator.lease_puts[-1] == 200


async def test_the_mirror_can_be_turned_off(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess, backend: RedisLeaseBackend
) -> None:
    await cluster.create(pod("pod-a"))
    await cluster.create(
        leader_election("jobs", lock="jobs", redis_url=redis_server.url, kubernetesLease={"enabled": False})
    )
    await backend.acquire("pod-a", ttl_ms=30_000)
    await start_operator()
    await eventually(lambda: cluster.election("jobs").get("status", {}).get("holder") == "pod-a")
    await asyncio.sleep(1.0)  # a few more cycles (0.2 s apart) in which a Lease could be written
    assert lease(cluster.mock, "jobs") is None
    assert not [r for r in list(cluster.mock) if r.resource is not None and r.resource.plural == "leases"]


async def test_a_lease_named_in_the_spec(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess, backend: RedisLeaseBackend
) -> None:
    await cluster.create(
        leader_election(
            "jobs", lock="jobs", redis_url=redis_server.url, kubernetesLease={"name": "jobs-leader"}
        )
    )
    await backend.acquire("pod-a", ttl_ms=30_000)
    await start_operator()
    await eventually(lambda: (lease(cluster.mock, "jobs-leader") or {}).get("spec", {}).get("holderIdentity"))
    assert _spec(cluster, "jobs-leader")["holderIdentity"] == "pod-a"
    assert lease(cluster.mock, "jobs") is None


async def test_a_restarted_operator_continues_the_record(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess, backend: RedisLeaseBackend
) -> None:
    await cluster.create(pod("pod-a"))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=redis_server.url))
    old = (await backend.acquire("pod-b", ttl_ms=30_000)).lease  # type: ignore[union-attr]
    first = await start_operator()
    await eventually(lambda: (lease(cluster.mock, "jobs") or {}).get("spec", {}).get("holderIdentity"))
    assert await backend.release(old)
    held = (await backend.acquire("pod-a", ttl_ms=TTL_MS)).lease  # type: ignore[union-attr]
    async with renewing(backend, held):
        await eventually(lambda: _spec(cluster)["holderIdentity"] == "pod-a", what="pod-a")
        before = _spec(cluster)
        assert before["leaseTransitions"] == 1
        await first.close()
        writes = len(_emulator(cluster).lease_puts)
        await start_operator(identity="operator-1")
        # The same term (same holder and fencing token): no transition counted, same acquireTime.
        await eventually(lambda: len(_emulator(cluster).lease_puts) > writes, timeout_s=TAKEOVER_TIMEOUT_S)
        after = _spec(cluster)
        assert after["leaseTransitions"] == 1 and after["acquireTime"] == before["acquireTime"]
        assert after["holderIdentity"] == "pod-a"


async def test_without_rbac_for_leases_the_operator_works_on_and_backs_off(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess, backend: RedisLeaseBackend
) -> None:
    _emulator(cluster).forbidden = True
    await cluster.create(pod("pod-a"))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=redis_server.url))
    await backend.acquire("pod-a", ttl_ms=30_000)
    operator = await start_operator()
    await eventually(lambda: cluster.leader_label("pod-a") == "true", what="the label still set")
    await eventually(lambda: cluster.election("jobs").get("status", {}).get("holder") == "pod-a")
    loop = asyncio.get_running_loop()
    refused_before, started = _emulator(cluster).lease_refused, loop.time()
    await asyncio.sleep(5.0)
    refused = _emulator(cluster).lease_refused - refused_before
    elapsed = loop.time() - started
    # Retries 2, 4, 8, ... s apart (1 s doubled per failure): over 25 cycles, at most a few tries.
    assert refused <= 3, (refused, elapsed)
    errors = operator.sample("elector_operator_reconcile_errors_total", reason="kubernetes")
    assert errors is not None and errors >= 1


def _condition(cluster: Cluster, kind: str, name: str = "jobs") -> dict[str, Any]:
    conditions = cluster.election(name).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


async def test_another_programs_lease_of_that_name_is_never_written(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess, backend: RedisLeaseBackend
) -> None:
    """The mirror overwrote any Lease of its name (a client-go program's own lock, say). It writes only
    Leases that carry its label; a clash is in the status and a Warning Event, and once the other Lease
    is gone the mirror creates its own."""
    foreign = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "jobs", "namespace": NAMESPACE, "labels": {"app": "billing"}},
        "spec": {"holderIdentity": "billing-7d9f-x", "leaseDurationSeconds": 15, "leaseTransitions": 4},
    }
    path = f"{cluster.url}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
    async with cluster.session.post(path, json=foreign) as response:
        assert response.status < 400, await response.text()
    await cluster.create(pod("pod-a"))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=redis_server.url))
    await backend.acquire("pod-a", ttl_ms=30_000)
    await start_operator()

    await eventually(lambda: _condition(cluster, "LeaseMirrored").get("status") == "False", what="the clash")
    condition = _condition(cluster, "LeaseMirrored")
    assert condition["reason"] == "LeaseNotOwned"
    assert "Lease jobs exists and is not this LeaderElection's" in condition["message"]
    await eventually(lambda: "LeaseNotOwned" in cluster.event_reasons(kind=resource.KIND, name="jobs"))
    # everything else goes on: labels and the status follow the lock
    await eventually(lambda: cluster.leader_label("pod-a") == "true")
    assert cluster.election("jobs")["status"]["holder"] == "pod-a"
    await asyncio.sleep(1.5)  # cycles (0.2 s) and a re-read (back-off from 2 s) in which it could write
    untouched = lease(cluster.mock, "jobs")
    assert untouched is not None and untouched["spec"] == foreign["spec"]
    assert untouched["metadata"]["labels"] == {"app": "billing"}
    assert _emulator(cluster).lease_puts == []
    assert not [
        r for r in list(cluster.mock) if r.method == "POST" and r.resource and r.resource.plural == "leases"
    ][1:]
    assert cluster.event_reasons(kind=resource.KIND, name="jobs").count("LeaseNotOwned") == 1

    # The other Lease goes: the mirror takes the name over (re-read with back-off, at most 30 s).
    async with cluster.session.delete(f"{path}/jobs") as response:
        assert response.status < 400, await response.text()
    await eventually(
        lambda: (lease(cluster.mock, "jobs") or {}).get("spec", {}).get("holderIdentity") == "pod-a",
        timeout_s=60.0,
        what="the mirror's own Lease",
    )
    await eventually(lambda: _condition(cluster, "LeaseMirrored").get("status") == "True")


async def test_two_leader_elections_naming_one_lease_do_not_overwrite_each_other(
    cluster: Cluster, start_operator: Any, redis_server: RedisServerProcess, backend: RedisLeaseBackend
) -> None:
    await cluster.create(pod("pod-a"))
    await cluster.create(leader_election("jobs", lock="jobs", redis_url=redis_server.url))
    await backend.acquire("pod-a", ttl_ms=30_000)
    await start_operator()
    await eventually(
        lambda: (lease(cluster.mock, "jobs") or {}).get("spec", {}).get("holderIdentity") == "pod-a"
    )
    seeded_redis(redis_server, "reports")
    await cluster.create(
        leader_election(
            "reports", lock="reports", redis_url=redis_server.url, kubernetesLease={"name": "jobs"}
        )
    )
    await eventually(
        lambda: _condition(cluster, "LeaseMirrored", "reports").get("reason") == "LeaseNotOwned",
        what="the second one's clash",
    )
    assert "it mirrors LeaderElection jobs" in _condition(cluster, "LeaseMirrored", "reports")["message"]
    assert _condition(cluster, "LeaseMirrored")["status"] == "True"
    found = lease(cluster.mock, "jobs")
    assert found is not None and found["metadata"]["labels"]["elector.io/leader-election"] == "jobs"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("yes", "spec.kubernetesLease: must be an object"),
        ({"enabled": "no"}, "spec.kubernetesLease.enabled: must be true or false"),
        ({"name": "Not_A_Name"}, "spec.kubernetesLease.name: 'Not_A_Name' is not a valid object name"),
    ],
)
def test_bad_kubernetes_lease_specs_name_the_field(value: Any, problem: str) -> None:
    spec = {"lock": "jobs", "redis": {"url": "redis://r:6379"}, "selector": {"matchLabels": {"a": "b"}}}
    with pytest.raises(resource.SpecError, match=problem):
        resource.parse_spec({**spec, "kubernetesLease": value})
    parsed = resource.parse_spec(spec)
    assert parsed.kubernetes_lease and parsed.kubernetes_lease_name is None
    # The CRD's default is the operator's: on.
    crd = yaml.safe_load(CRD_PATH.read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert props["kubernetesLease"]["properties"]["enabled"]["default"] is True
