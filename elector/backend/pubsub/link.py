"""One pub/sub connection and its wire protocol, for the `EventHub` (see hub.py).

Commands (SUBSCRIBE, UNSUBSCRIBE, PING) are written by one writer task, so that a caller cancelled
mid-write can never leave half a command on the shared socket, and the SUBSCRIBEs queued in one
event-loop iteration go out as a single command. Replies are matched to commands in order by the
reader task, which also hands each published message to its owner. Every command must be answered
within the request timeout, and a PING goes out after `keepalive_s` of silence (any reply or
message is a sign of life). A failed read or write, a late answer or a reply out of step breaks
the link for good: the owner is told once and the connection is closed; the owner reconnects.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import redis.exceptions
from redis.asyncio.connection import AbstractConnection, ConnectionPool

from elector.backend.errors import translate_error
from elector.lease import BackendErrorKind, LeaseBackendError

logger = logging.getLogger(__name__)

#: The reply each command gets, once per channel (a PONG once).
_REPLY_OF = {"SUBSCRIBE": "subscribe", "UNSUBSCRIBE": "unsubscribe", "PING": "pong"}

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


@dataclasses.dataclass(slots=True)
class _Command:
    """A command for the link and the replies it still awaits."""

    name: str  # a key of _REPLY_OF
    channels: list[str]
    #: Resolved when the last reply has come (SUBSCRIBE: the channels are live).
    futures: list[asyncio.Future[None]]
    remaining: int
    sent_at: float = 0.0


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def fail(future: asyncio.Future[None], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
        # Marked as retrieved: a subscriber that gave up waiting must not cause a
        # "Future exception was never retrieved" log line.
        future.exception()


def _coalesce(commands: Iterable[_Command]) -> list[_Command]:
    """Merge consecutive SUBSCRIBEs (and UNSUBSCRIBEs): N queued together, one command sent."""
    merged: list[_Command] = []
    for command in commands:
        last = merged[-1] if merged else None
        if last is not None and command.name == last.name and command.name != "PING":
            last.channels.extend(command.channels)
            last.futures.extend(command.futures)
            last.remaining += command.remaining
        else:
            merged.append(command)
    return merged


class PubSubLink:
    """One connection in subscribed mode: what was subscribed on it, a reader and a writer task."""

    def __init__(
        self,
        conn: AbstractConnection,
        *,
        pool: ConnectionPool,
        keepalive_s: float,
        request_timeout_s: float,
        on_message: Callable[[str, Any], None],
        on_broken: Callable[[PubSubLink, LeaseBackendError], None],
        spawn: Spawn,
    ) -> None:
        self.conn = conn
        self._pool = pool
        self._keepalive_s = keepalive_s
        self._request_timeout_s = request_timeout_s
        self._on_message = on_message
        self._on_broken = on_broken
        self._spawn = spawn
        self.loop = asyncio.get_running_loop()
        #: Channels subscribed (or being subscribed) on this connection -> their confirmation.
        self.channels: dict[str, asyncio.Future[None]] = {}
        self.error: LeaseBackendError | None = None
        self._last_heard = self.loop.time()
        self._outbox: list[_Command] = []
        self._awaiting: collections.deque[_Command] = collections.deque()
        self._outbox_ready = asyncio.Event()
        self._ping_pending = False
        self._deadline: asyncio.TimerHandle | None = None
        self._tasks = [
            spawn(self._read_loop(), "elector:hub:reader"),
            spawn(self._write_loop(), "elector:hub:writer"),
        ]

    # -- sending -------------------------------------------------------------------------------

    def subscribe(self, channels: list[str]) -> asyncio.Future[None]:
        """Queue a SUBSCRIBE; the future resolves once Redis confirmed every channel."""
        future: asyncio.Future[None] = self.loop.create_future()
        for channel in channels:
            self.channels[channel] = future
        self._send(_Command("SUBSCRIBE", list(channels), [future], len(channels)))
        return future

    def unsubscribe(self, channels: list[str]) -> None:
        for channel in channels:
            self.channels.pop(channel, None)
        self._send(_Command("UNSUBSCRIBE", list(channels), [], len(channels)))

    def _send(self, command: _Command) -> None:
        if self.error is not None:
            for future in command.futures:
                fail(future, self.error)
            return
        self._outbox.append(command)
        self._outbox_ready.set()

    async def _write_loop(self) -> None:
        # Loops until the link breaks, not until cancelled: on Python 3.11 redis-py's send (an
        # asyncio.wait_for) swallows a cancellation that lands as the write completes.
        try:
            while self.error is None:
                await self._outbox_ready.wait()
                if self.error is not None:
                    return
                self._outbox_ready.clear()
                commands, self._outbox = _coalesce(self._outbox), []
                now = self.loop.time()
                for command in commands:
                    command.sent_at = now
                    self._awaiting.append(command)
                self._arm_deadline()
                packed = self.conn.pack_commands([(c.name, *c.channels) for c in commands])
                await self.conn.send_packed_command(packed, check_health=False)
        except Exception as exc:
            self.broken(translate_error(exc, what="announcements"))

    # -- receiving -----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            while self.error is None:
                silence_s = self.loop.time() - self._last_heard
                if silence_s >= self._keepalive_s:
                    if not self._ping_pending:
                        self._ping_pending = True
                        self._send(_Command("PING", [], [], 1))
                    # Its answer is awaited by the deadline timer, not by this read.
                    wait_s = self._keepalive_s
                else:
                    wait_s = self._keepalive_s - silence_s
                try:
                    response = await self.conn.read_response(
                        timeout=wait_s, disconnect_on_error=False, push_request=True
                    )
                except redis.exceptions.ResponseError as exc:
                    # An error answers one command (e.g. NOPERM for a channel); the link is fine.
                    self._last_heard = self.loop.time()
                    self._answered(None, error=translate_error(exc, what="subscribe"))
                    continue
                if response is None:
                    continue  # our own read timeout: time for a keep-alive check
                self._last_heard = self.loop.time()
                self._handle(response)
        except Exception as exc:
            self.broken(translate_error(exc, what="announcements"))

    def _handle(self, response: Any) -> None:
        if isinstance(response, bytes | str):
            kind = "pong"  # +PONG: the answer to a PING when no channel is subscribed
        elif isinstance(response, list) and len(response) >= 2:
            kind = text(response[0]).lower()
        else:
            self._out_of_step(response)
            return
        if kind == "message" and len(response) >= 3:
            self._on_message(text(response[1]), response[2])
        elif kind in ("subscribe", "unsubscribe", "pong"):
            self._answered(kind)
        # Anything else (pmessage, smessage, ...) is not ours: ignored.

    def _answered(self, kind: str | None, *, error: LeaseBackendError | None = None) -> None:
        """One reply to the oldest command in flight: `kind`, or an error reply."""
        if not self._awaiting or (kind is not None and _REPLY_OF[self._awaiting[0].name] != kind):
            self._out_of_step(kind)
            return
        command = self._awaiting[0]
        command.remaining -= 1
        if error is None and command.remaining > 0:
            return
        self._awaiting.popleft()
        if command.name == "PING":
            self._ping_pending = False
        for future in command.futures:
            if error is not None:
                fail(future, error)
            elif not future.done():
                future.set_result(None)
        if error is not None:
            # The whole command was refused: its channels are not subscribed.
            for channel in command.channels:
                if self.channels.get(channel) in command.futures:
                    del self.channels[channel]
        self._arm_deadline()

    def _out_of_step(self, reply: object) -> None:
        message = f"announcements: unexpected reply from Redis ({text(reply)[:80]})"
        self.broken(LeaseBackendError(message, kind=BackendErrorKind.DATA))

    # -- deadlines and breaking ----------------------------------------------------------------

    def _arm_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._awaiting and self.error is None:
            due = self._awaiting[0].sent_at + self._request_timeout_s
            self._deadline = self.loop.call_at(due, self._check_deadline)

    def _check_deadline(self) -> None:
        self._deadline = None
        if not self._awaiting:
            return
        oldest = self._awaiting[0]
        if self.loop.time() < oldest.sent_at + self._request_timeout_s:
            self._arm_deadline()  # the timer fired a little early
            return
        what = "keep-alive PING" if oldest.name == "PING" else oldest.name
        message = f"announcements: Redis did not answer a {what} in time"
        self.broken(LeaseBackendError(message, kind=BackendErrorKind.TIMEOUT))

    def broken(self, error: LeaseBackendError) -> None:
        """Give the connection up: fail everything that waits on it, tell the owner, close it."""
        if self.error is not None:
            return
        self.error = error
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        for command in [*self._awaiting, *self._outbox]:
            for future in command.futures:
                fail(future, error)
        for future in self.channels.values():
            fail(future, error)
        self._awaiting.clear()
        self._outbox.clear()
        self._outbox_ready.set()  # a writer whose cancellation was swallowed sees the error and ends
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self._on_broken(self, error)
        self._spawn(self._close_connection(), "elector:hub:close")

    async def _close_connection(self) -> None:
        try:
            await self.conn.disconnect(nowait=True)
            await self._pool.release(self.conn)
        except Exception as exc:  # closing a broken connection may fail; nothing to do about it
            logger.debug("closing the announcement connection failed: %r", exc)
