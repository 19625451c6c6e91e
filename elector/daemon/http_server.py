"""A small HTTP/1.1 server: h11 (python-hyper's protocol state machine) on asyncio streams.

h11 does all the parsing and framing (request line, headers, Content-Length and chunked bodies,
keep-alive, HEAD); this module only moves bytes, bounds what a client may cost, and hands each
request to an application: `async (Request) -> Response`. The budgets, so that a hostile client
gets bounded service and a fresh probe always gets an answer:

- connections: at most `max_connections` open at once. At the cap a new connection is served
  and the one waiting longest on its client (idle, sending its request slowly, or not reading
  its answer) is cut (`shed`); only when every connection is in the middle of its handler is the
  new one closed instead. A slowloris crowd therefore rotates through the slots, and a probe,
  which sends its request at once, is answered before 127 newer connections could push it out;
- time: a request (line, headers and body) must arrive within `idle_timeout_s` of the start of
  the wait for it, an answer must be taken by the client within SEND_TIMEOUT_S;
- bytes: request heads above MAX_HEAD_BYTES get 431, a malformed request 400 with h11's reason
  (and the connection is closed); bodies (no route reads one) are skipped up to MAX_BODY_BYTES,
  else the connection is closed after the answer. Per connection, at most READ_BUFFER_BYTES of
  input wait unparsed (reading pauses above it) and WRITE_BUFFER_BYTES of output unsent (answers
  go out in pieces of that size as the client takes them), so the server's buffers are bounded
  by max_connections x (h11's head buffer + both), whatever the clients do;
- turns: a connection whose requests are already buffered (pipelining) answers at most
  REQUESTS_PER_TURN of them before it lets the other connections have the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import http
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Mapping

import h11

_MAX_PORT = 65535
#: Probes and scrapes need a handful of connections; this many open at once bounds the
#: descriptors and buffers HTTP can take from the daemon (Redis needs its own).
DEFAULT_MAX_CONNECTIONS = 128
#: A connection that has not completed a request within this long of the start of the wait for
#: it is closed: it bounds how long a slowloris client holds a descriptor.
DEFAULT_IDLE_TIMEOUT_S = 5.0
#: Request line and headers together; h11 answers more with 431 (its own default size).
MAX_HEAD_BYTES = 16 * 1024
#: A request body is read and dropped (to keep the connection) up to this size.
MAX_BODY_BYTES = 64 * 1024
#: Writing one answer (a /metrics exposition of a few MB) to a client that does not read it.
SEND_TIMEOUT_S = 30.0
#: Input read but not yet parsed, per connection: the stream pauses reading above twice this.
READ_BUFFER_BYTES = 16 * 1024
#: Output not yet sent, per connection: an answer goes out in pieces of this size, each written
#: once the previous ones have left (a body is never copied whole into the transport's buffer).
WRITE_BUFFER_BYTES = 64 * 1024
#: Pipelined requests answered back to back before the connection yields the loop to the others.
REQUESTS_PER_TURN = 4
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


@dataclasses.dataclass(slots=True)
class HttpStats:
    """What a server's connection budget did; written by its loop's thread, read by any."""

    #: Connections holding a slot now, and the most that ever did at once (never above the cap).
    open: int = 0
    peak: int = 0
    #: Connections cut at the cap to make room for a new one, and new ones closed at the cap.
    shed: int = 0
    refused: int = 0


class _Refused(asyncio.Protocol):
    """Stands in for a connection over the limit: closes it as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Slot:
    """One connection's share of `max_connections`, given back exactly once."""

    __slots__ = ("claimed", "released")

    def __init__(self) -> None:
        self.claimed = False
        self.released = False


class _Connection:
    """One client connection: requests in, answers out, until either side is done."""

    def __init__(
        self,
        app: Application,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        slot: _Slot,
        settings: HttpSettings,
        log: logging.Logger,
        waiting: dict[_Connection, None],
    ) -> None:
        self.slot = slot
        self._app = app
        self._reader = reader
        self._writer = writer
        self._settings = settings
        self._log = log
        #: The server's connections that wait on their client, longest first (see `shed`).
        self._waiting = waiting
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)

    def shed(self) -> None:
        """Cut the connection now (the server needs its slot): its handler ends on its own."""
        self._waiting.pop(self, None)
        self._writer.transport.abort()

    @contextlib.contextmanager
    def _waiting_on_client(self) -> Iterator[None]:
        """While the client owes us bytes or has not taken our answer, we may be shed."""
        self._waiting[self] = None  # at the end: the longest-waiting connection comes first
        try:
            yield
        finally:
            self._waiting.pop(self, None)

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
        answered_this_turn = 0
        while True:
            try:
                with self._waiting_on_client():
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
            with self._waiting_on_client():
                await self._send(response, head_only=request.method == "HEAD")
                body_skipped = await self._skip_body()
            if not body_skipped or self._h11.our_state is not h11.DONE:
                await self._linger()
                return
            self._h11.start_next_cycle()
            answered_this_turn += 1
            if answered_this_turn >= REQUESTS_PER_TURN:
                # Buffered (pipelined) requests are answered without the loop ever waiting:
                # without this, one connection would hold the loop for as long as it sends.
                answered_this_turn = 0
                await asyncio.sleep(0)

    async def _bad_request(self, exc: h11.RemoteProtocolError) -> None:
        status = exc.error_status_hint
        # A scanner or a client's bug, not ours: DEBUG, so that nobody can flood the logs.
        self._log.debug("http_bad_request", extra={"status": status, "reason": str(exc)})
        if self._h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            phrase = http.HTTPStatus(status).phrase
            body = f"{status}: {phrase}: {exc}\n"
            with self._waiting_on_client():
                await self._send(
                    text_response(status, body, headers=(("Connection", "close"),)), head_only=False
                )
        await self._linger()

    async def _send(self, response: Response, *, head_only: bool) -> None:
        headers = [*response.headers, ("Content-Length", str(len(response.body)))]
        reason = http.HTTPStatus(response.status).phrase.encode()
        data = self._h11.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
        assert data is not None  # only None for ConnectionClosed
        self._writer.write(data)
        body = b"" if head_only else response.body
        async with asyncio.timeout(SEND_TIMEOUT_S):
            # In pieces, each once the client has taken the previous ones: a client that does not
            # read costs WRITE_BUFFER_BYTES, not a copy of the whole answer.
            for start in range(0, len(body), WRITE_BUFFER_BYTES):
                piece = self._h11.send(h11.Data(data=body[start : start + WRITE_BUFFER_BYTES]))
                self._writer.write(piece or b"")
                await self._writer.drain()
            self._writer.write(self._h11.send(h11.EndOfMessage()) or b"")
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
        with self._waiting_on_client(), contextlib.suppress(OSError, RuntimeError, TimeoutError):
            if self._writer.can_write_eof():
                self._writer.write_eof()
            async with asyncio.timeout(_LINGER_S):
                while await self._reader.read(_READ_SIZE):
                    pass


class HttpServer:
    """Serves an application on one address until stopped."""

    def __init__(
        self,
        app: Application,
        *,
        settings: HttpSettings,
        logger: logging.Logger | None = None,
        stats: HttpStats | None = None,
    ) -> None:
        self._app = app
        self._settings = settings
        self._log = logging.getLogger("elector.http") if logger is None else logger
        self.stats = HttpStats() if stats is None else stats
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._waiting: dict[_Connection, None] = {}

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the HTTP server is already started")
        loop = asyncio.get_running_loop()
        limit = self._settings.max_connections
        stats = self.stats

        def protocol() -> asyncio.Protocol:
            # Called at accept time, so a burst of accepts is counted before any handler runs.
            if stats.open >= limit and not self._shed_one():
                stats.refused += 1
                return _Refused()
            slot = _Slot()
            stats.open += 1
            stats.peak = max(stats.peak, stats.open)
            # Should the connection never reach its handler (a transport that failed at once),
            # its slot is given back after a moment.
            loop.call_later(_REGISTRATION_S, lambda: None if slot.claimed else self._release(slot))
            reader = asyncio.StreamReader(limit=READ_BUFFER_BYTES)
            return asyncio.StreamReaderProtocol(reader, functools.partial(self._serve, slot))

        try:
            self._server = await loop.create_server(protocol, self._settings.host, self._settings.port)
        except OSError as exc:
            raise HttpBindError(
                exc.errno, f"cannot listen on {self._settings.address}: {exc.strerror or exc}"
            ) from exc

    def _shed_one(self) -> bool:
        """Cut the connection that has waited longest on its client; False if none waits."""
        victim = next(iter(self._waiting), None)
        if victim is None:
            return False
        victim.shed()
        self._release(victim.slot)
        self.stats.shed += 1
        return True

    def _release(self, slot: _Slot) -> None:
        if not slot.released:
            slot.released = True
            self.stats.open -= 1

    async def _serve(self, slot: _Slot, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        slot.claimed = True
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        connection = _Connection(
            self._app,
            reader,
            writer,
            slot=slot,
            settings=self._settings,
            log=self._log,
            waiting=self._waiting,
        )
        try:
            if slot.released:  # shed before it was even served
                return
            await connection.serve()
        except (ConnectionError, TimeoutError):
            pass  # the client went away, or did not read its answer: nothing to tell anyone
        finally:
            self._waiting.pop(connection, None)
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
