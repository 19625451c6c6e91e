"""The election's policy: when a leader yields or hands over, when it must step down, and how long
each wait lasts (the renewal schedule, a follower's wake-up, the back-off after a failure).

Pure functions of the numbers they are given: the state machine (machine.py) asks them and acts,
so that its cycles read as the story they tell and the rules can be checked on their own.
"""

from __future__ import annotations

import dataclasses
import math
import random

from elector.backoff import backoff_delay_s
from elector.election.outcome import StepDownReason
from elector.lease import Candidate, Handoff

#: Upper bound of the random delay added to a follower's wake-up, seconds.
MAX_WAKE_JITTER_S = 0.002

#: With renewal jitter on, the first renewal of a term comes 0-90% of an interval early.
FIRST_RENEWAL_SPREAD = 0.9

#: With renewal jitter on (many locks), each renewal is due on a point of a grid within its
#: jitter range: the renewals of many locks then fall due at the same instants and go out
#: together, as one batch script call, instead of one request each. This is the default grid,
#: and the finest a daemon of many locks picks.
RENEW_GRID_S = 0.02

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


# -- when a leader steps down -------------------------------------------------------------------


def step_down_due(now: float, *, valid_until: float, renew_deadline_at: float) -> StepDownReason | None:
    """Whether a leader must step down before sending a renewal: its validity has ended (it was not
    scheduled in time: the lease may be gone already), or the renew deadline has come."""
    if now >= valid_until:
        return StepDownReason.LEASE_EXPIRED
    if now >= renew_deadline_at:
        return StepDownReason.RENEW_DEADLINE
    return None


def withheld_stand_back_until(*, last_renew_sent_at: float, ttl_s: float, reason: StepDownReason) -> float:
    """Until when a leader whose work could not be seen to stop (release withheld) stays out.

    The old lease lapses on Redis no later than its last renewal's send time + ttl. No release
    means no handoff key either: after a handoff or a preemption it stays out for the window the
    release would have opened, so that the intended successor gets the lapsed lease, not us again.
    """
    lapse_at = last_renew_sent_at + ttl_s
    if reason in (StepDownReason.HANDOFF, StepDownReason.PREEMPTED):
        return lapse_at + ttl_s
    return lapse_at


# -- when a leader yields -----------------------------------------------------------------------

#: A rival must have refreshed its entry this share of a ttl after we first noticed it.
RIVAL_REFRESH_SLACK = 0.05


@dataclasses.dataclass(frozen=True, slots=True)
class YieldVerdict:
    """What a successful renewal's news means for the term."""

    #: HANDOFF or PREEMPTED when the term should end; None: lead on.
    reason: StepDownReason | None
    #: Whom the release hands the lease to (the handoff's target, the better rival).
    hand_over_to: str | None
    #: Since when the better rival has been watched (None: there is none).
    rival_seen_since: float | None


def should_yield(
    handoff: Handoff | None,
    rival: Candidate | None,
    *,
    now: float,
    identity: str,
    priority: int,
    led_since: float,
    rival_seen_since: float | None,
    preempt_after_s: float,
    ttl_s: float,
) -> YieldVerdict:
    """Whether a successful renewal at `now` should end our term: a handoff asked of us, or a rival
    of strictly higher priority, alive, watched for `preempt_after_s` while we led that long.

    Strict priority, the dwell time and the targeted handoff together keep leadership from
    flapping."""
    if handoff is not None and handoff.from_identity == identity:
        # Re-armed at the release for a named target, so that a long drain cannot outlast
        # the requested window and let a third candidate in.
        return YieldVerdict(StepDownReason.HANDOFF, handoff.to_identity, rival_seen_since)
    # A rival must be alive now: one that registered and died still has an entry for 3 ttl,
    # and handing over to it would leave the lock without a leader.
    if rival is None or rival.priority <= priority or rival.last_seen_ms_ago > round(ttl_s * 1000):
        return YieldVerdict(None, None, None)
    if rival_seen_since is None:
        rival_seen_since = now
    watched_s = now - rival_seen_since
    # It must also have refreshed its entry since we first noticed it, by more than the two
    # clocks can disagree: a pod that registered once and died can still look "seen within
    # a ttl" by a few ms when the dwell ends (its age is on Redis's clock, ours on our own).
    refreshed = rival.last_seen_ms_ago / 1000 < watched_s - RIVAL_REFRESH_SLACK * ttl_s
    settled = watched_s >= preempt_after_s and refreshed
    if settled and now - led_since >= preempt_after_s:
        return YieldVerdict(StepDownReason.PREEMPTED, rival.identity, rival_seen_since)
    return YieldVerdict(None, None, rival_seen_since)
