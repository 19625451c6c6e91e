"""Values the election produces: its state, the outcome of each cycle, and status snapshots.

Every cycle of the election returns one `CycleOutcome`. Adapters (logs, metrics) consume these
values instead of reaching into the state machine, and tests assert on them.
"""

from __future__ import annotations

import dataclasses
import enum

from elector.lease import BackendErrorKind, Holder, LeaseBackendError

#: Error kinds that all say "Redis is not reached" (see BackendErrorKind): one cause for logs.
_UNREACHED_KINDS = frozenset({BackendErrorKind.CONNECTION.value, BackendErrorKind.TIMEOUT.value})


def error_cause(error_kind: str | None) -> str:
    """The cause an outcome's `error_kind` stands for, as logs tell causes apart: "unreachable"
    for a timeout or a broken connection (they alternate in one outage), else the kind itself
    (auth, data, server: news an operator must see even in the middle of an outage)."""
    if error_kind is None or error_kind in _UNREACHED_KINDS:
        return "unreachable"
    return error_kind


def error_kind_of(exc: BaseException) -> str:
    """The `error_kind` of an outcome: the backend's kind, or a timeout."""
    return exc.kind.value if isinstance(exc, LeaseBackendError) else BackendErrorKind.TIMEOUT.value


def describe_error(exc: BaseException) -> str:
    """The `error` of an outcome: what the request met, in words."""
    if isinstance(exc, TimeoutError):
        return "Redis did not answer in time"
    return str(exc)


class State(enum.StrEnum):
    FOLLOWER = "follower"
    LEADER = "leader"
    STEPPING_DOWN = "stepping_down"
    STOPPED = "stopped"


class StepDownReason(enum.StrEnum):
    #: A renewal (or an announcement) showed the key gone, expired or held by another value.
    LOST = "lost"
    #: Renewals kept failing until the renew deadline; stepped down before the lease could expire.
    RENEW_DEADLINE = "renew_deadline"
    #: Our own validity had already run out when we looked (the process was paused or starved).
    LEASE_EXPIRED = "lease_expired"
    #: The daemon is stopping; the lease is released.
    SHUTDOWN = "shutdown"
    #: The program gave leadership up (`Election.resign`, a leader child that exited); released.
    RESIGNED = "resigned"
    #: Someone asked for a handoff (`elector handoff`); released to the named candidate or anyone.
    HANDOFF = "handoff"
    #: A live candidate with a higher priority was seen long enough; released to it.
    PREEMPTED = "preempted"
    #: The program's own application failed its health checks (`Election.resign(reason=...)`,
    #: the daemon's --app-health-url); released so that a healthy candidate takes over at once.
    APP_UNHEALTHY = "app_unhealthy"


class OutcomeKind(enum.StrEnum):
    """What the request of a cycle found. Whether the cycle ended leadership is told apart, by
    `CycleOutcome.step_down_reason`."""

    ACQUIRED = "acquired"  # follower -> leader
    HELD = "held"  # someone else holds the lock
    QUIET_PERIOD = "quiet_period"  # the backend refuses grants after a data loss
    STAND_BACK = "stand_back"  # a handoff to another candidate is in progress, or we resigned
    ACQUIRE_ERROR = "acquire_error"  # the attempt failed (Redis unreachable, timeout, bad data)
    RENEWED = "renewed"
    RENEW_LOST = "renew_lost"  # the renewal found the key gone or foreign: stepped down at once
    RENEW_ERROR = "renew_error"  # a renewal failed; retried until the renew deadline
    STEPPED_DOWN = "stepped_down"  # a step-down without a request (expired validity, announcement)
    RELEASED = "released"  # the lease was deleted (on shutdown, or after a deadline step-down)
    RELEASE_FAILED = "release_failed"  # could not release; the lease will expire by its ttl
    #: Leader work could not be stopped (the stop hook raised): the lease is NOT released but left
    #: to lapse by its ttl, so that no successor starts while the old work may still run.
    RELEASE_WITHHELD = "release_withheld"


@dataclasses.dataclass(frozen=True, slots=True)
class CycleOutcome:
    """What one cycle of the election did and what it decided."""

    kind: OutcomeKind
    #: The state after this cycle.
    state: State
    #: Clock time (the election's clock: CLOCK_BOOTTIME seconds in the daemon) when the request
    #: of this cycle was sent.
    at: float
    #: Round trip of the request, seconds; None when no request completed.
    duration_s: float | None = None
    #: The holder observed by this cycle (ourselves when leading), if known.
    holder: Holder | None = None
    #: Remaining lease time: our own validity when leading, the holder's PTTL otherwise.
    remaining_ms: int | None = None
    #: Clock time at which the next cycle is due (absent announcements).
    next_cycle_at: float | None = None
    #: Set when this cycle ended our leadership, and why.
    step_down_reason: StepDownReason | None = None
    #: A short, secret-free description of the error, for logs.
    error: str | None = None
    #: The failed request's BackendErrorKind value (connection, timeout, auth, data, server), for
    #: metrics: a data error (someone else's value at our key) needs a person, a timeout does not.
    error_kind: str | None = None
    #: On ACQUIRED and RENEWED: the clock time at which this replica stops believing it leads
    #: (the request's send time + validity). Watchdogs outside the election use it as a deadline.
    valid_until: float | None = None
    #: Set when this cycle saw a holder's fencing token LOWER than the highest one seen before:
    #: that highest token. Tokens only grow unless a server's clock broke the ordering (see
    #: docs/fencing.md); the fence would then reject the new leader's writes.
    token_regressed_from: int | None = None
    #: Set when this cycle's request found our identity's live candidate entry registered by
    #: another instance (`elector.lease.Granted.identity_clash`): two live processes report
    #: our identity, whether either leads or not. Logs warn about it; the election goes on.
    identity_clash: bool = False

    @property
    def is_transition(self) -> bool:
        """Whether this outcome changes the role (worth an INFO log line)."""
        return self.step_down_reason is not None or self.kind in (
            OutcomeKind.ACQUIRED,
            OutcomeKind.RELEASED,
            OutcomeKind.RELEASE_FAILED,
            OutcomeKind.RELEASE_WITHHELD,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ElectionStatus:
    """A snapshot of the election, computed at the moment it is asked for."""

    lock: str
    identity: str
    state: State
    #: Leading right now: state is leader AND our validity has not run out.
    is_leader: bool
    #: The current holder as last observed (ourselves when leading), or None.
    holder: Holder | None
    #: Our fencing token while leading, else None.
    fencing_token: int | None
    #: Leader: our own remaining validity; follower: the holder's remaining PTTL as last seen.
    lease_remaining_s: float | None
    #: Whether the election loop has begun its first cycle.
    started: bool
    #: Clock time of the last successful exchange with the backend, or None.
    last_backend_ok_at: float | None
    #: Clock time by which the loop should have finished its current wait or request.
    cycle_due_by: float | None
    #: Whether the last exchange with the backend succeeded.
    backend_up: bool
    #: The clock reading this snapshot was computed at.
    now: float
    #: Not contending because the program's own leader work of an ended term still runs.
    waiting_for_own_work: bool = False
    #: Another live process reports our identity (an episode of clash.py is under way).
    identity_clash: bool = False
