"""kmock with the API server's optimistic concurrency for Leases, for the Lease mirror's tests.

kmock 0.8 stores objects as posted and patched: it gives no resourceVersion of its own, checks
none, and has no PUT (update). Leases are what client-go and the operator write with PUT and a
resourceVersion precondition, so `LeaseEmulator` adds exactly that for `leases`, as the real API
server does it:
- every create and write of a Lease gets a new resourceVersion (and a create a uid);
- PUT replaces the object; a resourceVersion in the body that is not the current one is a
  409 Conflict; a PUT of a missing Lease is a 404;
- a create of an existing Lease is a 409 AlreadyExists (kmock's own).
Every PUT's outcome is recorded in `lease_puts` (status codes), to assert a conflict happened.
With `forbidden` set, every Lease request is refused with 403 (an operator without the RBAC rule)
and counted in `lease_refused`.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import aiohttp.web
import attrs
import pytest

from tests.kube.operator_fixtures import NAMESPACE, NamingEmulator

LEASES = "coordination.k8s.io/v1/leases"
_resource_versions = itertools.count(1000)


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message}
    return aiohttp.web.json_response(body, status=code)


@attrs.define(kw_only=True)
class LeaseEmulator(NamingEmulator):
    lease_puts: list[int] = attrs.field(factory=list)
    forbidden: bool = False
    lease_refused: int = 0

    async def _handle(self, request: Any) -> Any:
        is_lease = request.resource is not None and request.resource.plural == "leases"
        if is_lease and self.forbidden:
            self.lease_refused += 1
            return _status(403, "Forbidden", "leases.coordination.k8s.io is forbidden: no RBAC rule")
        if is_lease and request.method == "PUT" and request.name:
            return await self._put(request)
        if is_lease and request.method in ("POST", "PATCH") and isinstance(request.data, dict):
            # A fresh resourceVersion on every write (in a merge patch it simply replaces the old).
            meta = request.data.setdefault("metadata", {})
            meta["resourceVersion"] = str(next(_resource_versions))
            if request.method == "POST":
                meta.setdefault("uid", str(uuid.uuid4()))
        return await super()._handle(request)

    async def _put(self, request: Any) -> aiohttp.web.StreamResponse:
        data = request.data if isinstance(request.data, dict) else {}
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                self.lease_puts.append(404)
                return _status(404, "NotFound", f'leases.coordination.k8s.io "{request.name}" not found')
            current = self._objects[key].raw
            current_meta = current.get("metadata") or {}
            sent = (data.get("metadata") or {}).get("resourceVersion")
            if sent is not None and sent != current_meta.get("resourceVersion"):
                self.lease_puts.append(409)
                return _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on leases.coordination.k8s.io "{request.name}": '
                    "the object has been modified; please apply your changes to the latest version",
                )
            replaced = {**data}
            replaced["metadata"] = {
                **(data.get("metadata") or {}),
                "uid": current_meta.get("uid"),
                "resourceVersion": str(next(_resource_versions)),
            }
            self._objects[key].delete()
            self._objects[key].create(replaced)
            self.lease_puts.append(200)
            return aiohttp.web.json_response(self._objects[key].raw)


LEASE_KMOCK = pytest.mark.kmock(cls=LeaseEmulator)


def lease(cluster_mock: Any, name: str) -> dict[str, Any] | None:
    """The Lease as stored (None when missing or deleted)."""
    key = (LEASES, NAMESPACE, name)
    try:
        obj = cluster_mock.objects[key]
    except KeyError:
        return None
    return None if obj.deleted else dict(obj.raw)
