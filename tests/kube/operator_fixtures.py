"""Helpers of the `elector operator` tests: kmock as the API server, a real redis-server, the
operator itself (`run_operator`, with kopf in its own thread as in production). Their fixtures
(`cluster`, `start_operator`, `redis_client`) are in tests/kube/conftest.py.

kmock's gaps (see shared notes): objects are seeded with uid and resourceVersion; watches replay
every object, so assertions are "at least once". kmock ignores `generateName` (every Event kopf
posts would be the same nameless object, the second a 409): `NamingEmulator` names them as the
API server does. Test modules select it with `pytestmark = OPERATOR_KMOCK`.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import kmock
import pytest
import redis
from prometheus_client import CollectorRegistry

from elector.kube.operator import resource
from elector.kube.operator.runner import OperatorSettings
from elector.testing.redis_server import RedisServerProcess
from tests.support.seed import seed_used_lock

NAMESPACE = "apps"
CRD_PATH = (
    Path(__file__).resolve().parents[2] / "helm" / "elector-operator" / "files" / "leaderelection-crd.yaml"
)
LE_KEY = f"{resource.GROUP}/{resource.VERSION}/{resource.PLURAL}"
_versions = itertools.count(1)


@attrs.define(kw_only=True)
class NamingEmulator(kmock.KubernetesEmulator):
    """kmock's emulator, plus the API server's naming of objects created with generateName."""

    async def _handle(self, request: Any) -> Any:
        data = request.data
        if request.method == "POST" and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            if isinstance(meta, dict) and not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:10]}"
        return await super()._handle(request)


OPERATOR_KMOCK = pytest.mark.kmock(cls=NamingEmulator)


def _meta(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": NAMESPACE,
        "uid": str(uuid.uuid4()),
        "resourceVersion": str(next(_versions)),
        **extra,
    }


def pod(name: str, *, app: str = "worker", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(name, labels={"app": app, **(labels or {})}),
        "spec": {"containers": [{"name": "main", "image": "example/worker:1"}]},
    }


def secret(name: str, **data: str) -> dict[str, Any]:
    """A Secret with `data` base64-encoded, as the API server stores it."""
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(name), "data": encoded}


def leader_election(name: str, *, lock: str, redis_url: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": resource.API_VERSION,
        "kind": resource.KIND,
        "metadata": _meta(name),
        "spec": {
            "lock": lock,
            "redis": {"url": redis_url},
            "selector": {"matchLabels": {"app": "worker"}},
            **spec,
        },
    }


@dataclass
class Cluster:
    """The emulated API server with helpers to change it as kubectl would (through HTTP)."""

    mock: kmock.KubernetesEmulator
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return str(self.mock.url).rstrip("/")

    async def create(self, obj: dict[str, Any]) -> None:
        path = _collection_path(obj)
        async with self.session.post(f"{self.url}{path}", json=obj) as response:
            assert response.status < 400, await response.text()

    async def patch(self, obj: dict[str, Any], changes: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        path = f"{_collection_path(obj)}/{name}"
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(f"{self.url}{path}", json=changes, headers=headers) as response:
            assert response.status < 400, await response.text()

    def get(self, key: str, name: str) -> dict[str, Any]:
        return dict(self.mock.objects[key, NAMESPACE, name].raw)

    def election(self, name: str) -> dict[str, Any]:
        return self.get(LE_KEY, name)

    def leader_label(self, pod_name: str, label: str = resource.DEFAULT_LEADER_LABEL) -> str | None:
        labels: dict[str, str] = self.get("v1/pods", pod_name)["metadata"].get("labels") or {}
        return labels.get(label)

    def events(self) -> list[dict[str, Any]]:
        """Every Event the operator posted, in order."""
        return [
            request.data
            for request in list(self.mock)
            if request.method == "POST"
            and request.resource is not None
            and request.resource.plural == "events"
        ]

    def event_reasons(self, *, kind: str, name: str) -> list[str]:
        return [
            e.get("reason", "")
            for e in self.events()
            if (e.get("involvedObject") or {}).get("kind") == kind
            and (e.get("involvedObject") or {}).get("name") == name
        ]


def _collection_path(obj: dict[str, Any]) -> str:
    if obj["apiVersion"] == "v1":
        return f"/api/v1/namespaces/{NAMESPACE}/{obj['kind'].lower()}s"
    return f"/apis/{resource.API_VERSION}/namespaces/{NAMESPACE}/{resource.PLURAL}"


@dataclass
class RunningOperator:
    task: asyncio.Task[None]
    stop: asyncio.Event
    registry: CollectorRegistry
    http_port: int
    settings: OperatorSettings
    extra: dict[str, Any] = field(default_factory=dict)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=30)


def seeded_redis(server: RedisServerProcess, *locks: str) -> None:
    client = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        for lock in locks:
            seed_used_lock(client, lock)
    finally:
        client.close()


#: `eventually`'s default: a bound on a hang, never a claimed latency (a test that claims one
#: asserts on the time returned). 10 s ran out at load 11 (`make test-loaded`), where a local
#: Redis round trip took up to 0.5 s and a 1 s request timed out again and again.
EVENTUALLY_S = 30.0


async def eventually(
    check: Callable[[], object], *, timeout_s: float = EVENTUALLY_S, what: str | Callable[[], object] = ""
) -> float:
    """Wait until `check()` is truthy (an AssertionError counts as not yet); returns the time taken."""
    started = time.monotonic()
    last: BaseException | None = None
    while time.monotonic() - started < timeout_s:
        try:
            if check():
                return time.monotonic() - started
        except (AssertionError, KeyError) as exc:
            last = exc
        await asyncio.sleep(0.05)
    shown = what() if callable(what) else what
    raise AssertionError(f"not within {timeout_s}s: {shown or check} (last error: {last!r})")
