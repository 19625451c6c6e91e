"""Logging: structlog and the standard library through one handler, one renderer.

Every line, whether logged through a structlog logger from `make_logger` or through a plain
`logging.getLogger(...)` of a library (redis, kopf and its aiohttp), is rendered by the same
`ProcessorFormatter`: JSON lines in production (stream not a TTY), colourful console otherwise.

`OutcomeLogger` turns the election's cycle outcomes into a quiet log: one INFO line per role
change or backend edge, everything periodic at DEBUG.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Literal, TextIO, get_args

import structlog
import structlog.tracebacks
from structlog.typing import EventDict, Processor, WrappedLogger

from elector.election.clash import ClashEpisodes
from elector.election.outcome import CycleOutcome, OutcomeKind, error_cause
from elector.lease import Holder

LogFormat = Literal["auto", "json", "console"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
LOG_LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


@dataclasses.dataclass(frozen=True, slots=True)
class LogSettings:
    format: LogFormat = "auto"
    #: A level name, case-insensitive: debug, info, warning, error, critical.
    level: str = "info"

    def __post_init__(self) -> None:
        if self.format not in LOG_FORMATS:
            raise ValueError(f"unknown log format {self.format!r}; expected one of {', '.join(LOG_FORMATS)}")
        if self.level.lower() not in LOG_LEVELS:
            raise ValueError(f"unknown log level {self.level!r}; expected one of {', '.join(LOG_LEVELS)}")

    @property
    def level_number(self) -> int:
        return LOG_LEVELS[self.level.lower()]


class _ElectorHandler(logging.StreamHandler[TextIO]):
    """Marks the handler `configure_logging` installs, so a second call can replace it."""


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _formatter(*, json: bool) -> structlog.stdlib.ProcessorFormatter:
    renderer: list[Processor]
    # Tracebacks never show local variables: frames hold the Redis settings (password) and lease
    # values (the secret owner token).
    if json:
        renderer = [
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            structlog.processors.JSONRenderer(),
        ]
    else:
        renderer = [structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)]
    return structlog.stdlib.ProcessorFormatter(
        # Only for standard-library records: keep their `extra=` fields as keys.
        foreign_pre_chain=[structlog.stdlib.ExtraAdder()],
        # Run for every record, structlog's and foreign, so both carry the same keys.
        processors=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *renderer,
        ],
    )


class _DemoteClientProtocolErrors(logging.Filter):
    """A malformed request (a scanner, an oversized header) is the client's fault, already answered
    with 400: keep it at DEBUG, without a traceback, so nobody can flood the logs with ERRORs.

    For aiohttp servers in the same process (kopf's, under `elector operator`); elector's own
    HTTP server (h11) logs these at DEBUG itself (`http_bad_request`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "aiohttp.server" or not record.exc_info or record.exc_info[1] is None:
            return True
        error = record.exc_info[1]
        if not any(cls.__name__ == "BadHttpMessage" for cls in type(error).__mro__):
            return True
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = f"{record.getMessage()}: {error}", ()
        record.exc_info, record.exc_text = None, None
        return True


def configure_logging(settings: LogSettings, *, stream: TextIO | None = None) -> None:
    """Route all logging to `stream` (stderr by default) through one structlog renderer.

    Replaces the handler installed by an earlier call; leaves other handlers alone.
    """
    out = sys.stderr if stream is None else stream
    use_json = settings.format == "json" or (settings.format == "auto" and not _is_tty(out))
    handler = _ElectorHandler(out)
    handler.setFormatter(_formatter(json=use_json))
    handler.addFilter(_DemoteClientProtocolErrors())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _ElectorHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level_number)
    # kopf's aiohttp (operator) logs access lines: noise at INFO. (A logger by name: no import.)
    logging.getLogger("aiohttp.access").setLevel(max(logging.WARNING, settings.level_number))


def _capture_exc_info(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    # Resolve `exc_info=True` while the exception is current, not whenever a handler formats it.
    if event_dict.get("exc_info") is True:
        event_dict["exc_info"] = sys.exc_info()
    return event_dict


def _context_adder(context: Callable[[], Mapping[str, object]]) -> Processor:
    def add_context(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        try:
            extra = context()
        except Exception as exc:  # logging must never fail because the status could not be read
            event_dict.setdefault("context_error", repr(exc))
            return event_dict
        # Keys given at the call site are more specific than the ambient context.
        for key, value in extra.items():
            event_dict.setdefault(key, value)
        return event_dict

    return add_context


def make_logger(name: str, *, context: Callable[[], Mapping[str, object]]) -> structlog.stdlib.BoundLogger:
    """A structlog logger over `logging.getLogger(name)` that adds `context()` to every line.

    `context` is called at log time (only for lines that pass the level filter), so values
    such as the election state are current without rebinding.
    """
    logger: structlog.stdlib.BoundLogger = structlog.wrap_logger(
        logging.getLogger(name),
        processors=[
            structlog.stdlib.filter_by_level,
            _context_adder(context),
            _capture_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    return logger


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
    """Logs cycle outcomes (an `ElectionHooks.on_outcome` hook) without flooding.

    One INFO line per transition; a WARNING when Redis becomes unreachable and an INFO when it
    is back, a WARNING for each new cause of error in between, DEBUG for repeats; one INFO per
    quiet period; one INFO when another holder is seen; one WARNING when the lock is blocked by
    a value elector did not write; with `identity`, one WARNING per episode of another live
    process reporting that identity (clash.py; `ttl_s` sets how long one lasts). Renewals and
    `held` cycles are DEBUG only. `lease_key` (the lock's lease key in Redis) is named in the
    warning about a foreign value, so that an operator knows what to inspect or delete.
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
        self._backend_failing_since: float | None = None
        #: The error kinds already said at WARNING in the current outage.
        self._failing_kinds_warned: set[str] = set()
        self._in_quiet_period = False
        # None until a first observation; then (holder,) so that "lock free" is a value too.
        self._last_holder: tuple[Holder | None] | None = None
        # Resolved at the first look: through structlog's lazy proxy each look costs a bind
        # (~2 us), paid by every renewal of a daemon holding thousands of locks. The stdlib
        # logger it ends in caches the answer per level and forgets it when a level is set.
        self._resolved_enabled_for: Callable[[int], bool] | None = None

    def __call__(self, outcome: CycleOutcome) -> None:
        if (
            outcome.kind is OutcomeKind.RENEWED
            and outcome.step_down_reason is None
            and outcome.token_regressed_from is None
            and self._backend_failing_since is None
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
            if self._backend_failing_since is None:
                self._backend_failing_since = outcome.at
                self._failing_kinds_warned = {error_cause(outcome.error_kind)}
                self._log.warning(
                    "redis_unreachable", error=outcome.error, outcome=outcome.kind.value, **kind
                )
            elif error_cause(outcome.error_kind) not in self._failing_kinds_warned:
                # A new cause within one outage (a timeout first, then the data that blocks the
                # lock): said once at WARNING, else the operator sees only the first cause.
                self._failing_kinds_warned.add(error_cause(outcome.error_kind))
                self._log.warning("redis_error", error=outcome.error, outcome=outcome.kind.value, **kind)
            else:
                self._log.debug("redis_error", error=outcome.error, outcome=outcome.kind.value, **kind)
        elif outcome.kind in _BACKEND_OK and self._backend_failing_since is not None:
            down_for_s = max(0.0, outcome.at - self._backend_failing_since)
            self._backend_failing_since = None
            self._failing_kinds_warned = set()
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
        # Every line here is DEBUG: a dropped structlog call still costs ~30 us, paid by every
        # renewal of a daemon holding thousands of locks.
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
