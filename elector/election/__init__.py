"""The election state machine: follower -> leader -> stepping down. Knows no Redis.

`Election` (machine.py) is the one class; the rest of this package is what it is made of and
what it reports. A daemon of many locks drives it through the small public interface
re-exported here (`Renewer`, `WakeUpTimers`, `StartGate`), never through its private state.
"""

from elector.election.hooks import ElectionHooks
from elector.election.machine import (
    Election,
    RenewalAnswer,
    Renewer,
    StartGate,
    StartTurn,
    WakeUpTimer,
    WakeUpTimers,
)
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
    "RenewalAnswer",
    "Renewer",
    "StartGate",
    "StartTurn",
    "State",
    "StepDownReason",
    "WakeUpTimer",
    "WakeUpTimers",
    "error_cause",
]
