"""The election state machine for one lock.

    follower --granted--> leader --renewed--> leader
    leader --lost / announced lost--> follower                      (nothing to release)
    leader --renew deadline / validity expired--> stepping_down --release--> follower
    leader --stop()--> stepping_down --release--> stopped
    leader --resign() / handoff asked / higher-priority rival--> stepping_down --release--> follower

Handoffs and priorities: every acquire and renewal also refreshes this candidate's registration
(identity and priority) in the backend. A renewal reports a requested handoff (the leader then
stops its work and releases) and the best live rival; a leader yields to a rival with a strictly
higher priority once that rival has been seen continuously for `preempt_after_s` and the leader
has led at least that long, releasing *to that rival* so nobody else slips in. Strict priority,
the dwell time and the targeted handoff together keep leadership from flapping.

Time is an injected monotonic clock (seconds). Validity is counted from the moment a request was
SENT, never from when its answer came back: Redis starts the TTL somewhere in between, so the
send time is the conservative end. A leader believes it leads until
`send time of its last successful renewal + ttl - safety margin` and steps down at the renew
deadline, which comes earlier.

Leader work that cannot be stopped: `on_stopped_leading` is awaited before every release. If it
raises, the work may still be running, so the lease is NOT released: it is left to lapse on Redis
by its ttl (outcome RELEASE_WITHHELD), and this replica does not contend again before it could
have lapsed. A successor can then never start beside work that was not seen to stop. Every run
calls `on_stopped_leading` at least once, even one that never led (see `ElectionHooks`).

Fencing tokens only grow across grants. A holder seen with a token below the highest one this
replica has seen (from Redis's replies, never from announcements, which anyone may publish) means
the ordering broke (a server clock behind after the counter was lost): the cycle's outcome carries
`token_regressed_from` so that it is logged and counted.

Followers subscribe to the lock's announcements before their first try, then sleep until the
holder's lease would run out (its PTTL plus a small jitter), a release announcement, or a re-check
cap, whichever comes first: no fixed polling period.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import math
import random
from collections.abc import Awaitable, Callable

from elector.backoff import backoff_delay_s
from elector.election.hooks import ElectionHooks
from elector.election.outcome import CycleOutcome, ElectionStatus, OutcomeKind, State, StepDownReason
from elector.election.timing import ElectionTiming
from elector.lease import (
    BackendErrorKind,
    Candidate,
    Granted,
    Handoff,
    Held,
    Holder,
    Lease,
    LeaseBackend,
    LeaseBackendError,
    LeaseEvent,
    LeaseEventKind,
    Lost,
    QuietPeriod,
    StandBack,
)

logger = logging.getLogger(__name__)

#: Upper bound of the random delay added to a follower's wake-up, seconds.
MAX_WAKE_JITTER_S = 0.002
#: A flood of announcements must not become a flood of requests.
MIN_ATTEMPT_SPACING_S = 0.005
#: Waits shorter than this are due now (like asyncio's own clock resolution); sleeping them can
#: spin on clocks that round timers.
CLOCK_RESOLUTION_S = 1e-4


#: A rival must have refreshed its entry this share of a ttl after we first noticed it.
RIVAL_REFRESH_SLACK = 0.05

#: With renewal jitter on, the first renewal of a term comes 0-90% of an interval early.
FIRST_RENEWAL_SPREAD = 0.9

#: With renewal jitter on (many locks), each renewal is due on a point of this grid within its
#: jitter range: the renewals of many locks then fall due at the same instants and go out
#: together, as one batch script call (backend/pipeline.py), instead of one request each.
RENEW_GRID_S = 0.02

#: Retries after failed requests: each delay is drawn from its upper half, so replicas that failed
#: together spread out. Capped so that a recovered Redis is noticed quickly (see `_failed`).
FAILURE_BACKOFF_JITTER = 0.5
#: Re-subscribing to announcements: the first wait, the longest, and the same half-range jitter.
RESUBSCRIBE_FIRST_S = 0.4
RESUBSCRIBE_MAX_S = 30.0


class Election:
    """Contends for one lock, holds it while it can, and says at every step what it did."""

    def __init__(
        self,
        backend: LeaseBackend,
        *,
        identity: str,
        timing: ElectionTiming,
        hooks: ElectionHooks | None = None,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        subscription_keepalive_s: float | None = None,
        priority: int = 0,
        preempt_after_s: float | None = None,
        renew_jitter_share: float = 0.0,
    ) -> None:
        timing.validate()
        if not 0.0 <= renew_jitter_share < 0.5:
            raise ValueError(f"renew_jitter_share must be in [0, 0.5), got {renew_jitter_share}")
        # Renewing up to this share of the interval early spreads locks whose renewals fell due
        # together (many locks started at once, or re-synchronised by an outage). Early is safe.
        self._renew_jitter_share = renew_jitter_share
        self._backend = backend
        self._identity = identity
        self._timing = timing
        self._hooks = hooks or ElectionHooks()
        self._clock = clock or asyncio.get_running_loop().time
        self._rng = rng or random.Random()
        # The idle follower's request budget leaves room for one PING per ~6 ttl at most.
        self._keepalive_s = subscription_keepalive_s or max(60.0, 6 * timing.ttl_s)
        self._priority = priority
        self._preempt_after_s = timing.ttl_s if preempt_after_s is None else preempt_after_s

        self._state = State.FOLLOWER
        self._lease: Lease | None = None
        self._last_renew_sent_at = 0.0
        self._valid_until = 0.0
        self._pending_release: Lease | None = None
        self._pending_release_reason: StepDownReason | None = None
        self._pending_handoff_to: str | None = None
        self._led_since = 0.0
        self._rival_seen_since: float | None = None
        self._resign_stand_back_s: float | None = None
        self._contend_not_before = 0.0
        #: Held by the program while its own leader work of an ended term still runs.
        self._contend_held = False
        self._hold_lifted = False

        self._holder: Holder | None = None
        self._holder_expires_at: float | None = None
        self._last_backend_ok_at: float | None = None
        self._backend_up = False
        self._failures_in_a_row = 0
        self._last_attempt_at: float | None = None
        self._highest_token_seen = 0
        self._token_regressed_from: int | None = None

        self._started = False
        #: Whether this run has called on_stopped_leading (a term ended): its end then need not.
        self._stop_hook_called = False
        self._cycle_due_by: float | None = None
        self._stop_requested = False
        self._wakeup = asyncio.Event()
        self._events: collections.deque[LeaseEvent] = collections.deque(maxlen=64)
        self._subscribed = asyncio.Event()
        #: Set once the first subscription succeeded or failed: a failure need not be waited out
        #: (a wrong URL or password then shows in the first acquire, within a request timeout).
        self._subscribe_tried = asyncio.Event()
        self._resubscribed = False

    # -- observation ---------------------------------------------------------------------------

    @property
    def lock(self) -> str:
        return self._backend.lock

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def timing(self) -> ElectionTiming:
        return self._timing

    def status(self) -> ElectionStatus:
        now = self._clock()
        is_leader = self._state is State.LEADER and now < self._valid_until
        if self._state is State.LEADER:
            remaining: float | None = max(0.0, self._valid_until - now)
        elif self._holder_expires_at is not None and self._holder is not None:
            remaining = max(0.0, self._holder_expires_at - now)
        else:
            remaining = None
        return ElectionStatus(
            lock=self.lock,
            identity=self._identity,
            state=self._state,
            is_leader=is_leader,
            holder=self._holder,
            fencing_token=self._lease.fencing_token if is_leader and self._lease else None,
            lease_remaining_s=remaining,
            started=self._started,
            last_backend_ok_at=self._last_backend_ok_at,
            cycle_due_by=self._cycle_due_by,
            backend_up=self._backend_up,
            now=now,
            waiting_for_own_work=self._contend_held,
        )

    # -- control -------------------------------------------------------------------------------

    @property
    def priority(self) -> int:
        return self._priority

    def stop(self) -> None:
        """Ask the election to finish: a leader stops its work and releases; a follower exits."""
        self._stop_requested = True
        self._wakeup.set()

    def resign(self, *, stand_back_s: float) -> None:
        """Give leadership up: stop leader work, release, and not contend for `stand_back_s`.

        A no-op for a follower (it does not stand back either). The step-down is reported with
        `StepDownReason.RESIGNED` when the release completes.
        """
        if stand_back_s < 0:
            raise ValueError(f"stand_back_s must not be negative, got {stand_back_s}")
        if self._state is State.LEADER:
            self._resign_stand_back_s = stand_back_s
            self._wakeup.set()

    def hold_contending(self, held: bool) -> None:
        """While held, a follower sends no acquire (outcomes STAND_BACK): the program's own leader
        work of an ended term still runs. Lifting the hold contends at once (not before a
        withheld lease could have lapsed)."""
        self._contend_held = held
        if not held:
            self._hold_lifted = True
            self._wakeup.set()

    async def run(self, *, start_delay_s: float = 0.0) -> None:
        """Contend, lead and step down until `stop()`; returns after releasing a held lease.

        `start_delay_s`: wait this long before subscribing and the first try (a stop meanwhile
        ends the run without any request). A daemon of many locks spreads their starts with it,
        so that neither their subscriptions, nor their acquisitions, nor (hence) their renewals
        fall due together.
        """
        if start_delay_s < 0:
            raise ValueError(f"start_delay_s must not be negative, got {start_delay_s}")
        self._started = True
        self._stop_hook_called = False
        listener: asyncio.Task[None] | None = None
        try:
            if start_delay_s > 0:
                start_at = self._clock() + start_delay_s
                self._cycle_due_by = start_at + 2 * self._timing.request_timeout_s
                await self._sleep_until(start_at)
                if self._stop_requested:
                    return  # nothing was tried, nothing registered: the run's own end follows
            listener = asyncio.create_task(self._listen(), name=f"elector:{self.lock}:announcements")
            # Subscribe before the first try, so that no release can slip in between. Without a
            # subscription we still work, only slower to notice releases.
            self._cycle_due_by = self._clock() + 2 * self._timing.request_timeout_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2 * self._timing.request_timeout_s):
                    await self._subscribe_tried.wait()
            while True:
                if self._stop_requested and self._state is not State.STEPPING_DOWN:
                    if self._state is State.LEADER:
                        await self._begin_step_down(StepDownReason.SHUTDOWN, release=True)
                    if self._pending_release is None:
                        await self._withdraw()
                        break
                elif self._resign_stand_back_s is not None:
                    stand_back_s, self._resign_stand_back_s = self._resign_stand_back_s, None
                    if self._state is State.LEADER:
                        await self._begin_step_down(StepDownReason.RESIGNED, release=True)
                        # max: a withheld release has already set the later time the lease lapses.
                        self._contend_not_before = max(self._contend_not_before, self._clock() + stand_back_s)
                outcome = await self.step()
                if outcome.next_cycle_at is None:
                    continue
                await self._sleep_until(outcome.next_cycle_at)
        finally:
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await listener
            if self._lease is not None:
                # Cancelled while leading (a second signal, the owner gave up): the lease is not
                # released, but leader work must still be told to stop, always.
                self._lease = None
                self._valid_until = 0.0
                self._state = State.STEPPING_DOWN
                await self._close_run()
            elif not self._stop_hook_called:
                # No term ended in this run, so it never led (a term's step-down sets the flag).
                # client-go's contract, "always called": cleanup in the hook runs once it ran.
                self._state = State.STOPPED
                await self._close_run()
            self._state = State.STOPPED

    async def _close_run(self) -> None:
        """The run's own `on_stopped_leading(SHUTDOWN)`; nothing is released, so a raise is only logged."""
        self._stop_hook_called = True
        await self._call_hook("on_stopped_leading", self._hooks.on_stopped_leading(StepDownReason.SHUTDOWN))

    async def _withdraw(self) -> None:
        """Drop our candidate entry so status and handoffs stop listing us (best effort)."""
        try:
            async with asyncio.timeout(self._timing.request_timeout_s):
                await self._backend.withdraw(self._identity)
        except (LeaseBackendError, TimeoutError) as exc:
            logger.debug("could not withdraw the candidate entry: %s", _describe(exc))

    async def step(self) -> CycleOutcome:
        """Run one cycle in the current state and return what it did."""
        self._last_attempt_at = self._clock()
        if self._state is State.STEPPING_DOWN:
            outcome = await self._release_cycle()
        elif self._state is State.LEADER:
            outcome = await self._leader_cycle()
        else:
            outcome = await self._follower_cycle()
        if outcome.next_cycle_at is not None:
            self._cycle_due_by = outcome.next_cycle_at
        self._emit(outcome)
        return outcome

    # -- follower ------------------------------------------------------------------------------

    async def _follower_cycle(self) -> CycleOutcome:
        sent = self._clock()
        self._hold_lifted = False
        if sent < self._contend_not_before or self._contend_held:
            # We resigned a moment ago (let the others have it), or our own late work still runs:
            # no request is sent. A lifted hold wakes us (see `_sleep_until`).
            until = self._contend_not_before if sent < self._contend_not_before else sent + self._timing.ttl_s
            return CycleOutcome(
                kind=OutcomeKind.STAND_BACK,
                state=self._state,
                at=sent,
                holder=self._holder,
                remaining_ms=_ms(until - sent),
                next_cycle_at=until,
            )
        self._cycle_due_by = sent + self._timing.request_timeout_s
        try:
            async with asyncio.timeout(self._timing.request_timeout_s):
                result = await self._backend.acquire(
                    self._identity, ttl_ms=self._timing.ttl_ms, priority=self._priority
                )
        except (LeaseBackendError, TimeoutError) as exc:
            return self._failed(
                OutcomeKind.ACQUIRE_ERROR, sent=sent, error=_describe(exc), error_kind=_kind_of(exc)
            )
        received = self._clock()
        self._backend_ok(received)

        if isinstance(result, Granted):
            lease = result.lease
            self._check_token(lease.fencing_token)
            self._lease = lease
            self._last_renew_sent_at = sent
            self._valid_until = sent + self._timing.validity_s
            self._state = State.LEADER
            self._led_since = sent
            self._rival_seen_since = None
            self._observe_holder(lease.holder, expires_at=sent + self._timing.ttl_s)
            valid_until = self._valid_until
            await self._call_hook("on_started_leading", self._hooks.on_started_leading(lease))
            return CycleOutcome(
                kind=OutcomeKind.ACQUIRED,
                state=self._state,
                at=sent,
                duration_s=received - sent,
                holder=lease.holder,
                remaining_ms=_ms(valid_until - received),
                next_cycle_at=self._next_renewal(sent, first=True),
                valid_until=valid_until,
            )

        cap = received + self._timing.ttl_s
        if isinstance(result, Held):
            # Redis read the PTTL between send and receive: the expiry is no earlier than
            # send + PTTL, and waking then (not later) is what makes a takeover prompt. Waking a
            # little early only costs one more look, and never less than a millisecond apart.
            expires_at = None if result.remaining_ms is None else sent + max(result.remaining_ms, 1) / 1000
            if result.holder is not None:
                self._check_token(result.holder.fencing_token)
            self._observe_holder(result.holder, expires_at=expires_at)
            wake = cap if expires_at is None else min(cap, expires_at + self._jitter())
            return CycleOutcome(
                kind=OutcomeKind.HELD,
                state=self._state,
                at=sent,
                duration_s=received - sent,
                holder=result.holder,
                remaining_ms=result.remaining_ms,
                next_cycle_at=wake,
            )

        if isinstance(result, StandBack):
            # A handoff to someone else is under way. Its target takes the lease on the release
            # announcement; we look again when the window ends or the lease changes hands.
            handoff: Handoff = result.handoff
            return CycleOutcome(
                kind=OutcomeKind.STAND_BACK,
                state=self._state,
                at=sent,
                duration_s=received - sent,
                holder=self._holder,
                remaining_ms=handoff.remaining_ms,
                next_cycle_at=min(cap, sent + max(handoff.remaining_ms, 1) / 1000 + self._jitter()),
            )

        assert isinstance(result, QuietPeriod)
        self._observe_holder(None, expires_at=None)
        return CycleOutcome(
            kind=OutcomeKind.QUIET_PERIOD,
            state=self._state,
            at=sent,
            duration_s=received - sent,
            remaining_ms=result.remaining_ms,
            next_cycle_at=min(cap, sent + max(result.remaining_ms, 1) / 1000 + self._jitter()),
        )

    # -- leader --------------------------------------------------------------------------------

    async def _leader_cycle(self) -> CycleOutcome:
        assert self._lease is not None
        now = self._clock()
        if now >= self._valid_until:
            # We were not scheduled in time (paused, starved): the lease may be gone already.
            await self._begin_step_down(StepDownReason.LEASE_EXPIRED, release=True)
            return self._stepped_down(OutcomeKind.STEPPED_DOWN, StepDownReason.LEASE_EXPIRED, at=now)
        deadline = self._last_renew_sent_at + self._timing.renew_deadline_s
        if now >= deadline:
            await self._begin_step_down(StepDownReason.RENEW_DEADLINE, release=True)
            return self._stepped_down(OutcomeKind.STEPPED_DOWN, StepDownReason.RENEW_DEADLINE, at=now)

        sent = now
        self._cycle_due_by = sent + self._timing.request_timeout_s
        try:
            async with asyncio.timeout(min(self._timing.request_timeout_s, deadline - sent)):
                result = await self._backend.renew(self._lease, priority=self._priority)
        except (LeaseBackendError, TimeoutError) as exc:
            received = self._clock()
            error = _describe(exc)
            if received >= deadline:
                await self._begin_step_down(StepDownReason.RENEW_DEADLINE, release=True)
                self._note_failure()
                return self._stepped_down(
                    OutcomeKind.RENEW_ERROR,
                    StepDownReason.RENEW_DEADLINE,
                    at=sent,
                    duration_s=received - sent,
                    error=error,
                )
            retry_at = min(received + self._timing.retry_delay_s, deadline)
            return self._failed(
                OutcomeKind.RENEW_ERROR, sent=sent, error=error, error_kind=_kind_of(exc), retry_at=retry_at
            )
        received = self._clock()
        self._backend_ok(received)

        if isinstance(result, Lost):
            await self._begin_step_down(StepDownReason.LOST, release=False)
            expires_at = None if result.remaining_ms is None else received + result.remaining_ms / 1000
            if result.holder is not None:
                self._check_token(result.holder.fencing_token)
            self._observe_holder(result.holder, expires_at=expires_at)
            return self._stepped_down(
                OutcomeKind.RENEW_LOST,
                StepDownReason.LOST,
                at=sent,
                duration_s=received - sent,
                holder=result.holder,
            )

        self._last_renew_sent_at = sent
        self._valid_until = sent + self._timing.validity_s
        self._holder_expires_at = sent + self._timing.ttl_s
        yield_reason = self._should_yield(result.handoff, result.best_rival, now=sent)
        if yield_reason is not None:
            await self._begin_step_down(yield_reason, release=True)
            return self._stepped_down(
                OutcomeKind.STEPPED_DOWN,
                yield_reason,
                at=sent,
                duration_s=received - sent,
            )
        return CycleOutcome(
            kind=OutcomeKind.RENEWED,
            state=self._state,
            at=sent,
            duration_s=received - sent,
            holder=self._lease.holder,
            remaining_ms=_ms(self._valid_until - received),
            next_cycle_at=self._next_renewal(sent),
            valid_until=self._valid_until,
        )

    def _should_yield(
        self, handoff: Handoff | None, rival: Candidate | None, *, now: float
    ) -> StepDownReason | None:
        """Whether a successful renewal should end our term: a handoff asked, or a better rival."""
        self._pending_handoff_to = None
        if handoff is not None and handoff.from_identity == self._identity:
            # Re-armed at the release for a named target, so that a long drain cannot outlast
            # the requested window and let a third candidate in.
            self._pending_handoff_to = handoff.to_identity
            return StepDownReason.HANDOFF
        # A rival must be alive now: one that registered and died still has an entry for 3 ttl,
        # and handing over to it would leave the lock without a leader.
        if rival is None or rival.priority <= self._priority or rival.last_seen_ms_ago > self._timing.ttl_ms:
            self._rival_seen_since = None
            return None
        if self._rival_seen_since is None:
            self._rival_seen_since = now
        watched_s = now - self._rival_seen_since
        # It must also have refreshed its entry since we first noticed it, by more than the two
        # clocks can disagree: a pod that registered once and died can still look "seen within
        # a ttl" by a few ms when the dwell ends (its age is on Redis's clock, ours on our own).
        refreshed = rival.last_seen_ms_ago / 1000 < watched_s - RIVAL_REFRESH_SLACK * self._timing.ttl_s
        settled = watched_s >= self._preempt_after_s and refreshed
        if settled and now - self._led_since >= self._preempt_after_s:
            self._pending_handoff_to = rival.identity
            return StepDownReason.PREEMPTED
        return None

    async def _begin_step_down(self, reason: StepDownReason, *, release: bool) -> None:
        """Stop leader work first (the lease is still ours meanwhile), then drop the lease.

        When the work could not be stopped (the hook raised), nothing is released: see the module doc.
        """
        lease = self._lease
        self._state = State.STEPPING_DOWN
        stopped, error = await self._stop_leader_work(reason)
        self._lease = None
        self._valid_until = 0.0
        if not stopped:
            # The old lease lapses on Redis no later than its last renewal's send time + ttl.
            lapse_at = self._last_renew_sent_at + self._timing.ttl_s
            stand_back_until = lapse_at
            if reason in (StepDownReason.HANDOFF, StepDownReason.PREEMPTED):
                # No release means no handoff key: stay out for the window the release would have
                # opened, so that the intended successor gets the lapsed lease, not us again.
                stand_back_until += self._timing.ttl_s
            self._contend_not_before = max(self._contend_not_before, stand_back_until)
            self._pending_handoff_to = None
            self._state = State.STOPPED if reason is StepDownReason.SHUTDOWN else State.FOLLOWER
            now = self._clock()
            self._emit(
                CycleOutcome(
                    kind=OutcomeKind.RELEASE_WITHHELD,
                    state=self._state,
                    at=now,
                    holder=None if lease is None else lease.holder,
                    remaining_ms=_ms(lapse_at - now),
                    step_down_reason=reason if reason in _REQUESTED_STEP_DOWNS else None,
                    error=f"leader work did not stop ({error}); the lease is left to lapse by its ttl",
                )
            )
            return
        if release and lease is not None:
            self._pending_release = lease
            self._pending_release_reason = reason
        else:
            self._state = State.FOLLOWER

    async def _stop_leader_work(self, reason: StepDownReason) -> tuple[bool, str]:
        """Await `on_stopped_leading`; (False, why) when it raised."""
        try:
            await self._hooks.on_stopped_leading(reason)
        except Exception as exc:
            self._stop_hook_called = True
            logger.error(
                "on_stopped_leading failed: leader work may still run; not releasing the lease",
                exc_info=True,
                extra={"lock": self.lock},
            )
            return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        # Set only once the call finished: one cut short by cancelling the run is made again, with
        # SHUTDOWN, by the run's cleanup (the lease is still set then), so the work still stops.
        self._stop_hook_called = True
        return True, ""

    def _stepped_down(
        self,
        kind: OutcomeKind,
        reason: StepDownReason,
        *,
        at: float,
        duration_s: float | None = None,
        holder: Holder | None = None,
        error: str | None = None,
    ) -> CycleOutcome:
        # After a step-down, release at once (pending) or contend again at once.
        return CycleOutcome(
            kind=kind,
            state=self._state,
            at=at,
            duration_s=duration_s,
            holder=holder,
            step_down_reason=reason,
            error=error,
            next_cycle_at=self._clock(),
        )

    async def _release_cycle(self) -> CycleOutcome:
        lease, reason = self._pending_release, self._pending_release_reason
        handoff_to, self._pending_handoff_to = self._pending_handoff_to, None
        assert lease is not None
        self._pending_release = None
        self._pending_release_reason = None
        sent = self._clock()
        self._cycle_due_by = sent + self._timing.request_timeout_s
        kind = OutcomeKind.RELEASED
        error: str | None = None
        error_kind: str | None = None
        try:
            async with asyncio.timeout(self._timing.request_timeout_s):
                if handoff_to is None:
                    released = await self._backend.release(lease)
                else:
                    # Everyone but the rival stands back for a ttl: it is awake (it just
                    # refreshed its entry) and takes the lease on the release announcement.
                    released = await self._backend.release(
                        lease, handoff_to=handoff_to, handoff_window_ms=self._timing.ttl_ms
                    )
            self._backend_ok(self._clock())
            if not released:
                kind, error = OutcomeKind.RELEASE_FAILED, "the lease was no longer ours"
        except (LeaseBackendError, TimeoutError) as exc:
            kind, error, error_kind = OutcomeKind.RELEASE_FAILED, _describe(exc), _kind_of(exc)
            self._note_failure()
        received = self._clock()
        self._state = State.STOPPED if reason is StepDownReason.SHUTDOWN else State.FOLLOWER
        self._observe_holder(None, expires_at=None)
        return CycleOutcome(
            kind=kind,
            state=self._state,
            at=sent,
            duration_s=received - sent,
            holder=lease.holder,
            # A requested step-down (shutdown, resign) is reported here, where it completes.
            step_down_reason=reason if reason in _REQUESTED_STEP_DOWNS else None,
            error=error,
            error_kind=error_kind,
            next_cycle_at=None if reason is StepDownReason.SHUTDOWN else received,
        )

    # -- shared helpers ------------------------------------------------------------------------

    def _failed(
        self,
        kind: OutcomeKind,
        *,
        sent: float,
        error: str,
        error_kind: str | None = None,
        retry_at: float | None = None,
    ) -> CycleOutcome:
        """A failed request; retried at `retry_at`, or after an exponential back-off."""
        received = self._clock()
        self._note_failure()
        if retry_at is None:
            # Exponential back-off with jitter, capped so a recovered Redis is noticed quickly.
            retry_at = received + backoff_delay_s(
                self._failures_in_a_row,
                base_s=min(0.1, self._timing.renew_interval_s / 4),
                cap_s=min(self._timing.renew_interval_s, 2.0),
                jitter=FAILURE_BACKOFF_JITTER,
                rng=self._rng,
            )
        return CycleOutcome(
            kind=kind,
            state=self._state,
            at=sent,
            duration_s=received - sent,
            holder=self._holder,
            error=error,
            error_kind=error_kind,
            next_cycle_at=retry_at,
        )

    def _note_failure(self) -> None:
        self._failures_in_a_row += 1
        self._backend_up = False

    def _backend_ok(self, at: float) -> None:
        self._failures_in_a_row = 0
        self._backend_up = True
        self._last_backend_ok_at = at

    def _next_renewal(self, sent: float, *, first: bool = False) -> float:
        interval = self._timing.renew_interval_s
        if self._renew_jitter_share:
            # Locks granted together (a daemon's start, the end of an outage) would renew in one
            # burst for many intervals while the small jitter drifts them apart: the first
            # renewal of a term lands anywhere in the interval instead. One early renewal per
            # grant is the whole cost, and early is always safe.
            share = FIRST_RENEWAL_SPREAD if first else self._renew_jitter_share
            due = sent + interval * (1 - self._rng.uniform(0.0, share))
            return _on_grid(due, earliest=sent + interval * (1 - share), latest=sent + interval)
        return sent + interval

    def _jitter(self) -> float:
        return self._rng.uniform(0.0, min(MAX_WAKE_JITTER_S, self._timing.ttl_s * 0.001))

    def _observe_holder(self, holder: Holder | None, *, expires_at: float | None) -> None:
        changed = holder != self._holder
        self._holder = holder
        self._holder_expires_at = expires_at
        if changed:
            try:
                self._hooks.on_new_leader(holder)
            except Exception:
                logger.exception("on_new_leader hook failed", extra={"lock": self.lock})

    def _check_token(self, token: int) -> None:
        """Remember the highest fencing token Redis showed us; note one that went backwards."""
        if token < self._highest_token_seen:
            self._token_regressed_from = self._highest_token_seen
        else:
            self._highest_token_seen = token

    def _emit(self, outcome: CycleOutcome) -> None:
        if self._token_regressed_from is not None:
            outcome = dataclasses.replace(outcome, token_regressed_from=self._token_regressed_from)
            self._token_regressed_from = None
        try:
            self._hooks.on_outcome(outcome)
        except Exception:
            logger.exception("on_outcome hook failed", extra={"lock": self.lock})

    async def _call_hook(self, name: str, call: Awaitable[None]) -> None:
        try:
            await call
        except Exception:
            logger.exception("%s hook failed", name, extra={"lock": self.lock})

    # -- waiting and announcements -------------------------------------------------------------

    async def _sleep_until(self, when: float) -> None:
        """Sleep until `when`, a stop request, or an announcement that calls for a cycle now."""
        while not self._stop_requested and self._resign_stand_back_s is None and not self._hold_lifted:
            if self._handle_announcements():
                earliest = (self._last_attempt_at or 0.0) + MIN_ATTEMPT_SPACING_S
                when = min(when, max(earliest, self._clock()))
            remaining = when - self._clock()
            if remaining <= CLOCK_RESOLUTION_S:
                return
            self._wakeup.clear()
            if self._events or self._resubscribed:
                continue
            # A timer that sets the event, rather than asyncio.timeout: a timeout cancels the
            # task and raises through it, which costs more than the rest of a renewal's cycle
            # in a daemon of thousands of locks.
            timer = asyncio.get_running_loop().call_later(remaining, self._wakeup.set)
            try:
                await self._wakeup.wait()
            finally:
                timer.cancel()

    def _handle_announcements(self) -> bool:
        """Apply queued announcements; True when the next cycle should run now."""
        run_now = False
        if self._resubscribed:
            # Announcements may have been missed while unsubscribed: look again.
            self._resubscribed = False
            run_now = self._state is State.FOLLOWER
        while self._events:
            event = self._events.popleft()
            if self._state is State.LEADER and self._lease is not None:
                if event.kind is LeaseEventKind.HANDOFF and event.holder == self._lease.holder:
                    # Asked to hand over: the renewal reads the request from Redis (a message
                    # alone is not trusted) and steps down if it is real.
                    run_now = True
                elif event.kind is LeaseEventKind.ACQUIRED and (
                    event.holder.fencing_token > self._lease.fencing_token
                ):
                    # A later grant means our key is gone. Announcements can be late or forged
                    # (anyone allowed to PUBLISH), so renew now and let Redis say: lost, or ours.
                    run_now = True
            elif self._state is State.FOLLOWER:
                if event.kind is LeaseEventKind.RELEASED:
                    if self._holder is None or event.holder.fencing_token >= self._holder.fencing_token:
                        self._observe_holder(None, expires_at=None)
                    run_now = True
                elif event.kind is LeaseEventKind.HANDOFF:
                    continue
                elif self._holder is None or event.holder.fencing_token > self._holder.fencing_token:
                    self._observe_holder(event.holder, expires_at=self._holder_expires_at)
        return run_now

    async def _listen(self) -> None:
        """Keep a subscription to the lock's announcements for as long as the election runs.

        Every new subscription makes a follower look at the lock once (it may have missed a
        release), so a link that breaks right after each subscribe (an idle-timeout proxy) must
        not turn into a request loop: the back-off keeps growing until a subscription has stayed
        up for `_stable_subscription_s`.
        """
        failures = 0
        while True:
            try:
                async with asyncio.timeout(2 * self._timing.request_timeout_s):
                    subscription = await self._backend.subscribe(keepalive_s=self._keepalive_s)
            except (LeaseBackendError, TimeoutError) as exc:
                failures += 1
                self._subscribe_tried.set()
                logger.debug("cannot subscribe to announcements: %s", _describe(exc))
                await asyncio.sleep(self._resubscribe_delay_s(failures))
                continue
            if failures or self._subscribed.is_set():
                self._resubscribed = True
                self._wakeup.set()
            self._subscribed.set()
            self._subscribe_tried.set()
            subscribed_at = self._clock()
            try:
                while True:
                    event = await subscription.next_event(timeout_s=self._keepalive_s)
                    if event is not None:
                        self._events.append(event)
                        self._wakeup.set()
            except LeaseBackendError as exc:
                logger.debug("announcement subscription broke: %s", exc)
            except Exception:
                # A bug or hostile data must not silently end the subscription for good.
                logger.exception("announcement listener failed; re-subscribing")
            finally:
                await subscription.close()
            stable = self._clock() - subscribed_at >= self._stable_subscription_s
            failures = 1 if stable else failures + 1
            await asyncio.sleep(self._resubscribe_delay_s(failures))

    @property
    def _stable_subscription_s(self) -> float:
        """How long a subscription must have lasted for its break to count as a first failure."""
        return max(5.0, self._timing.ttl_s)

    def _resubscribe_delay_s(self, failures: int) -> float:
        return backoff_delay_s(
            failures,
            base_s=RESUBSCRIBE_FIRST_S,
            cap_s=RESUBSCRIBE_MAX_S,
            jitter=FAILURE_BACKOFF_JITTER,
            rng=self._rng,
        )


#: Step-downs asked for from outside a cycle; their outcome is the release that completes them.
_REQUESTED_STEP_DOWNS = frozenset({StepDownReason.SHUTDOWN, StepDownReason.RESIGNED})


def _kind_of(exc: BaseException) -> str:
    return exc.kind.value if isinstance(exc, LeaseBackendError) else BackendErrorKind.TIMEOUT.value


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "Redis did not answer in time"
    return str(exc)


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _on_grid(due: float, *, earliest: float, latest: float) -> float:
    """`due` moved to a point of the RENEW_GRID_S grid within [earliest, latest]: the one just
    before it, else the one just after; `due` itself when the range holds no grid point."""
    before = math.floor(due / RENEW_GRID_S) * RENEW_GRID_S
    if before >= earliest:
        return before
    after = before + RENEW_GRID_S
    return after if after <= latest else due
