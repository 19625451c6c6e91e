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
cap, whichever comes first: no fixed polling period (announcements.py).
"""

from __future__ import annotations

import asyncio
import contextlib

from elector.election.core import describe_error, error_kind_of
from elector.election.outcome import CycleOutcome, ElectionStatus, OutcomeKind, State, StepDownReason
from elector.election.policy import ms, next_renewal_at, step_down_due
from elector.election.rounds import RoundMember
from elector.election.stepping_down import SteppingDown
from elector.election.timers import StartGate, StartTurn
from elector.election.timing import ElectionTiming
from elector.lease import (
    Granted,
    Handoff,
    Held,
    LeaseBackendError,
    Lost,
    QuietPeriod,
    Renewed,
    StandBack,
)

#: The step-down reasons `Election.resign` may report.
_RESIGN_REASONS = frozenset({StepDownReason.RESIGNED, StepDownReason.APP_UNHEALTHY})

#: The outcomes after which a leader of a daemon with renewal rounds waits in them (rounds.py).
_HELD_IN_ROUNDS = frozenset({OutcomeKind.ACQUIRED, OutcomeKind.RENEWED})


class Election(SteppingDown, RoundMember):
    """Contends for one lock, holds it while it can, and says at every step what it did.

    Constructed with the backend, identity, timing and options of `ElectionCore` (core.py), which
    holds the state. This class is the story: run, step, the follower and the leader cycles;
    stepping down and releasing are in stepping_down.py, the announcements in announcements.py,
    the arithmetic of when the next cycle is due in cadence.py.
    """

    # -- observation ---------------------------------------------------------------------------

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
            identity_clash=self._clashes.active(now),
        )

    # -- control -------------------------------------------------------------------------------

    @property
    def priority(self) -> int:
        return self._priority

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

    async def run(self, *, start_delay_s: float = 0.0, start_gate: StartGate | None = None) -> None:
        """Contend, lead and step down until `stop()`; returns after releasing a held lease.

        `start_delay_s`: wait this long before subscribing and the first try (a stop meanwhile
        ends the run without any request). `start_gate`: then wait for a turn of it, which this
        election holds until its first cycle has ended. A daemon of many locks paces their
        starts with a gate (daemon/many_locks.py), so that neither their subscriptions, nor their
        acquisitions, nor (hence) their renewals fall due together, and so that starts wait for
        earlier ones to be answered instead of piling up on a busy loop.
        """
        if start_delay_s < 0:
            raise ValueError(f"start_delay_s must not be negative, got {start_delay_s}")
        self._started = True
        self._stop_hook_called = False
        listener: asyncio.Task[None] | None = None
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
            listener = asyncio.create_task(self._listen(), name=f"elector:{self.lock}:announcements")
            # Subscribe before the first try, so that no release can slip in between. Without a
            # subscription we still work, only slower to notice releases.
            self._cycle_due_by = self._clock() + 2 * self._timing.request_timeout_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2 * self._timing.request_timeout_s):
                    await self._subscribe_tried.wait()
            while True:
                if self._prefetched is not None and self._state is State.LEADER:
                    pass  # a round's answer came after a stop or a resignation: its cycle ends first
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
                    self._rounds is not None
                    and outcome.kind in _HELD_IN_ROUNDS
                    and self._state is State.LEADER
                ):
                    await self._hold_for_rounds(outcome.next_cycle_at, self._rounds)
                else:
                    await self._sleep_until(outcome.next_cycle_at)
        finally:
            if turn is not None:
                turn.end()
            if listener is not None:
                await self._stop_listener(listener)
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

    # -- follower ------------------------------------------------------------------------------

    async def _follower_cycle(self) -> CycleOutcome:
        sent = self._clock()
        self._hold_lifted = False
        if not self._may_contend and sent >= self._contend_not_before and not self._contend_held:
            return await self._gated_cycle(sent)
        if sent < self._contend_not_before or self._contend_held or not self._may_contend:
            # We resigned a moment ago (let the others have it), or our own late work still runs:
            # no request is sent. A lifted hold wakes us (see `_sleep_until`).
            until = self._contend_not_before if sent < self._contend_not_before else sent + self._timing.ttl_s
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

    # -- leader --------------------------------------------------------------------------------

    async def _leader_cycle(self) -> CycleOutcome:
        assert self._lease is not None
        deadline = self._last_renew_sent_at + self._timing.renew_deadline_s
        prefetched, self._prefetched = self._prefetched, None
        try:
            if prefetched is not None:
                # A round sent this renewal (rounds.py), within the validity and the deadline.
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

    def _renewed_in_round(self, sent: float, received: float, result: Renewed) -> float:
        """A round's plain renewal (rounds.py), applied as `step` and `_leader_cycle` would."""
        self._last_attempt_at = sent
        self._backend_ok(received)
        self._apply_renewal(sent, result)  # nothing to yield to: a plain renewal has no news
        outcome = self._renewed_outcome(sent, received, result)
        assert outcome.next_cycle_at is not None
        self._cycle_due_by = outcome.next_cycle_at
        self._emit(outcome)
        return outcome.next_cycle_at

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

    # -- helpers of the cycles ----------------------------------------------------------------

    def _next_renewal(self, sent: float, *, first: bool = False) -> float:
        return next_renewal_at(
            sent,
            interval_s=self._timing.renew_interval_s,
            jitter_share=self._renew_jitter_share,
            first=first,
            rng=self._rng,
            grid_s=self._renew_grid_s,
        )
