"""Every kind of lease-event subscription (`LeaseEventSubscription`) the backend hands out.

- `RedisEventSubscription`: one lock's own pub/sub connection, with its own keep-alive (a
  backend without a hub);
- `HubSubscription`: one lock's announcements from the `EventHub`'s shared connection (hub.py);
- `RedlockSubscription`: every Redlock server's announcements, merged and de-duplicated.

The last two are built on `QueuedEvents`, the waiting half of a subscription: a reader fills its
queue and `next_event` empties it; events that came before an error are still handed out, then
the error is raised, and a closed subscription raises a connection error.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio.client import PubSub

from elector.backend.codec import parse_event_message
from elector.backend.errors import translate_error
from elector.lease import BackendErrorKind, Holder, LeaseBackendError, LeaseEvent, LeaseEventSubscription

#: Announcements remembered for de-duplication (every server publishes the same ones).
DEDUPE_WINDOW = 256


class RedisEventSubscription:
    """A subscription to one lock's announcements, with its own keep-alive.

    The idle connection is checked by a PING after `keepalive_s` of silence; any message counts
    as a sign of life. TCP keepalive (see connection.py) catches a dead peer between PINGs.
    """

    def __init__(self, pubsub: PubSub, *, request_timeout_s: float, keepalive_s: float = 60.0) -> None:
        self._pubsub = pubsub
        self._request_timeout_s = request_timeout_s
        self._keepalive_s = keepalive_s
        self._last_heard = time.monotonic()
        self._ping_sent_at: float | None = None

    async def next_event(self, timeout_s: float) -> LeaseEvent | None:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            now = time.monotonic()
            if self._ping_sent_at is not None and now - self._ping_sent_at > self._request_timeout_s:
                raise LeaseBackendError(
                    "subscription: no answer to a keep-alive PING", kind=BackendErrorKind.TIMEOUT
                )
            if self._ping_sent_at is None and now - self._last_heard >= self._keepalive_s:
                await self._send_ping()
                continue
            if now >= deadline:
                return None
            wake = min(deadline, self._last_heard + self._keepalive_s)
            if self._ping_sent_at is not None:
                wake = min(wake, self._ping_sent_at + self._request_timeout_s)
            message = await self._read(max(0.0, wake - now))
            if message is None:
                continue
            self._last_heard = time.monotonic()
            self._ping_sent_at = None
            event = parse_event_message(message)
            if event is not None:
                return event

    async def _send_ping(self) -> None:
        try:
            await self._pubsub.ping()
        except Exception as exc:
            raise translate_error(exc, what="subscription keep-alive") from exc
        self._ping_sent_at = time.monotonic()

    async def _read(self, timeout_s: float) -> dict[str, Any] | None:
        try:
            message: dict[str, Any] | None = await self._pubsub.get_message(timeout=timeout_s)
        except Exception as exc:
            raise translate_error(exc, what="subscription") from exc
        if message is None and not self._pubsub.connection:
            raise LeaseBackendError("subscription: connection closed", kind=BackendErrorKind.CONNECTION)
        return message

    async def close(self) -> None:
        try:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        except Exception:  # closing a broken connection may fail; nothing to do about it
            return


class QueuedEvents:
    """Events put by a reader (`_deliver`-style code appends to `_events` and sets `_wakeup`)."""

    def __init__(self, *, maxlen: int) -> None:
        self._events: collections.deque[LeaseEvent] = collections.deque(maxlen=maxlen)
        self._wakeup = asyncio.Event()
        self._error: LeaseBackendError | None = None
        self._closed = False

    async def next_event(self, timeout_s: float) -> LeaseEvent | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        while True:
            if self._events:
                return self._events.popleft()
            if self._error is not None:
                raise LeaseBackendError(str(self._error), kind=self._error.kind)
            if self._closed:
                raise LeaseBackendError("subscription: closed", kind=BackendErrorKind.CONNECTION)
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                return None
            self._wakeup.clear()
            try:
                async with asyncio.timeout(remaining_s):
                    await self._wakeup.wait()
            except TimeoutError:
                pass


class HubSubscription(QueuedEvents):
    """One lock's announcements from the hub (a `LeaseEventSubscription`).

    Keep-alives are the hub's business; `next_event` only waits for its queue. Events that came
    before the link broke are still handed out, then the error is raised. The hub feeds it
    (`deliver`, `fail`) and is told when it closes (`on_close`, which unsubscribes the last of a
    channel): the subscription needs nothing else of the hub.
    """

    def __init__(self, channel: str, *, queue_size: int, on_close: Callable[[HubSubscription], None]) -> None:
        super().__init__(maxlen=queue_size)
        self._on_close = on_close
        self.channel = channel
        #: Announcements dropped because the election did not read them in time.
        self.dropped = 0

    def deliver(self, event: LeaseEvent) -> None:
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
        self._events.append(event)
        self._wakeup.set()

    def fail(self, error: LeaseBackendError) -> None:
        self._error = error
        self._wakeup.set()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._wakeup.set()
            self._on_close(self)


class RedlockSubscription(QueuedEvents):
    """The announcements of every server's subscription, merged and de-duplicated.

    Every server of a majority publishes the same `acquired` / `released`, so each is handed out
    once. The subscription holds while a majority of its parts live (every grant's and release's
    majority shares a server with them, so none is missed); below that, `next_event` raises and
    the election subscribes again.
    """

    def __init__(self, parts: Sequence[LeaseEventSubscription], *, majority: int, keepalive_s: float) -> None:
        self._parts = list(parts)
        self._majority = majority
        self._live = len(self._parts)
        super().__init__(maxlen=64)
        self._seen: collections.OrderedDict[tuple[str, Holder], None] = collections.OrderedDict()
        loop = asyncio.get_running_loop()
        self._readers = [
            loop.create_task(self._read(part, keepalive_s), name="elector:redlock:announcements")
            for part in self._parts
        ]

    async def _read(self, part: LeaseEventSubscription, keepalive_s: float) -> None:
        try:
            while True:
                event = await part.next_event(timeout_s=keepalive_s)
                if event is not None:
                    self._deliver(event)
        except LeaseBackendError as exc:
            self._live -= 1
            if self._live < self._majority and self._error is None:
                self._error = exc
                self._wakeup.set()

    def _deliver(self, event: LeaseEvent) -> None:
        key = (event.kind.value, event.holder)
        if key in self._seen:
            return
        self._seen[key] = None
        if len(self._seen) > DEDUPE_WINDOW:
            self._seen.popitem(last=False)
        self._events.append(event)
        self._wakeup.set()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        for part in self._parts:
            await part.close()
