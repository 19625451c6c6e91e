"""The library's log lines for an outage: one WARNING when it starts, one per new kind of error."""

from __future__ import annotations

import logging

import pytest

from elector.election import CycleOutcome, OutcomeKind, State
from elector.telemetry.outcome_log import ElectionLog


def _failure(kind: str, *, at: float) -> CycleOutcome:
    return CycleOutcome(
        kind=OutcomeKind.ACQUIRE_ERROR, state=State.FOLLOWER, at=at, error=f"{kind} error", error_kind=kind
    )


def test_each_new_kind_of_error_in_an_outage_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="elector")
    log = ElectionLog(lock="jobs", identity="a", ttl_s=10.0)
    for at, kind in [(1.0, "timeout"), (2.0, "data"), (3.0, "data"), (4.0, "connection")]:
        log.observe(_failure(kind, at=at))
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.error_kind for r in warned] == ["timeout", "data"]  # type: ignore[attr-defined]
    assert "unreachable" in warned[0].getMessage() and "data error" in warned[1].getMessage()
    log.observe(CycleOutcome(kind=OutcomeKind.HELD, state=State.FOLLOWER, at=5.0, duration_s=0.001))
    log.observe(_failure("data", at=6.0))
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    # Redis answered this time (with an error): said so, not "unreachable".
    assert len(warned) == 3 and "Redis answered with an error (data error)" in warned[2].getMessage()
