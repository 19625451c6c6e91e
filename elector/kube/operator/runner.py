"""`elector operator`: the kopf operator for LeaderElections, as a hot-standby singleton.

Every replica starts and contends for the operator's own Redis lease (default lock named after
the namespaces it watches, `default_operator_lock`); only the leader runs kopf
(standalone: kopf's peering off), through `elector.kube.run_singleton`. Every replica serves
/healthz and /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import socket
from collections.abc import Mapping, Sequence

import kopf
from prometheus_client import CollectorRegistry

import elector
from elector.backend import RedisSettings, make_client
from elector.daemon.http import (
    HttpApp,
    HttpServer,
    HttpSettings,
    Request,
    Response,
    json_response,
    metrics_handler,
)
from elector.kube.operator.handlers import Login, build_handlers, configure_settings
from elector.kube.operator.kubeapi import KubeApi
from elector.kube.operator.metrics import OperatorMetrics
from elector.kube.operator.watcher import WatchSettings
from elector.kube.singleton import run_singleton
from elector.telemetry.metrics import register_process_metrics


def default_identity(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("POD_NAME") or socket.gethostname()


#: The longest lock name elector takes (elector.lease.check_lock_name).
MAX_LOCK_LENGTH = 200


def default_operator_lock(namespaces: Sequence[str], *, clusterwide: bool) -> str:
    """The operator's own lock when none is given: named after what it watches.

    Operators for different sets of namespaces must not exclude each other (a single global
    name let one team's operator keep another's idle); the replicas of one operator watch the
    same set, so they share the name. Namespaces are DNS labels (no dots): the join is
    unambiguous. A set too long for a lock name is hashed.
    """
    if clusterwide:
        return "elector-operator/cluster-wide"
    joined = ".".join(sorted(set(namespaces)))
    lock = f"elector-operator/namespaces/{joined}"
    if len(lock) > MAX_LOCK_LENGTH:
        lock = f"elector-operator/namespaces/sha256-{hashlib.sha256(joined.encode()).hexdigest()}"
    return lock


@dataclasses.dataclass(frozen=True, slots=True)
class OperatorSettings:
    """Settings of `elector operator` (the operator's own lease, what it watches, where it serves)."""

    redis: RedisSettings
    identity: str
    #: The operator's own lock; empty: named after what it watches (`default_operator_lock`).
    lock: str = ""
    ttl_s: float = 10.0
    #: Namespaces whose LeaderElections are watched; empty with `clusterwide`: all of them.
    namespaces: tuple[str, ...] = ()
    clusterwide: bool = False
    http: HttpSettings = dataclasses.field(default_factory=HttpSettings)
    watch: WatchSettings = dataclasses.field(default_factory=WatchSettings)

    def __post_init__(self) -> None:
        if self.clusterwide == bool(self.namespaces):
            raise ValueError("give --namespace (one or more) or --all-namespaces, not both and not neither")
        if not self.lock:
            derived = default_operator_lock(self.namespaces, clusterwide=self.clusterwide)
            object.__setattr__(self, "lock", derived)


def make_http_app(registry: CollectorRegistry, *, is_leader: elector.Elector) -> HttpApp:
    """/healthz (200 while the process serves; says whether this replica runs kopf) and /metrics."""

    async def healthz(_: Request) -> Response:
        return json_response({"ok": True, "leading": is_leader.is_leader})

    return HttpApp({"/healthz": healthz, "/metrics": metrics_handler(registry)})


async def run_operator(
    settings: OperatorSettings,
    *,
    registry: CollectorRegistry | None = None,
    login: Login | None = None,
    stop_flag: asyncio.Event | None = None,
    on_http_started: asyncio.Future[int] | None = None,
) -> None:
    """Run until `stop_flag` is set (or the task is cancelled)."""
    metrics_registry = registry if registry is not None else CollectorRegistry()
    if registry is None:
        register_process_metrics(metrics_registry)
    metrics = OperatorMetrics(metrics_registry)
    api = KubeApi()
    kopf_registry = build_handlers(api=api, metrics=metrics, watch=settings.watch, login=login)
    kopf_settings = kopf.OperatorSettings()
    configure_settings(kopf_settings)
    # The operator's own lease: redis-py retries off, short timeouts (see elector.backend).
    request_timeout_s = min(1.0, 0.15 * settings.ttl_s)
    client = make_client(
        dataclasses.replace(settings.redis, request_timeout_s=request_timeout_s),
        client_name=f"elector:{settings.lock}:operator",
    )
    try:
        async with elector.Elector(
            settings.lock, redis=client, identity=settings.identity, ttl_s=settings.ttl_s
        ) as lease:
            server = HttpServer(make_http_app(metrics_registry, is_leader=lease), settings=settings.http)
            await server.start()
            if on_http_started is not None:
                on_http_started.set_result(server.bound_port)
            try:
                await run_singleton(
                    lease,
                    registry=kopf_registry,
                    settings=kopf_settings,
                    namespaces=settings.namespaces,
                    clusterwide=settings.clusterwide,
                    stop_flag=stop_flag,
                    # ElectorOperatorDown: no replica leads, so labels and status stand still.
                    on_leading=lambda _: metrics.leading(True),
                    on_stopped=lambda _: metrics.leading(False),
                )
            finally:
                await server.stop()
    finally:
        # kopf's cleanup handler closed the API sessions in kopf's own loop; this only catches
        # what a cancelled term left behind, and must not fail on a session of a closed loop.
        with contextlib.suppress(Exception):
            await api.close()
        await client.aclose()
