"""A lock renamed without two leaders: lead the new lock only while holding its predecessor too.

A release that renames its lock (chart 0.1.0's `jobs-elector` became `apps/jobs-elector`) runs old
and new replicas side by side during a rolling update. On two unrelated locks they would both
lead. With `--predecessor-lock OLD`, a new replica treats the two locks as one lease:

- **acquire**: the new lock, then the predecessor, and never a wait while holding one: an
  attempt that gets the first but not the second gives the first back at once (and follows the
  second's holder), so two replicas never each hold one lock and wait for the other. The new lock
  first because giving it back is silent to everyone who waits: followers listen to the
  predecessor's announcements (every term ends with its release), and nobody holds the new lock
  without the predecessor for more than that attempt. The other order would announce the
  predecessor's return to all of them at every failed attempt, and wake them all to try again.
- **renew**: both, sent together, inside one cycle: the election counts the validity from the
  send time of the cycle, before either request, so it ends before either key can expire. A
  renewal that fails on either is a failed renewal (retried until the renew deadline), and either
  lock lost is the lease lost: the election steps down before the predecessor's validity ends.
- **release**: the new lock first, then the predecessor (a waiter woken by the predecessor's
  release then finds the new lock free). A lock still held after the other was lost is released
  at the next acquire, after the step-down has stopped the work: until then it fences peers out.

The election sees one lease: one term, one `/leader`, one leader file, one set of metrics, one
command in exec mode. Its fencing token is the predecessor's: every leader during the migration
(old replicas, new ones, and old ones again after a rollback) is granted the predecessor, whose
counter orders all of their terms. docs/upgrades.md says how a migration ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from elector.lease import (
    AcquireResult,
    Granted,
    Held,
    Lease,
    LeaseBackend,
    LeaseBackendError,
    LeaseEventSubscription,
    Lost,
    Observation,
    QuietPeriod,
    Renewed,
    RenewResult,
    StandBack,
)


@dataclasses.dataclass(frozen=True, slots=True)
class _Term:
    """The two leases behind the one the election holds."""

    lock: Lease
    predecessor: Lease


class PredecessorLeaseBackend:
    """The lease of `lock` held together with `predecessor`'s, as one `LeaseBackend`."""

    def __init__(self, lock: LeaseBackend, *, predecessor: LeaseBackend) -> None:
        if lock.lock == predecessor.lock:
            raise ValueError(f"the predecessor of lock {lock.lock!r} must be another lock")
        self._lock = lock
        self._predecessor = predecessor
        #: The term under way, by the lease the election holds.
        self._terms: dict[Lease, _Term] = {}
        #: Leases still ours after their term ended without a release (the other lock was lost,
        #: or an acquire was cut short): released at the next acquire or withdraw.
        self._leftovers: list[tuple[LeaseBackend, Lease]] = []

    @property
    def lock(self) -> str:
        return self._lock.lock

    @property
    def predecessor(self) -> str:
        return self._predecessor.lock

    async def acquire(self, identity: str, *, ttl_ms: int, priority: int = 0) -> AcquireResult:
        await self._release_leftovers()
        first = await self._lock.acquire(identity, ttl_ms=ttl_ms, priority=priority)
        if isinstance(first, Held):
            return await self._held_by_leader(first)
        if not isinstance(first, Granted):
            return first
        try:
            second = await self._predecessor.acquire(identity, ttl_ms=ttl_ms, priority=priority)
        except BaseException:
            # Cut short (an error, the election's timeout): the new lock is given back next time.
            self._leftovers.append((self._lock, first.lease))
            raise
        clash = first.identity_clash or second.identity_clash
        if not isinstance(second, Granted):
            # The predecessor's holder (an old replica) leads: give the new lock back now.
            self._leftovers.append((self._lock, first.lease))
            await self._release_leftovers()
            return _with_clash(second, clash)
        mine = second.lease
        lease = Lease(
            lock=self.lock,
            identity=identity,
            fencing_token=mine.fencing_token,
            ttl_ms=ttl_ms,
            value=first.lease.value,
        )
        self._terms[lease] = _Term(lock=first.lease, predecessor=mine)
        return Granted(lease=lease, identity_clash=clash)

    async def _held_by_leader(self, held: Held) -> Held:
        """`held` (the new lock's answer) naming the predecessor's holder when there is one: the
        leader's own token is the predecessor's, and followers show the leader as it shows itself."""
        try:
            observed = await self._predecessor.observe()
        except LeaseBackendError:
            return held  # only a name shown: the new lock's answer stands
        if observed.holder is None:
            return held  # a replica of a later release, without the predecessor, holds the new lock
        return dataclasses.replace(held, holder=observed.holder)

    async def renew(self, lease: Lease, *, priority: int = 0) -> RenewResult:
        term = self._terms.get(lease)
        if term is None:
            return Lost(holder=None, remaining_ms=None)
        answers = await asyncio.gather(
            self._lock.renew(term.lock, priority=priority),
            self._predecessor.renew(term.predecessor, priority=priority),
            return_exceptions=True,
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, Exception):
                raise answer  # a cancellation
        lock_answer, predecessor_answer = answers
        lost = next((a for a in (predecessor_answer, lock_answer) if isinstance(a, Lost)), None)
        if lost is not None:
            # Either lock lost is the lease lost. The other stays ours until the work has stopped.
            del self._terms[lease]
            if not isinstance(lock_answer, Lost):
                self._leftovers.append((self._lock, term.lock))
            if not isinstance(predecessor_answer, Lost):
                self._leftovers.append((self._predecessor, term.predecessor))
            return lost
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer  # a failed renewal: the election retries both until its deadline
        assert isinstance(lock_answer, Renewed)
        assert isinstance(predecessor_answer, Renewed)
        return Renewed(
            # A handoff asked on either lock (`elector handoff` of either release) is honoured.
            handoff=lock_answer.handoff or predecessor_answer.handoff,
            # Rivals register on both locks; the new lock's registry has only replicas that know it.
            best_rival=lock_answer.best_rival,
            identity_clash=lock_answer.identity_clash or predecessor_answer.identity_clash,
        )

    async def release(
        self, lease: Lease, *, handoff_to: str | None = None, handoff_window_ms: int = 0
    ) -> bool:
        term = self._terms.pop(lease, None)
        if term is None:
            return False
        try:
            released = await self._lock.release(
                term.lock, handoff_to=handoff_to, handoff_window_ms=handoff_window_ms
            )
        except BaseException:
            self._leftovers.append((self._predecessor, term.predecessor))
            raise
        # The predecessor last: its announcement wakes the waiters, who then find both free.
        predecessor_released = await self._predecessor.release(
            term.predecessor, handoff_to=handoff_to, handoff_window_ms=handoff_window_ms
        )
        return released and predecessor_released

    async def withdraw(self, identity: str) -> None:
        await self._release_leftovers()
        await asyncio.gather(self._lock.withdraw(identity), self._predecessor.withdraw(identity))

    async def observe(self) -> Observation:
        return await self._lock.observe()

    async def subscribe(self, *, keepalive_s: float) -> LeaseEventSubscription:
        # Every term starts with a predecessor grant and ends with its release: its announcements
        # are the ones a follower waits for, from replicas of either release.
        return await self._predecessor.subscribe(keepalive_s=keepalive_s)

    async def _release_leftovers(self) -> None:
        leftovers, self._leftovers = self._leftovers, []
        for backend, lease in leftovers:
            with contextlib.suppress(LeaseBackendError):
                await backend.release(lease)  # False: it lapsed meanwhile, as good


def _with_clash(result: AcquireResult, clash: bool) -> AcquireResult:
    if not clash or isinstance(result, Granted):
        return result
    assert isinstance(result, Held | QuietPeriod | StandBack)
    return dataclasses.replace(result, identity_clash=True)
