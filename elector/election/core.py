"""The state one lock's election keeps, and the small helpers every part of it shares.

`Election` (machine.py) is assembled from parts that each read and write this one state: the
cycles (machine.py), stepping down and releasing (stepping_down.py) and the announcement listener
with the waits it cuts short (announcements.py). The state lives here, in one constructor, so
that every field is declared once and each part names what it touches.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from elector.election.clash import ClashEpisodes
from elector.election.hooks import ElectionHooks
from elector.election.outcome import CycleOutcome, OutcomeKind, State, StepDownReason
from elector.election.policy import RENEW_GRID_S, failure_backoff_s, wake_jitter_s
from elector.election.timers import SharedTimers

if TYPE_CHECKING:
    from elector.election.rounds import RenewalRounds
from elector.election.timing import ElectionTiming
from elector.lease import (
    BackendErrorKind,
    Holder,
    Lease,
    LeaseBackend,
    LeaseBackendError,
    LeaseEvent,
    RenewResult,
)

#: What a renewal round gives an election's task (rounds.py): (send time, answer time, RENEW's
#: result or the error it met).
RoundResult = tuple[float, float, "RenewResult | BaseException"]

#: One logger for every part of the election, under the name its records always had.
logger = logging.getLogger("elector.election.machine")


class ElectionCore:
    """The fields of one lock's election and the helpers that keep them consistent."""

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
        shared_timers: SharedTimers | None = None,
        renew_grid_s: float = RENEW_GRID_S,
        renewal_rounds: RenewalRounds | None = None,
    ) -> None:
        timing.validate()
        if not 0.0 <= renew_jitter_share < 0.5:
            raise ValueError(f"renew_jitter_share must be in [0, 0.5), got {renew_jitter_share}")
        # Renewing up to this share of the interval early spreads locks whose renewals fell due
        # together (many locks started at once, or re-synchronised by an outage). Early is safe.
        self._renew_jitter_share = renew_jitter_share
        #: With jitter on, renewals fall due on this grid (cadence.py; a daemon picks it by its
        #: number of locks with `renew_grid_s`).
        if renew_grid_s <= 0:
            raise ValueError(f"renew_grid_s must be positive, got {renew_grid_s}")
        self._renew_grid_s = renew_grid_s
        self._backend = backend
        self._identity = identity
        self._timing = timing
        self._hooks = hooks or ElectionHooks()
        self._clock = clock or asyncio.get_running_loop().time
        #: Where the waits take their timers from: elections of one daemon that wake at the same
        #: time share one (timers.py). On the elections' clock; None: the loop's own.
        self._shared_timers = shared_timers
        #: The rounds that renew this lease with the others due at the same grid point (rounds.py;
        #: the backend must be a `RoundRenewable` that `renews_in_rounds`). None: its own cycles.
        self._rounds = renewal_rounds
        #: The grid point of the round this election waits in, while its task holds (rounds.py).
        self._round_at: float | None = None
        #: Set while a round's renewal of this lease is under way: resolved with its RoundResult.
        self._round_result: asyncio.Future[RoundResult] | None = None
        #: Whether the task waits in `_hold_for_rounds` (a round may then apply plain answers).
        self._round_held = False
        #: Set by a round that leaves the next cycle to the task, with its answer if it has one
        #: (the leader cycle then uses it instead of sending a renewal).
        self._handed_back = False
        self._prefetched: RoundResult | None = None
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
        self._resign_reason = StepDownReason.RESIGNED
        self._contend_not_before = 0.0
        #: Held by the program while its own leader work of an ended term still runs.
        self._contend_held = False
        #: Closed by `gate_contending` while something outside the lease forbids leading.
        self._may_contend = True
        self._withdrawn_while_gated = False
        self._hold_lifted = False

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

    @property
    def lock(self) -> str:
        return self._backend.lock

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

    # -- outcomes every cycle may end with ------------------------------------------------------

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

    def _jitter(self) -> float:
        return wake_jitter_s(ttl_s=self._timing.ttl_s, rng=self._rng)


def error_kind_of(exc: BaseException) -> str:
    """The `error_kind` of an outcome: the backend's kind, or a timeout."""
    return exc.kind.value if isinstance(exc, LeaseBackendError) else BackendErrorKind.TIMEOUT.value


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "Redis did not answer in time"
    return str(exc)
