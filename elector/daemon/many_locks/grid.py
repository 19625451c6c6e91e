"""The renewal grid of a daemon of many locks: how far apart the points are on which renewals fall
due (`Election`'s `renew_grid_s`), picked by the number of locks.

Each point costs a daemon one round trip (a send and a read) whatever the number due at it,
while every renewal of a point waits for the client work of all of them (their replies are
handled one after another): too fine a grid spends the daemon's CPU on round trips, too coarse
a one puts so many renewals on a point that each waits long for the others. The measurements
behind the bounds are in docs/design.md ("Renewals on a grid, in rounds").
"""

from __future__ import annotations

from elector.election.policy import RENEW_GRID_S

#: The coarsest grid `renew_grid_s` picks, and about how many renewals it puts on one point.
MAX_RENEW_GRID_S = 0.1
RENEWALS_PER_GRID_POINT = 30


def renew_grid_s(locks: int, *, renew_interval_s: float) -> float:
    """The renewal grid of a daemon of `locks` locks: about RENEWALS_PER_GRID_POINT renewals a
    point, between RENEW_GRID_S and MAX_RENEW_GRID_S. Early is always safe; never later than
    the renew interval (see `policy.on_grid`)."""
    per_second = max(1, locks) / renew_interval_s
    return min(MAX_RENEW_GRID_S, max(RENEW_GRID_S, RENEWALS_PER_GRID_POINT / per_second))
