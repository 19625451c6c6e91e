"""The election state machine: follower -> leader -> stepping down. Knows no Redis."""

from elector.election.hooks import ElectionHooks
from elector.election.machine import Election
from elector.election.outcome import (
    CycleOutcome,
    ElectionStatus,
    OutcomeKind,
    State,
    StepDownReason,
    error_cause,
)
from elector.election.timing import ElectionTiming, InvalidTimingError

__all__ = [
    "CycleOutcome",
    "Election",
    "ElectionHooks",
    "ElectionStatus",
    "ElectionTiming",
    "InvalidTimingError",
    "OutcomeKind",
    "State",
    "StepDownReason",
    "error_cause",
]
