"""An in-memory lease backend with Redis's semantics, for unit tests of the state machine.

Time is the running loop's clock, so under looptime the whole election runs in virtual time
(or any clock passed as `FakeStore(clock=...)`). Faults are scripted: `fail_with` makes every
request raise until cleared, `hang` makes requests never answer (the election's own timeouts
must cut them), `requests` counts each call.

tests/backend/test_fake_contract.py runs this fake and the real Lua scripts through the same
sequences of operations: a change of the scripts' semantics must be made here too. (The batch
forms of ACQUIRE, RENEW and RELEASE, lua/batch.py, run the single scripts' own code per lease;
the contract test runs its sequences through them as well.)

Not modelled: the owner-token adoption of a grant whose answer was lost, foreign or garbage
data, protocol versions, and each contender's memory of the ttls in use (a quiet period lasts
the ttl of the request that started it).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import secrets
from collections.abc import Callable

from elector.backend import HandoffRefusedError
from elector.backend.candidates import check_priority
from elector.backend.errors import invalid_request
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


@dataclasses.dataclass
class CandidateEntry:
    priority: int
    #: When the candidate last refreshed its entry (an acquire attempt or a renewal).
    seen_at: float
    #: When the entry lapses: 3 ttl after the refresh, as in Redis.
    until: float


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
    """The shared 'Redis': one lock, its fencing counter and its subscribers.

    By default the lock has been used before (as after `tests.support.seed`): the first request
    is granted at once. `new_lock=True` models a brand-new lock (no fencing counter yet): its
    first acquire starts a quiet period of one ttl, as the ACQUIRE script does.
    """

    def __init__(self, *, clock: Callable[[], float] | None = None, new_lock: bool = False) -> None:
        self.lease: StoredLease | None = None
        self.counter = 0
        #: True while the fencing counter is missing (a new lock, or lost data).
        self.counter_missing = new_lock
        self.quiet_until = 0.0
        self.subscriptions: set[FakeSubscription] = set()
        self._clock = clock
        self._tokens = itertools.count(1)
        #: identity -> its entry; entries lapse after 3 ttl, as in Redis.
        self.candidates: dict[str, CandidateEntry] = {}
        #: identity -> the nonce of the backend (instance) that registered it last.
        self.instances: dict[str, str] = {}
        #: (from, to, until) of a handoff in progress.
        self.handoff: tuple[str, str | None, float] | None = None

    def register(self, identity: str, *, priority: int, ttl_ms: int, nonce: str | None = None) -> bool:
        """Refresh `identity`'s entry; whether its live entry was another instance's (a clash)."""
        entry = self.candidates.get(identity)
        stored = self.instances.get(identity)
        clash = (
            nonce is not None
            and entry is not None
            and entry.until > self.now
            and stored is not None
            and stored != nonce
        )
        self.candidates[identity] = CandidateEntry(
            priority=priority, seen_at=self.now, until=self.now + 3 * ttl_ms / 1000
        )
        if nonce is not None:
            self.instances[identity] = nonce
        return clash

    def live_candidates(self) -> dict[str, int]:
        return {name: entry.priority for name, entry in self.candidates.items() if entry.until > self.now}

    def best_rival(self, identity: str, *, ttl_ms: int) -> Candidate | None:
        """The live candidate other than `identity` with the highest priority (ties: the greatest
        identity) among those seen within the last ttl, as the RENEW script picks it."""
        now = self.now
        rivals = [
            (entry.priority, name, entry.seen_at)
            for name, entry in self.candidates.items()
            if name != identity and entry.until > now and now - entry.seen_at < ttl_ms / 1000
        ]
        if not rivals:
            return None
        priority, name, seen_at = max(rivals)
        return Candidate(identity=name, priority=priority, last_seen_ms_ago=max(0, self._ms(now - seen_at)))

    def current_handoff(self) -> Handoff | None:
        if self.handoff is None or self.handoff[2] <= self.now:
            self.handoff = None
            return None
        source, target, until = self.handoff
        return Handoff(from_identity=source, to_identity=target, remaining_ms=self._ms(until - self.now))

    def request_handoff(self, *, to: str | None, window_s: float) -> Handoff | None:
        """What `elector handoff` does: mark the handoff and announce it to the holder.

        None when nobody holds the lock; HandoffRefusedError when `to` already holds it.
        """
        current = self.current()
        if current is None:
            return None
        if to == current.holder.identity:
            raise HandoffRefusedError(to)
        self.handoff = (current.holder.identity, to, self.now + window_s)
        self.publish(LeaseEventKind.HANDOFF, current.holder)
        return self.current_handoff()

    @property
    def now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()

    @staticmethod
    def _ms(seconds: float) -> int:
        return round(seconds * 1000)

    def remaining_ms(self, until: float) -> int:
        return self._ms(until - self.now)

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
        #: This instance's nonce in the registry, and whether a registration of ours was answered
        #: (the first one's clash is not reported), as RedisLeaseBackend.
        self.nonce = secrets.token_hex(8)
        self._registered = False

    def _register(self, identity: str, *, priority: int, ttl_ms: int) -> bool:
        clash = self.store.register(identity, priority=priority, ttl_ms=ttl_ms, nonce=self.nonce)
        clash, self._registered = clash and self._registered, True
        return clash

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
        # Bad arguments are refused as the real backend refuses them (the same checks, unsent).
        if ttl_ms <= 0:
            raise invalid_request("acquire", f"ttl must be positive, got {ttl_ms} ms")
        check_priority(priority, what="acquire")
        await self._request("acquire")
        store = self.store
        clash = self._register(identity, priority=priority, ttl_ms=ttl_ms)
        current = store.current()
        if current is not None:
            remaining = store.remaining_ms(current.expires_at)
            return Held(holder=current.holder, remaining_ms=remaining, identity_clash=clash)
        if store.quiet_until > store.now:
            return QuietPeriod(remaining_ms=store.remaining_ms(store.quiet_until), identity_clash=clash)
        if store.counter_missing:
            # No counter: whatever was granted before may still be believed. The next token is
            # taken from "the clock" (above every earlier one) and nobody is granted for a ttl.
            store.counter_missing = False
            store.counter += 1
            store.quiet_until = store.now + ttl_ms / 1000
            return QuietPeriod(remaining_ms=ttl_ms, identity_clash=clash)
        handoff = store.current_handoff()
        if handoff is not None:
            if identity == handoff.from_identity or handoff.to_identity not in (None, identity):
                return StandBack(handoff=handoff, identity_clash=clash)
            store.handoff = None
        store.counter += 1
        value = f"{identity}/{next(store._tokens)}"
        lease = Lease(
            lock=self._lock, identity=identity, fencing_token=store.counter, ttl_ms=ttl_ms, value=value
        )
        store.lease = StoredLease(value=value, holder=lease.holder, expires_at=store.now + ttl_ms / 1000)
        store.publish(LeaseEventKind.ACQUIRED, lease.holder)
        return Granted(lease=lease, identity_clash=clash)

    async def renew(self, lease: Lease, *, priority: int = 0) -> RenewResult:
        check_priority(priority, what="renew")
        await self._request("renew")
        store = self.store
        clash = self._register(lease.identity, priority=priority, ttl_ms=lease.ttl_ms)
        current = store.current()
        if current is None or current.value != lease.value:
            if current is None:
                return Lost(holder=None, remaining_ms=None, identity_clash=clash)
            remaining = store.remaining_ms(current.expires_at)
            return Lost(holder=current.holder, remaining_ms=remaining, identity_clash=clash)
        current.expires_at = store.now + lease.ttl_ms / 1000
        handoff = store.current_handoff()
        if handoff is not None and handoff.from_identity != lease.identity:
            handoff = None
        rival = store.best_rival(lease.identity, ttl_ms=lease.ttl_ms)
        return Renewed(handoff=handoff, best_rival=rival, identity_clash=clash)

    async def release(
        self, lease: Lease, *, handoff_to: str | None = None, handoff_window_ms: int = 0
    ) -> bool:
        if handoff_to is not None and handoff_window_ms <= 0:
            raise invalid_request("release", f"a handoff window must be positive, got {handoff_window_ms} ms")
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
        self.store.instances.pop(identity, None)

    async def observe(self) -> Observation:
        await self._request("observe")
        store = self.store
        current = store.current()
        return Observation(
            holder=current.holder if current else None,
            unrecognised_value=False,
            remaining_ms=store.remaining_ms(current.expires_at) if current else None,
            last_fencing_token=None if store.counter_missing else store.counter or None,
            quiet_remaining_ms=max(0, store.remaining_ms(store.quiet_until)),
        )

    async def subscribe(self, *, keepalive_s: float) -> FakeSubscription:
        await self._request("subscribe")
        sub = FakeSubscription(self.store)
        self.store.subscriptions.add(sub)
        return sub


def unreachable() -> LeaseBackendError:
    return LeaseBackendError("cannot reach Redis: connection refused", kind=BackendErrorKind.CONNECTION)
