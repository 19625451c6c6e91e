"""The HTTP protocol layer (elector/daemon/http_server.py, h11 on asyncio streams): framing,
keep-alive, HEAD, bodies, malformed requests, compression, and the connection limits."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from elector.daemon.http import (
    MAX_HEAD_BYTES,
    HttpApp,
    HttpServer,
    HttpSettings,
    Request,
    Response,
    json_response,
    metrics_handler,
)

Raw = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def echo(request: Request) -> Response:
    return json_response({"method": request.method, "path": request.path, "query": dict(request.query)})


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    big = Counter("big", "A family with many series", ["n"], registry=registry)
    for n in range(300):
        big.labels(n=str(n)).inc(n)
    return registry


async def serve(registry: CollectorRegistry, **settings: float) -> HttpServer:
    app = HttpApp({"/echo": echo, "/metrics": metrics_handler(registry)})
    server = HttpServer(app, settings=HttpSettings(host="127.0.0.1", port=0, **settings))  # type: ignore[arg-type]
    await server.start()
    return server


@pytest.fixture
async def server(registry: CollectorRegistry) -> AsyncIterator[HttpServer]:
    server = await serve(registry)
    yield server
    await server.stop()


async def connect(server: HttpServer) -> Raw:
    return await asyncio.open_connection("127.0.0.1", server.bound_port)


async def exchange(raw: Raw, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one request; its status, headers (lower-case names) and Content-Length body."""
    reader, writer = raw
    writer.write(request)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    length = int(headers.get("content-length", "0"))
    head_only = request.startswith(b"HEAD ")
    body = b"" if head_only else await asyncio.wait_for(reader.readexactly(length), timeout=5)
    return int(status_line.split()[1]), headers, body


async def closed_by_server(reader: asyncio.StreamReader, *, within_s: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), timeout=within_s) == b""
    except ConnectionResetError:
        return True


def get(target: str, *extra: str) -> bytes:
    return "\r\n".join([f"GET {target} HTTP/1.1", "Host: x", *extra, "", ""]).encode()


async def test_keep_alive_serves_several_requests_on_one_connection(server: HttpServer) -> None:
    raw = await connect(server)
    for n in range(3):
        status, headers, body = await exchange(raw, get(f"/echo?n={n}&n=x&blank="))
        assert status == 200
        assert headers["content-type"] == "application/json; charset=utf-8"
        assert body == b'{"method": "GET", "path": "/echo", "query": {"n": ["%d", "x"], "blank": [""]}}' % n
    raw[1].close()


async def test_head_has_the_get_headers_and_no_body(server: HttpServer) -> None:
    raw = await connect(server)
    _, get_headers, body = await exchange(raw, get("/metrics"))
    status, headers, _ = await exchange(raw, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and headers["content-length"] == get_headers["content-length"] == str(len(body))
    # The connection is still in step: the next answer is the next request's, not a stray body.
    status, _, body = await exchange(raw, get("/echo?after=head"))
    assert status == 200 and b"after" in body
    raw[1].close()


async def test_paths_are_percent_decoded_and_absolute_targets_understood(server: HttpServer) -> None:
    raw = await connect(server)
    assert (await exchange(raw, get("/%65cho")))[0] == 200
    assert (await exchange(raw, get("http://elsewhere/echo?a=1")))[0] == 200
    assert (await exchange(raw, get("/echo/")))[0] == 404
    raw[1].close()


async def test_a_request_body_is_skipped_and_the_connection_kept(server: HttpServer) -> None:
    raw = await connect(server)
    request = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    status, headers, body = await exchange(raw, request)
    assert status == 405 and headers["allow"] == "GET, HEAD" and body == b"405: Method Not Allowed"
    assert (await exchange(raw, get("/echo")))[0] == 200
    raw[1].close()


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason"),
    [
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, b"illegal request line"),
        (b"GET /echo HTTP/1.1\r\n\r\n", 400, b"Host"),
        (b"GET /echo HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n", 400, b"illegal header line"),
        (b"GET /echo HTTP/1.1\r\nHost: x\r\nX: " + b"v" * 4 * MAX_HEAD_BYTES + b"\r\n\r\n", 431, b""),
    ],
)
async def test_malformed_requests_get_a_4xx_with_the_reason(
    server: HttpServer, request_bytes: bytes, status: int, reason: bytes
) -> None:
    reader, writer = raw = await connect(server)
    got, headers, body = await exchange(raw, request_bytes)
    assert got == status and headers["connection"] == "close"
    assert body.startswith(b"%d: " % status) and reason in body
    assert await closed_by_server(reader, within_s=5)
    writer.close()


async def test_metrics_are_compressed_when_the_scraper_offers_it(server: HttpServer) -> None:
    raw = await connect(server)
    _, plain_headers, plain = await exchange(raw, get("/metrics"))
    assert "content-encoding" not in plain_headers and b'big_total{n="299"} 299.0' in plain
    _, headers, body = await exchange(raw, get("/metrics", "Accept-Encoding: br;q=1, gzip"))
    assert headers["content-encoding"] == "gzip" and gzip.decompress(body) == plain
    assert len(body) < len(plain) / 3
    _, headers, body = await exchange(raw, get("/metrics", "Accept-Encoding: deflate, gzip;q=0"))
    assert headers["content-encoding"] == "deflate" and zlib.decompress(body) == plain
    _, headers, _ = await exchange(raw, get("/metrics", "Accept-Encoding: gzip;q=0, deflate;q=x"))
    assert "content-encoding" not in headers
    raw[1].close()


async def test_a_silent_connection_is_closed_after_the_idle_timeout(registry: CollectorRegistry) -> None:
    server = await serve(registry, idle_timeout_s=0.3)
    try:
        reader, writer = raw = await connect(server)
        assert (await exchange(raw, get("/echo")))[0] == 200
        writer.write(b"GET /ec")  # and never the rest
        assert await closed_by_server(reader, within_s=10)
        writer.close()
    finally:
        await server.stop()


async def test_at_the_cap_the_connection_waiting_longest_is_shed_for_the_new_one(
    registry: CollectorRegistry,
) -> None:
    """A slowloris crowd cannot lock probes out: a new connection always gets a slot."""
    server = await serve(registry, max_connections=2)
    try:
        first, second = [await connect(server) for _ in range(2)]
        for raw in (first, second):  # both registered; `first` has waited on its client longest
            assert (await exchange(raw, get("/echo")))[0] == 200
        newest = await connect(server)
        assert (await exchange(newest, get("/echo")))[0] == 200
        assert await closed_by_server(first[0], within_s=5)
        assert (await exchange(second, get("/echo")))[0] == 200  # the younger one was kept
        assert (server.stats.shed, server.stats.deferred, server.stats.peak) == (1, 0, 2)
        for raw in (first, second, newest):
            raw[1].close()
    finally:
        await server.stop()


async def test_at_the_cap_a_new_connection_waits_while_every_open_one_is_being_answered() -> None:
    """Nothing is cut in the middle of its handler: the new connection waits in the kernel's
    queue until a slot can be had, and is served then."""
    release = asyncio.Event()
    inside: list[Request] = []
    both_inside = asyncio.Event()

    async def slow(request: Request) -> Response:
        inside.append(request)
        if len(inside) == 2:
            both_inside.set()
        await release.wait()
        return json_response({"slow": True})

    server = HttpServer(
        HttpApp({"/slow": slow, "/echo": echo}),
        settings=HttpSettings(host="127.0.0.1", port=0, max_connections=2),
    )
    await server.start()
    try:
        busy = [await connect(server) for _ in range(2)]
        for _, writer in busy:
            writer.write(get("/slow"))
        await asyncio.wait_for(both_inside.wait(), timeout=10)
        waiting = await connect(server)
        waiting[1].write(get("/echo"))
        answer = asyncio.ensure_future(waiting[0].readuntil(b"\r\n\r\n"))
        await asyncio.sleep(0.5)
        assert not answer.done() and server.stats.deferred == 1 and server.stats.open == 2
        release.set()
        for raw in busy:
            head = await asyncio.wait_for(raw[0].readuntil(b"\r\n\r\n"), timeout=5)
            assert head.startswith(b"HTTP/1.1 200")
        assert (await asyncio.wait_for(answer, timeout=5)).startswith(b"HTTP/1.1 200")
        assert server.stats.peak == 2 and server.stats.shed == 1  # the longest idle made room
        for raw in [*busy, waiting]:
            raw[1].close()
    finally:
        await server.stop()


async def test_a_fresh_connection_is_read_before_a_flood_of_newer_ones_can_push_it_out(
    registry: CollectorRegistry,
) -> None:
    """A probe among a flood: each connection gets its first read before it may be cut."""
    server = await serve(registry, max_connections=4)
    try:
        flood = [await connect(server) for _ in range(4)]
        for raw in flood:
            raw[1].write(b"GET /ec")  # heads under way, never finished: cut first
        probe = await connect(server)
        probe[1].write(get("/echo"))
        more = [await connect(server) for _ in range(20)]  # silent: fresh, then cut after a grace
        assert (await exchange(probe, b""))[0] == 200
        assert server.stats.peak == 4 and server.stats.shed >= 4
        for raw in [*flood, probe, *more]:
            raw[1].close()
    finally:
        await server.stop()


async def test_pipelined_requests_share_the_loop_with_other_connections(registry: CollectorRegistry) -> None:
    """A connection whose requests are all buffered answers REQUESTS_PER_TURN, then lets others in
    (before, it answered every buffered request without the loop ever turning)."""
    served: list[str] = []

    async def record(request: Request) -> Response:
        served.append(request.query["who"][0])
        return json_response({})

    server = HttpServer(HttpApp({"/r": record}), settings=HttpSettings(host="127.0.0.1", port=0))
    await server.start()
    try:
        hog, probe = await connect(server), await connect(server)
        hog[1].write(get("/r?who=hog") * 2000)
        await hog[1].drain()
        probe[1].write(get("/r?who=probe"))
        await probe[1].drain()
        assert (await asyncio.wait_for(probe[0].readuntil(b"\r\n\r\n"), timeout=10)).startswith(
            b"HTTP/1.1 200"
        )
        hog_after_probe = len(served) - 1 - served.index("probe")
        # Some of the hog's requests were still waiting when the probe was answered.
        assert served.count("hog") < 2000 or hog_after_probe > 0, served.index("probe")
        for raw in (hog, probe):
            raw[1].close()
    finally:
        await server.stop()


async def test_stop_closes_open_connections(registry: CollectorRegistry) -> None:
    server = await serve(registry)
    reader, writer = raw = await connect(server)
    assert (await exchange(raw, get("/echo")))[0] == 200
    await server.stop()
    assert await closed_by_server(reader, within_s=5)
    writer.close()
