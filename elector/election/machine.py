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
cap, whichever comes first: no fixed polling period (the subscription: announcements.py).

The rules (when to yield, when to step down, how long each wait lasts) are pure functions in
policy.py; this module asks them and acts. A daemon of many locks may renew a waiting leader's
lease on its behalf (`Renewer`, with one batched send for many leases) and share its wake-up
timers (`WakeUpTimers`) and its start turns (`StartGate`): the small public interface under
"Renewals made elsewhere" is all such an engine uses.

One module, though long: it is the whole story of one lock's election, read top-down (follower,
leader, stepping down, the waits between) over one state; split, that state was shared by
mixins over several files and no cycle could be read in one place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Protocol

from elector.election.announcements import Announcements
from elector.election.clash import ClashEpisodes
from elector.election.hooks import ElectionHooks
from elector.election.outcome import (
    CycleOutcome,
    ElectionStatus,
    OutcomeKind,
    State,
    StepDownReason,
    describe_error,
    error_kind_of,
)
from elector.election.policy import (
    RENEW_GRID_S,
    failure_backoff_s,
    ms,
    next_renewal_at,
    should_yield,
    step_down_due,
    wake_jitter_s,
    withheld_stand_back_until,
)
from elector.election.timing import ElectionTiming
from elector.lease import (
    Granted,
    Handoff,
    Held,
    Holder,
    Lease,
    LeaseBackend,
    LeaseBackendError,
    LeaseEventKind,
    Lost,
    QuietPeriod,
    Renewed,
    RenewResult,
    StandBack,
)

#: One logger for the whole election, under the name its records always had.
logger = logging.getLogger("elector.election.machine")

#: The step-down reasons `Election.resign` may report.
_RESIGN_REASONS = frozenset({StepDownReason.RESIGNED, StepDownReason.APP_UNHEALTHY})

#: Step-downs asked for from outside a cycle; their outcome is the release that completes them.
REQUESTED_STEP_DOWNS = frozenset(
    {StepDownReason.SHUTDOWN, StepDownReason.RESIGNED, StepDownReason.APP_UNHEALTHY}
)

#: The outcomes after which a leader with a `Renewer` waits for it to renew the lease.
_RENEWED_ELSEWHERE_AFTER = frozenset({OutcomeKind.ACQUIRED, OutcomeKind.RENEWED})

#: A flood of announcements must not become a flood of requests.
MIN_ATTEMPT_SPACING_S = 0.005
#: Waits shorter than this are due now (like asyncio's own clock resolution); sleeping them can
#: spin on clocks that round timers.
CLOCK_RESOLUTION_S = 1e-4

#: A renewal sent on an election's behalf: (send time, answer time, RENEW's result or the error
#: it met).
RenewalAnswer = tuple[float, float, "RenewResult | BaseException"]


# -- what an engine of many elections gives them ------------------------------------------------


class StartTurn(Protocol):
    """An election's place at a `StartGate`; `end` gives it back (its first cycle ended, or its
    run ended before that)."""

    def end(self) -> None: ...


class StartGate(Protocol):
    """Admits the first tries of many elections a few at a time: `request` queues `admit`,
    called on the running loop when this election's turn comes."""

    def request(self, admit: Callable[[], None]) -> StartTurn: ...


class WakeUpTimer(Protocol):
    def cancel(self) -> None: ...


class WakeUpTimers(Protocol):
    """Timers many elections share: `callback` is called at `when` on the elections' clock."""

    def call_at(self, when: float, callback: Callable[[], object]) -> WakeUpTimer: ...


class Renewer(Protocol):
    """Renews a leader's lease on its behalf while its task waits for the next renewal.

    `enter` takes the election in, due at `when`; the renewer then uses the election's public
    renewal interface (`lease_to_renew`, `renewal_sent`, `renewed_elsewhere`, `hand_back`).
    `leave` takes it out and returns the answer still under way for it, if any: the election
    awaits it and uses it as its own cycle's (the renewer resolves it within its timeout).
    """

    def enter(self, election: Election, when: float) -> None: ...

    def leave(self, election: Election) -> asyncio.Future[RenewalAnswer] | None: ...


class Election:
    """Contends for one lock, holds it while it can, and says at every step what it did.

    Read top-down: what it keeps, how it is observed and controlled, the run and its cycles
    (follower, leader, stepping down), the waits between them, the public interface through
    which an engine of many locks renews its lease, and the helpers every cycle shares.
    """

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
        shared_timers: WakeUpTimers | None = None,
        renew_grid_s: float = RENEW_GRID_S,
        renewer: Renewer | None = None,
    ) -> None:
        timing.validate()
        if not 0.0 <= renew_jitter_share < 0.5:
            raise ValueError(f"renew_jitter_share must be in [0, 0.5), got {renew_jitter_share}")
        # Renewing up to this share of the interval early spreads locks whose renewals fell due
        # together (many locks started at once, or re-synchronised by an outage). Early is safe.
        self._renew_jitter_share = renew_jitter_share
        #: With jitter on, renewals fall due on this grid (policy.next_renewal_at; a daemon of many
        #: locks picks a coarser one by their number).
        if renew_grid_s <= 0:
            raise ValueError(f"renew_grid_s must be positive, got {renew_grid_s}")
        self._renew_grid_s = renew_grid_s
        self._backend = backend
        self._identity = identity
        self._timing = timing
        self._hooks = hooks or ElectionHooks()
        self._clock = clock or asyncio.get_running_loop().time
        #: Where the waits take their timers from: elections of one daemon that wake at the same
        #: time share one. On the elections' clock; None: the loop's own.
        self._shared_timers = shared_timers
        #: Renews this lease on the election's behalf while its task waits (`Renewer`); None: its
        #: own cycles renew it.
        self._renewer = renewer
        #: Whether the task waits for the renewer (which may then apply plain answers).
        self._waits_for_renewer = False
        #: Set by the renewer when it leaves the next cycle to the task, with its answer if it has
        #: one (the leader cycle then uses it instead of sending a renewal).
        self._handed_back = False
        self._prefetched: RenewalAnswer | None = None
        self._rng = rng or random.Random()
        # The idle follower's request budget leaves room for one PING per ~6 ttl at most.
        self._keepalive_s = subscription_keepalive_s or max(60.0, 6 * timing.ttl_s)
        self._priority = priority
        self._preempt_after_s = timing.ttl_s if preempt_after_s is None else preempt_after_s

        # The term: our state, the lease, its validity, and how it ends.
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
        self._resign_reason = StepDownReason.RESIGNED
        # Whether we may contend: a stand-back, the program's hold, the outside gate.
        self._contend_not_before = 0.0
        #: Held by the program while its own leader work of an ended term still runs.
        self._contend_held = False
        #: Closed by `gate_contending` while something outside the lease forbids leading.
        self._may_contend = True
        self._withdrawn_while_gated = False
        self._hold_lifted = False

        # What we have seen of the lock and of Redis (the status and the outcomes report it).
        self._holder: Holder | None = None
        self._holder_expires_at: float | None = None
        self._last_backend_ok_at: float | None = None
        self._backend_up = False
        self._failures_in_a_row = 0
        #: Episodes of another live process reporting our identity, for the status.
        self._clashes = ClashEpisodes(identity=identity, ttl_s=timing.ttl_s)
        self._last_attempt_at: float | None = None
        self._highest_token_seen = 0
        self._token_regressed_from: int | None = None

        # The run, and what wakes its task.
        self._started = False
        #: Whether this run has called on_stopped_leading (a term ended): its end then need not.
        self._stop_hook_called = False
        self._cycle_due_by: float | None = None
        self._stop_requested = False
        #: Set by whatever calls for the task's attention: a stop, a resignation, a lifted hold, an
        #: announcement, a timer, the renewer.
        self._wakeup = asyncio.Event()
        self._announcements = Announcements(
            backend,
            request_timeout_s=timing.request_timeout_s,
            stable_after_s=max(5.0, timing.ttl_s),
            keepalive_s=self._keepalive_s,
            clock=self._clock,
            rng=self._rng,
            wake=self._wakeup.set,
        )

    # -- observation -------------------------------------------------------------------------

    @property
    def lock(self) -> str:
        return self._backend.lock

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def timing(self) -> ElectionTiming:
        return self._timing

    @property
    def priority(self) -> int:
        return self._priority

    @property
    def state(self) -> State:
        return self._state

    @property
    def backend(self) -> LeaseBackend:
        return self._backend

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
            identity_clash=self._clashes.active(now),
        )

    # -- control -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the election to finish: a leader stops its work and releases; a follower exits."""
        self._stop_requested = True
        self._wakeup.set()

    def resign(self, *, stand_back_s: float, reason: StepDownReason = StepDownReason.RESIGNED) -> None:
        """Give leadership up: stop leader work, release, and not contend for `stand_back_s`.

        A no-op for a follower (it does not stand back either). The step-down is reported with
        `reason` when the release completes: RESIGNED, or APP_UNHEALTHY when the program's own
        application failed (close `gate_contending` first, so that the release is not followed
        by our own acquire).
        """
        if stand_back_s < 0:
            raise ValueError(f"stand_back_s must not be negative, got {stand_back_s}")
        if reason not in _RESIGN_REASONS:
            raise ValueError(f"a resignation's reason is one of {sorted(_RESIGN_REASONS)}, got {reason}")
        if self._state is State.LEADER:
            self._resign_stand_back_s = stand_back_s
            self._resign_reason = reason
            self._wakeup.set()

    def gate_contending(self, *, may_contend: bool) -> None:
        """Whether this replica may seek the lease, as something outside it decides (the
        daemon's app health). While it may not, a follower sends no acquire (outcomes
        STAND_BACK); a leader is not affected (`resign` ends its term). Opening the gate
        contends at once. Independent of `hold_contending`: both must allow an acquire."""
        self._may_contend = may_contend
        if may_contend:
            self._withdrawn_while_gated = False
        if may_contend and self._state is State.FOLLOWER:
            # Only a follower's wait: a lifted hold makes every wait return at once until the
            # next follower cycle clears it, which a leader's renewals would then never do.
            self._hold_lifted = True
            self._wakeup.set()

    def hold_contending(self, held: bool) -> None:
        """While held, a follower sends no acquire (outcomes STAND_BACK): the program's own leader
        work of an ended term still runs. Lifting the hold contends at once (not before a
        withheld lease could have lapsed)."""
        self._contend_held = held
        if not held:
            self._hold_lifted = True
            self._wakeup.set()

    # -- the run -----------------------------------------------------------------------------

    async def run(self, *, start_delay_s: float = 0.0, start_gate: StartGate | None = None) -> None:
        """Contend, lead and step down until `stop()`; returns after releasing a held lease.

        `start_delay_s`: wait this long before subscribing and the first try (a stop meanwhile
        ends the run without any request). `start_gate`: then wait for a turn of it, which this
        election holds until its first cycle has ended. A daemon of many locks paces their
        starts with a gate (its many-locks engine), so that neither their subscriptions, nor their
        acquisitions, nor (hence) their renewals fall due together, and so that starts wait for
        earlier ones to be answered instead of piling up on a busy loop.
        """
        if start_delay_s < 0:
            raise ValueError(f"start_delay_s must not be negative, got {start_delay_s}")
        self._started = True
        self._stop_hook_called = False
        turn: StartTurn | None = None
        try:
            if start_delay_s > 0:
                start_at = self._clock() + start_delay_s
                self._cycle_due_by = start_at + 2 * self._timing.request_timeout_s
                await self._sleep_until(start_at)
                if self._stop_requested:
                    return  # nothing was tried, nothing registered: the run's own end follows
            if start_gate is not None:
                turn = await self._wait_for_turn(start_gate)
                if self._stop_requested:
                    return  # as above
            self._announcements.start(name=f"elector:{self.lock}:announcements")
            # Subscribe before the first try, so that no release can slip in between. Without a
            # subscription we still work, only slower to notice releases.
            self._cycle_due_by = self._clock() + 2 * self._timing.request_timeout_s
            await self._announcements.first_try(within_s=2 * self._timing.request_timeout_s)
            while True:
                if self._prefetched is not None and self._state is State.LEADER:
                    pass  # the renewer's answer came after a stop or a resignation: its cycle ends first
                elif self._stop_requested and self._state is not State.STEPPING_DOWN:
                    if self._state is State.LEADER:
                        await self._begin_step_down(StepDownReason.SHUTDOWN, release=True)
                    if self._pending_release is None:
                        await self._withdraw()
                        break
                elif self._resign_stand_back_s is not None:
                    stand_back_s, self._resign_stand_back_s = self._resign_stand_back_s, None
                    if self._state is State.LEADER:
                        await self._begin_step_down(self._resign_reason, release=True)
                        # max: a withheld release has already set the later time the lease lapses.
                        self._contend_not_before = max(self._contend_not_before, self._clock() + stand_back_s)
                outcome = await self.step()
                if turn is not None:
                    turn.end()  # the first cycle has ended: the next election's turn
                    turn = None
                if outcome.next_cycle_at is None:
                    continue
                if (
                    self._renewer is not None
                    and outcome.kind in _RENEWED_ELSEWHERE_AFTER
                    and self._state is State.LEADER
                ):
                    await self._wait_renewed_elsewhere(outcome.next_cycle_at, self._renewer)
                else:
                    await self._sleep_until(outcome.next_cycle_at)
        finally:
            if turn is not None:
                turn.end()
            await self._announcements.stop(lock=self.lock)
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

    # -- follower ----------------------------------------------------------------------------

    async def _follower_cycle(self) -> CycleOutcome:
        sent = self._clock()
        self._hold_lifted = False
        # A stand-back within the clock's resolution of its end is over: `_sleep_until` treats such
        # a wait as due, so standing back for it again would repeat this cycle without end.
        standing_back = sent < self._contend_not_before - CLOCK_RESOLUTION_S
        if not self._may_contend and not standing_back and not self._contend_held:
            return await self._gated_cycle(sent)
        if standing_back or self._contend_held or not self._may_contend:
            # We resigned a moment ago (let the others have it), or our own late work still runs:
            # no request is sent. A lifted hold wakes us (see `_sleep_until`).
            until = self._contend_not_before if standing_back else sent + self._timing.ttl_s
            return CycleOutcome(
                kind=OutcomeKind.STAND_BACK,
                state=self._state,
                at=sent,
                holder=self._holder,
                remaining_ms=ms(until - sent),
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
                OutcomeKind.ACQUIRE_ERROR, sent=sent, error=describe_error(exc), error_kind=error_kind_of(exc)
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
                remaining_ms=ms(valid_until - received),
                next_cycle_at=self._next_renewal(sent, first=True),
                valid_until=valid_until,
                identity_clash=result.identity_clash,
            )

        cap = received + self._timing.ttl_s
        if isinstance(result, Held):
            if result.holder is not None:
                self._check_token(result.holder.fencing_token)
            return self._holder_seen(
                OutcomeKind.HELD,
                sent=sent,
                received=received,
                holder=result.holder,
                remaining_ms=result.remaining_ms,
                identity_clash=result.identity_clash,
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
                identity_clash=result.identity_clash,
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
            identity_clash=result.identity_clash,
        )

    async def _gated_cycle(self, sent: float) -> CycleOutcome:
        """The gate is closed (`gate_contending`): look at the lock without contending (a read:
        no acquire, no registration), so that the holder and Redis's health stay known. The
        first such cycle withdraws our candidate entry: no leader hands over or yields to us."""
        self._cycle_due_by = sent + self._timing.request_timeout_s
        if not self._withdrawn_while_gated:
            self._withdrawn_while_gated = True
            await self._withdraw()  # best effort, within a request timeout
            sent = self._clock()
        try:
            async with asyncio.timeout(self._timing.request_timeout_s):
                seen = await self._backend.observe()
        except (LeaseBackendError, TimeoutError) as exc:
            return self._failed(
                OutcomeKind.ACQUIRE_ERROR, sent=sent, error=describe_error(exc), error_kind=error_kind_of(exc)
            )
        received = self._clock()
        self._backend_ok(received)
        return self._holder_seen(
            OutcomeKind.STAND_BACK,
            sent=sent,
            received=received,
            holder=seen.holder,
            remaining_ms=seen.remaining_ms,
        )

    def _holder_seen(
        self,
        kind: OutcomeKind,
        *,
        sent: float,
        received: float,
        holder: Holder | None,
        remaining_ms: int | None,
        identity_clash: bool = False,
    ) -> CycleOutcome:
        """A follower saw the lease held (or free): look again when it can expire, at the latest
        after the re-check cap of one ttl. Redis read the PTTL between send and receive: the
        expiry is no earlier than send + PTTL, and waking then (not later) is what makes a
        takeover prompt. Waking a little early only costs one more look, never less than a
        millisecond apart."""
        expires_at = None if remaining_ms is None else sent + max(remaining_ms, 1) / 1000
        self._observe_holder(holder, expires_at=expires_at)
        cap = received + self._timing.ttl_s
        return CycleOutcome(
            kind=kind,
            state=self._state,
            at=sent,
            duration_s=received - sent,
            holder=holder,
            remaining_ms=remaining_ms,
            next_cycle_at=cap if expires_at is None else min(cap, expires_at + self._jitter()),
            identity_clash=identity_clash,
        )

    # -- leader ------------------------------------------------------------------------------

    async def _leader_cycle(self) -> CycleOutcome:
        assert self._lease is not None
        deadline = self._last_renew_sent_at + self._timing.renew_deadline_s
        prefetched, self._prefetched = self._prefetched, None
        try:
            if prefetched is not None:
                # The renewer sent this renewal, within the validity and the deadline.
                sent, received, answer = prefetched
                if isinstance(answer, BaseException):
                    raise answer
                result = answer
            else:
                now = self._clock()
                overdue = step_down_due(now, valid_until=self._valid_until, renew_deadline_at=deadline)
                if overdue is not None:
                    await self._begin_step_down(overdue, release=True)
                    return self._stepped_down(OutcomeKind.STEPPED_DOWN, overdue, at=now)
                sent = now
                self._cycle_due_by = sent + self._timing.request_timeout_s
                async with asyncio.timeout(min(self._timing.request_timeout_s, deadline - sent)):
                    result = await self._backend.renew(self._lease, priority=self._priority)
                received = self._clock()
        except (LeaseBackendError, TimeoutError) as exc:
            received = self._clock() if prefetched is None else prefetched[1]
            error = describe_error(exc)
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
                OutcomeKind.RENEW_ERROR,
                sent=sent,
                error=error,
                error_kind=error_kind_of(exc),
                retry_at=retry_at,
            )
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
                identity_clash=result.identity_clash,
            )

        yield_reason = self._apply_renewal(sent, result)
        if yield_reason is not None:
            await self._begin_step_down(yield_reason, release=True)
            return self._stepped_down(
                OutcomeKind.STEPPED_DOWN,
                yield_reason,
                at=sent,
                duration_s=received - sent,
                identity_clash=result.identity_clash,
            )
        return self._renewed_outcome(sent, received, result)

    def _apply_renewal(self, sent: float, result: Renewed) -> StepDownReason | None:
        """A renewal sent at `sent` succeeded: the lease is ours until `sent` + validity. Whether
        it should end the term anyway: a handoff asked, a better rival (`policy.should_yield`)."""
        self._last_renew_sent_at = sent
        self._valid_until = sent + self._timing.validity_s
        self._holder_expires_at = sent + self._timing.ttl_s
        verdict = should_yield(
            result.handoff,
            result.best_rival,
            now=sent,
            identity=self._identity,
            priority=self._priority,
            led_since=self._led_since,
            rival_seen_since=self._rival_seen_since,
            preempt_after_s=self._preempt_after_s,
            ttl_s=self._timing.ttl_s,
        )
        self._pending_handoff_to = verdict.hand_over_to
        self._rival_seen_since = verdict.rival_seen_since
        return verdict.reason

    def _renewed_outcome(self, sent: float, received: float, result: Renewed) -> CycleOutcome:
        assert self._lease is not None
        return CycleOutcome(
            kind=OutcomeKind.RENEWED,
            state=self._state,
            at=sent,
            duration_s=received - sent,
            holder=self._lease.holder,
            remaining_ms=ms(self._valid_until - received),
            next_cycle_at=self._next_renewal(sent),
            valid_until=self._valid_until,
            identity_clash=result.identity_clash,
        )

    def _next_renewal(self, sent: float, *, first: bool = False) -> float:
        return next_renewal_at(
            sent,
            interval_s=self._timing.renew_interval_s,
            jitter_share=self._renew_jitter_share,
            first=first,
            rng=self._rng,
            grid_s=self._renew_grid_s,
        )

    # -- stepping down -----------------------------------------------------------------------

    async def _begin_step_down(self, reason: StepDownReason, *, release: bool) -> None:
        """Stop leader work first (the lease is still ours meanwhile), then drop the lease.

        When the work could not be stopped (the hook raised), nothing is released: see machine.py.
        """
        lease = self._lease
        self._state = State.STEPPING_DOWN
        self._prefetched = None  # the renewer's answer was for the term that ends
        stopped, error = await self._stop_leader_work(reason)
        self._lease = None
        self._valid_until = 0.0
        if not stopped:
            # The old lease lapses on Redis no later than its last renewal's send time + ttl.
            lapse_at = self._last_renew_sent_at + self._timing.ttl_s
            stand_back_until = withheld_stand_back_until(
                last_renew_sent_at=self._last_renew_sent_at, ttl_s=self._timing.ttl_s, reason=reason
            )
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
                    remaining_ms=ms(lapse_at - now),
                    step_down_reason=reason if reason in REQUESTED_STEP_DOWNS else None,
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
        identity_clash: bool = False,
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
            identity_clash=identity_clash,
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
            kind, error, error_kind = OutcomeKind.RELEASE_FAILED, describe_error(exc), error_kind_of(exc)
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
            step_down_reason=reason if reason in REQUESTED_STEP_DOWNS else None,
            error=error,
            error_kind=error_kind,
            next_cycle_at=None if reason is StepDownReason.SHUTDOWN else received,
        )

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
            logger.debug("could not withdraw the candidate entry: %s", describe_error(exc))

    # -- the waits between cycles ------------------------------------------------------------

    async def _sleep_until(self, when: float) -> None:
        """Sleep until `when`, a stop request, or an announcement that calls for a cycle now."""
        while not self._stop_requested and self._resign_stand_back_s is None and not self._hold_lifted:
            if self._apply_announcements():
                earliest = (self._last_attempt_at or 0.0) + MIN_ATTEMPT_SPACING_S
                when = min(when, max(earliest, self._clock()))
            remaining = when - self._clock()
            if remaining <= CLOCK_RESOLUTION_S:
                return
            self._wakeup.clear()
            if self._announcements.pending:
                continue
            # A timer that sets the event, rather than asyncio.timeout: a timeout cancels the
            # task and raises through it, which costs more than the rest of a renewal's cycle
            # in a daemon of thousands of locks. Many elections share their wake-up's timer.
            timer: asyncio.TimerHandle | WakeUpTimer
            if self._shared_timers is not None:
                timer = self._shared_timers.call_at(when, self._wakeup.set)
            else:
                timer = asyncio.get_running_loop().call_later(remaining, self._wakeup.set)
            try:
                await self._wakeup.wait()
            finally:
                timer.cancel()

    async def _wait_for_turn(self, gate: StartGate) -> StartTurn:
        """Wait for a turn of `gate` (or a stop). No cycle is due meanwhile: the wait is as long
        as the earlier starts take, and liveness must not take it for a stuck loop."""
        admitted = False

        def admit() -> None:
            nonlocal admitted
            admitted = True
            self._wakeup.set()

        turn = gate.request(admit)
        self._cycle_due_by = None
        while not admitted and not self._stop_requested:
            self._wakeup.clear()
            await self._wakeup.wait()
        return turn

    async def _wait_renewed_elsewhere(self, when: float, renewer: Renewer) -> None:
        """Wait, as a leader, while the renewer renews the lease from `when` on; return when the
        task must run a cycle: the renewer handed it back (with its answer in `_prefetched`, or
        none: its own cycle then renews or steps down), a stop, a resignation, a lifted hold, or
        an announcement that calls for a renewal now."""
        renewer.enter(self, when)
        self._waits_for_renewer = True
        try:
            while not self._stop_requested and self._resign_stand_back_s is None and not self._hold_lifted:
                if self._handed_back or self._apply_announcements():
                    break
                self._wakeup.clear()
                if self._announcements.pending:
                    continue
                await self._wakeup.wait()
        finally:
            self._waits_for_renewer = False
            self._handed_back = False
            pending = renewer.leave(self)
        if pending is not None:
            # A renewal of ours is under way: its answer is this cycle's (the renewer resolves
            # every such future within its timeout).
            self._prefetched = await asyncio.shield(pending)

    def _apply_announcements(self) -> bool:
        """Apply queued announcements; True when the next cycle should run now."""
        run_now = False
        if self._announcements.take_resubscribed():
            # Announcements may have been missed while unsubscribed: look again.
            run_now = self._state is State.FOLLOWER
        for event in self._announcements.take_events():
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

    # -- renewals made elsewhere (the interface a `Renewer` drives) --------------------------

    @property
    def waits_for_renewal(self) -> bool:
        """Whether the task waits while its `Renewer` renews the lease (it may apply plain answers
        then; otherwise the task runs the next cycle itself)."""
        return self._waits_for_renewer

    def lease_to_renew(self, now: float) -> Lease | None:
        """The lease the renewer may renew now: a leader's, well within its validity and renew
        deadline; None otherwise (its own cycle then steps down)."""
        if (
            self._state is State.LEADER
            and self._lease is not None
            and now < self._valid_until
            and now < self._last_renew_sent_at + self._timing.renew_deadline_s
        ):
            return self._lease
        return None

    def renewal_sent(self, at: float) -> float:
        """The renewer sent this lease's renewal at `at`: how long it may wait for the answer (the
        request timeout, never past the renew deadline)."""
        self._last_attempt_at = at
        self._cycle_due_by = at + self._timing.request_timeout_s
        deadline_s = self._last_renew_sent_at + self._timing.renew_deadline_s - at
        return min(self._timing.request_timeout_s, deadline_s)

    def renewed_elsewhere(self, sent: float, received: float, result: Renewed) -> float:
        """Apply the renewer's plain renewal (no handoff, no rival, no clash) as `step` and
        `_leader_cycle` would; returns when the next renewal is due."""
        self._last_attempt_at = sent
        self._backend_ok(received)
        self._apply_renewal(sent, result)  # nothing to yield to: a plain renewal has no news
        outcome = self._renewed_outcome(sent, received, result)
        assert outcome.next_cycle_at is not None
        self._cycle_due_by = outcome.next_cycle_at
        self._emit(outcome)
        return outcome.next_cycle_at

    def hand_back(self, answer: RenewalAnswer | None) -> None:
        """Wake the task to run its own leader cycle (on the renewer's `answer`, if it has one)."""
        self._prefetched = answer
        self._handed_back = True
        self._wakeup.set()

    # -- what every cycle shares -------------------------------------------------------------

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
            retry_at = received + failure_backoff_s(
                self._failures_in_a_row, renew_interval_s=self._timing.renew_interval_s, rng=self._rng
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
        self._clashes.observe(outcome)
        try:
            self._hooks.on_outcome(outcome)
        except Exception:
            logger.exception("on_outcome hook failed", extra={"lock": self.lock})

    async def _call_hook(self, name: str, call: Awaitable[None]) -> None:
        try:
            await call
        except Exception:
            logger.exception("%s hook failed", name, extra={"lock": self.lock})

    def _jitter(self) -> float:
        return wake_jitter_s(ttl_s=self._timing.ttl_s, rng=self._rng)
