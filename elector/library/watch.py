"""Watch who leads a lock without contending: `elector.watch(lock, redis=...)`.

    async with elector.watch("nightly-report", redis="redis://redis:6379/0") as leaders:
        async for leader in leaders:   # a change at a time: Leader(identity, fencing_token)
            print(leader.identity or "nobody leads")

Like client-go's `OnNewLeader`/`GetLeader` and `etcdctl elect --listen`. It follows the lock as a
follower does, minus the contending: subscribed to the lock's announcements first, then one look
(a read, no write); then it sleeps until the holder's lease would run out (its PTTL, plus a few
ms), an announcement (a grant or a release: looked at at once, since anyone may publish), or a
ttl when the lock is free, whichever comes first. A quiet held lock costs one read per lease
lifetime, never a fixed polling period. Redis unreachable: one WARNING, retries with back-off;
unreachable for longer than a ttl, the leader is reported unknown (`Leader.known` False) instead
of the last one seen, whose lease may well have run out meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import AsyncIterator, Sequence
from types import TracebackType

import redis.asyncio as aioredis

from elector.backend import RedisLeaseBackend
from elector.backend.topologies.factory import LeaseConnections
from elector.backoff import backoff_delay_s
from elector.election.clock import boottime
from elector.lease import (
    LeaseBackend,
    LeaseBackendError,
    LeaseEventKind,
    LeaseEventSubscription,
    check_lock_name,
)
from elector.library._connections import open_connections
from elector.library._params import build_timing, checked, factory_of, lease_source
from elector.library.errors import ProcessBound, refuse_pickling

logger = logging.getLogger("elector.api")

#: A flood of announcements must not become a flood of reads (the election's own spacing).
MIN_LOOK_SPACING_S = 0.005
#: Waking a little after the holder's PTTL ran out, never before it.
WAKE_JITTER_S = 0.002


@dataclasses.dataclass(frozen=True, slots=True)
class Leader:
    """Who leads a lock: `identity` and `fencing_token`, both None when nobody does.

    `known` is False (and both None) when Redis has not answered the watch for over a ttl: who
    leads is unknown, not "nobody".
    """

    identity: str | None
    fencing_token: int | None
    known: bool = True


#: What the watch reports once Redis has not answered it for longer than a ttl.
UNKNOWN = Leader(None, None, known=False)


class LeaderWatch:
    """`async with` it, then `async for leader in it`: each change of the lock's leader.

    The first item is the leader at the start (possibly `Leader(None, None)`). Parameters as
    `elector.Elector`'s (`redis` a URL or your `redis.asyncio.Redis`, `cluster`, `redlock`,
    `key_prefix`); `ttl_s`, the lock's ttl, caps how long a free lock goes unlooked-at.
    """

    def __init__(
        self,
        lock: str,
        *,
        redis: aioredis.Redis | str | None = None,
        cluster: bool = False,
        redlock: Sequence[str] | None = None,
        ttl_s: float = 10.0,
        request_timeout_s: float | None = None,
        key_prefix: str = "elector",
    ) -> None:
        self.lock = checked("lock", check_lock_name, lock)
        #: Used only in this process: a fork's copy is refused (see errors.ForkedElectorError).
        self._process = ProcessBound(lock=self.lock, what="watch")
        self.timing = build_timing(
            ttl_s=ttl_s,
            renew_interval_s=None,
            renew_deadline_s=None,
            request_timeout_s=request_timeout_s,
            stop_work_s=None,
        )
        self._settings, self._client = lease_source(
            redis, cluster=cluster, redlock=redlock, timing=self.timing, key_prefix=key_prefix
        )
        self._key_prefix = key_prefix
        self._connections: LeaseConnections | None = None
        self._backend: LeaseBackend | None = None
        self._rng = random.Random()
        self._redis_down = False
        #: The latest leader seen (None before the first look).
        self.leader: Leader | None = None

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        raise refuse_pickling("watch", self.lock)

    async def __aenter__(self) -> LeaderWatch:
        self._process.check()
        if self._settings is None:
            assert self._client is not None
            self._backend = RedisLeaseBackend(self._client, lock=self.lock, key_prefix=self._key_prefix)
            return self
        self._connections = connections = await open_connections(
            self._settings,
            client_name=f"elector:{self.lock}:watch",
            timing=self.timing,
            who=f"watch of lock {self.lock!r}",
            then="retrying",
        )
        self._backend = connections.backend_for(self.lock)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._connections is not None:
            await self._connections.aclose(within_s=self.timing.request_timeout_s)
        self._backend = self._connections = None

    def __aiter__(self) -> AsyncIterator[Leader]:
        self._process.check()
        if self._backend is None:
            raise RuntimeError(f"the watch of lock {self.lock!r} is not open: use `async with`")
        return self._changes(self._backend)

    async def _changes(self, backend: LeaseBackend) -> AsyncIterator[Leader]:
        subscription: LeaseEventSubscription | None = None
        failures = 0
        next_look = boottime()
        last_look = -MIN_LOOK_SPACING_S
        answered_at = boottime()  # the watch's start counts as an answer: a ttl's grace
        try:
            while True:
                if subscription is None:
                    # Subscribed before each look, so that no release slips in between.
                    subscription = await self._subscribe(backend)
                now = boottime()
                if now >= next_look:
                    last_look = now
                    looked = await self._look(backend)
                    if looked is None:
                        failures += 1
                        next_look = boottime() + self._retry_delay_s(failures)
                        if boottime() - answered_at > self.timing.ttl_s and self.leader != UNKNOWN:
                            self.leader = UNKNOWN
                            yield UNKNOWN
                    else:
                        failures = 0
                        answered_at = boottime()
                        leader, next_look = looked
                        if leader != self.leader:
                            self.leader = leader
                            yield leader
                wait_s = max(0.0, next_look - boottime())
                if subscription is None:
                    await asyncio.sleep(min(wait_s, self._retry_delay_s(1)))
                    continue
                try:
                    event = await subscription.next_event(timeout_s=wait_s)
                except LeaseBackendError as exc:
                    logger.debug("watch of lock %r: announcements broke: %s", self.lock, exc)
                    await subscription.close()
                    subscription = None
                    next_look = min(next_look, boottime())  # may have missed a release
                    continue
                if event is not None and event.kind in (LeaseEventKind.ACQUIRED, LeaseEventKind.RELEASED):
                    next_look = min(next_look, max(boottime(), last_look + MIN_LOOK_SPACING_S))
        finally:
            if subscription is not None:
                with contextlib.suppress(Exception):
                    await subscription.close()

    async def _subscribe(self, backend: LeaseBackend) -> LeaseEventSubscription | None:
        try:
            async with asyncio.timeout(2 * self.timing.request_timeout_s):
                return await backend.subscribe(keepalive_s=max(60.0, 6 * self.timing.ttl_s))
        except (LeaseBackendError, TimeoutError) as exc:
            logger.debug("watch of lock %r: cannot subscribe: %s", self.lock, exc)
            return None

    async def _look(self, backend: LeaseBackend) -> tuple[Leader, float] | None:
        """The leader now and when to look next; None (logged) when Redis did not answer."""
        sent = boottime()
        try:
            async with asyncio.timeout(self.timing.request_timeout_s):
                observation = await backend.observe()
        except (LeaseBackendError, TimeoutError) as exc:
            if not self._redis_down:
                self._redis_down = True
                error = "Redis did not answer in time" if isinstance(exc, TimeoutError) else str(exc)
                logger.warning("watch of lock %r: Redis unreachable (%s); retrying", self.lock, error)
            return None
        if self._redis_down:
            self._redis_down = False
            logger.info("watch of lock %r: Redis answers again", self.lock)
        holder = observation.holder
        cap = sent + self.timing.ttl_s
        if holder is None:
            return Leader(None, None), cap
        leader = Leader(holder.identity, holder.fencing_token)
        if observation.remaining_ms is None:
            return leader, cap
        # Redis read the PTTL after `sent`: the lease runs out no earlier than sent + PTTL.
        expires_at = sent + max(observation.remaining_ms, 1) / 1000
        return leader, min(cap, expires_at + self._rng.uniform(0.0, WAKE_JITTER_S))

    def _retry_delay_s(self, failures: int) -> float:
        return backoff_delay_s(
            failures,
            base_s=min(0.1, self.timing.renew_interval_s / 4),
            cap_s=min(self.timing.renew_interval_s, 2.0),
            jitter=0.5,
            rng=self._rng,
        )


watch = factory_of(
    LeaderWatch, name="watch", doc="Watch who leads `lock` without contending (see `LeaderWatch`)."
)
