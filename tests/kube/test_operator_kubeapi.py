"""The operator's small Kubernetes API client: every failure is a KubeApiError, sessions do not pile up.

A real aiohttp server on 127.0.0.1 plays the API server, answering what kmock cannot be made to
answer (a 200 that is not JSON, a 401 until a re-login).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import kopf
import pytest
from aiohttp import web

from elector.kube.operator.kubeapi import KubeApi, KubeApiError


@dataclass
class FakeApiServer:
    url: str
    #: The Authorization header of every request, in order.
    seen_tokens: list[str | None] = field(default_factory=list)


@pytest.fixture
async def api_server() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer(url="")

    async def not_json(_: web.Request) -> web.Response:
        return web.Response(status=200, text="<html>a proxy's error page</html>", content_type="text/html")

    async def needs_fresh_token(request: web.Request) -> web.Response:
        token = request.headers.get("Authorization")
        server.seen_tokens.append(token)
        if token != "Bearer fresh":
            return web.json_response({"kind": "Status", "message": "Unauthorized"}, status=401)
        return web.json_response({"kind": "PodList", "items": []})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/apps/configmaps", not_json)
    app.router.add_get("/api/v1/namespaces/apps/pods", needs_fresh_token)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


async def test_an_answer_that_is_not_json_is_a_kube_api_error(api_server: FakeApiServer) -> None:
    api = KubeApi()
    api.set_credentials(kopf.ConnectionInfo(server=api_server.url, insecure=True))
    try:
        with pytest.raises(KubeApiError, match="not JSON") as info:
            await api.request("GET", "/api/v1/namespaces/apps/configmaps")
        assert info.value.status == 200
    finally:
        await api.close()


@pytest.mark.parametrize(
    "info",
    [
        kopf.ConnectionInfo(server="https://127.0.0.1:1", ca_data="%%% not base64 %%%"),
        kopf.ConnectionInfo(server="https://127.0.0.1:1", ca_data=base64.b64encode(b"not a certificate")),
        kopf.ConnectionInfo(server="https://127.0.0.1:1", ca_path="/nonexistent/ca.crt"),
        kopf.ConnectionInfo(
            server="https://127.0.0.1:1",
            certificate_data="-----BEGIN CERTIFICATE-----\nc2VjcmV0LWNlcnQ=\n-----END CERTIFICATE-----\n",
            private_key_data="-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleQ==\n-----END PRIVATE KEY-----\n",
        ),
    ],
    ids=["ca-not-base64", "ca-not-a-certificate", "ca-file-missing", "client-cert-garbage"],
)
async def test_bad_tls_material_from_the_login_is_a_kube_api_error(info: kopf.ConnectionInfo) -> None:
    api = KubeApi()
    api.set_credentials(info)
    try:
        with pytest.raises(KubeApiError, match="cannot set up TLS") as raised:
            await api.request("GET", "/api/v1/namespaces/apps/pods")
        message = str(raised.value)
        # What kind of problem, never the material itself.
        assert "c2VjcmV0" not in message and "not base64" not in message and "nonexistent" not in message
    finally:
        await api.close()


async def test_a_relogin_retires_the_old_session_once_its_request_is_done(api_server: FakeApiServer) -> None:
    logins = 0

    async def relogin() -> kopf.ConnectionInfo:
        nonlocal logins
        logins += 1
        return kopf.ConnectionInfo(server=api_server.url, insecure=True, token="fresh")

    api = KubeApi(relogin=relogin)
    api.set_credentials(kopf.ConnectionInfo(server=api_server.url, insecure=True, token="stale"))
    try:
        await api.request("GET", "/api/v1/namespaces/apps/pods")  # 401, re-login, retried: 200
        assert api_server.seen_tokens == ["Bearer stale", "Bearer fresh"]
        assert logins == 1
        # The stale session was closed as soon as its request ended, not kept until close().
        assert not api._retired and api._session is not None and not api._session.closed
        first = api._session
        for _ in range(3):  # rotated credentials many times: still nothing piles up
            api.set_credentials(kopf.ConnectionInfo(server=api_server.url, insecure=True, token="stale"))
            await api.request("GET", "/api/v1/namespaces/apps/pods")
        assert logins == 4 and not api._retired and not api._in_flight
        assert first.closed
    finally:
        await api.close()
