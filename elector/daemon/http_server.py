"""A small HTTP/1.1 server: h11 (python-hyper's protocol state machine) on asyncio streams.

h11 does all the parsing and framing (request line, headers, Content-Length and chunked bodies,
keep-alive, HEAD); this module only moves bytes, bounds what a client may cost, and hands each
request to an application: `async (Request) -> Response`. The limits:

- at most `max_connections` open at once; further ones are closed as soon as they are accepted;
- a request (line, headers and body) must arrive within `idle_timeout_s` of the connection's
  previous turn, or the connection is closed (slowloris);
- request heads above `MAX_HEAD_BYTES` get 431, a malformed request 400 with h11's reason;
  request bodies (no route reads one) are skipped up to `MAX_BODY_BYTES`, else the connection
  is closed after the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import http
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping

import h11

_MAX_PORT = 65535
#: Probes and scrapes need a handful of connections; beyond this many open at once, new ones
#: are closed at once, so that a flood of (slow) clients cannot take every file descriptor
#: the daemon needs for Redis.
DEFAULT_MAX_CONNECTIONS = 128
#: A connection that has not completed a request within this long is closed: it bounds how
#: long a slowloris client holds a descriptor.
DEFAULT_IDLE_TIMEOUT_S = 5.0
#: Request line and headers together; h11 answers more with 431 (its own default size).
MAX_HEAD_BYTES = 16 * 1024
#: A request body is read and dropped (to keep the connection) up to this size.
MAX_BODY_BYTES = 64 * 1024
#: Writing one answer (a /metrics exposition of a few MB) to a client that does not read it.
SEND_TIMEOUT_S = 30.0
#: After the last answer on a connection the client may still be sending (a body we did not
#: read): its input is drained this long before the close, so that the close is not a reset
#: that could destroy the answer in the client's receive buffer.
_LINGER_S = 1.0
#: h11 refuses a head once more than MAX_HEAD_BYTES of it are buffered unparsed; reading no more
#: at a time means no head much above twice that gets through.
_READ_SIZE = MAX_HEAD_BYTES
#: Longer than an accepted connection takes to reach its handler, unless the loop is starved.
_REGISTRATION_S = 0.1
#: How long `stop` lets a connection's handler finish an answer it is rendering.
_STOP_S = 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class HttpSettings:
    host: str = "0.0.0.0"
    #: 0 asks the system for a free port (see `HttpServer.bound_port`).
    port: int = 8080
    #: Most connections open at once; further ones are closed as soon as they are accepted.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: Close a connection idle (or still sending its request) for this long, seconds.
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0 <= self.port <= _MAX_PORT:
            raise ValueError(f"HTTP port {self.port} is out of range 0..{_MAX_PORT}")
        if self.max_connections < 1:
            raise ValueError(f"HTTP max connections must be at least 1, got {self.max_connections}")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"HTTP idle timeout must be positive, got {self.idle_timeout_s}")

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    method: str
    #: Percent-decoded (undecodable bytes replaced), without the query.
    path: str
    #: Every value of each query parameter, in order; blank values kept.
    query: Mapping[str, list[str]]
    #: Lower-case names; repeated headers joined with ", ".
    headers: Mapping[str, str]


@dataclasses.dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    #: Besides Content-Length, which the server sets.
    headers: tuple[tuple[str, str], ...] = ()


Application = Callable[[Request], Awaitable[Response]]


class HttpBindError(OSError):
    """The HTTP server could not listen on its address (in use, not permitted, unknown host)."""


def text_response(status: int, text: str, *, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, text.encode(), (("Content-Type", "text/plain; charset=utf-8"), *headers))


def _parse_request(event: h11.Request) -> Request:
    target = event.target.decode("latin-1")
    if not target.startswith("/"):  # absolute form (http://host/path), or `*`
        target = urllib.parse.urlsplit(target).path or "/"
    raw_path, _, raw_query = target.partition("?")
    query: dict[str, list[str]] = {}
    for name, value in urllib.parse.parse_qsl(raw_query, keep_blank_values=True, errors="replace"):
        query.setdefault(name, []).append(value)
    headers: dict[str, str] = {}
    for raw_name, raw_value in event.headers:
        key, text = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return Request(
        method=event.method.decode("latin-1"),
        path=urllib.parse.unquote(raw_path, errors="replace"),
        query=query,
        headers=headers,
    )


class _Refused(asyncio.Protocol):
    """Stands in for a connection over the limit: closes it as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Connection:
    """One client connection: requests in, answers out, until either side is done."""

    def __init__(
        self,
        app: Application,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        settings: HttpSettings,
        log: logging.Logger,
    ) -> None:
        self._app = app
        self._reader = reader
        self._writer = writer
        self._settings = settings
        self._log = log
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)

    async def _next_event(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        """The next event, reading as much as it needs (never NEED_DATA in fact: for mypy)."""
        while True:
            event = self._h11.next_event()
            if event is h11.NEED_DATA:
                # b"" at the end of the stream tells h11 the client closed.
                self._h11.receive_data(await self._reader.read(_READ_SIZE))
            else:
                return event

    async def serve(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self._settings.idle_timeout_s):
                    event = await self._next_event()
            except TimeoutError:
                return
            except h11.RemoteProtocolError as exc:
                await self._bad_request(exc)
                return
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed (or PAUSED after a protocol switch we never agree to)
            request = _parse_request(event)
            response = await self._app(request)
            await self._send(response, head_only=request.method == "HEAD")
            if not await self._skip_body() or self._h11.our_state is not h11.DONE:
                await self._linger()
                return
            self._h11.start_next_cycle()

    async def _bad_request(self, exc: h11.RemoteProtocolError) -> None:
        status = exc.error_status_hint
        # A scanner or a client's bug, not ours: DEBUG, so that nobody can flood the logs.
        self._log.debug("http_bad_request", extra={"status": status, "reason": str(exc)})
        if self._h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            phrase = http.HTTPStatus(status).phrase
            body = f"{status}: {phrase}: {exc}\n"
            await self._send(text_response(status, body, headers=(("Connection", "close"),)), head_only=False)
        await self._linger()

    async def _send(self, response: Response, *, head_only: bool) -> None:
        headers = [*response.headers, ("Content-Length", str(len(response.body)))]
        reason = http.HTTPStatus(response.status).phrase.encode()
        data = self._h11.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
        assert data is not None  # only None for ConnectionClosed
        self._writer.write(data)
        if response.body and not head_only:
            self._writer.write(self._h11.send(h11.Data(data=response.body)) or b"")
        self._writer.write(self._h11.send(h11.EndOfMessage()) or b"")
        async with asyncio.timeout(SEND_TIMEOUT_S):
            await self._writer.drain()

    async def _skip_body(self) -> bool:
        """Read and drop what is left of the request's body; False when too big, slow or bad."""
        skipped = 0
        try:
            async with asyncio.timeout(self._settings.idle_timeout_s):
                while self._h11.their_state is h11.SEND_BODY:
                    event = await self._next_event()
                    if isinstance(event, h11.Data):
                        skipped += len(event.data)
                        if skipped > MAX_BODY_BYTES:
                            return False
        except (TimeoutError, h11.RemoteProtocolError):
            return False
        return self._h11.their_state is h11.DONE

    async def _linger(self) -> None:
        """Close after the answer: stop sending, drop the client's remaining input for a moment."""
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            if self._writer.can_write_eof():
                self._writer.write_eof()
            async with asyncio.timeout(_LINGER_S):
                while await self._reader.read(_READ_SIZE):
                    pass


class _Slot:
    """One connection's share of `max_connections`, given back exactly once."""

    __slots__ = ("claimed", "released")

    def __init__(self) -> None:
        self.claimed = False
        self.released = False


class HttpServer:
    """Serves an application on one address until stopped."""

    def __init__(
        self, app: Application, *, settings: HttpSettings, logger: logging.Logger | None = None
    ) -> None:
        self._app = app
        self._settings = settings
        self._log = logging.getLogger("elector.http") if logger is None else logger
        self._server: asyncio.Server | None = None
        self._in_use = 0
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the HTTP server is already started")
        loop = asyncio.get_running_loop()
        limit = self._settings.max_connections

        def protocol() -> asyncio.Protocol:
            # Called at accept time, so a burst of accepts is counted before any handler runs.
            if self._in_use >= limit:
                return _Refused()
            slot = _Slot()
            self._in_use += 1
            # Should the connection never reach its handler (a transport that failed at once),
            # its slot is given back after a moment.
            loop.call_later(_REGISTRATION_S, lambda: None if slot.claimed else self._release(slot))
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(), functools.partial(self._serve, slot))

        try:
            self._server = await loop.create_server(protocol, self._settings.host, self._settings.port)
        except OSError as exc:
            raise HttpBindError(
                exc.errno, f"cannot listen on {self._settings.address}: {exc.strerror or exc}"
            ) from exc

    def _release(self, slot: _Slot) -> None:
        if not slot.released:
            slot.released = True
            self._in_use -= 1

    async def _serve(self, slot: _Slot, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        slot.claimed = True
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        connection = _Connection(self._app, reader, writer, settings=self._settings, log=self._log)
        try:
            await connection.serve()
        except (ConnectionError, TimeoutError):
            pass  # the client went away, or did not read its answer: nothing to tell anyone
        finally:
            self._connections.pop(task, None)
            self._release(slot)
            writer.close()

    @property
    def bound_port(self) -> int:
        """The port actually listened on (the system's choice when port 0 was asked)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the HTTP server is not started")
        # A host resolving to several addresses gets one socket each; with port 0 their ports
        # may differ, and the first one is reported.
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        # Cut the connections rather than cancel their tasks: each handler then ends on its own
        # (end of stream), which also keeps Python 3.11's streams from logging the cancellation.
        tasks = list(self._connections)
        for writer in self._connections.values():
            writer.transport.abort()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=_STOP_S)
            for task in stuck:  # an answer still being rendered
                task.cancel()
        await server.wait_closed()
