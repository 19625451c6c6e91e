"""An asyncio TCP proxy for fault injection between a client and Redis, inside the test's loop.

    proxy = TcpProxy("127.0.0.1", redis_port)
    await proxy.start()
    client = redis.asyncio.Redis.from_url(proxy.url)
    proxy.cut()          # RST every connection; new ones are accepted and reset at once
    proxy.blackhole()    # connections stay open, every byte is silently dropped (no RST, no FIN)
    proxy.delay(0.2)     # each chunk is delivered 0.2 s late, in each direction
    proxy.restore()      # normal forwarding again, for new and surviving connections
    await proxy.stop()

Faults apply to the proxy as a whole, at once, to all its connections. A blackholed connection
loses the bytes sent meanwhile for good (the RESP stream of a surviving connection is then out
of step, as after any lost reply: redis-py drops a connection after a timeout anyway). With
``blackhole(hold=True)`` the bytes are held instead and delivered, late, on restore(): like TCP
retransmissions after a short partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from typing import Literal

__all__ = ["TcpProxy"]

logger = logging.getLogger(__name__)

Direction = Literal["both", "upstream", "downstream"]
_CHUNK = 65536


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a TCP RST (SO_LINGER 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """One proxied client connection: two directions, each a reader task and a writer task."""

    def __init__(
        self,
        proxy: TcpProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.upstream_reader, self.upstream_writer = upstream
        self.closed = False
        self.tasks: list[asyncio.Task[bool]] = []

    def reset(self) -> None:
        """RST towards the client; the upstream side is just dropped."""
        if not self.closed:
            self.closed = True
            _reset(self.client_writer)
            self.upstream_writer.transport.abort()
        for task in self.tasks:
            task.cancel()  # e.g. a pipe waiting for restore() to pass an EOF on

    def close(self) -> None:
        """Graceful close (FIN) of both sides, after the buffered bytes are sent."""
        if not self.closed:
            self.closed = True
            for writer in (self.client_writer, self.upstream_writer):
                with contextlib.suppress(OSError, RuntimeError):
                    writer.close()

    async def run(self) -> None:
        pipes = [
            self._pipe(self.client_reader, self.upstream_writer, "upstream"),
            self._pipe(self.upstream_reader, self.client_writer, "downstream"),
        ]
        self.tasks = tasks = [asyncio.create_task(pipe) for pipe in pipes]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            graceful = all(not task.cancelled() and task.result() for task in done)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if graceful:
            self.close()
        else:
            self.reset()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: Direction
    ) -> bool:
        """Forward one direction until EOF (returns True) or a connection error (returns False)."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        forwarder = asyncio.create_task(self._forward(queue, writer, direction))
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    data = await reader.read(_CHUNK)
                except OSError:
                    return False
                if data and self.proxy.blackholed and not self.proxy.holding:
                    continue  # dropped on the floor
                queue.put_nowait((loop.time(), data))
                if not data:
                    break
            await asyncio.wait({forwarder})  # until the EOF is passed on, or a write failed
            return not forwarder.cancelled() and forwarder.result()
        finally:
            forwarder.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await forwarder

    async def _forward(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter, direction: Direction
    ) -> bool:
        loop = asyncio.get_running_loop()
        while True:
            received, data = await queue.get()
            delay = self.proxy.delay_for(direction)
            if delay > 0:
                await asyncio.sleep(max(0.0, received + delay - loop.time()))
            if data and self.proxy.blackholed and not self.proxy.holding:
                continue  # in flight when the blackhole began: lost too
            await self.proxy.wait_not_blackholed()  # held bytes and EOFs wait for restore()
            if not data:
                return True
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                return False


class TcpProxy:
    """Listens on 127.0.0.1 (a free port by default) and forwards to upstream_host:upstream_port."""

    def __init__(self, upstream_host: str, upstream_port: int, *, listen_port: int = 0) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self._listen_port = listen_port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[_Connection] = set()
        self._cut = False
        self._blackholed = asyncio.Event()  # set while blackholed
        self._unblocked = asyncio.Event()  # set while NOT blackholed
        self._unblocked.set()
        self.holding = False
        self._delays: dict[str, float] = {"upstream": 0.0, "downstream": 0.0}
        self.connections_accepted = 0

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("The proxy is not started.")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def active_connections(self) -> int:
        return len(self._connections)

    @property
    def blackholed(self) -> bool:
        return self._blackholed.is_set()

    @property
    def is_cut(self) -> bool:
        return self._cut

    async def start(self) -> TcpProxy:
        if self._server is None:
            self._server = await asyncio.start_server(self._on_accept, "127.0.0.1", self._listen_port)
            self._listen_port = self.port  # a restart of the proxy keeps its port
        return self

    async def stop(self) -> None:
        """Stop listening, reset every connection, and wait for all the proxy's tasks."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self._connections):
            conn.reset()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> TcpProxy:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- fault controls (synchronous: they take effect at once) ---------------------------------------

    def cut(self) -> None:
        """Reset every current connection (RST) and reset new ones at once, until restore()."""
        self._cut = True
        for conn in list(self._connections):
            conn.reset()

    def blackhole(self, *, hold: bool = False) -> None:
        """Keep connections open but pass no byte either way (dropped; held if hold=True)."""
        self.holding = hold
        self._blackholed.set()
        self._unblocked.clear()

    def delay(self, seconds: float, *, direction: Direction = "both") -> None:
        """Deliver every chunk `seconds` late, one way: a request/reply round trip gets 2x slower."""
        for name in ("upstream", "downstream"):
            if direction in ("both", name):
                self._delays[name] = seconds

    def restore(self) -> None:
        """Back to normal forwarding, for new connections and for existing ones that were not cut."""
        self._cut = False
        self.holding = False
        self._blackholed.clear()
        self._unblocked.set()
        self._delays = dict.fromkeys(self._delays, 0.0)

    # -- internals used by the connections ---------------------------------------------------------------

    def delay_for(self, direction: Direction) -> float:
        return self._delays[direction]

    async def wait_not_blackholed(self) -> None:
        await self._unblocked.wait()

    def _on_accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        if self._cut:
            _reset(writer)
            return
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.wait_for(
                asyncio.open_connection(self.upstream_host, self.upstream_port), timeout=5
            )
        except (OSError, TimeoutError) as exc:
            logger.debug("proxy: upstream %s:%s unreachable: %r", self.upstream_host, self.upstream_port, exc)
            _reset(writer)  # like a refused connection
            return
        except asyncio.CancelledError:
            _reset(writer)
            raise
        conn = _Connection(self, (reader, writer), upstream)
        if self._cut:  # cut() while we were connecting
            conn.reset()
            return
        self._connections.add(conn)
        try:
            await conn.run()
        except asyncio.CancelledError:
            conn.reset()
            raise
        except Exception:
            logger.exception("proxy: connection failed")
            conn.reset()
        finally:
            self._connections.discard(conn)
