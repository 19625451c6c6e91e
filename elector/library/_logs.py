"""What the library says about its election: stdlib `logging` lines and its own metric.

Logger `elector.api` (structlog's stdlib integration picks the `extra` fields up). The levels:

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
"""

from __future__ import annotations

import logging
import weakref

from prometheus_client import CollectorRegistry, Gauge

from elector.election import CycleOutcome, OutcomeKind, State, error_cause
from elector.election.clash import ClashEpisodes
from elector.lease import BackendErrorKind

logger = logging.getLogger("elector.api")

#: Failed requests: the outcomes that say Redis did not answer (or refused us).
_FAILURES = frozenset({OutcomeKind.ACQUIRE_ERROR, OutcomeKind.RENEW_ERROR})

#: What Redis answers when the settings are wrong in a way no retry can cure (besides refused
#: access, kind "auth"): a DB index it does not have, a topology that is not the server's.
_INCURABLE_ANSWERS = ("DB index is out of range", "invalid DB index", "Cluster mode is not enabled", "MOVED ")

_WAITING_GAUGES: weakref.WeakKeyDictionary[CollectorRegistry, Gauge] = weakref.WeakKeyDictionary()


def waiting_for_own_work_gauge(registry: CollectorRegistry) -> Gauge:
    """`elector_waiting_for_own_work{lock}` on `registry` (one family per registry)."""
    gauge = _WAITING_GAUGES.get(registry)
    if gauge is None:
        gauge = _WAITING_GAUGES[registry] = Gauge(
            "elector_waiting_for_own_work",
            "1 while this Elector does not contend because its own leader work of an ended term "
            "still runs (it outlived stop_work_s), else 0",
            ["lock"],
            registry=registry,
        )
    return gauge


class ElectionLog:
    """Turns an Elector's outcomes into the few log lines a user needs; remembers Redis's state."""

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
        #: The error causes said at WARNING in the current outage.
        self._kinds_warned: set[str] = set()
        self._clashes = ClashEpisodes(identity=identity, ttl_s=ttl_s)
        self._token: int | None = None  # of our current (or last) term

    def observe(self, outcome: CycleOutcome) -> None:
        extra: dict[str, object] = {"lock": self._lock, "identity": self._identity}
        if outcome.kind in _FAILURES or (outcome.error_kind is not None):
            self.last_error = outcome.error
            answered = error_cause(outcome.error_kind) != "unreachable"
            self.redis_reached |= answered
            self.refusal = outcome.error if incurable(outcome.error_kind, outcome.error) else None
            if self.redis_up is not False:
                self.redis_up = False
                self._kinds_warned = {error_cause(outcome.error_kind)}
                logger.warning(
                    "lock %r: %s (%s); %s",
                    self._lock,
                    "Redis answered with an error" if answered else "Redis unreachable",
                    outcome.error,
                    "retrying" if outcome.state is State.FOLLOWER else "renewing until the deadline",
                    extra={**extra, "error_kind": outcome.error_kind},
                )
            elif error_cause(outcome.error_kind) not in self._kinds_warned:
                # A new cause within one outage (a timeout, then data that blocks the lock).
                self._kinds_warned.add(error_cause(outcome.error_kind))
                logger.warning(
                    "lock %r: Redis request failed (%s)",
                    self._lock,
                    outcome.error,
                    extra={**extra, "error_kind": outcome.error_kind},
                )
        elif outcome.duration_s is not None:
            if self.redis_up is False:
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
