"""Exponential back-off: the one formula every retry loop of elector uses.

A delay doubles (by default) with each failure in a row, from `base_s` up to `cap_s`, and may be
spread by full-range jitter so that replicas failing together do not retry in lock-step. The
stateless `backoff_delay_s` serves loops that already count their failures (the election, the
pub/sub hub, Redlock's split votes); `Backoff` keeps the count for loops that do not (a command
restarted by exec mode, a resubscription, a poll that waits for a handoff).

Only the standard library: the election, the backend and the daemon all use it.
"""

from __future__ import annotations

import random

#: Doublings past which the delay is at its cap anyway for every base/cap pair elector uses;
#: bounding the exponent keeps `factor ** n` finite for counts that grew for days.
_MAX_EXPONENT = 60


def backoff_delay_s(
    failures: int,
    *,
    base_s: float,
    cap_s: float,
    factor: float = 2.0,
    jitter: float = 0.0,
    rng: random.Random | None = None,
) -> float:
    """The delay after `failures` failures in a row: `base_s * factor ** (failures - 1)`, capped.

    `failures <= 1` gives `base_s`. With `jitter` (a share, 0..1), the delay is drawn uniformly
    from `[delay * (1 - jitter), delay]`: never longer than the cap, never zero unless jitter is 1.
    """
    if base_s < 0 or cap_s < 0:
        raise ValueError(f"back-off needs non-negative delays, got base {base_s}s and cap {cap_s}s")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError(f"jitter is a share between 0 and 1, got {jitter}")
    exponent = min(max(failures - 1, 0), _MAX_EXPONENT)
    delay_s = min(cap_s, base_s * factor**exponent)
    if jitter:
        delay_s *= (rng or random).uniform(1.0 - jitter, 1.0)
    return delay_s


class Backoff:
    """A failure counter with its delay: `failed()` returns the next wait, `succeeded()` resets it.

    `reset_after_s`: a run (or a link) that lasted at least this long counts as a success, so
    `after_run(runtime_s)` restarts from `base_s` after a long healthy stretch.
    """

    def __init__(
        self,
        *,
        base_s: float,
        cap_s: float,
        factor: float = 2.0,
        jitter: float = 0.0,
        reset_after_s: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        backoff_delay_s(1, base_s=base_s, cap_s=cap_s, factor=factor, jitter=jitter)  # checks the values
        self.base_s = base_s
        self.cap_s = cap_s
        self.factor = factor
        self.jitter = jitter
        self.reset_after_s = reset_after_s
        self.failures = 0
        self._rng = rng

    def failed(self) -> float:
        """Count one more failure; the delay to wait before the next try, seconds."""
        self.failures += 1
        return backoff_delay_s(
            self.failures,
            base_s=self.base_s,
            cap_s=self.cap_s,
            factor=self.factor,
            jitter=self.jitter,
            rng=self._rng,
        )

    def succeeded(self) -> None:
        self.failures = 0

    def after_run(self, runtime_s: float) -> float:
        """The delay after a run that lasted `runtime_s` and then failed (e.g. a command that exited)."""
        if self.reset_after_s is not None and runtime_s >= self.reset_after_s:
            self.succeeded()
        return self.failed()
