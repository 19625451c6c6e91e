"""Two live processes reporting one identity: when such an episode starts, and whether one lasts.

The registry tells a cycle that our identity's live entry was registered by another instance
(`CycleOutcome.identity_clash`); a follower also sees it when the holder carries our identity
while we do not lead. Either is reported every few cycles while both processes live (each
registration overwrites the other's nonce), so a consumer that wants one line per episode needs
a memory: an episode starts with the first such cycle and ends once none was seen for `quiet_s`
(three ttl: the lapse of a registry entry, after which the other process, if still alive, has
registered again and been seen). The election keeps one for its status (the daemon's gauge);
the library's and the daemon's logs keep their own, to warn once per episode.
"""

from __future__ import annotations

from elector.election.outcome import CycleOutcome, OutcomeKind

#: An episode ends after this many ttls without a clash (a registry entry lapses after three).
QUIET_TTLS = 3


def sees_clash(outcome: CycleOutcome, *, identity: str) -> bool:
    """Whether this cycle saw another live process under `identity`."""
    if outcome.identity_clash:
        return True
    holder = outcome.holder
    return outcome.kind is OutcomeKind.HELD and holder is not None and holder.identity == identity


class ClashEpisodes:
    """Follows the episodes of identity clashes through a lock's cycle outcomes."""

    def __init__(self, *, identity: str, quiet_s: float) -> None:
        self._identity = identity
        self._quiet_s = quiet_s
        #: The election clock when the current episode last saw a clash; None: no episode.
        self._last_seen_at: float | None = None

    def observe(self, outcome: CycleOutcome) -> bool:
        """Take one cycle's outcome; True when it starts an episode (worth one warning)."""
        if not sees_clash(outcome, identity=self._identity):
            if self._last_seen_at is not None and outcome.at - self._last_seen_at > self._quiet_s:
                self._last_seen_at = None
            return False
        started = self._last_seen_at is None or outcome.at - self._last_seen_at > self._quiet_s
        self._last_seen_at = outcome.at
        return started

    def active(self, now: float) -> bool:
        """Whether an episode is under way at clock time `now`."""
        return self._last_seen_at is not None and now - self._last_seen_at <= self._quiet_s
