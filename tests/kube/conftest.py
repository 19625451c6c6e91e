"""Fixtures for kopf against the kmock Kubernetes API emulator, shared by every test under tests/kube.

- `kmock`: kmock's own live emulator (on 127.0.0.1, a free port), with the bundled built-in
  resources (pods, configmaps, events, ...) loaded; `declare_resource()` adds custom ones.
- `kopf_registry`: a fresh `kopf.OperatorRegistry` whose login handler points at `kmock`.
- `kopf_settings`: `kopf_test_settings()` (scanning off, no k8s events for handler logs).

The helpers to build and create objects are in tests/kube/kmock_support.py.

The `elector operator` tests (tests/kube/test_operator_*.py) add, with the helpers in
tests/kube/operator_fixtures.py:

- `cluster`: kmock with the LeaderElection resource of the chart's CRD, and a client session;
- `start_operator`: `await start_operator()` runs `run_operator` against it, with its own lease
  on the test's redis-server; every operator started is stopped after the test;
- `redis_client`: a sync client of that redis-server.

Teardown: stop every kopf that talks to `kmock` (thread or child process) before the `kmock`
fixture ends, and let the loop run once (`await asyncio.sleep(0.1)`): kmock's aiohttp server
waits up to 60 s for watch streams that are still open at its shutdown. A fixture that depends
on `kmock` is torn down before it (see `children` in test_singleton.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, NoReturn

import aiohttp
import kmock as kmock_lib
import kopf
import pytest
import redis
import yaml
from prometheus_client import CollectorRegistry

from elector.backend import RedisSettings
from elector.daemon.http import HttpSettings
from elector.kube import singleton as singleton_module
from elector.kube.operator.runner import OperatorSettings, run_operator
from elector.kube.operator.watcher import WatchSettings
from elector.testing.redis_server import RedisServerProcess
from tests.kube.kmock_support import kopf_test_settings, login_to
from tests.kube.operator_fixtures import (
    CRD_PATH,
    LE_KEY,
    NAMESPACE,
    Cluster,
    RunningOperator,
    seeded_redis,
)


@pytest.fixture
def kmock(kmock: kmock_lib.KubernetesEmulator) -> kmock_lib.KubernetesEmulator:
    """kmock's emulator with the bundled built-in resources loaded (kopf discovers them)."""
    kmock.resources.load_bundled()
    return kmock


@pytest.fixture
def kopf_registry(kmock: kmock_lib.KubernetesEmulator) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    login_to(kmock, registry=registry)
    return registry


@pytest.fixture
def kopf_settings() -> kopf.OperatorSettings:
    return kopf_test_settings()


@pytest.fixture
async def cluster(kmock: kmock_lib.KubernetesEmulator) -> AsyncIterator[Cluster]:
    """kmock serving the LeaderElection resource as the chart's CRD declares it."""
    kmock.resources.load_bundled()
    # The resource as the chart's CRD declares it (the file Helm installs), not a copy.
    crd = yaml.safe_load(CRD_PATH.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["served"])
    key = f"{crd['spec']['group']}/{version['name']}/{crd['spec']['names']['plural']}"
    assert key == LE_KEY, "the operator and the chart's CRD disagree on the resource"
    kmock.resources[key] = kmock.ResourceInfo(
        kind=crd["spec"]["names"]["kind"],
        singular=crd["spec"]["names"]["singular"],
        namespaced=crd["spec"]["scope"] == "Namespaced",
        subresources=set(version.get("subresources") or {}),
        verbs={"get", "list", "watch", "patch", "create", "delete"},
    )
    async with aiohttp.ClientSession() as session:
        yield Cluster(mock=kmock, session=session)


class KopfWouldHaveEndedTheWorker(AssertionError):
    """kopf did not stop within the singleton's budget, in a test running it in-process."""


@pytest.fixture(autouse=True)
def kopf_stuck_fails_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """The singleton's on_stuck="exit" ends the process with os._exit, which in-process is the
    pytest worker: its captured logs and every test after it on that worker went with it ("node
    down: Not properly terminated" was all two loaded runs showed). Here the same decision raises
    instead, so the test fails with its logs and the worker lives. What os._exit itself does is
    tested in a child process (test_singleton.py, the stuck-handler test)."""

    def fail_instead(elector: Any, *, budget_s: float) -> NoReturn:
        raise KopfWouldHaveEndedTheWorker(
            f"kopf of lock {elector.lock!r} did not stop within {budget_s:.3f}s: on_stuck='exit' "
            "would have ended this process (the pytest worker)"
        )

    monkeypatch.setattr(singleton_module, "_exit_stuck", fail_instead)


@pytest.fixture
async def start_operator(
    cluster: Cluster, redis_server: RedisServerProcess
) -> AsyncIterator[Callable[..., Any]]:
    """Start `run_operator` (its own lease on the test's redis-server) against kmock."""
    running: list[RunningOperator] = []

    async def login(_: kopf.OperatorSettings) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=cluster.url, insecure=True, default_namespace=NAMESPACE)

    async def start(*, identity: str = "operator-0", redis_url: str | None = None) -> RunningOperator:
        settings = OperatorSettings(
            redis=RedisSettings(url=redis_url or redis_server.url),
            identity=identity,
            # 30 s, not 3 s: the singleton's stop budget is 0.9 of stop_work_s, a tenth of the
            # ttl. At 3 s that is 0.27 s, which kopf's stop missed at load 10-12 (`make
            # test-loaded`): on_stuck="exit" then ended the process, the test's pytest worker
            # ("node down: Not properly terminated"). No test here waits for this lease to lapse:
            # a closed operator releases it.
            ttl_s=30.0,
            namespaces=(NAMESPACE,),
            http=HttpSettings(host="127.0.0.1", port=0),
            watch=WatchSettings(poll_s=0.2, redis_timeout_s=0.5, max_backoff_s=0.5),
        )
        seeded_redis(redis_server, settings.lock)
        registry = CollectorRegistry()
        stop = asyncio.Event()
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(
            run_operator(settings, registry=registry, login=login, stop_flag=stop, on_http_started=started)
        )
        port = await asyncio.wait_for(asyncio.shield(started), timeout=10)
        op = RunningOperator(task=task, stop=stop, registry=registry, http_port=port, settings=settings)
        running.append(op)
        return op

    yield start
    for op in running:
        if not op.task.done():
            await op.close()


@pytest.fixture
def redis_client(redis_server: RedisServerProcess) -> Iterator[redis.Redis]:
    """A sync client of the test's redis-server (where the operator keeps its own lease)."""
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    yield client
    client.close()
