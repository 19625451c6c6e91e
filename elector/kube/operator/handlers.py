"""The operator's kopf handlers, on an explicit `kopf.OperatorRegistry` (never kopf's global one).

- login: kopf's own service-account / kubeconfig logins (or the one given, e.g. in tests); the
  credentials also go to the operator's small API client (`KubeApi`), so both use the same.
- startup: settings for a minimal footprint (no namespace/CRD scanning, so no RBAC for them).
- an index of the pods of the watched namespaces: one shared watch (pods.py) for every watcher.
- a daemon per LeaderElection: `ElectionWatcher.run`, reading its candidates from that index.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from elector.kube.operator import pods, resource
from elector.kube.operator.kubeapi import KubeApi
from elector.kube.operator.metrics import OperatorMetrics
from elector.kube.operator.watcher import ElectionWatcher, WatchSettings

#: Gives credentials for the API server (kopf's login handler signature, simplified).
Login = Callable[[kopf.OperatorSettings], Awaitable[kopf.ConnectionInfo | None]]


async def default_login(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    """In a pod: its service account; elsewhere: $KUBECONFIG or ~/.kube/config."""
    info = kopf.login_with_service_account(settings=settings)
    return info if info is not None else kopf.login_with_kubeconfig(settings=settings)


def post_event(obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
    """kopf's public Event poster (queued, posted in the background with back-off)."""
    kopf.event(obj, type=type, reason=reason, message=message[:1024])  # type: ignore[arg-type]


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """What every `elector operator` needs, also when another program embeds the registry."""
    # Scanning watches namespaces and CRDs: more RBAC, for nothing (namespaces are given, and
    # the CRD ships with the chart before the operator starts).
    settings.scanning.disabled = True
    # Our Events are explicit; kopf's own log lines need not become Events.
    settings.posting.level = logging.WARNING
    # The daemons keep no progress in the objects: no annotations for kopf's bookkeeping.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="elector.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="elector.io")


def build_handlers(
    *,
    api: KubeApi,
    metrics: OperatorMetrics,
    watch: WatchSettings | None = None,
    login: Login | None = None,
) -> kopf.OperatorRegistry:
    """A registry with the operator's handlers; run it with `kopf.operator(registry=...)`."""
    registry = kopf.OperatorRegistry()
    watch_settings = watch or WatchSettings()
    get_credentials = login or default_login

    @kopf.on.login(registry=registry)
    async def _login(*, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
        info = await get_credentials(settings)
        if info is not None:
            api.set_credentials(info)
        return info

    @kopf.on.startup(registry=registry)
    async def _startup(*, settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(**_: Any) -> None:
        await api.close()

    @kopf.index("", "v1", "pods", registry=registry, id=pods.INDEX_ID)
    def _index_pod(*, body: kopf.Body, **_: Any) -> dict[str, pods.Pod]:
        return pods.pod_entry(body)

    @kopf.daemon(
        resource.GROUP,
        resource.VERSION,
        resource.PLURAL,
        registry=registry,
        id="watch-lock",
        # Cancel at once when the object goes or the operator stops: the watcher has nothing
        # to finish (the next leader's watcher starts from the status it wrote).
        cancellation_timeout=5.0,
    )
    async def _watch(
        *, body: kopf.Body, logger: logging.Logger | logging.LoggerAdapter[Any], **kwargs: Any
    ) -> None:
        watcher = ElectionWatcher(
            body=body,
            api=api,
            # kopf's live index, filled before any daemon starts (kopf waits for every index).
            pod_index=kwargs[pods.INDEX_ID],
            metrics=metrics,
            post_event=post_event,
            logger=logger,
            settings=watch_settings,
        )
        await watcher.run()

    return registry
