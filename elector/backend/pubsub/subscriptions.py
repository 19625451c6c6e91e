"""Lease-event subscriptions built from parts: the waiting queue, and Redlock's merged one.

`QueuedEvents` is the waiting half of a subscription: a reader fills its queue and `next_event`
empties it; events that came before an error are still handed out, then the error is raised, and
a closed subscription raises a connection error. The hub's per-lock subscriptions
(backend/hub.py) and `RedlockSubscription` (every Redlock server's announcements, merged and
de-duplicated) are built on it.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence

from elector.lease import BackendErrorKind, Holder, LeaseBackendError, LeaseEvent, LeaseEventSubscription

#: Announcements remembered for de-duplication (every server publishes the same ones).
DEDUPE_WINDOW = 256


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
