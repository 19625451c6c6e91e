"""One HTTP/1.1 client connection of `elector.daemon.http_server`: requests in through h11, answers
out, within the per-connection budgets (time, head and body bytes, buffers, answers per turn).

Each connection tells the server, through a `waiting` class, whether it may be cut to make room
for a new one (see SHED_ORDER); in its handler it may not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http
import logging
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Protocol, runtime_checkable

import h11

#: Request line and headers together; more gets 431. A probe's or a scrape's head is well under
#: 1 KiB; nginx's default is 8 KiB too. Every byte of an oversized head is read before the 431:
#: the smaller the bound, the less a flood of them costs.
MAX_HEAD_BYTES = 8 * 1024
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
#: ...and at most this much of it: beyond, the close may be a reset (a client that keeps sending
#: after its answer is not one whose answer we owe that much reading).
_LINGER_BYTES = 16 * 1024
#: h11 refuses a head once more than MAX_HEAD_BYTES of it are buffered unparsed; reading no more
#: at a time means no head much above twice that gets through.
_READ_SIZE = MAX_HEAD_BYTES
#: Connections that wait on their client, in the order they are shed at the cap: those closing
#: after their last answer, then those in the middle of a request (part of a head or body sent,
#: an answer not taken), then idle keep-alive ones, and last fresh ones (not read from yet),
#: once old enough (the server's grace). A probe sends its whole request at once and is answered
#: in the turn it is first read: a crowd of slow or oversized heads goes before it.
CLOSING, MID_REQUEST, IDLE, FRESH = 0, 1, 2, 3
SHED_ORDER = (CLOSING, MID_REQUEST, IDLE, FRESH)


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
    #: A streamed answer (server-sent events): the body, then each piece this yields, each taken
    #: by the client within SEND_TIMEOUT_S; no Content-Length, and the connection closes after.
    stream: Callable[[], AsyncIterator[bytes]] | None = None


Application = Callable[[Request], Awaitable[Response]]


@runtime_checkable
class AnswersAtOnce(Protocol):
    """An application that can answer some requests without waiting for anything (a probe, from
    a published snapshot): the server may then answer them in the turn it accepts them."""

    def answer_now(self, request: Request) -> Response | None:
        """The answer, or None when the request must go through the application's `__call__`."""


def response_event(response: Response) -> h11.Response:
    """The answer's status line and headers for h11 (Content-Length set from the body)."""
    headers = list(response.headers)
    if response.stream is None:
        headers.append(("Content-Length", str(len(response.body))))
    reason = http.HTTPStatus(response.status).phrase.encode()
    return h11.Response(status_code=response.status, headers=headers, reason=reason)


def text_response(status: int, text: str, *, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, text.encode(), (("Content-Type", "text/plain; charset=utf-8"), *headers))


def parse_request(event: h11.Request) -> Request:
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


class Slot:
    """One connection's share of `max_connections`, given back exactly once."""

    __slots__ = ("released",)

    def __init__(self) -> None:
        self.released = False


class Connection:
    """One client connection: requests in, answers out, until either side is done."""

    def __init__(
        self,
        app: Application,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        slot: Slot,
        idle_timeout_s: float,
        log: logging.Logger,
        waiting: tuple[dict[Connection, None], ...],
        on_sheddable: Callable[[], None],
    ) -> None:
        self.slot = slot
        self._app = app
        self._reader = reader
        self._writer = writer
        self._idle_timeout_s = idle_timeout_s
        self._log = log
        #: The server's connections that wait on their client, per SHED_ORDER class, each
        #: longest first: a connection is in one of them (`_wait_class`) or, in its handler, none.
        self._waiting = waiting
        self._on_sheddable = on_sheddable
        self._wait_class: int | None = None
        self._cut = False
        #: When it was accepted (loop time), and whether it has sent us anything yet.
        self.accepted_at = asyncio.get_running_loop().time()
        self._heard_from = False
        #: Bytes of the current request received so far (0: nothing of it yet).
        self._request_bytes = 0
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)

    def shed(self) -> None:
        """Cut the connection now (the server needs its slot): its handler ends on its own.

        One that is closing has its answer written already: it is closed, not reset, so that
        the answer is not destroyed in the client's receive buffer (a probe that asked for
        `Connection: close` waits here for the client's end of the stream).
        """
        closing = self._wait_class == CLOSING
        self._set_waiting(None)
        self._cut = True  # its handler may still be winding down: never in line again
        if closing:
            self._writer.transport.close()
        else:
            self._writer.transport.abort()

    def shed_no_more(self) -> None:
        """The connection has ended: it is no one's to shed any more."""
        self._set_waiting(None)

    def _set_waiting(self, wait_class: int | None) -> None:
        if wait_class == self._wait_class or (wait_class is not None and self._cut):
            return  # keeps its place: the order is by how long it has waited in its class
        if self._wait_class is not None:
            self._waiting[self._wait_class].pop(self, None)
        self._wait_class = wait_class
        if wait_class is not None:
            self._waiting[wait_class][self] = None  # at the end: the longest-waiting come first
            if wait_class != FRESH:
                self._on_sheddable()

    @contextlib.contextmanager
    def _waiting_on_client(self, wait_class: int) -> Iterator[None]:
        """While the client owes us bytes or has not taken our answer, we may be shed."""
        self._set_waiting(wait_class)
        try:
            yield
        finally:
            self._set_waiting(None)

    async def _next_event(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        """The next event, reading as much as it needs (never NEED_DATA in fact: for mypy)."""
        while True:
            event = self._h11.next_event()
            if event is h11.NEED_DATA:
                data = await self._reader.read(_READ_SIZE)
                self._heard_from = True
                if data and self._wait_class in (IDLE, FRESH):
                    self._set_waiting(MID_REQUEST)  # a request under way, not complete yet
                self._request_bytes += len(data)
                # b"" at the end of the stream tells h11 the client closed.
                self._h11.receive_data(data)
            else:
                return event

    async def serve(self) -> None:
        answered_this_turn = 0
        while True:
            try:
                waits_as = MID_REQUEST if self._request_bytes else IDLE if self._heard_from else FRESH
                with self._waiting_on_client(waits_as):
                    async with asyncio.timeout(self._idle_timeout_s):
                        event = await self._next_event()
            except TimeoutError:
                return
            except h11.RemoteProtocolError as exc:
                await self._bad_request(exc)
                return
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed (or PAUSED after a protocol switch we never agree to)
            request = parse_request(event)
            response = await self._app(request)
            with self._waiting_on_client(MID_REQUEST):
                await self._send(response, head_only=request.method == "HEAD")
                body_skipped = await self._skip_body()
            if not body_skipped or self._h11.our_state is not h11.DONE or response.stream is not None:
                await self._linger()
                return
            self._h11.start_next_cycle()
            # (A pipelined request already in h11 is parsed without waiting: never shed meanwhile.)
            self._request_bytes = 0
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
            with self._waiting_on_client(CLOSING):
                await self._send(
                    text_response(status, body, headers=(("Connection", "close"),)), head_only=False
                )
        await self._linger()

    async def _send(self, response: Response, *, head_only: bool) -> None:
        data = self._h11.send(response_event(response))
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
        if response.stream is not None and not head_only:
            await self._send_stream(response.stream())
        async with asyncio.timeout(SEND_TIMEOUT_S):
            self._writer.write(self._h11.send(h11.EndOfMessage()) or b"")
            await self._writer.drain()

    async def _send_stream(self, pieces: AsyncIterator[bytes]) -> None:
        """Each piece as it comes, taken by the client within SEND_TIMEOUT_S (else the stream is
        cut: a client that stopped reading costs one piece of buffer, not a backlog), until the
        stream ends or the client closes its side (or sends more than _LINGER_BYTES meanwhile)."""
        gone = asyncio.ensure_future(self._client_gone())
        try:
            while True:
                coming = asyncio.ensure_future(anext(pieces))
                await asyncio.wait([coming, gone], return_when=asyncio.FIRST_COMPLETED)
                if not coming.done():
                    coming.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await coming
                    return
                try:
                    piece = coming.result()
                except StopAsyncIteration:
                    return
                async with asyncio.timeout(SEND_TIMEOUT_S):
                    self._writer.write(self._h11.send(h11.Data(data=piece)) or b"")
                    await self._writer.drain()
        finally:
            gone.cancel()
            aclose = getattr(pieces, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _client_gone(self) -> None:
        """Returns when the client has closed its side (its input meanwhile is dropped), or sent
        more than _LINGER_BYTES while it should only listen."""
        received = 0
        while received <= _LINGER_BYTES and (data := await self._reader.read(_READ_SIZE)):
            received += len(data)

    async def _skip_body(self) -> bool:
        """Read and drop what is left of the request's body; False when too big, slow or bad."""
        skipped = 0
        try:
            async with asyncio.timeout(self._idle_timeout_s):
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
        with self._waiting_on_client(CLOSING), contextlib.suppress(OSError, RuntimeError, TimeoutError):
            if self._writer.can_write_eof():
                self._writer.write_eof()
            drained = 0
            async with asyncio.timeout(_LINGER_S):
                while drained <= _LINGER_BYTES and (data := await self._reader.read(_READ_SIZE)):
                    drained += len(data)
