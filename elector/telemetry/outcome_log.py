"""What the election's outcomes say in the logs: one module for the daemon and the library.

Both layers turn the same `CycleOutcome` stream into a quiet log and say an outage of Redis on
its edges only: a warning when it starts, one more for each new cause within it, a line when
Redis answers again. `RedisOutage` makes that decision once, for both; `ClashEpisodes`
(elector.election.clash) decides when another live process reports our identity. What differs
is the voice: `OutcomeLogger` writes the daemon's structlog events (one name per event, every
field a key, for JSON lines); `ElectionLog` writes the library's stdlib lines under the logger
`elector.api`, which users filter on and render with their own logging set-up (structlog's stdlib
integration keeps the `extra` fields).

The library's levels:

* WARNING, once, when Redis becomes unreachable (a wrong URL, a cut link: the first failed
  request, so within one request timeout) or answers with an error (a refused password, a DB
  index out of range), and INFO, once, when it answers again; in between, one WARNING for each
  new kind of error (a timeout, then data that blocks the lock);
* INFO for each transition (leading, released, stepped down, release withheld: ERROR) with the
  lock, our identity and the fencing token;
* WARNING, once per episode, when another live process reports our identity for the lock
  (it holds the lock under our identity, or the candidate registry saw it register as us:
  even when neither leads); a new warning only after three ttl without a sign of it;
* nothing else on the happy path: renewals and followers' looks are silent.

The daemon's: one INFO line per transition; the outage's edges as above, DEBUG for its repeats;
one INFO per quiet period; one INFO when another holder is seen; one WARNING when the lock is
blocked by a value elector did not write; renewals and `held` cycles at DEBUG only.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from elector.election.clash import ClashEpisodes
from elector.election.outcome import CycleOutcome, OutcomeKind, State, error_cause
from elector.lease import BackendErrorKind, Holder

if TYPE_CHECKING:  # the type only: the library's lines need nothing of structlog
    import structlog

logger = logging.getLogger("elector.api")

#: Failed requests: the outcomes that say Redis did not answer (or refused us).
_FAILURES = frozenset({OutcomeKind.ACQUIRE_ERROR, OutcomeKind.RENEW_ERROR})

#: What Redis answers when the settings are wrong in a way no retry can cure (besides refused
#: access, kind "auth"): a DB index it does not have, a topology that is not the server's.
_INCURABLE_ANSWERS = ("DB index is out of range", "invalid DB index", "Cluster mode is not enabled", "MOVED ")


class OutageEdge(enum.Enum):
    """Where a failed request stands in an outage of Redis."""

    #: The first failure after an answer (or ever): say it.
    STARTED = "started"
    #: A cause not said yet in this outage (a timeout, then data that blocks the lock): say it too,
    #: else the operator sees only the first cause.
    NEW_CAUSE = "new_cause"
    #: A cause already said in this outage: a repeat, not news.
    REPEAT = "repeat"


class RedisOutage:
    """The edges of an outage of Redis as both layers' logs tell them."""

    def __init__(self) -> None:
        #: Clock time of the outage's first failure; None while Redis answers.
        self.since: float | None = None
        #: The causes (`error_cause`: timeouts and broken connections are one) said in this outage.
        self._causes_said: set[str] = set()

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, *, error_kind: str | None, at: float) -> OutageEdge:
        cause = error_cause(error_kind)
        if self.since is None:
            self.since = at
            self._causes_said = {cause}
            return OutageEdge.STARTED
        if cause not in self._causes_said:
            self._causes_said.add(cause)
            return OutageEdge.NEW_CAUSE
        return OutageEdge.REPEAT

    def answered(self, *, at: float) -> float | None:
        """Redis answered: how long the outage this ends lasted (seconds), or None if none did."""
        since, self.since = self.since, None
        self._causes_said = set()
        return None if since is None else max(0.0, at - since)


class ElectionLog:
    """The library's voice: an Elector's outcomes as the few log lines a user needs; it also
    remembers Redis's state, for the errors that say why no term came (LeadershipTimeout).

    A failed release counts as a failed request here: the library has no line of its own for it
    at WARNING, so its outage is said as any other."""

    def __init__(self, *, lock: str, identity: str, ttl_s: float) -> None:
        self._lock = lock
        self._identity = identity
        #: None until the first answer or failure; then whether the last request was answered.
        self.redis_up: bool | None = None
        #: Redis answered at least once (a refusal, such as a wrong password, is an answer too).
        self.redis_reached = False
        self.last_error: str | None = None
        #: The last request's error when retrying cannot cure it (see `incurable`), else None.
        self.refusal: str | None = None
        self._outage = RedisOutage()
        self._clashes = ClashEpisodes(identity=identity, ttl_s=ttl_s)
        self._token: int | None = None  # of our current (or last) term

    def observe(self, outcome: CycleOutcome) -> None:
        extra: dict[str, object] = {"lock": self._lock, "identity": self._identity}
        if outcome.kind in _FAILURES or (outcome.error_kind is not None):
            self.last_error = outcome.error
            answered = error_cause(outcome.error_kind) != "unreachable"
            self.redis_reached |= answered
            self.refusal = outcome.error if incurable(outcome.error_kind, outcome.error) else None
            self.redis_up = False
            edge = self._outage.failed(error_kind=outcome.error_kind, at=outcome.at)
            if edge is OutageEdge.STARTED:
                logger.warning(
                    "lock %r: %s (%s); %s",
                    self._lock,
                    "Redis answered with an error" if answered else "Redis unreachable",
                    outcome.error,
                    "retrying" if outcome.state is State.FOLLOWER else "renewing until the deadline",
                    extra={**extra, "error_kind": outcome.error_kind},
                )
            elif edge is OutageEdge.NEW_CAUSE:
                logger.warning(
                    "lock %r: Redis request failed (%s)",
                    self._lock,
                    outcome.error,
                    extra={**extra, "error_kind": outcome.error_kind},
                )
        elif outcome.duration_s is not None:
            if self._outage.answered(at=outcome.at) is not None:
                logger.info("lock %r: Redis answers again", self._lock, extra=extra)
            self.redis_up = self.redis_reached = True
            self.refusal = None
        if self._clashes.observe(outcome):
            self._warn_clash(outcome, extra)
        if outcome.is_transition:
            self._transition(outcome, extra)

    def _warn_clash(self, outcome: CycleOutcome, extra: dict[str, object]) -> None:
        holder = outcome.holder
        if outcome.kind is OutcomeKind.HELD and holder is not None and holder.identity == self._identity:
            seen = f"holds it under our identity {self._identity!r} (fencing token {holder.fencing_token})"
        else:
            seen = f"registered as a candidate under our identity {self._identity!r}"
        logger.warning(
            "lock %r: another live process %s: give each process its own identity (the default, "
            "host-pid-random, is unique; a chosen one must differ per process)",
            self._lock,
            seen,
            extra={**extra, "identity_clash": True},
        )

    def _transition(self, outcome: CycleOutcome, extra: dict[str, object]) -> None:
        if outcome.kind is OutcomeKind.ACQUIRED and outcome.holder is not None:
            self._token = outcome.holder.fencing_token
        token = self._token
        extra = {**extra, "fencing_token": token, "reason": outcome.step_down_reason}
        kind = outcome.kind
        if kind is OutcomeKind.ACQUIRED:
            logger.info(
                "lock %r: leading as %r, fencing token %s", self._lock, self._identity, token, extra=extra
            )
        elif kind is OutcomeKind.RELEASE_WITHHELD:
            logger.error(
                "lock %r: leader work of %r, fencing token %s, did not stop; release withheld: %s",
                self._lock, self._identity, token, outcome.error, extra=extra,
            )  # fmt: skip
        elif outcome.step_down_reason is not None or kind is OutcomeKind.RELEASED:
            logger.info(
                "lock %r: stepped down (%s) as %r, fencing token %s%s",
                self._lock,
                outcome.step_down_reason or "released",
                self._identity,
                token,
                "; released" if kind is OutcomeKind.RELEASED else "",
                extra=extra,
            )
        elif kind is OutcomeKind.RELEASE_FAILED:
            # Redis unreachable was said once already; a lease found no longer ours was already
            # lost (it lapsed, or a successor holds it): what the step-down said, not a fault.
            logger.info(
                "lock %r: release failed (%s) as %r, fencing token %s; the lease lapses by its ttl",
                self._lock, outcome.error, self._identity, token, extra=extra,
            )  # fmt: skip


def incurable(error_kind: str | None, error: str | None) -> bool:
    """Whether a failed request's error is one retrying cannot cure: access refused (a password,
    an ACL), a DB index the server does not have, a topology that is not the server's."""
    if error_kind == BackendErrorKind.AUTH.value:
        return True
    return error_kind == BackendErrorKind.SERVER.value and any(
        answer in (error or "") for answer in _INCURABLE_ANSWERS
    )


# -- the daemon's events ------------------------------------------------------------------------


def _holder_fields(holder: Holder | None) -> dict[str, object]:
    if holder is None:
        return {"holder": None, "holder_fencing_token": None}
    return {"holder": holder.identity, "holder_fencing_token": holder.fencing_token}


def _ms(duration_s: float | None) -> float | None:
    return None if duration_s is None else round(duration_s * 1000, 3)


#: Outcomes whose request got an answer from the backend.
_BACKEND_OK = frozenset(
    {
        OutcomeKind.ACQUIRED,
        OutcomeKind.HELD,
        OutcomeKind.QUIET_PERIOD,
        OutcomeKind.RENEWED,
        OutcomeKind.RENEW_LOST,
        OutcomeKind.RELEASED,
    }
)
_BACKEND_ERRORS = frozenset({OutcomeKind.ACQUIRE_ERROR, OutcomeKind.RENEW_ERROR})
#: Outcomes that tell who holds the lock (None meaning: free, or not in elector's format).
_OBSERVES_HOLDER = frozenset(
    {OutcomeKind.ACQUIRED, OutcomeKind.HELD, OutcomeKind.RENEWED, OutcomeKind.RENEW_LOST}
)


class OutcomeLogger:
    """The daemon's voice: cycle outcomes (an `ElectionHooks.on_outcome` hook) as structlog events,
    without flooding (the levels are in this module's docstring). With `identity`, one WARNING per
    episode of another live process reporting that identity (`ttl_s` sets how long one lasts).
    `lease_key` (the lock's lease key in Redis) is named in the warning about a foreign value, so
    that an operator knows what to inspect or delete.
    """

    def __init__(
        self,
        logger: structlog.stdlib.BoundLogger,
        *,
        lease_key: str | None = None,
        identity: str | None = None,
        ttl_s: float = 0.0,
    ) -> None:
        self._log = logger
        self._lease_key = lease_key
        self._clashes = None if identity is None else ClashEpisodes(identity=identity, ttl_s=ttl_s)
        self._foreign_value_seen = False
        self._outage = RedisOutage()
        self._in_quiet_period = False
        # None until a first observation; then (holder,) so that "lock free" is a value too.
        self._last_holder: tuple[Holder | None] | None = None
        # Resolved at the first look: through structlog's lazy proxy each look costs a bind,
        # paid by every renewal of a daemon holding thousands of locks. The stdlib
        # logger it ends in caches the answer per level and forgets it when a level is set.
        self._resolved_enabled_for: Callable[[int], bool] | None = None

    def __call__(self, outcome: CycleOutcome) -> None:
        if (
            outcome.kind is OutcomeKind.RENEWED
            and outcome.step_down_reason is None
            and outcome.token_regressed_from is None
            and not self._outage.ongoing
            and not outcome.identity_clash
        ):
            # The plain renewal, by far the most common outcome: what the trackers below would
            # do with it (no line above DEBUG), without walking them.
            self._foreign_value_seen = False
            self._in_quiet_period = False
            self._last_holder = (outcome.holder,)
            if self._enabled_for(logging.DEBUG):
                self._log_routine(outcome)
            return
        if outcome.token_regressed_from is not None:
            token = None if outcome.holder is None else outcome.holder.fencing_token
            self._log.error(
                "fencing_token_regressed",
                fencing_token=token,
                highest_seen=outcome.token_regressed_from,
                hint="a grant got a lower token than an earlier one: a Redis server's clock is "
                "behind (see docs/fencing.md); fenced writes of the new leader will be rejected",
            )
        if self._clashes is not None and self._clashes.observe(outcome):
            self._log.warning(
                "identity_clash",
                **_holder_fields(outcome.holder) if outcome.kind is OutcomeKind.HELD else {},
                hint="another live process reports this daemon's identity for the lock: give each "
                "replica its own --identity (the default, $POD_NAME or the host name, differs per "
                "pod or host, not per process on one host)",
            )
        self._track_backend(outcome)
        self._track_foreign_value(outcome)
        self._track_quiet_period(outcome)
        if outcome.is_transition:
            self._log_transition(outcome)
        else:
            self._log_routine(outcome)
        self._track_holder(outcome)

    def _enabled_for(self, level: int) -> bool:
        if self._resolved_enabled_for is None:
            self._resolved_enabled_for = self._log.isEnabledFor
        return self._resolved_enabled_for(level)

    def _track_backend(self, outcome: CycleOutcome) -> None:
        if outcome.kind in _BACKEND_ERRORS:
            kind = _optional(error_kind=outcome.error_kind)
            edge = self._outage.failed(error_kind=outcome.error_kind, at=outcome.at)
            if edge is OutageEdge.STARTED:
                self._log.warning(
                    "redis_unreachable", error=outcome.error, outcome=outcome.kind.value, **kind
                )
            elif edge is OutageEdge.NEW_CAUSE:
                self._log.warning("redis_error", error=outcome.error, outcome=outcome.kind.value, **kind)
            else:
                self._log.debug("redis_error", error=outcome.error, outcome=outcome.kind.value, **kind)
        elif outcome.kind in _BACKEND_OK:
            down_for_s = self._outage.answered(at=outcome.at)
            if down_for_s is not None:
                self._log.info("redis_reachable", unreachable_for_s=round(down_for_s, 3))

    def _track_foreign_value(self, outcome: CycleOutcome) -> None:
        # An attempt answered "held" without a holder: the key holds something elector did not
        # write (another program, a hand-made SET). It blocks the lock until it expires.
        if outcome.kind is OutcomeKind.HELD and outcome.holder is None:
            fields = _optional(key=self._lease_key, remaining_ms=outcome.remaining_ms)
            if self._foreign_value_seen:
                self._log.debug("lock_held_by_foreign_value", **fields)
                return
            self._foreign_value_seen = True
            expiry = (
                "it has no expiry: nobody can lead until it is deleted"
                if outcome.remaining_ms is None
                else "nobody can lead until it expires"
            )
            self._log.warning(
                "lock_held_by_foreign_value",
                hint=f"the lock's lease key holds a value elector did not write; {expiry}",
                **fields,
            )
        elif outcome.kind in _BACKEND_OK:
            self._foreign_value_seen = False

    def _track_quiet_period(self, outcome: CycleOutcome) -> None:
        if outcome.kind is OutcomeKind.QUIET_PERIOD:
            if not self._in_quiet_period:
                self._in_quiet_period = True
                self._log.info("quiet_period", remaining_ms=outcome.remaining_ms)
            else:
                self._log.debug("quiet_period", remaining_ms=outcome.remaining_ms)
        elif outcome.kind in _BACKEND_OK:
            # Any other answer from the backend means grants are allowed again.
            self._in_quiet_period = False

    def _log_transition(self, outcome: CycleOutcome) -> None:
        reason = None if outcome.step_down_reason is None else outcome.step_down_reason.value
        if outcome.kind is OutcomeKind.ACQUIRED:
            token = None if outcome.holder is None else outcome.holder.fencing_token
            self._log.info(
                "acquired",
                fencing_token=token,
                remaining_ms=outcome.remaining_ms,
                duration_ms=_ms(outcome.duration_s),
            )
        elif outcome.kind is OutcomeKind.RELEASED:
            self._log.info("released", **_optional(reason=reason))
        elif outcome.kind is OutcomeKind.RELEASE_FAILED:
            self._log.warning("release_failed", **_optional(reason=reason, error=outcome.error))
        elif outcome.kind is OutcomeKind.RELEASE_WITHHELD:
            self._log.error(
                "release_withheld",
                error=outcome.error,
                lapses_in_ms=outcome.remaining_ms,
                **_optional(reason=reason),
            )
        else:
            # RENEW_LOST always says who (or that nobody) holds the lock now; others only if known.
            known = outcome.holder is not None or outcome.kind is OutcomeKind.RENEW_LOST
            holder = _holder_fields(outcome.holder) if known else {}
            self._log.info(
                "stepped_down",
                reason=reason,
                outcome=outcome.kind.value,
                **_optional(error=outcome.error),
                **holder,
            )

    def _log_routine(self, outcome: CycleOutcome) -> None:
        # Every line here is DEBUG: even a dropped structlog call costs more than this check, paid
        # by every renewal of a daemon holding thousands of locks.
        if not self._enabled_for(logging.DEBUG):
            return
        kind = outcome.kind
        if kind is OutcomeKind.RENEWED:
            self._log.debug("renewed", duration_ms=_ms(outcome.duration_s), remaining_ms=outcome.remaining_ms)
        elif kind is OutcomeKind.HELD:
            self._log.debug(
                "held",
                remaining_ms=outcome.remaining_ms,
                duration_ms=_ms(outcome.duration_s),
                **_holder_fields(outcome.holder),
            )
        elif kind not in _BACKEND_ERRORS and kind is not OutcomeKind.QUIET_PERIOD:
            # Already logged by the edge trackers; anything else is unexpected but harmless.
            self._log.debug(kind.value, **_optional(error=outcome.error))

    def _track_holder(self, outcome: CycleOutcome) -> None:
        if outcome.kind is OutcomeKind.RELEASED:
            self._last_holder = (None,)  # we deleted the key: the lock is free
            return
        announced = outcome.kind is OutcomeKind.STEPPED_DOWN and outcome.holder is not None
        if outcome.kind not in _OBSERVES_HOLDER and not announced:
            return
        previous = self._last_holder
        self._last_holder = (outcome.holder,)
        # Only a follower's look at the lock is news of its own: a transition line already names
        # the holder (one INFO line per transition), and a renewal can only find ourselves.
        if previous != self._last_holder and outcome.kind is OutcomeKind.HELD:
            self._log.info("new_leader_observed", **_holder_fields(outcome.holder))


def _optional(**fields: object) -> dict[str, object]:
    return {key: value for key, value in fields.items() if value is not None}
