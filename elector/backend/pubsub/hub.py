"""One shared pub/sub connection for the announcements of every lock of a daemon.

Without it each lock's election opens a pub/sub connection of its own (`RedisEventSubscription`):
a daemon holding 1,000 locks would keep 1,000 idle connections to Redis. The `EventHub` keeps ONE,
adds and drops channels on it (SUBSCRIBE / UNSUBSCRIBE) as elections come and go, and its reader
task hands each announcement to the subscriptions of that channel only.

Failure model. The link is checked by a PING after `keepalive_s` of silence (any message is a
sign of life), and every command sent on it (SUBSCRIBE, UNSUBSCRIBE, PING) must be answered within
`request_timeout_s`. A broken read, a failed write or a late answer breaks the link: every live
subscription's `next_event` raises `LeaseBackendError` (its election re-subscribes and looks at
the lock again, since announcements may have been missed) and the connection is dropped. The hub
reconnects lazily, on the next `subscribe()`, and backs off: a link that breaks before it has
stayed up for `stable_link_s` (an idle-timeout proxy that drops it right after SUBSCRIBE, a
server that refuses connections) counts as a failure, and after the second failure in a row
subscribe() fails at once for a cooldown that doubles with each failure up to
`max_backoff_s`. Only a link that stayed up that long resets the count, so a link that keeps
breaking right after subscribing costs a connection every `max_backoff_s`, not a reconnect loop.
The channels of the broken subscriptions are put in the reconnect's single SUBSCRIBE, so a
herd of re-subscribing elections costs one connection and one command, and each of them finds
its channel live already. Channels nobody claims back within `orphan_grace_s` are unsubscribed.

The connection's own wire protocol (writer and reader tasks, replies matched in order, deadlines,
keep-alive PING) is `PubSubLink`, in link.py; the subscriptions it hands out (`HubSubscription`)
are in subscriptions.py; this module keeps track of them. A lease backend sees the hub only as a
`LeaseEventSource` (pubsub/__init__.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import redis.asyncio

from elector.backend.codec import parse_event_message
from elector.backend.errors import translate_error
from elector.backend.pubsub.link import PubSubLink
from elector.backend.pubsub.subscriptions import HubSubscription
from elector.backoff import backoff_delay_s
from elector.lease import BackendErrorKind, LeaseBackendError

logger = logging.getLogger(__name__)

#: Announcements kept per subscription between two reads by its election; the oldest are dropped
#: beyond that (the election looks at the lock itself on its own schedule anyway).
DEFAULT_QUEUE_SIZE = 16
#: How long the channels of broken subscriptions stay subscribed after a reconnect, waiting for
#: their elections to come back (an election backs off at most 30 s between attempts).
DEFAULT_ORPHAN_GRACE_S = 60.0
#: After a failed connect, subscribe() calls fail at once for this long instead of each trying
#: again: a thousand elections retrying must not become a thousand connection attempts. It is
#: also the first step of the back-off of a link that keeps failing (doubled per failure).
RECONNECT_COOLDOWN_S = 0.5
#: A link that stayed up this long was a good one: the back-off starts over after it breaks.
DEFAULT_STABLE_LINK_S = 10.0
#: The longest cooldown between two connections of a link that keeps failing.
DEFAULT_MAX_BACKOFF_S = 30.0


#: Share of a cooldown drawn at random (full jitter in the upper half): hubs of many daemons
#: behind one proxy drift apart instead of reconnecting in step.
COOLDOWN_JITTER = 0.5


def backoff_s(failures: int, *, max_backoff_s: float, jitter: float = 0.0) -> float:
    """The cooldown after `failures` failed links in a row: none after the first (a broken link
    is re-made at once), then RECONNECT_COOLDOWN_S doubling per failure, capped."""
    if failures <= 1:
        return 0.0
    return backoff_delay_s(failures - 1, base_s=RECONNECT_COOLDOWN_S, cap_s=max_backoff_s, jitter=jitter)


class EventHub:
    """ONE pub/sub connection carrying the announcement channels of every lock of a daemon."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        keepalive_s: float,
        request_timeout_s: float,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
        stable_link_s: float = DEFAULT_STABLE_LINK_S,
        max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
    ) -> None:
        if keepalive_s <= 0 or request_timeout_s <= 0 or orphan_grace_s < 0 or queue_size < 1:
            raise ValueError("keepalive, request timeout and queue size must be positive")
        if stable_link_s <= 0 or max_backoff_s < RECONNECT_COOLDOWN_S:
            raise ValueError(
                f"stable_link_s must be positive and max_backoff_s at least {RECONNECT_COOLDOWN_S} s, "
                f"got {stable_link_s} and {max_backoff_s}"
            )
        self._stable_link_s = stable_link_s
        self._max_backoff_s = max_backoff_s
        #: Links that failed in a row (a failed connect, or a link broken before stable_link_s).
        self.failures_in_a_row = 0
        self._link_opened_at = 0.0
        self.client = client
        self.keepalive_s = keepalive_s
        self.request_timeout_s = request_timeout_s
        self._queue_size = queue_size
        self._orphan_grace_s = orphan_grace_s
        #: Open, healthy subscriptions per channel (confirmed, or waiting for confirmation).
        self._subscribers: dict[str, set[HubSubscription]] = {}
        #: Channels whose subscriptions broke with the link -> when; re-subscribed on reconnect.
        self._orphans: dict[str, float] = {}
        self._orphan_timer: asyncio.TimerHandle | None = None
        #: Subscriptions confirmed on the current link: they fail with it.
        self._attached: set[HubSubscription] = set()
        self._link: PubSubLink | None = None
        self._connecting: asyncio.Task[PubSubLink] | None = None
        self._connect_failed: tuple[float, LeaseBackendError] | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Connections opened so far (one, plus one per reconnect).
        self.connections_opened = 0

    @property
    def channels(self) -> frozenset[str]:
        """Channels with at least one open subscription."""
        return frozenset(self._subscribers)

    async def subscribe(self, channel: str) -> HubSubscription:
        """Subscribe to `channel`; returns once Redis confirmed it. Raises LeaseBackendError."""
        if self._closed:
            raise LeaseBackendError("subscribe: the event hub is closed", kind=BackendErrorKind.CONNECTION)
        subscription = HubSubscription(channel, queue_size=self._queue_size, on_close=self._drop)
        self._subscribers.setdefault(channel, set()).add(subscription)
        self._orphans.pop(channel, None)
        try:
            link = await self._connected()
            confirmed = link.channels.get(channel)
            if confirmed is None:
                confirmed = link.subscribe([channel])
            # Shielded: a caller that gives up must not cancel a confirmation others share.
            await asyncio.shield(confirmed)
            if link.error is not None:
                raise LeaseBackendError(str(link.error), kind=link.error.kind)
        except BaseException:
            self._drop(subscription)
            raise
        self._attached.add(subscription)
        return subscription

    async def aclose(self) -> None:
        """Close every subscription (their next_event raises) and the connection."""
        self._closed = True
        if self._orphan_timer is not None:
            self._orphan_timer.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
        if self._link is not None:
            self._link.broken(
                LeaseBackendError("announcements: the event hub was closed", kind=BackendErrorKind.CONNECTION)
            )
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- connecting ----------------------------------------------------------------------------

    async def _connected(self) -> PubSubLink:
        link = self._link
        if link is not None and link.error is None:
            return link
        if self._connecting is None:
            loop = asyncio.get_running_loop()
            if self._connect_failed is not None and loop.time() < self._connect_failed[0]:
                error = self._connect_failed[1]
                raise LeaseBackendError(str(error), kind=error.kind)
            self._connecting = self._spawn(self._connect(), "elector:hub:connect")
            self._connecting.add_done_callback(self._connect_done)
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if connecting.cancelled() and task is not None and not task.cancelling():
                # aclose() cancelled the connect, not our caller: a backend error, not a cancellation.
                raise LeaseBackendError(
                    "subscribe: the event hub is closed", kind=BackendErrorKind.CONNECTION
                ) from None
            raise

    async def _connect(self) -> PubSubLink:
        try:
            conn = await self.client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise translate_error(exc, what="subscribe") from exc
        self.connections_opened += 1
        link = PubSubLink(
            conn,
            pool=self.client.connection_pool,
            keepalive_s=self.keepalive_s,
            request_timeout_s=self.request_timeout_s,
            on_message=self._dispatch,
            on_broken=self._link_broken,
            spawn=self._spawn,
        )
        if self._closed:  # aclose() came while we were connecting
            error = LeaseBackendError("subscribe: the event hub is closed", kind=BackendErrorKind.CONNECTION)
            link.broken(error)
            raise error
        # One SUBSCRIBE for everything wanted: the new subscribers and the broken ones' channels.
        channels = sorted({*self._subscribers, *self._orphans})
        if channels:
            link.subscribe(channels)
        self._link = link
        return link

    def _connect_done(self, task: asyncio.Task[PubSubLink]) -> None:
        self._connecting = None
        if task.cancelled():
            return
        error = task.exception()  # also marks it retrieved when every caller gave up
        if isinstance(error, LeaseBackendError):
            self.failures_in_a_row += 1
            cooldown_s = max(RECONNECT_COOLDOWN_S, self._backoff_s())
            self._connect_failed = (asyncio.get_running_loop().time() + cooldown_s, error)
        elif error is None:
            self._connect_failed = None
            self._link_opened_at = asyncio.get_running_loop().time()

    def _backoff_s(self) -> float:
        return backoff_s(self.failures_in_a_row, max_backoff_s=self._max_backoff_s, jitter=COOLDOWN_JITTER)

    def _link_broken(self, link: PubSubLink, error: LeaseBackendError) -> None:
        if self._link is not link:
            return
        logger.debug("announcement connection lost (%d subscriptions): %s", len(self._attached), error)
        self._link = None
        now = asyncio.get_running_loop().time()
        if now - self._link_opened_at >= self._stable_link_s:
            self.failures_in_a_row = 0
        self.failures_in_a_row += 1
        cooldown_s = self._backoff_s()
        if cooldown_s > 0 and not self._closed:
            logger.debug(
                "announcement link failed %d times in a row: next in %.1f s",
                self.failures_in_a_row,
                cooldown_s,
            )
            self._connect_failed = (now + cooldown_s, error)
        for subscription in self._attached:
            subscribers = self._subscribers.get(subscription.channel)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._subscribers[subscription.channel]
            if not self._closed:
                self._orphans.setdefault(subscription.channel, now)
            subscription.fail(error)
        self._attached.clear()
        if self._orphans and self._orphan_timer is None and not self._closed:
            self._orphan_timer = asyncio.get_running_loop().call_later(
                self._orphan_grace_s, self._expire_orphans
            )

    def _expire_orphans(self) -> None:
        self._orphan_timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        expired = [c for c, since in self._orphans.items() if now - since >= self._orphan_grace_s]
        for channel in expired:
            del self._orphans[channel]
        link = self._link
        if link is not None and link.error is None:
            unclaimed = [c for c in expired if c in link.channels and c not in self._subscribers]
            if unclaimed:
                link.unsubscribe(unclaimed)
        if self._orphans:
            first = min(self._orphans.values())
            self._orphan_timer = loop.call_at(first + self._orphan_grace_s, self._expire_orphans)

    # -- subscriptions -------------------------------------------------------------------------

    def _dispatch(self, channel: str, data: Any) -> None:
        subscribers = self._subscribers.get(channel)
        if not subscribers:
            return
        if isinstance(data, str):
            data = data.encode("utf-8")
        event = parse_event_message({"type": "message", "data": data})
        if event is not None:
            for subscription in subscribers:
                subscription.deliver(event)

    def _drop(self, subscription: HubSubscription) -> None:
        """Forget a closed subscription; the last one of a channel unsubscribes it."""
        self._attached.discard(subscription)
        subscribers = self._subscribers.get(subscription.channel)
        if subscribers is None or subscription not in subscribers:
            return  # already detached by a broken link
        subscribers.discard(subscription)
        if subscribers:
            return
        del self._subscribers[subscription.channel]
        link = self._link
        if link is not None and link.error is None and subscription.channel in link.channels:
            link.unsubscribe([subscription.channel])

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
