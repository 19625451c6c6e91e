"""Timing settings of an election, checked up front (client-go style).

All durations are seconds on the monotonic clock. The invariants:

    ttl >= 0.5 s
    ttl > renew_deadline + safety margin       (step down before the lease can expire on Redis)
    renew_deadline > renew_interval > 0         (a renewal may be retried before the deadline)
    request_timeout < renew_interval            (one stuck request cannot eat a whole interval)
"""

from __future__ import annotations

import dataclasses

MIN_TTL_S = 0.5
#: Bound on how much faster our clock may run than Redis's, as a share of the ttl.
CLOCK_DRIFT_RATE = 0.01
#: Fixed part of the safety margin: scheduling jitter and the last request's flight time.
CLOCK_DRIFT_FIXED_S = 0.005


#: Default renew interval as a share of the ttl (see ElectionTiming on why not 1/3).
DEFAULT_RENEW_INTERVAL_SHARE = 0.3


class InvalidTimingError(ValueError):
    """A timing setting violates an invariant.

    `settings` names the settings involved ("ttl", "renew_interval", "renew_deadline",
    "request_timeout", "stop_work"), so a caller can name its own flags for them.
    """

    def __init__(self, message: str, *, settings: tuple[str, ...]) -> None:
        super().__init__(message)
        self.settings = settings


#: How each setting defaults, for messages about values the user never set.
DEFAULTS_TEXT = {
    "renew_interval": "0.3 x ttl",
    "renew_deadline": "2/3 of the ttl",
    "request_timeout": "half the renew interval, at most 1s",
}


@dataclasses.dataclass(frozen=True, slots=True)
class ElectionTiming:
    """When to renew, when to give up, and how long each request may take.

    Defaults (see `from_ttl`): renew every 0.3 x ttl, give up at 2/3 ttl after the last successful
    renewal, so that two more renewals can fail before stepping down and a third of the ttl
    remains to stop leader work before the lease can expire on Redis.

    Why 0.3 and not 1/3: an expiry a follower waits for is a renewal's time plus the ttl. With
    exactly ttl/3 that instant is also a later renewal's, and a waking follower races it: it sees
    2/3 ttl left and re-checks every 2/3 ttl. At 0.3 x ttl a renewal lands a tenth of a ttl before
    each old expiry, so a follower sees 0.9 ttl left and re-checks every 0.9 ttl.
    """

    #: Lease time to live, seconds (written to Redis as PX).
    ttl_s: float
    #: Period between renewals while leading, seconds.
    renew_interval_s: float
    #: After this long without a successful renewal (from its send time) the leader steps down.
    renew_deadline_s: float
    #: Per-request timeout for every Redis request, seconds.
    request_timeout_s: float
    #: Time the leader needs to stop its leader work; part of the safety margin, seconds.
    stop_work_s: float = 0.0

    @classmethod
    def from_ttl(
        cls,
        ttl_s: float,
        *,
        renew_interval_s: float | None = None,
        renew_deadline_s: float | None = None,
        request_timeout_s: float | None = None,
        stop_work_s: float = 0.0,
    ) -> ElectionTiming:
        """Fill the unset settings with defaults derived from the ttl, then validate."""
        interval = ttl_s * DEFAULT_RENEW_INTERVAL_SHARE if renew_interval_s is None else renew_interval_s
        deadline = ttl_s * 2 / 3 if renew_deadline_s is None else renew_deadline_s
        defaulted = [
            name
            for name, value in (
                ("renew_interval", renew_interval_s),
                ("renew_deadline", renew_deadline_s),
                ("request_timeout", request_timeout_s if request_timeout_s is None else 0),
            )
            if value is None
        ]
        if request_timeout_s is None:
            # Short enough to retry a couple of times inside one interval, never above 1 s.
            request_timeout_s = min(1.0, interval / 2)
        timing = cls(
            ttl_s=ttl_s,
            renew_interval_s=interval,
            renew_deadline_s=deadline,
            request_timeout_s=request_timeout_s,
            stop_work_s=stop_work_s,
        )
        try:
            timing.validate()
        except InvalidTimingError as exc:
            notes = [
                f"the {name.replace('_', ' ')} was not set: it defaults to {DEFAULTS_TEXT[name]}"
                for name in exc.settings
                if name in defaulted
            ]
            if not notes:
                raise
            raise InvalidTimingError(f"{exc} ({'; '.join(notes)})", settings=exc.settings) from None
        return timing

    @property
    def ttl_ms(self) -> int:
        return round(self.ttl_s * 1000)

    @property
    def safety_margin_s(self) -> float:
        """How long before the Redis expiry a leader stops believing it leads."""
        return self.ttl_s * CLOCK_DRIFT_RATE + CLOCK_DRIFT_FIXED_S + self.stop_work_s

    @property
    def validity_s(self) -> float:
        """How long after a renewal's send time the leader may consider itself leader."""
        return self.ttl_s - self.safety_margin_s

    @property
    def retry_delay_s(self) -> float:
        """Pause between failed renewal attempts (each attempt is also bounded by the timeout)."""
        return min(0.2, self.renew_interval_s / 5)

    def validate(self) -> None:
        def fmt(value: float) -> str:
            return f"{value * 1000:g}ms"

        if self.ttl_s < MIN_TTL_S:
            raise InvalidTimingError(
                f"ttl must be at least {fmt(MIN_TTL_S)}, got {fmt(self.ttl_s)}", settings=("ttl",)
            )
        if self.renew_interval_s <= 0:
            raise InvalidTimingError(
                f"renew interval must be positive, got {fmt(self.renew_interval_s)}",
                settings=("renew_interval",),
            )
        if self.request_timeout_s <= 0:
            raise InvalidTimingError(
                f"request timeout must be positive, got {fmt(self.request_timeout_s)}",
                settings=("request_timeout",),
            )
        if self.stop_work_s < 0:
            raise InvalidTimingError(
                f"stop-work time must not be negative, got {fmt(self.stop_work_s)}", settings=("stop_work",)
            )
        if self.renew_deadline_s <= self.renew_interval_s:
            raise InvalidTimingError(
                f"renew deadline ({fmt(self.renew_deadline_s)}) must be longer than the renew "
                f"interval ({fmt(self.renew_interval_s)}), so a failed renewal can be retried",
                settings=("renew_deadline", "renew_interval"),
            )
        if self.renew_deadline_s >= self.ttl_s:
            raise InvalidTimingError(
                f"ttl ({fmt(self.ttl_s)}) must be longer than the renew deadline "
                f"({fmt(self.renew_deadline_s)})",
                settings=("ttl", "renew_deadline"),
            )
        if self.renew_deadline_s > self.validity_s:
            raise InvalidTimingError(
                f"renew deadline ({fmt(self.renew_deadline_s)}) plus the safety margin "
                f"({fmt(self.safety_margin_s)}: 1% of ttl + 5ms + stop-work time) must not exceed "
                f"the ttl ({fmt(self.ttl_s)}); shorten the deadline or lengthen the ttl",
                settings=("renew_deadline", "ttl"),
            )
        if self.request_timeout_s >= self.renew_interval_s:
            raise InvalidTimingError(
                f"request timeout ({fmt(self.request_timeout_s)}) must be shorter than the renew "
                f"interval ({fmt(self.renew_interval_s)})",
                settings=("request_timeout", "renew_interval"),
            )
