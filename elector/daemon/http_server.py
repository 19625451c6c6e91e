"""A small HTTP/1.1 server: h11 (python-hyper's protocol state machine) on asyncio streams.

h11 does all the parsing and framing (request line, headers, Content-Length and chunked bodies,
keep-alive, HEAD); this module only moves bytes, bounds what a client may cost, and hands each
request to an application: `async (Request) -> Response`. The budgets, so that a hostile client
gets bounded service and a fresh probe always gets an answer:

- probes first: at each turn the server takes every connection the kernel has queued into its
  lobby (elector/daemon/http_accept.py) and looks at what each has sent. A whole small request
  asking for `Connection: close` of a route that needs no waiting (a kubelet's probe of
  /healthz, /readyz, /leader) is answered and closed right there, without a slot; other small
  complete heads get the next slots before the rest, which follow in arrival order, at most
  OTHERS_PER_TURN of them per turn. A flood queued ahead of a probe does not delay it (in the
  kernel's queue, probes behind a flood of large heads on a loaded machine time out);
- connections: at most `max_connections` open at once (and as many more in the lobby). At the
  cap a new connection is served and one that waits on its client is cut (`shed`) to make room:
  first one closing after its last answer, then one in the middle of a request (a slow or
  oversized head, an answer not taken), then an idle keep-alive one, and a fresh one (not read
  from yet) only once it is FRESH_GRACE_S old; each class longest-waiting first. Nothing is cut
  inside its handler: when no connection may be cut, new ones wait in the lobby, and when that
  is full of connections it may not cut, in the kernel's queue. A slowloris crowd rotates
  through the slots, and a probe always gets its answer;
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
import dataclasses
import errno
import functools
import logging
import socket

from elector.daemon.http_accept import Lobby
from elector.daemon.http_connection import (
    FRESH,
    MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    READ_BUFFER_BYTES,
    REQUESTS_PER_TURN,
    SEND_TIMEOUT_S,
    SHED_ORDER,
    WRITE_BUFFER_BYTES,
    AnswersAtOnce,
    Application,
    Connection,
    Request,
    Response,
    Slot,
    text_response,
)

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "MAX_BODY_BYTES",
    "MAX_HEAD_BYTES",
    "READ_BUFFER_BYTES",
    "REQUESTS_PER_TURN",
    "SEND_TIMEOUT_S",
    "WRITE_BUFFER_BYTES",
    "Application",
    "HttpBindError",
    "HttpServer",
    "HttpSettings",
    "HttpStats",
    "Request",
    "Response",
    "text_response",
]

_MAX_PORT = 65535
#: Probes and scrapes need a handful of connections; this many open at once bounds the
#: descriptors and buffers HTTP can take from the daemon (Redis needs its own).
DEFAULT_MAX_CONNECTIONS = 128
#: A connection that has not completed a request within this long of the start of the wait for
#: it is closed: it bounds how long a slowloris client holds a descriptor.
DEFAULT_IDLE_TIMEOUT_S = 5.0
#: The kernel's queue of connections not yet accepted (capped by net.core.somaxconn). While the
#: lobby is full of connections that may not be cut yet, new ones wait here, in arrival order.
_BACKLOG = 1024
#: Connections taken from the kernel's queue into the lobby in one turn of the loop, at most.
ACCEPTS_PER_TURN = 256
#: Connections without a small complete head given a slot per turn of the loop, at most: each
#: costs the loop a read of its head, perhaps an error answer, a close, all before the loop's
#: next turn, where the next probe is answered. Without the bound a flood of large heads
#: stretches every turn, and with them the leader's renewal gaps.
OTHERS_PER_TURN = 8
#: accept() failed for want of descriptors or memory: retry after this long, seconds.
_ACCEPT_RETRY_S = 0.05
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: A connection not yet read from may not be shed for this long: every connection (a probe
#: among a flood) gets its first read before a newer one can push it out.
FRESH_GRACE_S = 0.25
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


class HttpBindError(OSError):
    """The HTTP server could not listen on its address (in use, not permitted, unknown host)."""


@dataclasses.dataclass(slots=True)
class HttpStats:
    """What a server's connection budget did; written by its loop's thread, read by any."""

    #: Connections holding a slot now, and the most that ever did at once (never above the cap).
    open: int = 0
    peak: int = 0
    #: Connections cut at the cap to make room for a new one (in a slot, or in the full lobby),
    #: and new ones that had to wait in the lobby for a slot (every open one was being answered,
    #: or was too fresh to cut).
    shed: int = 0
    deferred: int = 0


class HttpServer:
    """Serves an application on one address until stopped.

    It accepts connections itself (asyncio's server would give each a transport and a task at
    once, however many): at each turn it takes what the kernel has queued into its lobby
    (`http_accept.Lobby`), then gives slots, as they are free or can be freed (`_admit`), to
    the lobby's connections whose small request head has arrived first, then to the others in
    arrival order.
    """

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
        self._sockets: list[socket.socket] = []
        #: The connections being set up, and those being served.
        self._connecting: set[asyncio.Task[None]] = set()
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._waiting: tuple[dict[Connection, None], ...] = tuple({} for _ in SHED_ORDER)
        self._lobby: Lobby | None = None
        #: Listening sockets not watched while the lobby is full of connections it may not cut.
        self._paused: list[socket.socket] = []
        #: A turn (`_turn`) is scheduled; and the timer of the next retry once a grace ends.
        self._turn_due = False
        self._retry: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        if self._sockets:
            raise RuntimeError("the HTTP server is already started")
        try:
            self._sockets = await _listen(self._settings.host, self._settings.port)
        except OSError as exc:
            raise HttpBindError(
                exc.errno, f"cannot listen on {self._settings.address}: {exc.strerror or exc}"
            ) from exc
        self._lobby = Lobby(
            limit=self._settings.max_connections, grace_s=FRESH_GRACE_S, on_change=self._wake,
            app=self._app if isinstance(self._app, AnswersAtOnce) else None,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            loop.add_reader(sock, self._accept, sock)

    def _accept(self, sock: socket.socket) -> None:
        """Take what the kernel has queued (up to ACCEPTS_PER_TURN) into the lobby, then admit:
        a probe queued behind a flood goes first instead of waiting for the flood to be read."""
        lobby = self._lobby
        assert lobby is not None
        for _ in range(ACCEPTS_PER_TURN):
            if not lobby.has_room():
                self._pause(sock)
                break
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # out of descriptors, a connection reset while queued
                self._log.debug("http_accept_failed", extra={"error": str(exc)})
                if exc.errno in _OUT_OF_RESOURCES:
                    self._pause(sock)
                    self._retry_at(asyncio.get_running_loop().time() + _ACCEPT_RETRY_S)
                    break
                continue
            conn.setblocking(False)
            if lobby.add(conn):
                self.stats.shed += 1
        self._admit()

    def _pause(self, sock: socket.socket) -> None:
        if sock not in self._paused:
            self._paused.append(sock)
            asyncio.get_running_loop().remove_reader(sock)

    def _wake(self) -> None:
        """Admit, and accept again, in the next turn of the loop (once, however many ask)."""
        if not self._turn_due and self._sockets:
            self._turn_due = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        self._turn_due = False
        if not self._sockets or self._lobby is None:
            return  # stopped meanwhile
        self._admit()
        loop = asyncio.get_running_loop()
        if self._paused and self._lobby.has_room():
            for sock in self._paused:
                loop.add_reader(sock, self._accept, sock)
            self._paused.clear()
        elif self._paused:
            grace_end = self._lobby.next_grace_end()
            if grace_end is not None:
                self._retry_at(grace_end)

    def _retry_at(self, when: float) -> None:
        """Wake at loop time `when`, unless a retry is due sooner already."""
        if self._retry is not None:
            if self._retry.when() <= when:
                return
            self._retry.cancel()
        self._retry = asyncio.get_running_loop().call_at(when, self._retried)

    def _retried(self) -> None:
        self._retry = None
        self._wake()

    def _admit(self) -> None:
        """Give slots to the lobby's connections, ready ones first, while one is free or can be
        freed (`_shed_one`); otherwise retry once the oldest fresh connection may be cut."""
        lobby = self._lobby
        assert lobby is not None
        others = 0
        while len(lobby):
            ready = lobby.has_ready()
            if not ready and others >= OTHERS_PER_TURN:
                self._wake()  # the rest in the next turn: a probe's work goes on meanwhile
                return
            if self.stats.open >= self._settings.max_connections and not self._shed_one():
                self.stats.deferred += lobby.count_waiting()
                fresh = next(iter(self._waiting[FRESH]), None)
                if fresh is not None:
                    self._retry_at(fresh.accepted_at + FRESH_GRACE_S)
                return
            arrival = lobby.pop()
            assert arrival is not None
            others += not ready
            self._open(arrival.sock)

    def _open(self, conn: socket.socket) -> None:
        slot = Slot()
        self.stats.open += 1
        self.stats.peak = max(self.stats.peak, self.stats.open)
        reader = asyncio.StreamReader(limit=READ_BUFFER_BYTES)
        protocol = asyncio.StreamReaderProtocol(reader, functools.partial(self._serve, slot))
        task = asyncio.create_task(self._connect(conn, protocol, slot))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, conn: socket.socket, protocol: asyncio.Protocol, slot: Slot) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol, conn)
        except OSError:
            conn.close()
            self._release(slot)

    def _shed_one(self) -> bool:
        """Cut the connection that has waited longest on its client, in SHED_ORDER's order (a
        fresh one only once FRESH_GRACE_S old); False if none may be cut."""
        victim = next((next(iter(self._waiting[c])) for c in SHED_ORDER[:-1] if self._waiting[c]), None)
        if victim is None:
            fresh = next(iter(self._waiting[FRESH]), None)
            now = asyncio.get_running_loop().time()
            if fresh is None or now < fresh.accepted_at + FRESH_GRACE_S:
                return False
            victim = fresh
        victim.shed()
        self._release(victim.slot)
        self.stats.shed += 1
        return True

    def _release(self, slot: Slot) -> None:
        if not slot.released:
            slot.released = True
            self.stats.open -= 1
            self._wake()

    async def _serve(self, slot: Slot, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        connection = Connection(
            self._app, reader, writer, slot=slot, idle_timeout_s=self._settings.idle_timeout_s, log=self._log,
            waiting=self._waiting, on_sheddable=self._wake,
        )  # fmt: skip
        try:
            await connection.serve()
        except (ConnectionError, TimeoutError):
            pass  # the client went away, or did not read its answer: nothing to tell anyone
        finally:
            connection.shed_no_more()
            self._connections.pop(task, None)
            self._release(slot)
            writer.close()

    @property
    def bound_port(self) -> int:
        """The port actually listened on (the system's choice when port 0 was asked)."""
        if not self._sockets:
            raise RuntimeError("the HTTP server is not started")
        # A host resolving to several addresses gets one socket each; with port 0 their ports
        # may differ, and the first one is reported.
        port: int = self._sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        sockets, self._sockets = self._sockets, []
        if not sockets:
            return
        loop = asyncio.get_running_loop()
        for sock in sockets:
            if sock not in self._paused:
                loop.remove_reader(sock)
            sock.close()
        self._paused.clear()
        if self._retry is not None:
            self._retry.cancel()
        if self._lobby is not None:
            self._lobby.close()
        connecting = list(self._connecting)
        for task in connecting:
            task.cancel()
        await asyncio.gather(*connecting, return_exceptions=True)
        # Cut the connections rather than cancel their tasks: each handler then ends on its own
        # (end of stream), which also keeps Python 3.11's streams from logging the cancellation.
        tasks = list(self._connections)
        for writer in self._connections.values():
            writer.transport.abort()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=_STOP_S)
            for task in stuck:  # an answer still being rendered
                task.cancel()


async def _listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address `host` resolves to, as asyncio's create_server makes
    them (SO_REUSEADDR; IPv6 sockets IPv6-only), with our own backlog."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(_BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets
