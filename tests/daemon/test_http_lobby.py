"""The HTTP server's lobby and its answers given at once (elector/daemon/http_accept.py): a probe
queued behind a flood is served before it, and a `Connection: close` probe of a route that needs
no waiting is answered in the turn it is accepted, without a slot."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from elector.daemon.http import HttpApp, HttpServer, HttpSettings, Request, Response, json_response
from elector.daemon.http_accept import AT_ONCE_MAX_BYTES, PRIORITY_HEAD_BYTES, answer_at_once
from tests.daemon.test_http_server import Raw, closed_by_server, exchange, get


class Gate:
    """An app whose /slow route holds every request inside its handler until `release`, and
    whose /probe route answers from nothing (immediate); /echo records who asked, in order."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.inside = 0
        self.all_inside = asyncio.Event()
        self.expected_inside = 1
        self.served: list[str] = []

    async def slow(self, request: Request) -> Response:
        self.inside += 1
        if self.inside >= self.expected_inside:
            self.all_inside.set()
        await self.release.wait()
        return json_response({"slow": True})

    async def probe(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def echo(self, request: Request) -> Response:
        self.served.append(request.query["who"][0])
        return json_response({"who": request.query["who"][0]})

    def app(self) -> HttpApp:
        routes = {"/slow": self.slow, "/probe": self.probe, "/echo": self.echo, "/big": self.big}
        return HttpApp(routes, immediate=("/probe", "/big"))

    async def big(self, request: Request) -> Response:
        return Response(200, b"b" * (AT_ONCE_MAX_BYTES + 1))


async def start(app: HttpApp, *, max_connections: int) -> HttpServer:
    server = HttpServer(app, settings=HttpSettings(host="127.0.0.1", port=0, max_connections=max_connections))
    await server.start()
    return server


async def connect(server: HttpServer) -> Raw:
    return await asyncio.open_connection("127.0.0.1", server.bound_port)


async def fill_with_handlers(server: HttpServer, gate: Gate, count: int) -> list[Raw]:
    """`count` connections inside /slow's handler: none of them may be cut."""
    gate.expected_inside = count
    busy = [await connect(server) for _ in range(count)]
    for _, writer in busy:
        writer.write(get("/slow"))
    await asyncio.wait_for(gate.all_inside.wait(), timeout=10)
    return busy


def big_get(target: str) -> bytes:
    """A head above PRIORITY_HEAD_BYTES (and under the 8 KiB bound): served, not first."""
    return get(target, "X-Pad: " + "p" * (2 * PRIORITY_HEAD_BYTES))


async def test_a_closing_probe_is_answered_at_once_while_every_slot_is_held_in_its_handler() -> None:
    """Before the lobby it waited in the kernel's queue until a slot could be had."""
    gate = Gate()
    server = await start(gate.app(), max_connections=2)
    try:
        busy = await fill_with_handlers(server, gate, 2)
        for _ in range(3):
            probe = await connect(server)
            status, headers, body = await exchange(probe, get("/probe", "Connection: close"))
            assert (status, body) == (200, b'{"status": "ok"}')
            assert headers["connection"] == "close"
            assert await closed_by_server(probe[0], within_s=5)
            probe[1].close()
        assert server.stats.open == 2 and server.stats.peak == 2 and server.stats.shed == 0
        gate.release.set()
        for reader, writer in busy:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            assert head.startswith(b"HTTP/1.1 200")
            writer.close()
    finally:
        await server.stop()


async def test_a_small_complete_head_gets_the_next_slot_before_older_connections() -> None:
    gate = Gate()
    server = await start(gate.app(), max_connections=1)
    try:
        busy = await fill_with_handlers(server, gate, 1)
        big = []
        for n in range(3):
            raw = await connect(server)
            raw[1].write(big_get(f"/echo?who=big{n}"))
            big.append(raw)
        await asyncio.sleep(0.3)  # all three in the lobby, in arrival order
        small = await connect(server)
        small[1].write(get("/echo?who=small"))  # keep-alive: the ordinary way, with a slot
        await asyncio.sleep(0.3)
        gate.release.set()
        status, _, body = await exchange(small, b"")
        assert (status, body) == (200, b'{"who": "small"}')
        assert gate.served[0] == "small", gate.served
        for raw in [*busy, *big, small]:
            raw[1].close()
    finally:
        await server.stop()


async def test_a_full_lobby_cuts_its_oldest_connection_that_cannot_be_a_probe() -> None:
    gate = Gate()
    server = await start(gate.app(), max_connections=1)
    try:
        busy = await fill_with_handlers(server, gate, 1)
        partial = []
        for _ in range(3):  # heads begun, not ended: the lobby (1 place) keeps the newest
            raw = await connect(server)
            raw[1].write(b"GET /echo?who=partial HTTP/1.1\r\nHost: x\r\n")
            await raw[1].drain()
            partial.append(raw)
            await asyncio.sleep(0.1)
        for raw in partial[:2]:
            assert await closed_by_server(raw[0], within_s=5)
        assert server.stats.shed == 2
        probe = await connect(server)
        assert (await exchange(probe, get("/probe", "Connection: close")))[0] == 200
        gate.release.set()
        for raw in [*busy, *partial, probe]:
            raw[1].close()
    finally:
        await server.stop()


async def test_a_probe_that_writes_after_its_connect_is_answered_at_once_too() -> None:
    gate = Gate()
    server = await start(gate.app(), max_connections=1)
    try:
        busy = await fill_with_handlers(server, gate, 1)
        probe = await connect(server)
        await asyncio.sleep(0.3)  # accepted silent: watched until it writes
        assert (await exchange(probe, get("/probe", "Connection: close")))[0] == 200
        gate.release.set()
        for raw in [*busy, probe]:
            raw[1].close()
    finally:
        await server.stop()


@pytest.mark.parametrize(
    "request_bytes",
    [
        get("/probe"),  # keep-alive: its next request could race the close
        get("/probe", "Connection: close") * 2,  # pipelined
        get("/probe", "Connection: close", "Content-Length: 3") + b"abc",  # a body
        get("/echo?who=x", "Connection: close"),  # a route that is not immediate
        get("/big", "Connection: close"),  # an answer too big to be written at once
        b"GET /probe HTTP/1.1\r\nHost: x\r\nConnection: close\r\nBad header\r\n\r\n",  # malformed
    ],
)
def test_answer_at_once_leaves_other_requests_untouched(request_bytes: bytes) -> None:
    server_end, client_end = socket.socketpair()
    try:
        client_end.sendall(request_bytes)
        server_end.setblocking(False)
        peeked = server_end.recv(PRIORITY_HEAD_BYTES, socket.MSG_PEEK)
        assert not answer_at_once(server_end, peeked, Gate().app())
        assert server_end.recv(len(request_bytes)) == request_bytes  # nothing consumed
    finally:
        server_end.close()
        client_end.close()


def test_answer_at_once_answers_and_closes() -> None:
    server_end, client_end = socket.socketpair()
    try:
        client_end.sendall(b"HEAD /probe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        server_end.setblocking(False)
        assert answer_at_once(server_end, server_end.recv(PRIORITY_HEAD_BYTES, socket.MSG_PEEK), Gate().app())
        client_end.settimeout(5)
        answer = b""
        while chunk := client_end.recv(4096):
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 16" in head.lower()
        assert body == b""  # HEAD
    finally:
        server_end.close()
        client_end.close()


async def test_answer_now_answers_immediate_routes_404_and_405_only(caplog: pytest.LogCaptureFixture) -> None:
    async def waits(request: Request) -> Response:
        await asyncio.sleep(0)
        return json_response({})

    gate = Gate()
    app = HttpApp({"/probe": gate.probe, "/echo": gate.echo, "/waits": waits}, immediate=("/probe", "/waits"))

    def ask(method: str, path: str) -> Response | None:
        return app.answer_now(Request(method=method, path=path, query={}, headers={}))

    answer = ask("GET", "/probe")
    assert answer is not None and answer.status == 200
    assert ask("GET", "/echo") is None
    assert (ask("GET", "/nowhere") or Response(0)).status == 404
    assert (ask("POST", "/echo") or Response(0)).status == 405
    with caplog.at_level(logging.ERROR, logger="elector.http"):
        assert (ask("GET", "/waits") or Response(0)).status == 503  # declared immediate, is not
    assert "http_handler_not_immediate" in caplog.text
    with pytest.raises(ValueError, match="without a route"):
        HttpApp({"/probe": gate.probe}, immediate=("/elsewhere",))
