"""Redlock: one lease granted by a majority of N independent Redis servers.

Each server runs the ordinary lease scripts through its own `RedisLeaseBackend`; this backend
combines their answers. What it guarantees, and what it does not, is in docs/topologies.md; in
short: no two leaders as long as the timing assumptions hold (bounded clock drift, a process not
paused past its validity, servers that keep their data or stay down for a ttl after losing it),
and fencing tokens that strictly increase for the resource to check when they do not - as long
as no server of a majority lost its counter, or the servers' clocks agree within a ttl (a server
that lost its counter restarts it from its own clock in ms).

acquire, in two rounds, timed on the monotonic clock from BEFORE the first request:
1. ACQUIRE on every server at once. Fewer than a majority granted: the grants are dropped again
   (silently, see REDLOCK_ABANDON) and the answer is Held / QuietPeriod; with no majority for
   anyone (a split vote) Held with a RANDOM wait, growing with consecutive split votes, so that
   contenders stop colliding.
2. REDLOCK_CONFIRM on the servers that granted: each raises its fencing counter to T, the highest
   token of the majority, and rewrites its value to one value shared by all of them. Granted
   only if a majority confirmed AND validity = ttl - elapsed - drift > 0, where drift =
   ttl x drift_factor + 2 ms; otherwise everything is dropped again and an error says why.
   Why raise the counters: each server counts on its own, and a later majority may overlap this
   one in a single server whose counter is below T. Raised, that server issues more than T, so
   the later grant's token (a max that includes it) is above T.

Validity. The election counts a lease valid until `send time + ttl - margin` with margin = 1% of
the ttl + 5 ms, which is Redlock's `ttl - elapsed - drift` counted from the start, as long as
drift <= margin: hence drift_factor <= 1%. Every key of the majority was (re)set after the send,
so each expires no earlier than send + ttl on its server's clock.

renew: RENEW (owner-checked, never re-creating a key) on every server with the shared value; a
majority renewed within the validity -> Renewed; more than N - majority say Lost -> Lost; else an
error (the election retries until its renew deadline). release: on every server, best effort.
observe: the holder seen by a majority. subscribe: the announcements of every server, merged and
de-duplicated; it holds while a majority of the subscriptions live. Candidates are merged from all
servers; an identity clash (redis_lease.py) any server answered is one. Not supported: handoffs
and priority pre-emption (renew never reports them; `release` with a handoff target and
`request_handoff` raise a clear error).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import random
import secrets
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from elector.backend.candidates import check_priority
from elector.backend.errors import invalid_request
from elector.backend.lua import redlock as redlock_scripts
from elector.backend.pubsub.subscriptions import RedlockSubscription
from elector.backend.redis_lease import RedisLeaseBackend
from elector.backoff import backoff_delay_s
from elector.lease import (
    AcquireResult,
    BackendErrorKind,
    Candidate,
    Granted,
    Held,
    Lease,
    LeaseBackendError,
    LeaseEventSubscription,
    Lost,
    Observation,
    QuietPeriod,
    Renewed,
    RenewResult,
    StandBack,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

MIN_SERVERS = 3
#: Highest drift factor: the election's safety margin is 1% of the ttl + 5 ms (see the module doc).
MAX_DRIFT_FACTOR = 0.01
#: Fixed part of Redlock's drift allowance, ms.
DRIFT_FIXED_MS = 2
#: Share of the request timeout the first acquire round may take; the confirm round gets the rest.
FIRST_ROUND_SHARE = 0.5
#: Every call finishes within this share of the request timeout (the caller's own bound is it).
CALL_SHARE = 0.95
#: Random wait after a split vote: up to this many ms (at most a tenth of the ttl), doubling with
#: each split vote in a row, up to half the ttl.
DEFAULT_SPLIT_VOTE_BACKOFF_MS = 200
#: Doublings of the split-vote wait at most (the half-ttl cap comes first for ttls up to ~7 min).
SPLIT_VOTE_MAX_DOUBLINGS = 10


class RedlockLeaseBackend:
    """The `LeaseBackend` of one lock over N >= 3 (odd) independent Redis servers."""

    def __init__(
        self,
        backends: Sequence[RedisLeaseBackend],
        *,
        lock: str,
        clock: Callable[[], float] = time.monotonic,
        drift_factor: float = 0.01,
        request_timeout_s: float = 1.0,
        split_vote_backoff_ms: int = DEFAULT_SPLIT_VOTE_BACKOFF_MS,
        rng: random.Random | None = None,
    ) -> None:
        count = len(backends)
        if count < MIN_SERVERS or count % 2 == 0:
            # 1 server is not Redlock, 2 need both (no failure tolerated), and an even N tolerates
            # no more failures than N - 1 while a tie (2 against 2) blocks every grant.
            raise ValueError(
                f"redlock servers: an odd number of at least {MIN_SERVERS} independent Redis servers "
                f"is needed, got {count}"
            )
        if len({id(backend) for backend in backends}) != count:
            raise ValueError("redlock servers: the same backend is given twice")
        for backend in backends:
            if backend.lock != lock:
                raise ValueError(f"redlock servers: a backend of lock {backend.lock!r} given for {lock!r}")
        if not 0.0 <= drift_factor <= MAX_DRIFT_FACTOR:
            raise ValueError(
                f"drift_factor must be between 0 and {MAX_DRIFT_FACTOR} (the election's safety margin "
                f"covers 1% of the ttl), got {drift_factor}"
            )
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive, got {request_timeout_s}")
        if split_vote_backoff_ms < 1:
            raise ValueError(f"split_vote_backoff_ms must be positive, got {split_vote_backoff_ms}")
        self._backends = list(backends)
        self._lock = lock
        self._clock = clock
        self._drift_factor = drift_factor
        self._request_timeout_s = request_timeout_s
        self._split_vote_backoff_ms = split_vote_backoff_ms
        self._rng = rng or random.Random()
        self.majority = count // 2 + 1
        self._confirm = [b.client.register_script(redlock_scripts.REDLOCK_CONFIRM) for b in backends]
        self._abandon = [b.client.register_script(redlock_scripts.REDLOCK_ABANDON) for b in backends]
        self._split_votes_in_a_row = 0
        self._tasks: set[asyncio.Task[None]] = set()
        #: Counters for tests and metrics.
        self.split_votes = 0

    @property
    def lock(self) -> str:
        return self._lock

    @property
    def servers(self) -> int:
        return len(self._backends)

    def drift_ms(self, ttl_ms: int) -> float:
        return ttl_ms * self._drift_factor + DRIFT_FIXED_MS

    async def aclose(self) -> None:
        """Wait for the background clean-ups (dropping grants that did not win) to finish."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- acquire -------------------------------------------------------------------------------

    async def acquire(self, identity: str, *, ttl_ms: int, priority: int = 0) -> AcquireResult:
        if ttl_ms <= 0:
            raise invalid_request("acquire", f"ttl must be positive, got {ttl_ms} ms")
        check_priority(priority, what="acquire")
        started = self._clock()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        votes = await self._each(
            "acquire",
            [b.acquire(identity, ttl_ms=ttl_ms, priority=priority) for b in self._backends],
            deadline=t0 + self._request_timeout_s * FIRST_ROUND_SHARE,
        )
        granted = {i: vote.lease for i, vote in enumerate(votes) if isinstance(vote, Granted)}
        clash = any(getattr(vote, "identity_clash", False) for vote in votes)
        if len(granted) < self.majority:
            self._abandon_later({i: [lease.value] for i, lease in granted.items()})
            return dataclasses.replace(self._not_granted(votes, ttl_ms=ttl_ms), identity_clash=clash)
        token = max(lease.fencing_token for lease in granted.values())
        owner = secrets.token_hex(16)
        try:
            replies = await self._each(
                "acquire",
                [self._confirm_on(i, granted[i], token, owner) for i in granted],
                deadline=t0 + self._request_timeout_s * CALL_SHARE,
            )
        except BaseException:
            # Cancelled (the caller's own timeout): nothing of this attempt may stay behind. The
            # confirmed value is not known here, so those keys lapse with their ttl.
            self._abandon_later({i: [lease.value] for i, lease in granted.items()})
            raise
        confirmed = {
            i: reply for i, reply in zip(granted, replies, strict=True) if isinstance(reply, str) and reply
        }
        leftovers = {
            i: [lease.value] + ([confirmed[i]] if i in confirmed else []) for i, lease in granted.items()
        }
        elapsed_ms = (self._clock() - started) * 1000
        validity_ms = ttl_ms - elapsed_ms - self.drift_ms(ttl_ms)
        if len(confirmed) >= self.majority and validity_ms > 0:
            value = next(iter(confirmed.values()))
            self._abandon_later({i: [lease.value] for i, lease in granted.items() if i not in confirmed})
            self._split_votes_in_a_row = 0
            lease = Lease(lock=self._lock, identity=identity, fencing_token=token, ttl_ms=ttl_ms, value=value)
            return Granted(lease=lease, identity_clash=clash)
        self._abandon_later(leftovers)
        if validity_ms <= 0:
            raise LeaseBackendError(
                f"acquire: a majority granted the lock but it took {elapsed_ms:.0f} ms of the {ttl_ms} ms "
                f"ttl (drift allowance {self.drift_ms(ttl_ms):.0f} ms): no validity left, not granted",
                kind=BackendErrorKind.TIMEOUT,
            )
        errors = [reply for reply in replies if isinstance(reply, LeaseBackendError)]
        raise LeaseBackendError(
            f"acquire: only {len(confirmed)} of {self.servers} Redis servers confirmed the grant, "
            f"{self.majority} needed" + (f" ({errors[0]})" if errors else ""),
            kind=errors[0].kind if errors else BackendErrorKind.CONNECTION,
        )

    async def _confirm_on(self, index: int, lease: Lease, token: int, owner: str) -> str:
        backend = self._backends[index]
        reply: Any = await backend.call_script(
            "acquire",
            self._confirm[index],
            keys=[backend.keys.lease, backend.keys.fencing],
            args=[lease.value, token, json.dumps(lease.identity), owner, backend.keys.channel, lease.ttl_ms],
        )
        try:
            return bytes(reply[1]).decode("utf-8") if int(reply[0]) == 1 else ""
        except (IndexError, TypeError, ValueError):
            message = "acquire: unexpected reply to the confirm script"
            raise LeaseBackendError(message, kind=BackendErrorKind.DATA) from None

    def _not_granted(self, votes: list[AcquireResult | LeaseBackendError], *, ttl_ms: int) -> AcquireResult:
        answers = [vote for vote in votes if not isinstance(vote, LeaseBackendError)]
        errors = [vote for vote in votes if isinstance(vote, LeaseBackendError)]
        if len(answers) < self.majority:
            raise LeaseBackendError(
                f"acquire: only {len(answers)} of {self.servers} Redis servers answered, a majority "
                f"({self.majority}) is needed: {errors[0]}",
                kind=errors[0].kind,
            )
        held = [vote for vote in answers if isinstance(vote, Held) and vote.holder is not None]
        counts = collections.Counter(vote.holder for vote in held)
        holder, votes_for = counts.most_common(1)[0] if counts else (None, 0)
        if votes_for >= self.majority:
            self._split_votes_in_a_row = 0
            remaining = _majority_remaining(
                [vote.remaining_ms for vote in held if vote.holder == holder], self.majority
            )
            return Held(holder=holder, remaining_ms=remaining)
        blocked_by_minority = self.servers - self.majority
        quiet = sorted(vote.remaining_ms for vote in answers if isinstance(vote, QuietPeriod))
        if len(quiet) > blocked_by_minority:
            # Grants need a majority outside quiet periods: wait for enough of them to end.
            return QuietPeriod(remaining_ms=quiet[len(quiet) - blocked_by_minority - 1])
        stand_back = [vote for vote in answers if isinstance(vote, StandBack)]
        if len(stand_back) > blocked_by_minority:
            return min(stand_back, key=lambda vote: vote.handoff.remaining_ms)
        # A split vote (or leftovers of one): nobody has a majority. Back off for a random time.
        self._split_votes_in_a_row += 1
        self.split_votes += 1
        base_ms = max(1, min(self._split_vote_backoff_ms, ttl_ms // 10))
        # The back-off's ceiling; the wait is drawn below it in whole ms (at least 1).
        ceiling_ms = backoff_delay_s(
            min(self._split_votes_in_a_row, SPLIT_VOTE_MAX_DOUBLINGS + 1), base_s=base_ms, cap_s=ttl_ms // 2
        )
        wait_ms = self._rng.randint(1, max(1, int(ceiling_ms)))
        logger.debug(
            "split vote on lock %s: no majority for anyone; trying again in %d ms", self._lock, wait_ms
        )
        return Held(holder=holder, remaining_ms=wait_ms)

    # -- renew, release ------------------------------------------------------------------------

    async def renew(self, lease: Lease, *, priority: int = 0) -> RenewResult:
        check_priority(priority, what="renew")
        started = self._clock()
        results = await self._each(
            "renew",
            [b.renew(lease, priority=priority) for b in self._backends],
        )
        renewed = [i for i, result in enumerate(results) if isinstance(result, Renewed)]
        clash = any(getattr(result, "identity_clash", False) for result in results)
        lost = [result for result in results if isinstance(result, Lost)]
        if len(renewed) >= self.majority:
            elapsed_ms = (self._clock() - started) * 1000
            if lease.ttl_ms - elapsed_ms - self.drift_ms(lease.ttl_ms) <= 0:
                raise LeaseBackendError(
                    f"renew: took {elapsed_ms:.0f} ms of the {lease.ttl_ms} ms ttl: no validity left",
                    kind=BackendErrorKind.TIMEOUT,
                )
            # Handoffs and priority pre-emption are not supported over Redlock (module doc).
            return Renewed(identity_clash=clash)
        if len(lost) > self.servers - self.majority:
            # A majority no longer holds our value: lost for good. Drop what a minority still holds.
            self._abandon_later({i: [lease.value] for i in renewed})
            others = collections.Counter(result.holder for result in lost if result.holder is not None)
            if others:
                holder = others.most_common(1)[0][0]
                remaining = max(
                    (r.remaining_ms for r in lost if r.holder == holder and r.remaining_ms is not None),
                    default=None,
                )
                return Lost(holder=holder, remaining_ms=remaining, identity_clash=clash)
            return Lost(holder=None, remaining_ms=None, identity_clash=clash)
        errors = [result for result in results if isinstance(result, LeaseBackendError)]
        raise LeaseBackendError(
            f"renew: renewed on {len(renewed)} of {self.servers} Redis servers, {self.majority} needed"
            + (f" ({errors[0]})" if errors else ""),
            kind=errors[0].kind if errors else BackendErrorKind.CONNECTION,
        )

    async def release(
        self, lease: Lease, *, handoff_to: str | None = None, handoff_window_ms: int = 0
    ) -> bool:
        if handoff_to is not None:
            raise LeaseBackendError(
                "release: handoffs are not supported with Redlock (several independent servers)",
                kind=BackendErrorKind.SERVER,
            )
        results = await self._each(
            "release",
            [b.release(lease) for b in self._backends],
        )
        if any(result is True for result in results):
            return True
        errors = [result for result in results if isinstance(result, LeaseBackendError)]
        if self.servers - len(errors) >= self.majority:
            return False  # a majority answered: it was not ours anywhere they know of
        raise LeaseBackendError(
            f"release: only {self.servers - len(errors)} of {self.servers} Redis servers answered "
            f"({errors[0]})",
            kind=errors[0].kind,
        )

    async def withdraw(self, identity: str) -> None:
        results = await self._each(
            "withdraw",
            [b.withdraw(identity) for b in self._backends],
        )
        errors = [result for result in results if isinstance(result, LeaseBackendError)]
        if self.servers - len(errors) < self.majority:
            raise LeaseBackendError(f"withdraw: {errors[0]}", kind=errors[0].kind)

    async def request_handoff(self, *, to: str | None, window_ms: int) -> None:
        raise LeaseBackendError(
            "handoff: handoffs are not supported with Redlock (several independent servers)",
            kind=BackendErrorKind.SERVER,
        )

    async def candidates(self) -> list[Candidate]:
        """The live candidates registered on any answering server (the freshest entry of each)."""
        results = await self._each(
            "candidates",
            [b.candidates() for b in self._backends],
        )
        errors = [result for result in results if isinstance(result, LeaseBackendError)]
        if self.servers - len(errors) < self.majority:
            raise LeaseBackendError(f"candidates: {errors[0]}", kind=errors[0].kind)
        freshest: dict[str, Candidate] = {}
        for result in results:
            if isinstance(result, LeaseBackendError):
                continue
            for candidate in result:
                known = freshest.get(candidate.identity)
                if known is None or candidate.last_seen_ms_ago < known.last_seen_ms_ago:
                    freshest[candidate.identity] = candidate
        return sorted(freshest.values(), key=lambda c: (-c.priority, c.identity))

    # -- observe, subscribe --------------------------------------------------------------------

    async def observe(self) -> Observation:
        results = await self._each(
            "observe",
            [b.observe() for b in self._backends],
        )
        seen = [result for result in results if isinstance(result, Observation)]
        errors = [result for result in results if isinstance(result, LeaseBackendError)]
        if len(seen) < self.majority:
            raise LeaseBackendError(
                f"observe: only {len(seen)} of {self.servers} Redis servers answered ({errors[0]})",
                kind=errors[0].kind,
            )
        counts = collections.Counter(o.holder for o in seen if o.holder is not None)
        holder, votes_for = counts.most_common(1)[0] if counts else (None, 0)
        if votes_for < self.majority:
            holder = None
        remaining = (
            _majority_remaining([o.remaining_ms for o in seen if o.holder == holder], self.majority)
            if holder is not None
            else None
        )
        tokens = [o.last_fencing_token for o in seen if o.last_fencing_token is not None]
        blocked_by_minority = self.servers - self.majority
        quiet = sorted(o.quiet_remaining_ms for o in seen if o.quiet_remaining_ms > 0)
        quiet_ms = quiet[len(quiet) - blocked_by_minority - 1] if len(quiet) > blocked_by_minority else 0
        return Observation(
            holder=holder,
            unrecognised_value=holder is None and any(o.unrecognised_value for o in seen),
            remaining_ms=remaining,
            last_fencing_token=max(tokens) if tokens else None,
            quiet_remaining_ms=quiet_ms,
            unknown_protocol="; ".join(o.unknown_protocol for o in seen if o.unknown_protocol) or None,
        )

    async def subscribe(self, *, keepalive_s: float = 60.0) -> LeaseEventSubscription:
        results = await self._each(
            "subscribe",
            [b.subscribe(keepalive_s=keepalive_s) for b in self._backends],
        )
        live = [result for result in results if not isinstance(result, LeaseBackendError)]
        errors = [result for result in results if isinstance(result, LeaseBackendError)]
        if len(live) < self.majority:
            for subscription in live:
                await subscription.close()
            raise LeaseBackendError(
                f"subscribe: only {len(live)} of {self.servers} Redis servers subscribed ({errors[0]})",
                kind=errors[0].kind,
            )
        return RedlockSubscription(live, majority=self.majority, keepalive_s=keepalive_s)

    # -- plumbing ------------------------------------------------------------------------------

    async def _each(
        self, what: str, calls: Sequence[Coroutine[Any, Any, T]], *, deadline: float | None = None
    ) -> list[T | LeaseBackendError]:
        """Run `calls` at once; each one's result, or its error (also for a late one, cancelled).

        `deadline` (loop time) defaults to the share of the request timeout a call may take.
        """
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self._request_timeout_s * CALL_SHARE
        tasks = [loop.create_task(call) for call in calls]
        try:
            await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
        except BaseException:
            # Cancelled by the caller: grants already made must not stay behind until their ttl.
            finished = [
                (i, task.result())
                for i, task in enumerate(tasks)
                if task.done() and not task.cancelled() and task.exception() is None
            ]
            self._abandon_later({i: [r.lease.value] for i, r in finished if isinstance(r, Granted)})
            raise
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
        results: list[T | LeaseBackendError] = []
        for index, task in enumerate(tasks):
            if not task.done() or task.cancelled():
                message = f"{what}: Redis server {index + 1} did not answer in time"
                results.append(LeaseBackendError(message, kind=BackendErrorKind.TIMEOUT))
                continue
            error = task.exception()
            if error is None:
                results.append(task.result())
            elif isinstance(error, LeaseBackendError):
                results.append(error)
            else:  # the backends raise only LeaseBackendError; anything else is a bug, not a vote
                raise error
        return results

    def _abandon_later(self, values: dict[int, list[str]]) -> None:
        """Drop grants that did not win, in the background (owner-checked, silent, bounded)."""
        if not values:
            return
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._abandon_all(values), name="elector:redlock:abandon")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _abandon_all(self, values: dict[int, list[str]]) -> None:
        async def abandon(index: int, candidates: list[str]) -> None:
            backend = self._backends[index]
            for value in candidates:
                await backend.call_script(
                    "abandon", self._abandon[index], keys=[backend.keys.lease], args=[value]
                )

        try:
            async with asyncio.timeout(self._request_timeout_s):
                await asyncio.gather(*(abandon(i, v) for i, v in values.items()), return_exceptions=True)
        except TimeoutError:
            pass  # what is left lapses with its ttl


def _majority_remaining(remaining: list[int | None], majority: int) -> int | None:
    """How long a holder keeps a majority: the majority-th longest of its keys' PTTLs.

    None (no expiry) counts as forever; fewer keys than a majority: 0.
    """
    if len(remaining) < majority:
        return 0
    ordered = sorted(remaining, key=lambda r: float("inf") if r is None else r, reverse=True)
    return ordered[majority - 1]
