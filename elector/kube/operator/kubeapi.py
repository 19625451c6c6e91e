"""A small Kubernetes API client for what kopf does not do for us: pod labels, secrets, status patches.

kopf has no public generic client. Rather than a second full client library (kr8s,
kubernetes_asyncio) with its own configuration loading, this uses aiohttp (already a dependency)
with the very `kopf.ConnectionInfo` that the operator's login handler gave kopf: one source of
credentials, one set of RBAC rules, and kmock in tests serves both. Only JSON merge patches
(the emulator does no strategic merge), GET and LIST are needed.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf

from elector.kube.operator import resource

#: Re-login hook: returns fresh credentials (a rotated service-account token) or None.
Relogin = Callable[[], Awaitable[kopf.ConnectionInfo | None]]


class KubeApiError(Exception):
    """A Kubernetes API request failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    context = ssl.create_default_context()
    if info.ca_path:
        context.load_verify_locations(cafile=os.fsdecode(info.ca_path))
    elif info.ca_data:
        data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
        if "BEGIN CERTIFICATE" not in data:
            data = base64.b64decode(data).decode()
        context.load_verify_locations(cadata=data)
    cert, key = info.certificate_path, info.private_key_path
    with tempfile.TemporaryDirectory() as tmp:
        # ssl only loads client certificates from files: write inline ones to a private temp dir.
        if info.certificate_data:
            cert = os.path.join(tmp, "cert.pem")
            _write_pem(cert, info.certificate_data)
        if info.private_key_data:
            key = os.path.join(tmp, "key.pem")
            _write_pem(key, info.private_key_data)
        if cert:
            context.load_cert_chain(os.fsdecode(cert), os.fsdecode(key) if key else None)
    return context


def _write_pem(path: str, data: str | bytes) -> None:
    raw = data.encode() if isinstance(data, str) else data
    if b"-----BEGIN" not in raw:
        raw = base64.b64decode(raw)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)


class KubeApi:
    """Requests to one API server with the operator's credentials (set by the login handler)."""

    def __init__(self, *, request_timeout_s: float = 10.0, relogin: Relogin | None = None) -> None:
        self._info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._relogin = relogin
        #: Sessions of replaced credentials: each is closed once its last request is done.
        self._retired: set[aiohttp.ClientSession] = set()
        #: Requests under way, per session.
        self._in_flight: dict[aiohttp.ClientSession, int] = {}

    @property
    def ready(self) -> bool:
        return self._info is not None

    def set_credentials(self, info: kopf.ConnectionInfo) -> None:
        """Use these credentials from now on (called by the login handler, also on re-login)."""
        self._info = info
        if self._session is not None:
            session, self._session = self._session, None
            self._retired.add(session)

    async def close(self) -> None:
        sessions = [s for s in (self._session, *self._retired) if s is not None]
        self._session, self._retired = None, set()
        for session in sessions:
            await session.close()

    async def _close_idle_retired(self) -> None:
        """Close the retired sessions no request uses any more (so that re-logins do not pile up)."""
        idle = [s for s in self._retired if not self._in_flight.get(s)]
        for session in idle:
            self._retired.discard(session)
            await session.close()

    def _session_for(self, info: kopf.ConnectionInfo) -> aiohttp.ClientSession:
        if self._session is None:
            try:
                ssl_context = _ssl_context(info)
            except (ssl.SSLError, OSError, ValueError) as exc:  # binascii.Error is a ValueError
                # Bad certificate data from the login (never shown: only what kind of problem).
                raise KubeApiError(
                    f"cannot set up TLS to the Kubernetes API with the login's certificates: "
                    f"{type(exc).__name__}"
                ) from None
            headers = {"Accept": "application/json", "User-Agent": "elector-operator"}
            auth = None
            if info.token:
                headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
            elif info.username and info.password:
                auth = aiohttp.BasicAuth(info.username, info.password)
            self._session = aiohttp.ClientSession(
                base_url=info.server.rstrip("/") + "/",
                headers=headers,
                auth=auth,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(ssl=ssl_context),
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        for attempt in (1, 2):
            info = self._info
            if info is None:
                raise KubeApiError("not logged in to the Kubernetes API yet")
            session = self._session_for(info)
            headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
            if body is not None and method in ("POST", "PUT"):
                headers = {"Content-Type": "application/json"}
            self._in_flight[session] = self._in_flight.get(session, 0) + 1
            try:
                async with session.request(
                    method,
                    path.lstrip("/"),
                    data=None if body is None else json.dumps(body),
                    params=params,
                    headers=headers,
                ) as response:
                    if response.status == 401 and attempt == 1 and self._relogin is not None:
                        fresh = await self._relogin()
                        if fresh is not None:
                            self.set_credentials(fresh)
                            continue
                    if response.status >= 400:
                        text = (await response.text())[:300]
                        raise KubeApiError(
                            f"{method} {path}: HTTP {response.status}: {_status_message(text)}",
                            status=response.status,
                        )
                    try:
                        return await response.json(content_type=None)
                    except ValueError:  # json.JSONDecodeError, UnicodeDecodeError
                        raise KubeApiError(
                            f"{method} {path}: HTTP {response.status}: the answer is not JSON",
                            status=response.status,
                        ) from None
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise KubeApiError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
            finally:
                left = self._in_flight.pop(session) - 1
                if left:
                    self._in_flight[session] = left
                if self._retired:
                    await self._close_idle_retired()
        raise KubeApiError(f"{method} {path}: unauthorized", status=401)

    # -- the requests the operator makes --------------------------------------------------------

    async def patch_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str | None]) -> None:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        await self.request("PATCH", path, body={"metadata": {"labels": dict(labels)}})

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        path = _election_path(namespace, name) + "/status"
        await self.request("PATCH", path, body={"status": dict(status)})

    async def patch_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        path = _election_path(namespace, name)
        await self.request("PATCH", path, body={"metadata": {"annotations": dict(annotations)}})

    async def read_secret_key(self, namespace: str, ref: resource.SecretKeyRef) -> str:
        """The text under `ref.key` of a Secret; errors name the Secret and key, never the value."""
        path = f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(ref.name)}"
        try:
            secret = await self.request("GET", path)
        except KubeApiError as exc:
            raise KubeApiError(
                f"cannot read Secret {ref.name}: HTTP {exc.status}", status=exc.status
            ) from None
        data = (secret.get("data") or {}) if isinstance(secret, dict) else {}
        if ref.key not in data:
            raise KubeApiError(f"Secret {ref.name} has no key {ref.key!r}")
        try:
            return base64.b64decode(data[ref.key], validate=True).decode("utf-8").rstrip("\r\n")
        except (ValueError, UnicodeDecodeError):
            raise KubeApiError(f"Secret {ref.name} key {ref.key!r} is not base64 UTF-8 text") from None


def _election_path(namespace: str, name: str) -> str:
    return f"/apis/{resource.API_VERSION}/namespaces/{quote(namespace)}/{resource.PLURAL}/{quote(name)}"


def _status_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text
    return str(data.get("message") or data.get("reason") or text) if isinstance(data, dict) else text
