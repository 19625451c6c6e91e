from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from elector.daemon.http import (
    HttpApp,
    HttpBindError,
    HttpServer,
    HttpSettings,
    make_http_app,
    parse_http_address,
)
from elector.daemon.http_compat import make_compat_app
from elector.election.outcome import CycleOutcome, OutcomeKind, State
from elector.lease import Holder
from elector.telemetry.metrics import ElectionMetrics
from tests.support.fake_status import FakeStatus as SharedFakeStatus

ME = Holder(identity="pod-a", fencing_token=7)
OTHER = Holder(identity="pod-b", fencing_token=8)


class FakeStatus(SharedFakeStatus):
    def __init__(self) -> None:
        super().__init__(
            holder=OTHER, lease_remaining_s=4.2, last_backend_ok_at=99.0, cycle_due_by=101.0, backend_up=True
        )

    def lead(self) -> None:
        self.set(state=State.LEADER, is_leader=True, holder=ME, fencing_token=7, lease_remaining_s=9.5)


@pytest.fixture
def status() -> FakeStatus:
    return FakeStatus()


@pytest.fixture
def registry(status: FakeStatus) -> CollectorRegistry:
    registry = CollectorRegistry()
    metrics = ElectionMetrics(registry, lock="jobs", status=status)
    metrics.observe(CycleOutcome(kind=OutcomeKind.HELD, state=State.FOLLOWER, at=1.0, holder=OTHER))
    return registry


@pytest.fixture
def app(status: FakeStatus, registry: CollectorRegistry) -> HttpApp:
    return make_http_app(status=status, registry=registry, liveness_grace_s=5.0, readiness_window_s=10.0)


@pytest.fixture
async def server(app: HttpApp) -> AsyncIterator[HttpServer]:
    server = HttpServer(app, settings=HttpSettings(host="127.0.0.1", port=0))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(server: HttpServer) -> AsyncIterator[aiohttp.ClientSession]:
    """A real HTTP client (aiohttp's, from the dev dependencies) against the real server."""
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{server.bound_port}") as client:
        yield client


Client = aiohttp.ClientSession


# --- probes ----------------------------------------------------------------------------------


async def test_healthz_ok_while_the_loop_turns_even_without_redis(client: Client, status: FakeStatus) -> None:
    status.set(backend_up=False, last_backend_ok_at=None, cycle_due_by=103.0)
    resp = await client.get("/healthz")
    assert resp.status == 200
    assert await resp.json() == {"status": "ok"}
    assert resp.headers["Cache-Control"] == "no-store"
    status.set(cycle_due_by=96.0)  # overdue, but within the 5 s grace
    assert (await client.get("/healthz")).status == 200


async def test_healthz_fails_when_the_loop_is_stuck_or_not_started(
    client: Client, status: FakeStatus
) -> None:
    status.set(cycle_due_by=60.0)
    resp = await client.get("/healthz")
    assert resp.status == 503
    assert "40.0s overdue" in (await resp.json())["reason"]
    status.set(started=False, cycle_due_by=None)
    resp = await client.get("/healthz")
    assert resp.status == 503
    assert "not started" in (await resp.json())["reason"]


async def test_readyz_follows_the_last_redis_exchange(client: Client, status: FakeStatus) -> None:
    assert (await client.get("/readyz")).status == 200
    status.set(last_backend_ok_at=87.7)
    resp = await client.get("/readyz")
    assert resp.status == 503
    assert (await resp.json())["reason"] == "no successful Redis exchange for 12.3s"
    status.set(last_backend_ok_at=None)
    resp = await client.get("/readyz")
    assert resp.status == 503
    assert "yet" in (await resp.json())["reason"]
    status.set(started=False, last_backend_ok_at=99.0)
    assert (await client.get("/readyz")).status == 503


async def test_readyz_does_not_depend_on_the_role(client: Client, status: FakeStatus) -> None:
    status.lead()
    assert (await client.get("/readyz")).status == 200


async def test_leader_as_follower_and_as_leader(client: Client, status: FakeStatus) -> None:
    resp = await client.get("/leader")
    assert resp.status == 503
    assert resp.headers["Cache-Control"] == "no-store"
    assert await resp.json() == {
        "lock": "jobs",
        "identity": "pod-a",
        "is_leader": False,
        "holder": "pod-b",
        "holder_fencing_token": 8,
        "fencing_token": None,
        "lease_remaining_ms": 4200,
        "state": "follower",
    }

    status.lead()
    resp = await client.get("/leader?lock=jobs")
    assert resp.status == 200
    body = await resp.json()
    assert body["is_leader"] is True
    assert body["fencing_token"] == 7
    assert body["holder"] == "pod-a"
    assert body["lease_remaining_ms"] == 9500
    assert body["state"] == "leader"

    status.set(holder=None, lease_remaining_s=None, is_leader=False, fencing_token=None)
    body = await (await client.get("/leader")).json()
    assert body["holder"] is None
    assert body["holder_fencing_token"] is None
    assert body["lease_remaining_ms"] is None


async def test_leader_of_another_lock_is_not_found(client: Client) -> None:
    resp = await client.get("/leader?lock=other")
    assert resp.status == 404
    assert "other" in (await resp.json())["reason"]
    assert (await client.get("/leader?lock=jobs&lock=other")).status == 404


async def test_head_is_answered_where_get_is(client: Client) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await client.head(path)).status == 200


async def test_metrics_exposition(client: Client, status: FakeStatus) -> None:
    resp = await client.get("/metrics")
    assert resp.status == 200
    text = await resp.text()
    assert 'elector_acquire_attempts_total{lock="jobs",result="held"} 1.0' in text
    assert 'elector_leader_info{holder="pod-b",lock="jobs"} 1.0' in text
    assert 'elector_is_leader{lock="jobs"} 0.0' in text
    status.lead()
    assert 'elector_is_leader{lock="jobs"} 1.0' in await (await client.get("/metrics")).text()
    resp = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert resp.status == 200
    assert (await resp.text()).rstrip().endswith("# EOF")


# --- errors ----------------------------------------------------------------------------------


async def test_unknown_path_and_wrong_method(client: Client) -> None:
    assert (await client.get("/nope")).status == 404
    resp = await client.post("/leader")
    assert resp.status == 405
    assert "GET" in resp.headers["Allow"]


@pytest.mark.parametrize(
    "path",
    [
        "/leader?lock=%zz",
        "/leader?%%%=&&=&lock",
        "/leader?lock=" + "x" * 4000,
        "/healthz?;;;",
        "/metrics?name[]=%ff&name[]=",
        "/readyz/",
    ],
)
async def test_malformed_queries_never_give_500(client: Client, path: str) -> None:
    resp = await client.get(path)
    assert resp.status in (200, 404, 503), await resp.text()


async def test_odd_headers_never_give_500(client: Client) -> None:
    for headers in (
        {"Accept": "*/*;q=abc, application/openmetrics-text;version=9"},
        {"Accept-Encoding": "gzip;q=x, br, zstd, \u00e9".encode().decode("latin-1")},
        {"Content-Length": "0", "Content-Type": "application/json; charset=bogus"},
        {"X-Forwarded-For": "::::", "Host": "[bad"},
    ):
        for path in ("/metrics", "/leader", "/healthz"):
            resp = await client.get(path, headers=headers)
            assert resp.status in (200, 503), (path, headers, resp.status)


async def test_a_failing_handler_answers_503_not_500(client: Client, status: FakeStatus) -> None:
    status.error = RuntimeError("status exploded")
    for path in ("/healthz", "/readyz", "/leader", "/metrics"):
        resp = await client.get(path)
        assert resp.status == 503
        assert (await resp.json())["status"] == "error"
        assert "exploded" not in await resp.text()  # details go to the log, not to the prober


async def test_raw_garbage_on_the_socket_never_gives_500(app: HttpApp) -> None:
    server = HttpServer(app, settings=HttpSettings(host="127.0.0.1", port=0))
    await server.start()
    try:
        for request in (
            b"GET /leader?lock=\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad\x01: \xff\r\n\r\n",
            b"BREW /healthz HTTP/1.1\r\n\r\n",
            b"GET //healthz HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET http://elsewhere/leader HTTP/1.1\r\nHost: x\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS hello
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
            writer.write(request)
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), timeout=1.0)
            writer.close()
            await writer.wait_closed()
            assert status_line.startswith(b"HTTP/1."), (request, status_line)
            assert status_line[9:12] != b"500", (request, status_line)
    finally:
        await server.stop()


# --- server ----------------------------------------------------------------------------------


async def test_server_binds_port_zero_and_serves(app: HttpApp) -> None:
    server = HttpServer(app, settings=HttpSettings(host="127.0.0.1", port=0))
    await server.start()
    try:
        assert server.bound_port > 0
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{server.bound_port}/healthz") as resp,
        ):
            assert resp.status == 200
    finally:
        await server.stop()
    await server.stop()  # idempotent
    with pytest.raises(RuntimeError):
        _ = server.bound_port


async def test_busy_port_gives_a_clear_bind_error(app: HttpApp) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = HttpServer(app, settings=HttpSettings(host="127.0.0.1", port=port))
        with pytest.raises(HttpBindError, match=f"cannot listen on 127.0.0.1:{port}") as info:
            await server.start()
        assert isinstance(info.value, OSError)
        with pytest.raises(RuntimeError):
            _ = server.bound_port


# --- addresses -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("0.0.0.0:8080", "0.0.0.0", 8080),
        ("127.0.0.1:0", "127.0.0.1", 0),
        (":8080", "0.0.0.0", 8080),
        ("[::]:8080", "::", 8080),
        ("[::1]:65535", "::1", 65535),
        ("localhost:9000", "localhost", 9000),
        ("elector.default.svc.cluster.local:80", "elector.default.svc.cluster.local", 80),
        (" 10.0.0.1:8080 ", "10.0.0.1", 8080),
    ],
)
def test_parse_http_address(text: str, host: str, port: int) -> None:
    assert parse_http_address(text) == HttpSettings(host=host, port=port)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("localhost", "no port"),
        ("8080", "no port"),
        ("localhost:", "non-numeric port"),
        ("localhost:http", "non-numeric port"),
        ("localhost:-1", "non-numeric port"),
        ("localhost:+80", "non-numeric port"),
        ("localhost:٨٠", "non-numeric port"),
        ("localhost:65536", "out of range"),
        ("localhost:99999999999", "out of range"),
        ("::1:8080", "brackets"),
        ("[nope]:8080", "invalid IPv6"),
        ("http://host:80", "invalid host"),
        ("bad host:80", "invalid host"),
        ("-bad-:80", "invalid host"),
    ],
)
def test_parse_http_address_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_http_address(text)
    assert "e.g. 0.0.0.0:8080" in str(info.value) or "out of range" in str(info.value)


def test_settings_reject_out_of_range_ports() -> None:
    with pytest.raises(ValueError, match="70000"):
        HttpSettings(port=70000)
    assert HttpSettings(host="::", port=80).address == "[::]:80"


# --- the leader-elector compatibility listener ---------------------------------------------------


@pytest.fixture
async def compat(status: FakeStatus) -> AsyncIterator[Client]:
    server = HttpServer(make_compat_app(status=status), settings=HttpSettings(host="127.0.0.1", port=0))
    await server.start()
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{server.bound_port}") as client:
            yield client
    finally:
        await server.stop()


async def test_compat_listener_names_the_holder_as_leader_elector_did(
    compat: Client, status: FakeStatus
) -> None:
    async def name(path: str = "/") -> bytes:
        return await (await compat.get(path)).read()

    resp = await compat.get("/")
    assert resp.status == 200 and resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert await resp.read() == b'{"name":"pod-b"}'  # the holder as observed, while following
    status.lead()
    assert await name() == b'{"name":"pod-a"}'
    status.set(state=State.FOLLOWER, is_leader=False, holder=None, lease_remaining_s=None)
    assert await name() == b'{"name":""}'
    status.set(holder=OTHER, lease_remaining_s=0.0)  # the holder's lease was seen to run out
    assert await name() == b'{"name":""}'
    assert await name("/healthz") == b'{"name":""}'  # every path, as leader-elector
