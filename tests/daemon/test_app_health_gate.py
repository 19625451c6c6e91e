"""The app-health verdict and what it does to the elections (`AppHealthGate`), without a daemon:
fake elections that record what they are told, virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from elector.daemon.app_health import (
    NEVER_HEALTHY_WARN_S,
    AppHealthGate,
    AppHealthSettings,
    Check,
    CheckResult,
)
from elector.election import CycleOutcome, OutcomeKind, State, StepDownReason

OK = Check(CheckResult.OK, "200", 0.001)
SICK = Check(CheckResult.STATUS, "HTTP 503", 0.001)


class FakeElection:
    def __init__(self, lock: str) -> None:
        self.lock = lock
        self.state = State.FOLLOWER
        self.may_contend: list[bool] = []
        self.resigned: list[StepDownReason] = []

    def status(self) -> Any:
        return type("Status", (), {"state": self.state})()

    def gate_contending(self, *, may_contend: bool) -> None:
        self.may_contend.append(may_contend)

    def resign(self, *, stand_back_s: float, reason: StepDownReason) -> None:
        assert stand_back_s == 0.0
        self.resigned.append(reason)


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    warning = info

    def events(self) -> list[str]:
        return [event for event, _ in self.lines]


def gate(
    *, failures: int = 3, min_term_s: float = 0.0, exec_mode: bool = False
) -> tuple[AppHealthGate, FakeElection, Log]:
    log = Log()
    settings = AppHealthSettings(url="http://app/", interval_s=1.0, failures=failures, min_term_s=min_term_s)
    loop = asyncio.get_running_loop()
    app = AppHealthGate(settings, log=log, exec_mode=exec_mode, clock=loop.time)  # type: ignore[arg-type]
    election = FakeElection("jobs")
    app.attach([election])  # type: ignore[list-item]
    return app, election, log


def lead(app: AppHealthGate, election: FakeElection) -> None:
    election.state = State.LEADER
    now = asyncio.get_running_loop().time()
    app.observe_outcome("jobs", CycleOutcome(kind=OutcomeKind.ACQUIRED, state=State.LEADER, at=now))


pytestmark = pytest.mark.looptime


async def test_closed_until_the_first_success_and_one_line_per_change() -> None:
    app, election, log = gate()
    assert election.may_contend == [False] and not app.healthy
    app.observe(SICK)
    app.observe(OK)
    assert election.may_contend[-1] is True and app.healthy
    for _ in range(2):
        app.observe(SICK)
    assert app.healthy  # two failures of three: still healthy
    for _ in range(5):
        app.observe(SICK)
    assert not app.healthy and election.may_contend[-1] is False
    app.observe(OK)
    assert log.events() == ["app_healthy", "app_unhealthy", "app_healthy"]
    assert app.checks[CheckResult.STATUS] == 8 and app.checks[CheckResult.OK] == 2


async def test_a_leader_hands_over_at_the_nth_failure_with_its_reason() -> None:
    app, election, log = gate()
    app.observe(OK)
    lead(app, election)
    app.observe(SICK)
    app.observe(SICK)
    assert election.resigned == []
    app.observe(SICK)
    assert election.resigned == [StepDownReason.APP_UNHEALTHY]
    assert "app_unhealthy_handover" in log.events()


async def test_the_min_term_defers_the_handover_and_a_recovery_cancels_it() -> None:
    app, election, log = gate(failures=1, min_term_s=10.0)
    app.observe(OK)
    lead(app, election)
    await asyncio.sleep(4.0)
    app.observe(SICK)
    assert election.resigned == [] and election.may_contend[-1] is False
    await asyncio.sleep(5.9)
    assert election.resigned == []
    await asyncio.sleep(0.2)  # the term is 10 s old
    assert election.resigned == [StepDownReason.APP_UNHEALTHY]
    (handover,) = [fields for event, fields in log.lines if event == "app_unhealthy_handover"]
    assert handover["led_ms"] >= 10_000
    # A second term whose app recovers before its min term: no hand-over.
    election.resigned.clear()
    app.observe(OK)
    lead(app, election)
    app.observe(SICK)
    await asyncio.sleep(5.0)
    app.observe(OK)
    await asyncio.sleep(10.0)
    assert election.resigned == []


@pytest.mark.parametrize("exec_mode", [False, True])
async def test_a_never_healthy_app_is_explained_once(exec_mode: bool) -> None:
    app, _, log = gate(exec_mode=exec_mode)
    for _ in range(int(NEVER_HEALTHY_WARN_S) + 5):
        app.observe(Check(CheckResult.REFUSED, "Connection refused", 0.001))
        await asyncio.sleep(1.0)
    warnings = [fields for event, fields in log.lines if event == "app_health_never_healthy"]
    assert len(warnings) == 1
    assert ("not by the command itself" in warnings[0]["hint"]) is exec_mode
