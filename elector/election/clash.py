"""Two live processes reporting one identity: when such an episode starts, and whether one lasts.

Two signs, each seen only every few cycles while both processes live:
- the registry tells a cycle that our identity's live entry was registered by another instance
  (`CycleOutcome.identity_clash`; never on an instance's first registration, backend side);
- a follower finds the lock held under our identity, and still held under the same fencing
  token more than HELD_TTLS ttl after it first saw it: someone renews it. A process restarted
  under the identity of a leader that died (a container restart keeps $POD_NAME) finds that
  lease too, but it cannot outlive its ttl, so it is no sign.
A consumer that wants one line per episode needs a memory: an episode starts with the first sign
and ends once none was seen for QUIET_TTLS ttl (the lapse of a registry entry, after which the
other process, if still alive, has registered again and been seen). The election keeps one for
its status (the daemon's gauge); the library's and the daemon's logs keep their own, to warn
once per episode.
"""

from __future__ import annotations

from elector.election.outcome import CycleOutcome, OutcomeKind

#: An episode ends after this many ttls without a sign of a clash (a registry entry lapses after three).
QUIET_TTLS = 3
#: A lease under our identity is a sign once it was held under one token for longer than this many
#: ttls (a dead process's lease lapses within one; the margin covers the round trips).
HELD_TTLS = 1.5


class ClashEpisodes:
    """Follows the episodes of identity clashes through a lock's cycle outcomes."""

    def __init__(self, *, identity: str, ttl_s: float) -> None:
        self._identity = identity
        self._ttl_s = ttl_s
        #: The election clock when the current episode last saw a sign; None: no episode.
        self._last_seen_at: float | None = None
        #: (fencing token, first seen at) of a lease under our identity held by someone else.
        self._held_as_us: tuple[int, float] | None = None

    def sees_clash(self, outcome: CycleOutcome) -> bool:
        """Whether this cycle shows another live process under our identity."""
        holder = outcome.holder
        if outcome.kind is OutcomeKind.HELD and holder is not None and holder.identity == self._identity:
            if self._held_as_us is None or self._held_as_us[0] != holder.fencing_token:
                self._held_as_us = (holder.fencing_token, outcome.at)
            renewed = outcome.at - self._held_as_us[1] > HELD_TTLS * self._ttl_s
            return renewed or outcome.identity_clash
        if outcome.kind is OutcomeKind.HELD:
            self._held_as_us = None
        return outcome.identity_clash

    def observe(self, outcome: CycleOutcome) -> bool:
        """Take one cycle's outcome; True when it starts an episode (worth one warning)."""
        quiet_s = QUIET_TTLS * self._ttl_s
        if not self.sees_clash(outcome):
            if self._last_seen_at is not None and outcome.at - self._last_seen_at > quiet_s:
                self._last_seen_at = None
            return False
        started = self._last_seen_at is None or outcome.at - self._last_seen_at > quiet_s
        self._last_seen_at = outcome.at
        return started

    def active(self, now: float) -> bool:
        """Whether an episode is under way at clock time `now`."""
        return self._last_seen_at is not None and now - self._last_seen_at <= QUIET_TTLS * self._ttl_s
