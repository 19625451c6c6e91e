"""When the election's next cycle is due: the renewal schedule, a follower's wake-up jitter and
the back-off after a failed request. Pure functions of the numbers they are given.

Kept apart from the state machine (machine.py) so that the cycles read as the story they tell,
and the arithmetic of "when" can be checked on its own.
"""

from __future__ import annotations

import math
import random

from elector.backoff import backoff_delay_s

#: Upper bound of the random delay added to a follower's wake-up, seconds.
MAX_WAKE_JITTER_S = 0.002

#: With renewal jitter on, the first renewal of a term comes 0-90% of an interval early.
FIRST_RENEWAL_SPREAD = 0.9

#: With renewal jitter on (many locks), each renewal is due on a point of a grid within its
#: jitter range: the renewals of many locks then fall due at the same instants and go out
#: together, as one batch script call (backend/pipeline.py), instead of one request each. This
#: is the default grid, and the finest `renew_grid_s` picks.
RENEW_GRID_S = 0.02

#: The coarsest grid `renew_grid_s` picks, and about how many renewals it puts on one point.
#: Each point costs a daemon one round trip (a send and a read: ~0.3-0.6 ms of CPU on a small VM,
#: loopback included) whatever the number due at it, while every renewal of a point waits for
#: the client work of all of them (their replies are handled one after another): at 1,000 locks
#: and ttl 10 s a 20 ms grid was 50 round trips a second for ~7 renewals each, a third of the
#: daemon's CPU; a 100 ms grid put ~170 renewals on a point at 5,000 locks and tripled the p50.
MAX_RENEW_GRID_S = 0.1
RENEWALS_PER_GRID_POINT = 30


def renew_grid_s(locks: int, *, renew_interval_s: float) -> float:
    """The renewal grid of a daemon of `locks` locks: about RENEWALS_PER_GRID_POINT renewals a
    point, between RENEW_GRID_S and MAX_RENEW_GRID_S. Early is always safe; never later than
    the renew interval (see `on_grid`)."""
    per_second = max(1, locks) / renew_interval_s
    return min(MAX_RENEW_GRID_S, max(RENEW_GRID_S, RENEWALS_PER_GRID_POINT / per_second))


#: Retries after failed requests: each delay is drawn from its upper half, so replicas that failed
#: together spread out. Capped so that a recovered Redis is noticed quickly.
FAILURE_BACKOFF_JITTER = 0.5


def next_renewal_at(
    sent: float,
    *,
    interval_s: float,
    jitter_share: float,
    first: bool,
    rng: random.Random,
    grid_s: float = RENEW_GRID_S,
) -> float:
    """When the renewal after one sent at `sent` is due: an interval later, or up to
    `jitter_share` of it early (on the `grid_s` grid) when renewal jitter is on."""
    if not jitter_share:
        return sent + interval_s
    # Locks granted together (a daemon's start, the end of an outage) would renew in one burst
    # for many intervals while the small jitter drifts them apart: the first renewal of a term
    # lands anywhere in the interval instead. One early renewal per grant is the whole cost, and
    # early is always safe.
    share = FIRST_RENEWAL_SPREAD if first else jitter_share
    due = sent + interval_s * (1 - rng.uniform(0.0, share))
    return on_grid(due, earliest=sent + interval_s * (1 - share), latest=sent + interval_s, grid_s=grid_s)


def wake_jitter_s(*, ttl_s: float, rng: random.Random) -> float:
    """A follower's small random delay after a lease's end, so that followers do not collide."""
    return rng.uniform(0.0, min(MAX_WAKE_JITTER_S, ttl_s * 0.001))


def failure_backoff_s(failures_in_a_row: int, *, renew_interval_s: float, rng: random.Random) -> float:
    """The wait before retrying after `failures_in_a_row` failed requests: exponential with
    jitter, capped so that a recovered Redis is noticed quickly."""
    return backoff_delay_s(
        failures_in_a_row,
        base_s=min(0.1, renew_interval_s / 4),
        cap_s=min(renew_interval_s, 2.0),
        jitter=FAILURE_BACKOFF_JITTER,
        rng=rng,
    )


def ms(seconds: float) -> int:
    """Whole milliseconds, never negative (for `remaining_ms`)."""
    return max(0, round(seconds * 1000))


def on_grid(due: float, *, earliest: float, latest: float, grid_s: float = RENEW_GRID_S) -> float:
    """`due` moved to a point of the `grid_s` grid within [earliest, latest]: the one just
    before it, else the one just after; `due` itself when the range holds no grid point."""
    before = math.floor(due / grid_s) * grid_s
    if before >= earliest:
        return before
    after = before + grid_s
    return after if after <= latest else due
