"""Helpers for kopf against the kmock Kubernetes API emulator (fixtures: tests/kube/conftest.py).

    registry = kopf.OperatorRegistry()
    login_to(kmock, registry=registry)                  # kopf talks to this emulator
    settings = kopf_test_settings()                      # scanning off: kmock lacks namespace listing
    seed_object(kmock, "v1/configmaps", "default", "c1", data={"k": "v"})    # before kopf starts
    await create_object(kmock, "v1/configmaps", "default", "c2")             # seen by live watches

kmock's gaps (see shared/notes/test-infra.md): no 409 conflicts, no PUT, and every watch replays
all objects first, so handlers run at least once per object, not exactly once: assert that.
Objects need metadata.uid and metadata.resourceVersion for kopf: these helpers always set them.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import aiohttp
import kmock
import kopf

_versions = itertools.count(1)


def login_to(emulator: kmock.KubernetesEmulator, *, registry: kopf.OperatorRegistry) -> None:
    """Register a kopf login handler in `registry` that points kopf at `emulator` (plain HTTP)."""
    url = str(emulator.url)

    @kopf.on.login(registry=registry)
    def _login_to_kmock(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url, insecure=True)


def kopf_test_settings() -> kopf.OperatorSettings:
    """kopf settings that work against kmock: no cluster scanning, short idle times, no k8s events."""
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True  # GET /api/v1/namespaces (and CRD scans) fail on kmock
    settings.posting.enabled = False  # handler logs would become Event objects in the emulator
    settings.queueing.idle_timeout = 0.5  # fewer idle workers lingering at exit
    settings.watching.reconnect_backoff = 0.2
    return settings


def declare_resource(
    emulator: kmock.KubernetesEmulator,
    resource: str,
    *,
    kind: str,
    namespaced: bool = True,
    subresources: tuple[str, ...] = ("status",),
) -> None:
    """Make a custom resource ("group/version/plural") discoverable, as an installed CRD would."""
    emulator.resources[resource] = kmock.ResourceInfo(
        kind=kind,
        namespaced=namespaced,
        verbs={"get", "list", "watch", "create", "patch", "delete"},
        subresources=set(subresources),
    )


def object_body(
    resource: str,
    namespace: str | None,
    name: str,
    *,
    kind: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A full object: apiVersion, kind, and metadata with a fresh uid and a resourceVersion."""
    group_version, _, plural = resource.rpartition("/")
    metadata: dict[str, Any] = {
        "name": name,
        "uid": str(uuid.uuid4()),
        "resourceVersion": str(next(_versions)),
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if namespace is not None:
        metadata["namespace"] = namespace
    kind = kind or _guess_kind(plural)
    return {"apiVersion": group_version, "kind": kind, "metadata": metadata, **fields}


def seed_object(
    emulator: kmock.KubernetesEmulator, resource: str, namespace: str | None, name: str, **kwargs: Any
) -> dict[str, Any]:
    """Store an object directly (no watch event: use before kopf starts); returns its body."""
    body = object_body(resource, namespace, name, **kwargs)
    emulator.objects[resource, namespace, name] = body
    return body


async def create_object(
    emulator: kmock.KubernetesEmulator, resource: str, namespace: str | None, name: str, **kwargs: Any
) -> dict[str, Any]:
    """Create an object through the API (POST), so that running watches see it as ADDED."""
    body = object_body(resource, namespace, name, **kwargs)
    # A bounded wait: a stuck emulator fails the test with a message instead of hanging it.
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        response = await session.post(f"{emulator.url}{collection_path(resource, namespace)}", json=body)
        response.raise_for_status()
        created: dict[str, Any] = await response.json()
    return created


def collection_path(resource: str, namespace: str | None) -> str:
    """The API path of a resource's collection: /api/v1/namespaces/ns/pods, /apis/g/v/plural."""
    group_version, _, plural = resource.rpartition("/")
    root = "/api/" + group_version if "/" not in group_version else "/apis/" + group_version
    return f"{root}/namespaces/{namespace}/{plural}" if namespace is not None else f"{root}/{plural}"


def _guess_kind(plural: str) -> str:
    known = {"configmaps": "ConfigMap", "pods": "Pod", "events": "Event", "secrets": "Secret"}
    return known.get(plural, plural.removesuffix("s").capitalize())
