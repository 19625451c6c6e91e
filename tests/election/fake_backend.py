"""An in-memory lease backend with Redis's semantics, for unit tests of the state machine.

Time is the running loop's clock, so under looptime the whole election runs in virtual time.
Faults are scripted: `fail_with` makes every request raise until cleared, `hang` makes requests
never answer (the election's own timeouts must cut them), `requests` counts each call.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools

from elector.lease import (
    AcquireResult,
    BackendErrorKind,
    Candidate,
    Granted,
    Handoff,
    Held,
    Holder,
    Lease,
    LeaseBackendError,
    LeaseEvent,
    LeaseEventKind,
    Lost,
    Observation,
    QuietPeriod,
    Renewed,
    RenewResult,
    StandBack,
)


@dataclasses.dataclass
class StoredLease:
    value: str
    holder: Holder
    expires_at: float


class FakeSubscription:
    def __init__(self, store: FakeStore) -> None:
        self._store = store
        self.queue: asyncio.Queue[LeaseEvent] = asyncio.Queue()

    async def next_event(self, timeout_s: float) -> LeaseEvent | None:
        try:
            async with asyncio.timeout(timeout_s):
                return await self.queue.get()
        except TimeoutError:
            return None

    async def close(self) -> None:
        self._store.subscriptions.discard(self)


class FakeStore:
    """The shared 'Redis': one lock, its fencing counter and its subscribers."""

    def __init__(self) -> None:
        self.lease: StoredLease | None = None
        self.counter = 0
        self.quiet_until = 0.0
        self.subscriptions: set[FakeSubscription] = set()
        self._tokens = itertools.count(1)
        #: identity -> (priority, expires_at); entries lapse after 3 ttl, as in Redis.
        self.candidates: dict[str, tuple[int, float]] = {}
        #: (from, to, until) of a handoff in progress.
        self.handoff: tuple[str, str | None, float] | None = None

    def register(self, identity: str, *, priority: int, ttl_ms: int) -> None:
        self.candidates[identity] = (priority, self.now + 3 * ttl_ms / 1000)

    def live_candidates(self) -> dict[str, int]:
        return {name: prio for name, (prio, until) in self.candidates.items() if until > self.now}

    def current_handoff(self) -> Handoff | None:
        if self.handoff is None or self.handoff[2] <= self.now:
            self.handoff = None
            return None
        source, target, until = self.handoff
        return Handoff(
            from_identity=source, to_identity=target, remaining_ms=round((until - self.now) * 1000)
        )

    def request_handoff(self, *, to: str | None, window_s: float) -> None:
        """What `elector handoff` does: mark the handoff and announce it to the holder."""
        current = self.current()
        assert current is not None
        self.handoff = (current.holder.identity, to, self.now + window_s)
        self.publish(LeaseEventKind.HANDOFF, current.holder)

    @property
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def current(self) -> StoredLease | None:
        if self.lease is not None and self.lease.expires_at <= self.now:
            self.lease = None
        return self.lease

    def publish(self, kind: LeaseEventKind, holder: Holder) -> None:
        for sub in self.subscriptions:
            sub.queue.put_nowait(LeaseEvent(kind=kind, holder=holder))

    def overwrite(self, identity: str, *, ttl_s: float) -> Holder:
        """Someone else writes the key (like a manual SET), without an announcement."""
        self.counter += 1
        holder = Holder(identity=identity, fencing_token=self.counter)
        self.lease = StoredLease(value=f"foreign-{self.counter}", holder=holder, expires_at=self.now + ttl_s)
        return holder


class FakeBackend:
    def __init__(self, store: FakeStore, *, lock: str = "test-lock") -> None:
        self.store = store
        self._lock = lock
        self.fail_with: LeaseBackendError | None = None
        self.hang = False
        self.requests: collections.Counter[str] = collections.Counter()

    @property
    def lock(self) -> str:
        return self._lock

    async def _request(self, name: str) -> None:
        self.requests[name] += 1
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail_with is not None:
            raise self.fail_with

    async def acquire(self, identity: str, *, ttl_ms: int, priority: int = 0) -> AcquireResult:
        await self._request("acquire")
        store = self.store
        store.register(identity, priority=priority, ttl_ms=ttl_ms)
        current = store.current()
        if current is not None:
            return Held(holder=current.holder, remaining_ms=round((current.expires_at - store.now) * 1000))
        if store.quiet_until > store.now:
            return QuietPeriod(remaining_ms=round((store.quiet_until - store.now) * 1000))
        handoff = store.current_handoff()
        if handoff is not None:
            if identity == handoff.from_identity or handoff.to_identity not in (None, identity):
                return StandBack(handoff=handoff)
            store.handoff = None
        store.counter += 1
        value = f"{identity}/{next(store._tokens)}"
        lease = Lease(
            lock=self._lock, identity=identity, fencing_token=store.counter, ttl_ms=ttl_ms, value=value
        )
        store.lease = StoredLease(value=value, holder=lease.holder, expires_at=store.now + ttl_ms / 1000)
        store.publish(LeaseEventKind.ACQUIRED, lease.holder)
        return Granted(lease=lease)

    async def renew(self, lease: Lease, *, priority: int = 0) -> RenewResult:
        await self._request("renew")
        self.store.register(lease.identity, priority=priority, ttl_ms=lease.ttl_ms)
        current = self.store.current()
        if current is None or current.value != lease.value:
            if current is None:
                return Lost(holder=None, remaining_ms=None)
            return Lost(
                holder=current.holder, remaining_ms=round((current.expires_at - self.store.now) * 1000)
            )
        current.expires_at = self.store.now + lease.ttl_ms / 1000
        handoff = self.store.current_handoff()
        if handoff is not None and handoff.from_identity != lease.identity:
            handoff = None
        rivals = {k: v for k, v in self.store.live_candidates().items() if k != lease.identity}
        best = max(rivals.items(), key=lambda item: (item[1], item[0]), default=None)
        rival = None
        if best is not None:
            rival = Candidate(identity=best[0], priority=best[1], last_seen_ms_ago=0)
        return Renewed(handoff=handoff, best_rival=rival)

    async def release(
        self, lease: Lease, *, handoff_to: str | None = None, handoff_window_ms: int = 0
    ) -> bool:
        await self._request("release")
        current = self.store.current()
        if current is None or current.value != lease.value:
            return False
        self.store.lease = None
        if handoff_to is not None:
            self.store.handoff = (lease.identity, handoff_to, self.store.now + handoff_window_ms / 1000)
        self.store.publish(LeaseEventKind.RELEASED, lease.holder)
        return True

    async def withdraw(self, identity: str) -> None:
        await self._request("withdraw")
        self.store.candidates.pop(identity, None)

    async def observe(self) -> Observation:
        await self._request("observe")
        current = self.store.current()
        return Observation(
            holder=current.holder if current else None,
            unrecognised_value=False,
            remaining_ms=round((current.expires_at - self.store.now) * 1000) if current else None,
            last_fencing_token=self.store.counter or None,
            quiet_remaining_ms=0,
        )

    async def subscribe(self, *, keepalive_s: float) -> FakeSubscription:
        await self._request("subscribe")
        sub = FakeSubscription(self.store)
        self.store.subscriptions.add(sub)
        return sub


def unreachable() -> LeaseBackendError:
    return LeaseBackendError("cannot reach Redis: connection refused", kind=BackendErrorKind.CONNECTION)
